// The scheduler of one model: what every batching strategy shares. It owns the lock, the
// request pool, one executor thread per model instance (each with its reused batch area and
// slot state), statistics and shutdown. A strategy (direct.cc, oldest.cc, dynamic.cc,
// stateless.cc; the sequence ones over sequence_scheduler.h) supplies the queueing of a
// request and the forming of one batch, through a few hooks; what only sequences have (their
// table, the sequence API, checkpoints) lives in SequenceScheduler. executor.cc runs formed
// batches, on an instance's executor thread or inline on the thread that already holds the
// Python runtime (the event loop; when is InlinePolicy's call). Python is reached only through
// Hooks, which are never called with the lock held.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "batch.h"
#include "common.h"
#include "request.h"
#include "spec.h"
#include "inline_policy.h"
#include "slot_state.h"

namespace seqserve {

// What DESCRIBE reports about a sequence that expired.
struct ExpiredSequence {
  CorrId id;
  double age_s = 0, idle_s = 0;
  uint64_t steps = 0;
  uint64_t state_bytes = 0;
  int instance = 0, slot = 0;
};

struct DurationStat {
  uint64_t count = 0, ns = 0;
  void add(uint64_t n, uint64_t d) { count += n; ns += d; }
};
struct BatchStat {
  DurationStat compute_input, compute_infer, compute_output;
};
struct Stats {
  uint64_t inference_count = 0, execution_count = 0, last_inference_ms = 0;
  uint64_t backlog_full = 0;  // STARTs refused because the backlog held its bound of sequences
  uint64_t tombstones_evicted = 0;  // session tombstones the count caps dropped before their time
  // ... of them by the per-client cap and by the total cap; new sessions refused because their
  // client's evicted ids fill its share of the filter (tombstones.h).
  uint64_t tombstones_evicted_client_cap = 0, tombstones_evicted_global_cap = 0, session_starts_refused = 0;
  DurationStat success, fail, queue, compute_input, compute_infer, compute_output;
  std::map<int64_t, BatchStat> batches;
  // Failures by Triton's `reason` label: REJECTED (queue and backlog timeouts), BACKEND (the
  // model failed the batch), CANCELED (dropped from the queues: their client went away, or
  // their sequence was cancelled or ended); the rest of `fail` is OTHER.
  uint64_t fail_rejected = 0, fail_backend = 0, fail_canceled = 0;
  // Sequences: STARTs accepted (implied ones included), ENDs accepted and sequences ended
  // otherwise (the sequence API, cancellation, their scope closing), idle expiries.
  uint64_t sequences_started = 0, sequences_ended = 0, sequences_expired = 0;
  // Checkpoints: sequences released from their slot to move elsewhere (neither ended nor
  // expired), and sequences restored into a slot from a checkpoint.
  uint64_t sequences_released = 0, sequences_restored = 0;
  // Successful requests by latency (arrival to the end of their batch), per bucket of
  // spec.latency_buckets_ms (the last one: +Inf), and their sum in ms.
  std::vector<uint64_t> latency_counts;
  double latency_sum_ms = 0;
  // A snapshot taken by stats(): requests waiting (queued or backlogged), sequence slots, slots
  // held, backlogged sequences, implicit state bytes held by the sequences in slots.
  int64_t pending_requests = 0, sequence_slots = 0, sequences_active = 0, sequences_backlogged = 0;
  uint64_t state_bytes = 0;
};

struct Instance {
  int index = 0;
  std::thread thread;
  std::condition_variable cv;
  Batch batch;
  SlotState state;  // its sequence slots' implicit state (empty without sequences)
  int64_t t_form = 0, t_gathered = 0, t_executed = 0;
  bool executing = false;
  bool exited = false;    // its executor thread has finished (close() waits for this, bounded)
  bool recorded = false;  // stats of the current batch already recorded (its state written); lock held
  bool cancels = false;   // a request this instance may hold outside its slot queues was cancelled
  // Its executor sleeps until this time for a batch's queue delay (0: it does not). Submit then
  // wakes it only for a batch that can go before the delay ends (batch_ready_locked).
  int64_t delay_until_ns = 0;
  // Inline execution (executor.cc): the current batch runs on the event loop's thread; its
  // executor waits for that batch to finish; submit queued work for it without waking it, and
  // its executor takes that work itself from this time on (0: none) if the loop has not.
  bool inline_batch = false;
  bool inline_on_loop = false;  // ... on the event loop (else the ring feeder's drain thread)
  bool waits_for_inline = false;
  int64_t inline_due_ns = 0;
};

// Hooks into the Python layer. Both are called without the scheduler lock and must take the
// GIL themselves.
struct Hooks {
  std::function<bool(Instance&)> run;  // returns success
  std::function<void(const std::vector<uint64_t>&, Code, const std::string&)> fail;
  std::function<void(const std::string&)> log_warning;
  std::function<void(const ExpiredSequence&)> describe;
  // Called on each core thread when it starts and before it exits (the binding attaches one
  // Python thread state for the thread's lifetime instead of one per GIL acquisition).
  std::function<void()> thread_start, thread_stop;
  // Take / give back the Python runtime (the GIL) on an executor thread. An executor takes it
  // *before* forming a batch, so requests the event loop queued while it waited join the batch.
  // Never called with the scheduler lock held.
  std::function<void()> enter, leave;
};

// submit()'s answer: accepted, or refused with nothing queued.
struct SubmitResult {
  bool accepted = true;
  Code code = kUnknown;
  std::string message;
  bool backlog_full = false;  // admission control: worth retrying later
  int64_t retry_after_ms = 0;  // a refusal that lasts this long (0: none said)
  // Checkpoints: the sequence has a request queued or running (retry after its step); a
  // non-START request names a sequence that was checkpointed and released from here.
  bool busy = false, released = false;
};

class Scheduler {
 public:
  // The scheduler for spec.strategy. The caller owns it; it calls `hooks` until close() has
  // returned (and, from an executor close() detached, later: see close()).
  static std::unique_ptr<Scheduler> create(ModelSpec spec, Hooks hooks);
  virtual ~Scheduler() = default;

