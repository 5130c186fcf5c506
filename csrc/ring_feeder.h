// The engine's compiled path for requests that arrive on the workers' rings (issue 27): one
// drain thread takes every record from every worker's request ring. A record for a target
// registered *fast* becomes a core Request whose inputs are TensorRefs into the worker's slab
// blocks, submitted to that model's Scheduler without Python; its answer comes back through
// reply_rows (one call per batch, from the batch runner) or fail (the scheduler's fail hook,
// and failed batches), which copy outputs into to-worker blocks and push reply records. Every
// other record (a slow target, an unknown one, a record marked slow by its worker) waits in a
// hand-off list that Python takes in bursts (take_slow), woken through an eventfd.
//
// A model in inline mode (inline_policy.h) has its batches run by the drain thread itself once a
// burst is in (run_inline), with the Python runtime taken per batch: no executor wake-up.
//
// Ring handles: the core knows a fast request by kRingHandleBit | worker << 48 | the worker's
// own handle (< 2**48), so the runner and the fail hook can tell them from in-process ones.
//
// Input blocks are freed when the request is done (answered, refused, cancelled, failed). A
// reply that finds the worker's reply ring full or no free to-worker block is queued per worker
// (in order) and retried by the drain thread: never lost.
//
// Locks: mu_ (targets, in-flight requests, the hand-off list, reply queues) is never held
// while calling into a Scheduler or Python; drain_mu_ is held by the drain thread while it
// handles a burst and runs its inline batches, so remove_target and reset_worker can wait for the
// thread to be out of a scheduler and a worker's ring: their callers let go of the runtime first
// (the drain thread may be waiting for it). mu_ is never held while waiting for the runtime.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "scheduler.h"
#include "shm_region.h"

namespace seqserve {

constexpr uint64_t kRingHandleBit = 1ull << 63;
constexpr int kRingWorkerShift = 48;
constexpr uint64_t kWorkerHandleMask = (1ull << kRingWorkerShift) - 1;

inline bool is_ring_handle(uint64_t h) { return (h & kRingHandleBit) != 0; }
inline uint64_t ring_handle(int worker, uint64_t handle) {
  return kRingHandleBit | (uint64_t(worker) << kRingWorkerShift) | (handle & kWorkerHandleMask);
}
inline int ring_worker(uint64_t h) { return static_cast<int>((h & ~kRingHandleBit) >> kRingWorkerShift); }
inline uint64_t worker_handle(uint64_t h) { return h & kWorkerHandleMask; }

// Where a scheduler's fail hook sends the ring handles it fails (no Python involved).
class RingSink {
 public:
  virtual ~RingSink() = default;
  virtual void fail(const std::vector<uint64_t>& handles, Code code, const std::string& message) = 0;
};

// A record for Python (take_slow). Its input blocks stay allocated: Python frees them.
struct SlowRecord {
  int worker = 0;
  uint32_t target = 0;
  bool cancel = false;
  uint64_t client = 0;
  shm::RequestRecord record;  // string_id points into `string_id` below
  std::string string_id;
};

// One output of a batch, as reply_rows reads it: `rows` rows of `row_bytes` each, contiguous.
struct BatchOutput {
  const uint8_t* data = nullptr;  // nullptr: the model did not produce it
  size_t row_bytes = 0;
  int64_t rows = 0;
  std::vector<int64_t> item_shape;  // the dims after the batch dim (all dims when unbatched)
};

struct FeederCounters {
  uint64_t fast = 0, slow = 0, refused = 0, bad = 0, cancels = 0, replies = 0, errors = 0, deferred = 0;
  uint64_t dropped = 0;  // replies for a forgotten worker
};

class RingFeeder : public RingSink {
 public:
  // `region` must outlive the feeder. spin_us: how long the drain thread keeps looking after the
  // rings went empty before it sleeps on the engine's doorbell (bench/docs/rings.md).
  RingFeeder(shm::Region& region, int64_t spin_us);
  ~RingFeeder() override;
  RingFeeder(const RingFeeder&) = delete;
  RingFeeder& operator=(const RingFeeder&) = delete;

  // How the drain thread joins Python's runtime to run cheap models' batches itself (inline
  // mode, inline_policy.h): attach once, detach when it exits. Set before start(); without
  // them, executors run every batch.
  void set_runtime(std::function<void()> attach, std::function<void()> detach);
  void start();
  void stop();  // joins the drain thread; queued replies stay queued

  // `sched` (borrowed; remove_target before it closes) takes the target's records when fast;
  // `dims`: each input's configured dims after the batch dim (-1: any), checked per record.
  void add_target(uint32_t target, Scheduler* sched, std::vector<std::vector<int64_t>> dims, bool fast);
  void remove_target(uint32_t target);  // waits for the drain thread to be out of that scheduler

