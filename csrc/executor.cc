// Running formed batches: the executor thread of each instance, and inline execution.
//
// A Python model's step used to cost two cross-thread hand-offs: submit woke the instance's
// executor, which took the GIL from the event loop, and the replies went back to the loop with
// a second wake-up. Inline execution removes both for cheap in-process models: the event loop,
// which already holds the GIL, forms and runs an idle instance's batch itself
// (run_ready_inline, called from a loop callback scheduled after submit), and submit wakes no
// executor. Both paths use the strategy's one form_locked, and `executing` (under the lock)
// keeps one batch per instance at a time, whoever runs it.
//
// A slow model must not block the loop, so a model goes inline only once it has shown to be
// cheap: promote_after batches in a row (on its executor) each costing at most max_batch_ns
// (gather + runner + reply split). Slow batches in inline mode end it (kSlowInWindow of the
// last 32, or one over kAtOnceFactor times the bound) and hand the queued work back to the
// executors; so a model that turns slow costs the loop a few batches. Each demotion doubles
// the cheap run needed for the next promotion (up to 16x). A batch is judged by
// its wall time, unless its thread never blocked: then the OS preempted it (a stall the loop
// suffers wherever the batch runs), and its thread CPU time counts instead.
//
// Correctness does not depend on the loop coming back: in inline mode an idle executor waits
// with a timeout, and takes the work queued for it once it has waited kInlineFallbackNs for
// the loop (a loop that is busy, or gone). A batch that must wait for its delay is left to the
// executor, as is everything while an instance's executor is running a batch of its own.
#include <sys/resource.h>
#include <time.h>

#include "scheduler.h"

namespace seqserve {

namespace {
constexpr int64_t kInlineFallbackNs = 10'000'000;  // an executor takes queued work the loop left this long
constexpr int64_t kInlinePassNs = 1'000'000;       // one inline pass runs batches for this long at most
constexpr int kMaxPenalty = 4;                     // promotion needs at most promote_after << 4 batches
constexpr uint64_t kPenaltyDecay = 1024;           // cheap inline batches that forgive one demotion
// In inline mode, a model goes back to its threads when kSlowInWindow of its last 32 batches
// were over the bound, or at once when one is over kAtOnceFactor times the bound. A cheap
// model's batch runs over now and then on a loaded machine (the GIL handed to another thread
// mid-batch, a garbage-collection pass): demoting on each such batch kept the demo model on its
// threads for 87% of its batches under a 16-sequence gRPC stream load (bench/README.md,
// "Inline execution: slow batches in a window").
constexpr int kSlowInWindow = 4;
constexpr int64_t kAtOnceFactor = 8;
}  // namespace

ThreadUsage ThreadUsage::now() {
  // CPU time from the thread's CPU clock (exact; getrusage's times are tick-sampled), context
  // switches from getrusage.
  ThreadUsage u;
  struct timespec ts;
  struct rusage ru;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0 || getrusage(RUSAGE_THREAD, &ru) != 0) return u;
  u.cpu_ns = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  u.blocked = ru.ru_nvcsw;
  return u;
}

int64_t ThreadUsage::cost(const ThreadUsage& start, int64_t wall_ns) {
  // On a loaded machine a cheap batch's wall time includes the time the OS gave its CPU to
  // others; that stalls the event loop wherever the batch runs. Time the thread spent blocked
  // (sleeping, waiting for a lock, for I/O, for the GIL) is the model's, and counts in full.
  const ThreadUsage end = now();
  if (end.blocked != start.blocked || start.cpu_ns == 0) return wall_ns;
  return std::min(wall_ns, end.cpu_ns - start.cpu_ns);
}

void Scheduler::executor_loop(Instance& inst) {
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk);
  for (;;) {
    if (force_) break;
    if (inst.executing) {
      // The event loop is running this instance's batch inline (this thread cannot be holding
      // the runtime meanwhile unless it took it while the loop's runner let it go).
      if (hold.held()) {
        hold.release();
        continue;
      }
      inst.waits_for_inline = true;
      inst.cv.wait(lk);
      inst.waits_for_inline = false;
      continue;
    }
    const Next n = form_locked(inst, lk, hold);
    switch (n.kind) {
      case Next::kBatch: run_formed_batch(inst, lk, hold, n.more); continue;
      case Next::kAgain: continue;
      case Next::kExit: return;
      default: break;
    }
    if (hold.held()) {  // never wait holding the runtime: give it back and look again
      hold.release();
      continue;
    }
    if (n.kind == Next::kUntil) inst.cv.wait_for(lk, std::chrono::nanoseconds(n.until_ns - now_ns()));
    else if (n.kind == Next::kIdle) idle_wait(inst, lk);
    else inst.cv.wait(lk);
  }
}