  const ModelSpec& spec() const { return spec_; }
  void start();
  // Ownership of a Request: the pool owns every Request for the scheduler's life; callers only
  // borrow one. new_request() lends one to the caller, who fills it and hands it back through
  // exactly one of submit() or recycle(). After submit() the caller must not touch it again,
  // accepted or not (a refused one is recycled here; an accepted one may be answered and
  // reused by another thread as soon as the lock is dropped).
  //
  // Enqueue a request; on failure nothing is queued and the caller answers the client.
  SubmitResult submit(Request* r, int priority = 0);
  // The same, for a caller that submits a burst: the instance to wake (if any) is added to
  // `wakes` instead of being woken here; the caller notifies each one's cv once the burst is in
  // (batches then form from the whole burst, and an executor wakes once, not once a request).
  SubmitResult submit(Request* r, int priority, std::vector<Instance*>& wakes);
  Request* new_request();
  void recycle(Request* r);  // gives back a request new_request() lent and submit() never took

  // The client of a queued request is gone: it is dropped before it runs (a sequence's request
  // takes its whole sequence with it, as in Triton) and answered CANCELLED. `token` is the
  // request's pool index (what the binding's submit returns). False when it is no longer queued
  // or running.
  bool cancel(uint32_t token, uint64_t handle);

  void stop_accepting();
  int64_t inflight_sequences();
  // Stops the executors once every queue has drained (force: at once); whatever is left is
  // failed with UNAVAILABLE. Waits up to timeout_ns (< 0: without limit) for the executor
  // threads; one still running then (a model that never returns from execute) is detached and
  // its instance index returned. A scheduler that detached a thread must never be destroyed:
  // the thread may come back to it. Concrete schedulers call close(true) in their destructor,
  // before the members their threads use are gone.
  std::vector<int> close(bool force, int64_t timeout_ns = -1);
  Stats stats();
  int64_t pending_requests();

