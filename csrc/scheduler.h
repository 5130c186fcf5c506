// The sequence / stateless scheduler of one model: slot table, per-slot queues, backlog,
// idle reaper, batch assembly into reused buffers, state stores and one executor thread per
// model instance. It knows nothing about Python objects except through the Runner hooks,
// which are only ever called without the scheduler lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>

#include "common.h"

namespace seqserve {

constexpr int kMaxRank = 16;

// kStateless: one request per batch; kDynamic: dynamic batcher; kDirect / kOldest: sequences.
enum Strategy : int { kStateless = 0, kDirect = 1, kOldest = 2, kDynamic = 3 };
enum ControlKind : int { kCtlStart = 0, kCtlReady = 1, kCtlEnd = 2, kCtlCorrid = 3 };

struct InputSpec {
  std::string name;
  int dtype = kInvalid;
  bool must_match = false;  // variable dims without ragged batching: shapes must be equal
  std::vector<int64_t> default_shape;  // item dims with -1 -> 1: the shape of zero-filled rows
};

struct QueuePolicy {
  bool delay_on_timeout = false;  // DELAY (else REJECT)
  int64_t default_timeout_ns = 0;
  bool allow_override = false;
  uint32_t max_queue_size = 0;  // 0: unlimited
};

struct ControlSpec {
  std::string name;
  int kind = kCtlStart;
  int dtype = kInt32;
  double false_value = 0, true_value = 1;
};

struct StateSpec {
  std::string input_name, output_name;
  int dtype = kFp32;
  std::vector<int64_t> dims;  // without the batch dim; -1 allowed
  bool variable = false;
  std::string initial;  // initial bytes (zeros when the config has no initial_state)
  std::vector<int64_t> initial_dims;
};

struct ModelSpec {
  std::string name;
  int strategy = kStateless;
  int max_batch_size = 0;
  int instance_count = 1;
  int slots_per_instance = 1;
  int64_t idle_ns = 1000000000;
  int64_t max_queue_delay_ns = 0;
  double min_slot_utilization = 0;
  std::vector<InputSpec> inputs;
  std::vector<ControlSpec> controls;
  std::vector<StateSpec> states;
  int64_t delay_requests = 0;          // TRITONSERVER_DELAY_SCHEDULER
  int64_t delay_backlog_requests = 0;  // TRITONSERVER_BACKLOG_DELAY_SCHEDULER
  // Batch forming for kOldest (per instance) and kDynamic (per model).
  std::vector<int64_t> preferred_batch_sizes;  // ascending; empty: max(1, max_batch_size)
  int64_t batch_delay_ns = 0;
  // kDynamic queues: one per priority level (level 1 is the highest).
  int priority_levels = 1;
  int default_priority = 1;
  std::vector<QueuePolicy> policies;  // one per level
  // Idle expiry: give the model a final END step (TIMEOUT_COMPLETE) / describe the sequence.
  bool timeout_complete = false;
  bool describe_on_expiry = false;
};

// What DESCRIBE reports about a sequence that expired.
struct ExpiredSequence {
  CorrId id;
  double age_s = 0, idle_s = 0;
  uint64_t steps = 0;
  uint64_t state_bytes = 0;
  int instance = 0, slot = 0;
};

struct TensorRef {
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int ndim = 0;
  int64_t shape[kMaxRank] = {};
  int64_t elements() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

// kForceEnd: idle expiry frees the slot silently; kNotify: idle expiry runs one final END step.
enum ReqKind : uint8_t { kNormal = 0, kForceEnd = 1, kNotify = 2 };

struct Request {
  uint64_t handle = 0;
  CorrId id;
  bool start = false, end = false;
  uint8_t kind = kNormal;
  int64_t arrival_ns = 0;
  int64_t timeout_ns = 0;
  int64_t rows = 1;
  int level = 0;             // kDynamic: priority queue index
  int64_t deadline_ns = 0;   // kDynamic: queue timeout (0: none)
  bool expired = false;      // kDynamic: moved behind its level after a DELAY timeout
  int slot = -1;             // kOldest: the instance-local slot it came from
  int64_t handoff_ns = 0;    // kOldest: when it reached the instance's batcher
  std::vector<TensorRef> inputs;
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
  DurationStat success, fail, queue, compute_input, compute_infer, compute_output;
  std::map<int64_t, BatchStat> batches;
};

// A backlogged sequence: its requests move into a slot as a whole, FIFO across sequences.
struct BacklogQueue {
  uint64_t serial = 0;
  CorrId id;
  Ring<Request*> reqs;
  int64_t expiry_ns = INT64_MAX;  // earliest request timeout among its requests
};

struct SeqEntry {
  int gslot = -1;  // global slot index, -1 while in the backlog
  std::list<BacklogQueue>::iterator bq;
  int64_t last_arrival_ns = 0;
  uint64_t serial = 0;
  bool armed = false;  // has a live idle timer (backlogged sequences give theirs up)
};

struct Slot {
  int instance = 0, index = 0;
  Ring<Request*> queue;
  bool occupied = false;
  bool in_flight = false;    // kOldest: a request of this slot is being batched or executed
  bool state_ready = false;  // the slot has had a state created at least once
  uint64_t steps = 0;        // steps of the current sequence handed to the model
  int64_t start_ns = 0;      // when the current sequence started
  // Variable-shape state lives per slot; fixed-shape state lives in the instance's store.
  std::vector<std::vector<int64_t>> var_shape;
  std::vector<Buffer> var_data;
  std::vector<size_t> var_bytes;
};

struct Row {
  Request* req = nullptr;  // nullptr: padding
  int slot = 0;
};

struct Instance {
  int index = 0;
  std::thread thread;
  std::condition_variable cv;
  std::vector<Slot> slots;
  int max_active = -1;  // highest slot index that may hold work
  // Reused batch assembly area.
  int64_t batch_size = 0;
  std::vector<Row> rows;
  std::vector<Buffer> input_bufs;
  std::vector<size_t> input_nbytes;
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<Buffer> control_bufs;
  std::vector<size_t> control_bytes;
  std::vector<Buffer> state_store;  // fixed states: [slots, row bytes]
  std::vector<Buffer> state_gather;  // states gathered per batch ([B, ...])
  std::vector<uint8_t> state_gathered;  // per state: the batch reads state_gather, not the store
  Ring<Request*> ready;  // kOldest: requests handed to this instance's batcher
  std::vector<int64_t> item_shape;  // gather's scratch (executor thread only)
  std::vector<std::vector<int64_t>> state_shapes;  // per state, batch shape presented
  std::vector<size_t> state_nbytes;
  std::vector<uint8_t> flag_start, flag_end, flag_ready;
  std::vector<uint64_t> corrid_num;
  std::vector<std::string> corrid_str;
  int64_t t_form = 0, t_gathered = 0, t_executed = 0;
  bool executing = false;
  bool recorded = false;  // stats of the current batch already recorded
};

// Hooks into the Python layer. Both are called without the scheduler lock and must take the
// GIL themselves.
struct Hooks {
  std::function<bool(Instance&)> run;  // returns success
  std::function<void(const std::vector<uint64_t>&, int, const std::string&)> fail;
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

struct SubmitResult {
  int code = -1;  // -1: accepted
  std::string message;
};

class Scheduler {
 public:
  Scheduler(ModelSpec spec, Hooks hooks);
  ~Scheduler();

