// When a model's batches run inline, on the thread that already holds the Python runtime (the
// event loop), instead of on its instances' executor threads (executor.cc runs them either way).
//
// A slow model must not block the loop, so a model goes inline only once it has shown to be
// cheap: promote_after batches in a row each costing at most max_batch_ns (gather + runner +
// reply split). Slow batches in inline mode end it (kSlowInWindow of the last 32, or one over
// kAtOnceFactor times the bound), so a model that turns slow costs the loop a few batches.
// Each demotion doubles the cheap run needed for the next promotion (up to 16x). A batch is
// judged by its wall time, unless its thread never blocked: then the OS preempted it (a stall
// the loop suffers wherever the batch runs), and its thread CPU time counts instead
// (ThreadUsage).
//
// Lock: everything but active() runs under the scheduler lock; active() is read without it
// (run_ready_inline's first check, submit's choice between waking an executor and not).
#pragma once

#include <atomic>
#include <cstdint>

namespace seqserve {

// This thread's CPU time and voluntary context switches: a batch that overran its bound
// without ever blocking was preempted, and is judged by the CPU time it used.
struct ThreadUsage {
  int64_t cpu_ns = 0;
  long blocked = 0;
  static ThreadUsage now();
  // What a batch that took `wall_ns` since `start` cost: its CPU time if it never blocked.
  static int64_t cost(const ThreadUsage& start, int64_t wall_ns);
};

// Inline execution's settings and counters, as Scheduler::inline_stats reports them.
struct InlineStats {
  int64_t max_batch_ns = 0;  // a batch costing more is not cheap (0: inline never)
  int promote_after = 0;     // cheap executor batches in a row before inline mode
  bool active = false;       // inline mode now
  uint64_t inline_batches = 0, thread_batches = 0, promotions = 0, demotions = 0;
  uint64_t slow_batches = 0;  // batches over the bound in inline mode (not all demote)
  int64_t last_batch_ns = 0;  // the cost of the latest batch (gather, runner, replies)
};

class InlinePolicy {
 public:
  // What a batch's cost changed.
  enum Verdict { kUnchanged, kPromoted, kDemoted };

  // Sets the bound (0: never inline) and the promotion run. True when that ended inline mode
  // (the caller wakes the executors).
  bool configure(int64_t max_batch_ns, int promote_after);
  // Inline mode now (any thread).
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // The bound on a cheap batch (0: nobody asks what batches cost).
  int64_t bound() const { return stats_.max_batch_ns; }
  // A batch ran (in_line: on the loop) and cost cost_ns. `closing`: the scheduler is closing,
  // so it is not promoted. On kDemoted the caller hands queued work back to the executors.
  Verdict note(bool in_line, int64_t cost_ns, bool closing);
  InlineStats stats() const;

 private:
  InlineStats stats_;                 // settings and counters
  std::atomic<bool> active_{false};
  int cheap_streak_ = 0;              // cheap batches in a row
  uint32_t slow_window_ = 0;          // in inline mode, bit k: the batch k batches ago was over the bound
  int penalty_ = 0;                   // demotions lately: promotion needs promote_after << penalty_
};

}  // namespace seqserve