  // Used by the Python batch view while the runner executes (executor thread, GIL held).
  void set_output_state(Instance& inst, size_t state_index, const uint8_t* data, size_t nbytes,
                        const int64_t* shape, int ndim);
  // The scheduler owns its instances for its whole life; callers only borrow them.
  std::vector<std::unique_ptr<Instance>>& instances() { return instances_; }
  // Records the current batch's statistics (once); the runner calls it before replying so a
  // client that reads statistics after its reply sees its request counted.
  void record_batch(Instance& inst, bool ok);

  // Inline execution (executor.cc). configure_inline (before start): batches costing at most
  // max_batch_ns (0: never inline) are cheap; after promote_after cheap batches in a row the
  // model goes inline, and submit stops waking executors. run_ready_inline: the caller holds
  // the Python runtime (the event loop): runs on this thread the batches that idle instances
  // can form now; returns how many. `more`: it stopped at its time budget with work left (the
  // caller should come back soon). A batch that must wait (a delay, a queue timeout) is left
  // to its executor. A batch over the bound ends inline mode at once.
  void configure_inline(int64_t max_batch_ns, int promote_after);
  // `borrowed`: the caller holds the runtime (the event loop); else (the ring feeder's drain
  // thread, attached to the runtime) each batch takes the runtime while it forms and runs.
  int run_ready_inline(bool* more, bool borrowed = true);
  bool inline_active() const { return inline_.active(); }
  InlineStats inline_stats();

 protected:
  using Fails = std::vector<std::pair<std::vector<uint64_t>, std::string>>;

  // `sequences`: batches carry sequence flags and controls, and slots_per_instance slots per
  // instance; `gather_state`: fixed-shape state is gathered by slot rather than read in place.
  Scheduler(ModelSpec spec, Hooks hooks, bool sequences, bool gather_state);

  // --- what a strategy supplies (lock held unless noted)
  // Queues `r` (closing_ already checked, arrival stamped). Sets `wake` to an instance to
  // notify once the lock is dropped, `warning` to a message to log. Accepted: the strategy
  // holds `r` (still the pool's) until a batch or a drop recycles it. Refused: it keeps no
  // reference, and submit() recycles `r`.
  virtual SubmitResult enqueue_locked(Request* r, int priority, Instance*& wake, std::string& warning) = 0;
  class RuntimeHold;
  // What forming a batch of `inst` came to (see form_locked).
  struct Next {
    enum Kind {
      kBatch,    // inst.batch holds a batch to run; `more`: a shared queue holds more work
      kAgain,    // the lock was dropped meanwhile (answers reported, the runtime taken): look again
      kIdle,     // nothing ready
      kBlocked,  // TRITONSERVER_DELAY_SCHEDULER holds everything back
      kUntil,    // work must wait (batch delay, queue timeout) until `until_ns`
      kExit,     // closing, and nothing left for this instance
    };
    Kind kind = kIdle;
    int64_t until_ns = 0;
    bool more = false;
    static Next batch(bool more) { return {kBatch, 0, more}; }
    static Next until(int64_t t) { return {kUntil, t, false}; }
  };
  // Forms the next batch of `inst` into inst.batch (lock held; `inst` is not executing). The one
  // batch-forming logic of a strategy, shared by its executor thread and inline execution. It
  // calls hold.acquire() just before it takes requests, and returns kAgain if that waited.
  virtual Next form_locked(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold) = 0;
  virtual void start_helpers() {}        // lock held
  virtual void stop_helpers() {}         // after the executors joined; no lock held
  // Hands every request still queued to `take` (which recycles it) and forgets them.
  virtual void drain_locked(const std::function<void(Request*)>& take) = 0;
  // What inflight_sequences() counts (a drain waits for it to reach 0): queued and running
  // requests; the sequence strategies count live sequences.
  virtual int64_t inflight_locked();
  // cancel(): `r` (queued or running, now marked cancelled) leaves the queues. Requests the
  // strategy meets later are dropped as batches form; dropped requests go to cancelled_.
  // `r` stays the pool's: the strategy only unlinks it.
  virtual void cancel_locked(Request*) {}
  // A batch has run; its rows are still in inst.batch (their requests go back to the pool
  // after this).
  virtual void batch_done_locked(Instance&) {}
  // Whether `inst` could form a batch now, before its queue delay ends. Only asked while its
  // executor sleeps on that delay; true (the default) wakes it for every arrival.
  virtual bool batch_ready_locked(Instance&) { return true; }
  // An idle instance is woken for new work unless it waits on a delay its batch is not ready for.
  bool worth_waking_locked(Instance& inst) {
    return !inst.executing && (inst.delay_until_ns == 0 || batch_ready_locked(inst));
  }
  // stats(): the strategy's gauges (sequence slots, backlog) into the snapshot.
  virtual void gauges_locked(Stats&) {}