  const ModelSpec& spec() const { return spec_; }
  void start();
  // Enqueue a request; on failure nothing is queued and the caller answers the client.
  SubmitResult submit(Request* r, int priority = 0);
  Request* new_request();  // from the pool; caller fills it, then submit() or recycle()
  void recycle(Request* r);

  void stop_accepting();
  int64_t inflight_sequences();
  // Stops the executors once every queue has drained (force: at once); whatever is left is
  // failed with UNAVAILABLE.
  void close(bool force);
  Stats stats();
  int64_t pending_requests();
  int64_t free_slots();
  int64_t backlog_sequences();
  void describe_slots(std::vector<std::pair<std::string, int>>& out);

  // Used by the Python batch view while the runner executes (executor thread, GIL held).
  void set_output_state(Instance& inst, size_t state_index, const uint8_t* data, size_t nbytes,
                        const int64_t* shape, int ndim);
  std::vector<std::unique_ptr<Instance>>& instances() { return instances_; }
  // Records the current batch's statistics (once); the runner calls it before replying so a
  // client that reads statistics after its reply sees its request counted.
  void record_batch(Instance& inst, bool ok);

 private:
  using Fails = std::vector<std::pair<std::vector<uint64_t>, std::string>>;
  void direct_loop(Instance& inst);
  void oldest_loop(Instance& inst);
  void stateless_loop(Instance& inst);
  void dynamic_loop(Instance& inst);
  void handoff_locked(Instance& inst, int s);
  // Size of the batch to form from `n` candidates (rows given by `rows_of`), or 0 to wait
  // until `*wake_ns`. Implements preferred sizes, max batch size and the queue delay.
  template <class RowsOf, class Matches>
  size_t pick_batch(size_t n, RowsOf rows_of, Matches matches, int64_t oldest_ns, int64_t* wake_ns) const;
  bool expire_queued_locked(int64_t now, Fails& fails, int64_t* next_deadline);
  Request* take_marker_locked(uint8_t kind, const CorrId& id, int64_t now);
  void reaper_loop();
  void execute(Instance& inst);  // no lock held
  // Runs the batch just formed in `inst`; the lock is held on entry and on return.
  template <class Hold>
  void run_formed_batch(Instance& inst, std::unique_lock<std::mutex>& lk, Hold& hold, bool more_work);
  void gather(Instance& inst);
  void reset_state_rows(Instance& inst);
  void release_slot(Instance& inst, int s);
  bool shapes_match(const Request* a, const Request* b) const;
  bool hooks_released_locked();
  void notify_slot(int gslot);
  Slot& gslot_ref(int g) { return instances_[g / spec_.slots_per_instance]->slots[g % spec_.slots_per_instance]; }
  void push_idle(const CorrId& id, SeqEntry& e);
  void report(Fails& fails, int code);
  void recycle_locked(Request* r);
  void finish_batch_locked(Instance& inst);
  void record_batch_locked(Instance& inst, bool ok);
  bool state_shape_matches(Instance& inst, int slot, const Request* r, const std::vector<std::vector<int64_t>>& rep) ;
  void effective_state_shapes(Slot& sl, const Request* r, std::vector<std::vector<int64_t>>& out);
  std::vector<std::vector<int64_t>> rep_state_shapes_;

