// What one model asks of the core, as engine/model/spec.py builds it from the config. The
// binding exposes these structs to Python as keyword-constructed classes (bind_spec.cc).
#pragma once

#include <string>
#include <vector>

#include "common.h"

namespace seqserve {

// kStateless: one request per batch; kDynamic: dynamic batcher; kDirect / kOldest: sequences.
enum Strategy : int { kStateless = 0, kDirect = 1, kOldest = 2, kDynamic = 3 };
enum ControlKind : int { kCtlStart = 0, kCtlReady = 1, kCtlEnd = 2, kCtlCorrid = 3 };

// A tensor element type. The core keeps no dtype table: Python passes the numpy dtype from
// engine/tensors.py, and the binding derives the rest from it (object dtype: BYTES).
struct ElemType {
  std::string numpy;      // numpy's dtype.str ("<f4", "|b1", "|O"): the binding's views use it
  size_t itemsize = 0;    // bytes per element; 0 for BYTES
  bool is_bytes = false;  // elements are a 4-byte little-endian length and that many bytes
};

struct InputSpec {
  std::string name;
  ElemType type;
  bool must_match = false;  // variable dims without ragged batching: shapes must be equal
  std::vector<int64_t> default_shape;  // item dims with -1 -> 1: the shape of zero-filled rows
  // allow_ragged_batch on a batched model: the batch holds every request's elements end to end
  // (1-D) and the shape of each request, so each request keeps its own extent.
  bool ragged = false;
};

struct QueuePolicy {
  bool delay_on_timeout = false;  // DELAY (else REJECT)
  int64_t default_timeout_ns = 0;
  bool allow_override = false;
  uint32_t max_queue_size = 0;  // 0: unlimited
};

struct ControlSpec {
  std::string name;
  ControlKind kind = kCtlStart;
  ElemType type;
  double false_value = 0, true_value = 1;
  // The two values as one element of `type`, encoded by the binding through numpy.
  std::string false_bytes, true_bytes;
};

struct StateSpec {
  std::string input_name, output_name;
  ElemType type;
  std::vector<int64_t> dims;  // without the batch dim; -1 allowed
  bool variable = false;      // some dim is -1
  std::string initial;        // initial bytes (zeros when the config has no initial_state)
  std::vector<int64_t> initial_dims;
  // use_same_buffer_for_input_output: the model may write the next state into its input state
  // (one buffer), and what it writes there is kept even if it does not return it.
  bool same_buffer = false;
};

// Variable-shape and BYTES states live per slot; fixed-shape states in a [slots, ...] store.
inline bool is_var_state(const StateSpec& s) { return s.variable || s.type.is_bytes; }

struct ModelSpec {
  std::string name;
  Strategy strategy = kStateless;
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
  std::vector<QueuePolicy> queue_policies;  // one per level
  // Idle expiry: give the model a final END step (TIMEOUT_COMPLETE) / describe the sequence.
  bool timeout_complete = false;
  bool describe_on_expiry = false;
  // Sessions (requests that may start their sequence implicitly): ended and expired session
  // ids are remembered this long, at most this many per model (0: not at all).
  int64_t tombstone_ns = 3600LL * 1000000000LL;
  int64_t max_tombstones = 10000;
  int64_t max_tombstones_per_client = 0;  // 0: no bound but max_tombstones
  // Upper bounds (ms) of the request latency histogram's buckets (Triton's first-response
  // histogram); +Inf is implied.
  std::vector<double> latency_buckets_ms{100, 500, 2000, 5000};
  // Sequences: how many may wait in the backlog for a slot; a START beyond it is refused (0: no bound).
  int64_t max_backlog_sequences = 0;
};

inline int64_t product(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (auto v : d) n *= v;
  return n;
}

}  // namespace seqserve