  // --- shared by the strategies (lock held unless noted)
  static SubmitResult refuse(Code code, std::string message) { return {false, code, std::move(message)}; }
  static constexpr const char* kStopping =
      "Server is stopping, scheduler for model has stopped accepting new inference requests";
  // A core thread: runs `body` between the thread_start and thread_stop hooks; then sets
  // `*exited` (under the lock) and wakes close(), when given.
  std::thread spawn(const char* name, std::function<void()> body, bool* exited = nullptr);
  // The test hooks' delay (TRITONSERVER_DELAY_SCHEDULER): nothing runs until enough is queued.
  bool released_locked();
  // The first instance not executing a batch, if any.
  Instance* idle_instance_locked();
  void recycle_locked(Request* r) { pool_.give(r); }
  // Equal shapes on the inputs that must match (variable dims without ragged batching).
  bool shapes_match(const Request* a, const Request* b) const;
  // Size of the batch to form from `n` candidates (rows given by `rows_of`), or 0 to wait
  // until `*wake_ns`. Implements preferred sizes, max batch size and the queue delay.
  template <class RowsOf, class Matches>
  size_t pick_batch(size_t n, RowsOf rows_of, Matches matches, int64_t oldest_ns, int64_t* wake_ns) const;
  // Runs the batch just formed in `inst`; the lock is held on entry and on return.
  // `more_work`: a shared queue holds more, so an idle instance is woken for it. `in_line`: on
  // the event loop's thread (run_ready_inline).
  void run_formed_batch(Instance& inst, std::unique_lock<std::mutex>& lk, RuntimeHold& hold, bool more_work,
                        bool in_line = false);
  void report(Fails& fails, Code code);  // no lock held
  // A dropped request joins the CANCELLED answers (lock held). `r` goes back to the pool
  // here: the caller must not touch it afterwards.
  void cancelled_locked(Request* r, std::vector<uint64_t>& handles, int64_t now);
  // Reports cancelled_ (dropping the lock meanwhile); false when there was nothing to report.
  bool flush_cancelled(std::unique_lock<std::mutex>& lk);
  // A successful request's latency into the histogram of stats_.
  void observe_latency_locked(int64_t ns);

  ModelSpec spec_;
  Hooks hooks_;
  std::mutex mu_;
  std::condition_variable exited_cv_;  // an executor thread finished (Instance::exited)
  std::vector<std::unique_ptr<Instance>> instances_;
  RequestPool pool_;
  QueueCounts counts_;
  Stats stats_;
  Fails cancelled_;  // dropped requests not yet answered CANCELLED
  bool delay_released_ = false;
  bool accepting_ = true;
  bool closing_ = false, force_ = false, started_ = false, closed_ = false;

 private:
  SubmitResult submit_waking(Request* r, int priority, std::vector<Instance*>* wakes);
  void execute(Instance& inst);  // no lock held
  void finish_batch_locked(Instance& inst);
  void record_batch_locked(Instance& inst, bool ok);
  // executor.cc
  void executor_loop(Instance& inst);
  void idle_wait(Instance& inst, std::unique_lock<std::mutex>& lk);
  void note_batch_cost_locked(bool in_line, int64_t cost_ns);  // the policy's verdict, acted on
  // Submit in inline mode: `inst` is due to run what was just queued (lock held).
  void inline_queued_locked(Instance& inst, int64_t now);