  std::vector<SlowRecord> take_slow();
  int slow_fd() const { return slow_fd_; }

  // One batch's answered ring rows (handles[i] owns rows [first[i], first[i] + rows[i])).
  void reply_rows(const std::vector<uint64_t>& handles, const std::vector<int64_t>& first,
                  const std::vector<int64_t>& rows, const std::vector<BatchOutput>& outputs, bool batched);
  void fail(const std::vector<uint64_t>& handles, Code code, const std::string& message) override;

  void forget_worker(int w);  // drops its queued replies; its later replies are dropped too
  void reset_worker(int w);   // Region::reset_worker, out of the drain thread's way; takes it back
  int64_t inflight(int w);
  size_t queued_replies(int w);
  FeederCounters counters();
  // The target's requests answered with a refusal or as malformed: the in-process path counts
  // these as the model's failed requests (statistics), so the engine adds them.
  uint64_t refused(uint32_t target);
  // Of those, the refusals with UNAVAILABLE (REJECTED in the metrics, as one process counts them).
  uint64_t rejected(uint32_t target);

 private:
  struct Target {
    Scheduler* sched = nullptr;
    bool fast = false;
    std::vector<std::vector<int64_t>> dims;
  };
  struct Inflight {
    uint32_t target = 0;
    uint32_t token = 0;
    std::vector<uint64_t> blocks;  // its input blocks in the worker's to-engine pool
  };
  // A reply not yet on the ring. Outputs whose `offset` is 0 wait for a block in `bytes`.
  struct QueuedReply {
    shm::ReplyRecord record;
    std::string error;
    std::vector<std::vector<uint8_t>> bytes;
  };

  void loop();
  bool run_inline();  // drain_mu_ held; true: a pass stopped at its time budget with work left
  void on_record(int w, const shm::RequestRecord& r);
  void submit_fast(int w, const Target& t, const shm::RequestRecord& r);
  std::string check_inputs(const Target& t, const shm::RequestRecord& r) const;
  void free_inputs(int w, const shm::RequestRecord& r);
  void free_blocks(int w, const std::vector<uint64_t>& blocks);
  // What one batch's replies add to the counters (counted once, under mu_).
  struct Tally {
    uint64_t replies = 0, errors = 0, deferred = 0, dropped = 0;
  };

  // Takes the in-flight entry of `handle` (false when there is none: already answered).
  bool finish(uint64_t handle, Inflight* out);
  bool finish_locked(uint64_t handle, Inflight* out);  // mu_ held
  void send_error(int w, uint64_t handle, Code code, const std::string& message, uint32_t extra_flags = 0);
  void send(int w, QueuedReply&& q);
  // replies_mu_ held; wake: ring the worker now (else the caller wakes each worker once)
  void send_locked(int w, QueuedReply&& q, Tally& tally, bool wake = true);
  void count(const Tally& tally);
  bool try_push(int w, QueuedReply& q, bool wake = true);  // replies_mu_ held
  // Why a row's outputs can never be sent (one larger than the largest slab block), or "".
  static std::string oversized(const std::vector<BatchOutput>& outputs, int64_t rows, uint64_t largest);
  void flush_queued();

  shm::Region& region_;
  const int64_t spin_ns_;
  int slow_fd_ = -1;

  std::mutex mu_;
  std::unordered_map<uint32_t, std::shared_ptr<const Target>> targets_;
  std::unordered_map<uint64_t, Inflight> inflight_;
  std::vector<int64_t> inflight_per_worker_;
  std::vector<SlowRecord> slow_;
  bool slow_signalled_ = false;
  FeederCounters counters_;
  // Per target: requests refused or malformed (failed requests), and of them the refusals with
  // UNAVAILABLE (a full queue or backlog, a scheduler stopping), which metrics count as REJECTED.
  struct Refusals {
    uint64_t refused = 0, rejected = 0;
  };
  std::unordered_map<uint32_t, Refusals> refused_by_target_;
  Refusals refusals(uint32_t target);

  std::mutex replies_mu_;
  std::vector<std::deque<QueuedReply>> queued_;
  std::vector<bool> forgotten_;
  std::atomic<size_t> queued_total_{0};

  std::mutex drain_mu_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  bool signal_slow_ = false;  // drain thread only: a record joined the empty hand-off list
  std::vector<Instance*> wakes_;  // drain thread only: executors to wake once the burst is in
  // Under drain_mu_: schedulers in inline mode that took records of the burst; the drain thread
  // runs their batches itself instead of waking an executor (a sleep and a wake-up per batch).
  std::vector<Scheduler*> inline_;
  std::function<void()> attach_, detach_;
  bool attached_ = false;  // drain thread only
};

}  // namespace seqserve
