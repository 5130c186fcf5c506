// Running formed batches: the executor thread of each instance, and inline execution.
//
// Why inline execution: on an executor thread, a Python model's step costs two cross-thread
// hand-offs: submit wakes the instance's executor, which takes the GIL from the event loop,
// and the replies go back to the loop with a second wake-up. For cheap in-process models the
// event loop, which already holds the GIL, can form and run an idle instance's batch itself
// (run_ready_inline, called from a loop callback scheduled after submit), and submit then wakes
// no executor. Both paths use the strategy's one form_locked, and `executing` (under the lock)
// keeps one batch per instance at a time, whoever runs it. When a model is cheap enough to run
// inline is InlinePolicy's call (inline_policy.h). Under worker processes the thread that submits
// plain requests is the ring feeder's drain thread: it runs inline batches the same way, taking
// the runtime per batch (run_ready_inline with borrowed = false; ring_feeder.h).
//
// Correctness does not depend on the loop coming back: in inline mode an idle executor waits
// with a timeout, and takes the work queued for it once it has waited kInlineFallbackNs for
// the loop (a loop that is busy, or gone). A batch that must wait for its delay is left to the
// executor, as is everything while an instance's executor is running a batch of its own.
#include "scheduler.h"

namespace seqserve {

namespace {
constexpr int64_t kInlineFallbackNs = 10'000'000;  // an executor takes queued work the loop left this long
constexpr int64_t kInlinePassNs = 1'000'000;       // one inline pass runs batches for this long at most
}  // namespace

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
    if (n.kind == Next::kUntil) {
      inst.delay_until_ns = n.until_ns;
      inst.cv.wait_for(lk, std::chrono::nanoseconds(n.until_ns - now_ns()));
      inst.delay_until_ns = 0;
    } else if (n.kind == Next::kIdle) {
      idle_wait(inst, lk);
    } else {
      inst.cv.wait(lk);
    }
  }
}

void Scheduler::idle_wait(Instance& inst, std::unique_lock<std::mutex>& lk) {
  if (!inline_.active()) {
    inst.cv.wait(lk);
    return;
  }
  // Submit does not wake this thread in inline mode: poll (cheaply, without the runtime) for
  // work that the event loop has left queued for too long.
  while (inline_.active() && !closing_) {
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
  if (inline_.configure(max_batch_ns, promote_after))
    for (auto& inst : instances_) inst->cv.notify_one();
}

InlineStats Scheduler::inline_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return inline_.stats();
}

void Scheduler::note_batch_cost_locked(bool in_line, int64_t cost_ns) {
  if (inline_.note(in_line, cost_ns, closing_) != InlinePolicy::kDemoted) return;
  // Back to the executors, with what is queued.
  for (auto& i : instances_) {
    i->inline_due_ns = 0;
    i->cv.notify_one();
  }
}

int Scheduler::run_ready_inline(bool* more, bool borrowed) {
  *more = false;
  if (!inline_.active()) return 0;
  std::unique_lock<std::mutex> lk(mu_);
  RuntimeHold hold(hooks_, lk, borrowed);
  const int64_t t0 = now_ns();
  int ran = 0;
  for (auto& inst : instances_) inst->inline_due_ns = 0;  // the loop has come for it
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& ip : instances_) {
      Instance& inst = *ip;
      Next n;
      for (;;) {
        if (!inline_.active() || closing_ || force_) return ran;
        if (inst.executing) break;  // its executor (or a runner that let the runtime go) has it
        n = form_locked(inst, lk, hold);
        if (n.kind != Next::kAgain) break;
      }
      if (inst.executing) continue;
      if (n.kind == Next::kUntil) {
        // A batch that must wait is its executor's (woken unless it already waits that long).
        if (inst.delay_until_ns == 0 || inst.delay_until_ns > n.until_ns) inst.cv.notify_one();
        continue;
      }
      if (n.kind != Next::kBatch) continue;
      inst.inline_on_loop = borrowed;
      run_formed_batch(inst, lk, hold, false, true);
      ++ran;
      progress = true;
      if (now_ns() - t0 >= std::max(kInlinePassNs, inline_.bound())) {
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