  ModelSpec spec_;
  Hooks hooks_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Instance>> instances_;
  std::vector<Request*> pool_;
  std::vector<std::unique_ptr<Request>> owned_;

  // Sequence state.
  std::set<std::pair<int, int>> free_slots_;  // (slot index, instance): lowest slot first
  std::unordered_map<CorrId, SeqEntry, CorrIdHash> seqs_;
  std::list<BacklogQueue> backlog_;
  std::unordered_map<uint64_t, std::list<BacklogQueue>::iterator> backlog_index_;
  uint64_t next_serial_ = 1;
  int64_t slot_queued_ = 0, backlog_queued_ = 0;
  bool delay_released_ = false;

  // Stateless FIFO (kStateless), or per-priority queues (kDynamic; `delayed_` holds requests
  // whose DELAY timeout expired, served after their level's other requests).
  Ring<Request*> fifo_;
  std::vector<Ring<Request*>> levels_, delayed_;
  int64_t timed_requests_ = 0;

  // Idle reaper: lazy timer heap, at most one live entry per sequence.
  struct IdleTimer {
    int64_t deadline;
    uint64_t serial;
    CorrId id;
    bool operator>(const IdleTimer& o) const { return deadline > o.deadline; }
  };
  struct BacklogTimer {
    int64_t deadline;
    uint64_t serial;
    bool operator>(const BacklogTimer& o) const { return deadline > o.deadline; }
  };
  std::priority_queue<IdleTimer, std::vector<IdleTimer>, std::greater<IdleTimer>> idle_heap_;
  std::priority_queue<BacklogTimer, std::vector<BacklogTimer>, std::greater<BacklogTimer>> backlog_heap_;
  std::thread reaper_;
  std::condition_variable reaper_cv_;
  int64_t reaper_target_ = INT64_MAX;

  bool reaper_stop_ = false;
  bool accepting_ = true;
  bool closing_ = false, force_ = false, started_ = false, closed_ = false;
  Stats stats_;
};

}  // namespace seqserve