  InlinePolicy inline_;  // when batches run on the event loop (inline_policy.h)

  const bool sequences_;
};

// Holds the Python runtime (via Hooks::enter/leave) around forming and running one batch.
// Both transitions drop the scheduler lock first, so the lock order is always runtime -> lock.
// `borrowed`: the caller already holds the runtime (inline execution on the event loop), so it
// is neither entered nor left here.
class Scheduler::RuntimeHold {
 public:
  RuntimeHold(const Hooks& h, std::unique_lock<std::mutex>& lk, bool borrowed = false)
      : h_(h), lk_(lk), held_(borrowed), borrowed_(borrowed) {}
  ~RuntimeHold() { release(); }
  bool held() const { return held_; }
  // True when it had to wait for the runtime: the caller re-examines its queues.
  bool acquire() {
    if (held_ || !h_.enter) return false;
    lk_.unlock();
    h_.enter();
    lk_.lock();
    held_ = true;
    return true;
  }
  void release() {
    if (!held_ || borrowed_) return;
    lk_.unlock();
    h_.leave();
    lk_.lock();
    held_ = false;
  }
  // Same, for a caller that does not hold the lock right now.
  void release_unlocked() {
    if (!held_ || borrowed_) return;
    h_.leave();
    held_ = false;
  }

 private:
  const Hooks& h_;
  std::unique_lock<std::mutex>& lk_;
  bool held_ = false;
  const bool borrowed_ = false;
};

template <class RowsOf, class Matches>
size_t Scheduler::pick_batch(size_t n, RowsOf rows_of, Matches matches, int64_t oldest_ns, int64_t* wake_ns) const {
  // Triton's dynamic-batcher rule: grow in queue order up to max_batch_size, stopping at a
  // shape mismatch, and remember the largest prefix that is a preferred size (or that stops
  // just short of passing the largest preferred size). Before the delay has passed, send that
  // prefix; send everything once the batch is full, cannot grow, or the delay has passed.
  if (n == 0) return 0;
  const int64_t cap = std::max(1, spec_.max_batch_size);
  const auto& pref = spec_.preferred_batch_sizes;
  const int64_t max_pref = pref.empty() ? cap : std::min(cap, pref.back());
  int64_t total = 0;
  size_t count = 0, best = 0;
  bool cannot_grow = false;
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = rows_of(i);
    if (count > 0 && total + rows > max_pref && best == 0) best = count;
    if ((count > 0 && total + rows > cap) || (i > 0 && !matches(i))) {
      cannot_grow = true;
      break;
    }
    total += rows;
    ++count;
    if (std::binary_search(pref.begin(), pref.end(), total)) best = count;
    if (total >= cap) break;
  }
  // As in Triton, a zero delay never counts as "exceeded": a preferred prefix still goes first.
  const int64_t now = now_ns();
  const bool no_delay = spec_.batch_delay_ns == 0;
  const bool exceeded = closing_ || (!no_delay && now - oldest_ns >= spec_.batch_delay_ns);
  if (best > 0 && !exceeded) return best;
  if (exceeded || no_delay || cannot_grow || total >= max_pref) return count;
  *wake_ns = oldest_ns + spec_.batch_delay_ns;
  return 0;
}

// One per strategy, each in its own file.
std::unique_ptr<Scheduler> make_direct_scheduler(ModelSpec spec, Hooks hooks);
std::unique_ptr<Scheduler> make_oldest_scheduler(ModelSpec spec, Hooks hooks);
std::unique_ptr<Scheduler> make_dynamic_scheduler(ModelSpec spec, Hooks hooks);
std::unique_ptr<Scheduler> make_stateless_scheduler(ModelSpec spec, Hooks hooks);

}  // namespace seqserve
