#include "inline_policy.h"

#include <sys/resource.h>
#include <time.h>

#include <algorithm>

namespace seqserve {

namespace {
constexpr int kMaxPenalty = 4;            // promotion needs at most promote_after << 4 batches
constexpr uint64_t kPenaltyDecay = 1024;  // cheap inline batches that forgive one demotion
// In inline mode, a model goes back to its threads when kSlowInWindow of its last 32 batches
// were over the bound, or at once when one is over kAtOnceFactor times the bound. A cheap
// model's batch runs over now and then on a loaded machine (the GIL handed to another thread
// mid-batch, a garbage-collection pass): demoting on each such batch kept the demo model on its
// threads for 87% of its batches under a 16-sequence gRPC stream load (bench/docs/engine.md,
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

bool InlinePolicy::configure(int64_t max_batch_ns, int promote_after) {
  stats_.max_batch_ns = std::max<int64_t>(0, max_batch_ns);
  stats_.promote_after = std::max(1, promote_after);
  cheap_streak_ = 0;
  if (stats_.max_batch_ns == 0 && active_.load()) {
    active_.store(false);
    return true;
  }
  return false;
}

InlineStats InlinePolicy::stats() const {
  InlineStats s = stats_;
  s.active = active_.load();
  return s;
}

InlinePolicy::Verdict InlinePolicy::note(bool in_line, int64_t cost_ns, bool closing) {
  stats_.last_batch_ns = cost_ns;
  if (in_line) ++stats_.inline_batches;
  else ++stats_.thread_batches;
  if (stats_.max_batch_ns == 0) return kUnchanged;
  const bool cheap = cost_ns <= stats_.max_batch_ns;
  if (!active_.load(std::memory_order_relaxed)) {
    cheap_streak_ = cheap ? cheap_streak_ + 1 : 0;
    if (cheap && cheap_streak_ >= (stats_.promote_after << penalty_) && !closing) {
      active_.store(true, std::memory_order_relaxed);
      ++stats_.promotions;
      cheap_streak_ = 0;
      return kPromoted;
    }
    return kUnchanged;
  }
  // Inline mode (this batch may still have run on an executor: a delayed batch, a fallback).
  slow_window_ = (slow_window_ << 1) | (cheap ? 0u : 1u);
  if (cheap) {
    if (++cheap_streak_ >= static_cast<int>(kPenaltyDecay) && penalty_ > 0) {
      --penalty_;
      cheap_streak_ = 0;
    }
    return kUnchanged;
  }
  ++stats_.slow_batches;
  if (cost_ns <= kAtOnceFactor * stats_.max_batch_ns && __builtin_popcount(slow_window_) < kSlowInWindow)
    return kUnchanged;
  // Too slow for the loop: back to the executors.
  active_.store(false, std::memory_order_relaxed);
  ++stats_.demotions;
  cheap_streak_ = 0;
  slow_window_ = 0;
  penalty_ = std::min(kMaxPenalty, penalty_ + 1);
  return kDemoted;
}

}  // namespace seqserve