void Scheduler::idle_wait(Instance& inst, std::unique_lock<std::mutex>& lk) {
  if (!inline_mode_.load(std::memory_order_relaxed)) {
    inst.cv.wait(lk);
    return;
  }
  // Submit does not wake this thread in inline mode: poll (cheaply, without the runtime) for
  // work that the event loop has left queued for too long.
  while (inline_mode_.load(std::memory_order_relaxed) && !closing_) {
    if (inst.cv.wait_for(lk, std::chrono::nanoseconds(kInlineFallbackNs)) == std::cv_status::no_timeout) return;
    if (inst.inline_due_ns && now_ns() >= inst.inline_due_ns) {
      inst.inline_due_ns = 0;
      return;
    }
  }
}

void Scheduler::inline_queued_locked(Instance& inst, int64_t now) {
  if (inst.inline_due_ns == 0) inst.inline_due_ns = now + kInlineFallbackNs;
}

void Scheduler::configure_inline(int64_t max_batch_ns, int promote_after) {
  std::lock_guard<std::mutex> lk(mu_);
  inline_.max_batch_ns = std::max<int64_t>(0, max_batch_ns);
  inline_.promote_after = std::max(1, promote_after);
  if (inline_.max_batch_ns == 0 && inline_mode_.load()) {
    inline_mode_.store(false);
    for (auto& inst : instances_) inst->cv.notify_one();
  }
  cheap_streak_ = 0;
}

InlineStats Scheduler::inline_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  InlineStats s = inline_;
  s.active = inline_mode_.load();
  return s;
}

void Scheduler::note_batch_cost_locked(bool in_line, int64_t cost_ns) {
  inline_.last_batch_ns = cost_ns;
  if (in_line) ++inline_.inline_batches;
  else ++inline_.thread_batches;
  if (inline_.max_batch_ns == 0) return;
  const bool cheap = cost_ns <= inline_.max_batch_ns;
  if (!inline_mode_.load(std::memory_order_relaxed)) {
    cheap_streak_ = cheap ? cheap_streak_ + 1 : 0;
    if (cheap && cheap_streak_ >= (inline_.promote_after << inline_penalty_) && !closing_) {
      inline_mode_.store(true, std::memory_order_relaxed);
      ++inline_.promotions;
      cheap_streak_ = 0;
    }
    return;
  }
  // Inline mode (this batch may still have run on an executor: a delayed batch, a fallback).
  slow_window_ = (slow_window_ << 1) | (cheap ? 0u : 1u);
  if (cheap) {
    if (++cheap_streak_ >= static_cast<int>(kPenaltyDecay) && inline_penalty_ > 0) {
      --inline_penalty_;
      cheap_streak_ = 0;
    }
    return;
  }
  ++inline_.slow_batches;
  if (cost_ns <= kAtOnceFactor * inline_.max_batch_ns && __builtin_popcount(slow_window_) < kSlowInWindow) return;
  // Too slow for the loop: back to the executors, with what is queued.
  inline_mode_.store(false, std::memory_order_relaxed);
  ++inline_.demotions;
  cheap_streak_ = 0;
  slow_window_ = 0;
  inline_penalty_ = std::min(kMaxPenalty, inline_penalty_ + 1);
  for (auto& i : instances_) {
    i->inline_due_ns = 0;
    i->cv.notify_one();
  }
}

int Scheduler::run_ready_inline(bool* more) {
  *more = false;
  if (!inline_mode_.load(std::memory_order_relaxed)) return 0;
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk, true);  // the caller (the event loop) holds the runtime
  const int64_t t0 = now_ns();
  int ran = 0;
  for (auto& inst : instances_) inst->inline_due_ns = 0;  // the loop has come for it
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& ip : instances_) {
      Instance& inst = *ip;
      Next n;
      for (;;) {
        if (!inline_mode_.load(std::memory_order_relaxed) || closing_ || force_) return ran;
        if (inst.executing) break;  // its executor (or a runner that let the runtime go) has it
        n = form_locked(inst, lk, hold);
        if (n.kind != Next::kAgain) break;
      }
      if (inst.executing) continue;
      if (n.kind == Next::kUntil) {
        inst.cv.notify_one();  // a batch that must wait is its executor's
        continue;
      }
      if (n.kind != Next::kBatch) continue;
      run_formed_batch(inst, lk, hold, false, true);
      ++ran;
      progress = true;
      if (now_ns() - t0 >= std::max(kInlinePassNs, inline_.max_batch_ns)) {
        // The loop has other work (sockets to read, replies to write): the caller comes back
        // for the rest after it. (Waking the executors instead would have them compete with
        // the loop for the GIL.)
        *more = true;
        return ran;
      }
    }
  }
  return ran;
}

}  // namespace seqserve
