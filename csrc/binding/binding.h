// Declarations shared by the files of the pybind11 binding of the core (module.cc and the
// bind_*.cc files beside it). The typed description of what Python sees is
// src/seqserve/engine/_core.pyi.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "sequence_scheduler.h"

namespace seqserve {
class RingSink;
}

namespace seqserve::binding {

namespace py = pybind11;

// BYTES wire format: per element a 4-byte little-endian length and the bytes, row-major.
py::array deserialize_bytes(const uint8_t* p, size_t n, const std::vector<int64_t>& shape);
std::string serialize_bytes(const py::array& arr);

// The numpy dtype an element type was made from.
py::dtype numpy_dtype(const ElemType& t);

// A correlation id to and from Python: str, or int (uint64).
py::object corrid_object(const CorrId& id);
CorrId corrid_from(py::handle obj);

// The numpy dtypes of one model's tensors, made once: batch views reuse them.
struct Dtypes {
  explicit Dtypes(const ModelSpec& spec);
  std::vector<py::dtype> inputs, controls, states;
};

// The batch handed to the runner. Valid only during that call: arrays are views onto the
// instance's reused buffers.
struct BatchView {
  Scheduler* sched = nullptr;
  const Dtypes* dtypes = nullptr;
  Instance* inst = nullptr;
  bool valid = true;
  Instance& get() {
    if (!valid) throw std::runtime_error("this batch has finished executing; its arrays are no longer valid");
    return *inst;
  }
};

// A core thread's Python thread state, kept for the thread's life (bind_scheduler.cc): the
// executors' hooks, and the ring feeder's drain thread when it runs batches inline.
void attach_core_thread();
void detach_core_thread();

// A RequestHeader as Python builds it (bind_request.cc): the fixed header, and a string
// sequence id kept as the caller's str (in a ring record its bytes would follow the header).
struct RequestHeaderObject {
  PyObject_HEAD
  RequestHeader fixed;
  PyObject* string_id;  // a reference to the str id, or nullptr for a numeric id
  // The client a session's tombstones are accounted to (tombstones.h; 0: the shared key).
  // Beside the fixed header, not in it: the request ring's record layout stays as it is.
  uint64_t client;
};
// `obj` as a RequestHeader, or nullptr when it is not one.
const RequestHeaderObject* as_request_header(py::handle obj);

// Checkpoints (bind_checkpoint.cc). checkpoint: None (not live), a Refusal, or (steps,
// session, [(bytes, shape) per state]). restore: None, or a Refusal.
py::object checkpoint_sequence(SequenceScheduler& sched, py::handle corrid, bool release);
py::object restore_sequence(SequenceScheduler& sched, py::handle corrid, bool session, uint64_t steps, py::list states);

// A Python Scheduler's core scheduler (nullptr when `obj` is not one), and where its fail hook
// sends the handles of requests from the workers' rings (bind_scheduler.cc).
Scheduler* core_scheduler(py::handle obj);
void set_ring_sink(py::handle obj, std::weak_ptr<RingSink> sink);

// Batch.set_state: the output state `index` of every real row of the batch (bind_batch.cc).
void set_output_state(BatchView& v, size_t index, py::array value);
// Batch.finish: the batch's statistics recorded (the GIL let go unless it runs inline).
void record_batch_stats(BatchView& v, bool ok);

void bind_dlpack(py::module_& m);  // DLPackView: engine-owned memory exported through DLPack
void bind_spec(py::module_& m);   // enums, spec classes, statistics, Refusal, ExpiredSequence
void bind_batch(py::module_& m);  // Batch, serialize_bytes, deserialize_bytes
void bind_request(py::module_& m);    // RequestHeader
void bind_scheduler(py::module_& m);  // Scheduler, InlineStats
void bind_rings(py::module_& m);      // ShmRegion (the worker <-> engine transport)
void bind_feeder(py::module_& m);     // RingFeeder (the engine's compiled path for ring records)

}  // namespace seqserve::binding
