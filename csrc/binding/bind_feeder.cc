// Binding of the RingFeeder (ring_feeder.h): the engine's compiled path for the records of the
// workers' rings. Python registers targets (a model version's Scheduler, fast or slow), takes
// the records the compiled path leaves to it (take_slow, woken through slow_fd), and hands each
// batch's ring rows to reply_rows once per batch. Everything else happens on the feeder's drain
// thread, without Python.
#include <pybind11/stl.h>

#include <optional>
#include <unordered_map>

#include "binding.h"
#include "ring_feeder.h"
#include "ring_objects.h"

namespace seqserve::binding {

namespace {

constexpr size_t kReleaseRuntimeBytes = 256 * 1024;

// The feeder and the Python schedulers it points into, kept alive while they are its targets.
class PyFeeder {
 public:
  PyFeeder(shm::Region& region, double spin_us) {
    if (!(spin_us >= 0)) throw py::value_error("spin_us must be >= 0");
    feeder_ = std::shared_ptr<RingFeeder>(new RingFeeder(region, static_cast<int64_t>(spin_us)), [](RingFeeder* f) {
      if (PyGILState_Check()) {  // its drain thread may be waiting for the runtime: let it have it
        py::gil_scoped_release r;
        delete f;
      } else {
        delete f;
      }
    });
    workers_ = region.workers();
    feeder_->set_runtime(attach_core_thread, detach_core_thread);
    feeder_->start();
  }
  // The drain thread stops before the schedulers it submits to can go.
  ~PyFeeder() { close(); }
  PyFeeder(const PyFeeder&) = delete;
  PyFeeder& operator=(const PyFeeder&) = delete;

  void add_target(uint32_t target, py::object scheduler, bool fast, std::optional<std::vector<std::vector<int64_t>>> dims) {
    if (target == 0) throw py::value_error("targets are numbered from 1");
    Scheduler* sched = scheduler.is_none() ? nullptr : core_scheduler(scheduler);
    if (!scheduler.is_none() && sched == nullptr) throw py::type_error("scheduler must be a Scheduler or None");
    if (fast && sched == nullptr) throw py::value_error("a fast target needs its Scheduler");
    std::vector<std::vector<int64_t>> d;
    if (fast) {
      const ModelSpec& spec = sched->spec();
      if (dims) {
        if (dims->size() != spec.inputs.size())
          throw py::value_error("input_dims needs one list per input (" + std::to_string(spec.inputs.size()) + ")");
        d = *dims;
      } else {  // any extent, the configured rank
        for (const InputSpec& in : spec.inputs) d.emplace_back(in.default_shape.size(), -1);
      }
    }
    if (schedulers_.count(target)) remove_target(target);
    feeder_->add_target(target, sched, std::move(d), fast);
    schedulers_[target] = scheduler;
    if (fast) set_ring_sink(scheduler, feeder_);
  }

  void remove_target(uint32_t target) {
    {
      py::gil_scoped_release r;
      feeder_->remove_target(target);
    }
    schedulers_.erase(target);
  }

  py::list take_slow() {
    std::vector<SlowRecord> records = feeder_->take_slow();
    py::list out;
    for (SlowRecord& s : records) {
      s.record.string_id = s.string_id;
      out.append(py::make_tuple(s.worker, s.target, s.cancel, request_header_from(s.record),
                                slab_tensors_to(s.record.inputs), s.client));
    }
    return out;
  }

  void reply_rows(const std::vector<uint64_t>& handles, const std::vector<int64_t>& first, const std::vector<int64_t>& rows,
                  const py::list& outputs, bool batched) {
    if (first.size() != handles.size() || rows.size() != handles.size())
      throw py::value_error("handles, first_rows and rows must have the same length");
    reply(handles, first, rows, outputs, batched);
  }

  // The batch's ring rows read from the core's batch itself: no per-row Python objects.
  void reply_batch(BatchView& view, const py::list& outputs, bool batched) {
    std::vector<uint64_t> handles;
    std::vector<int64_t> first, rows;
    int64_t row = 0;
    for (const Row& r : view.get().batch.rows) {
      const int64_t n = r.req ? r.req->rows : 1;
      if (r.req && is_ring_handle(r.req->handle)) {
        handles.push_back(r.req->handle);
        first.push_back(row);
        rows.push_back(n);
      }
      row += n;
    }
    if (!handles.empty()) reply(handles, first, rows, outputs, batched);
  }

  // A batch of ring rows only, after its execute (RingOnlyRunner): its output states stored,
  // its statistics recorded and its replies sent, in one call. False, with nothing done, when
  // an output is not a C-contiguous array of its configured dtype with the batch's rows (or
  // `produced` not a dict): the runner's checked path then converts or names the mistake.
  // states: (index, name) per output state; outputs: (name, dtype) per configured output.
  bool complete_batch(BatchView& view, const py::handle& produced, const py::list& states, const py::list& outputs,
                      bool batched) {
    Instance& inst = view.get();
    if (!PyDict_CheckExact(produced.ptr())) return false;
    auto& api = py::detail::npy_api::get();
    py::list arrays(outputs.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      py::tuple spec = outputs[k].cast<py::tuple>();
      PyObject* value = PyDict_GetItemWithError(produced.ptr(), spec[0].ptr());  // borrowed
      if (value == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        continue;  // not produced: None, as reply_rows reads it
      }
      if (!py::isinstance<py::array>(value)) return false;
      auto arr = py::reinterpret_borrow<py::array>(value);
      py::handle dtype = spec[1];
      if (!(arr.flags() & py::array::c_style) || arr.dtype().kind() == 'O' ||
          !(arr.dtype().is(dtype) || api.PyArray_EquivTypes_(arr.dtype().ptr(), dtype.ptr())))
        return false;
      if (batched && (arr.ndim() == 0 || arr.shape(0) != inst.batch.size)) return false;
      arrays[k] = arr;
    }
    inst.t_executed = now_ns();
    for (const py::handle item : states) {
      py::tuple st = item.cast<py::tuple>();
      PyObject* value = PyDict_GetItemWithError(produced.ptr(), st[1].ptr());
      if (value == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        continue;
      }
      set_output_state(view, st[0].cast<size_t>(), py::array(py::reinterpret_borrow<py::object>(value)));
    }
    record_batch_stats(view, true);  // statistics first: a client with its reply sees them
    reply_batch(view, arrays, batched);
    return true;
  }

  static py::list ring_handles(BatchView& view) {
    py::list out;
    for (const Row& r : view.get().batch.rows)
      if (r.req && is_ring_handle(r.req->handle)) out.append(py::int_(r.req->handle));
    return out;
  }

  // No copies: quick, done with the runtime held (the feeder's locks never wait for it).
  void fail(const std::vector<uint64_t>& handles, int code, const std::string& message) {
    feeder_->fail(handles, static_cast<Code>(code), message);
  }

  int checked(int w) const {
    if (w < 0 || w >= workers_) throw py::index_error("no worker " + std::to_string(w));
    return w;
  }

  void close() {
    py::gil_scoped_release r;
    feeder_->stop();
  }

  RingFeeder& feeder() { return *feeder_; }

 private:
  void reply(const std::vector<uint64_t>& handles, const std::vector<int64_t>& first, const std::vector<int64_t>& rows,
             const py::list& outputs, bool batched) {
    std::vector<BatchOutput> outs(outputs.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      py::handle item = outputs[k];
      if (item.is_none()) continue;
      auto arr = py::reinterpret_borrow<py::array>(item);
      if (!py::isinstance<py::array>(item) || !(arr.flags() & py::array::c_style) || arr.dtype().kind() == 'O')
        throw py::value_error("outputs must be C-contiguous numeric arrays or None");
      BatchOutput& o = outs[k];
      o.data = static_cast<const uint8_t*>(arr.data());
      const int lead = batched ? 1 : 0;
      if (arr.ndim() < lead) throw py::value_error("a batched output needs a batch dimension");
      o.rows = batched ? arr.shape(0) : 1;
      o.row_bytes = batched ? (o.rows > 0 ? static_cast<size_t>(arr.nbytes()) / o.rows : 0) : arr.nbytes();
      for (py::ssize_t d = lead; d < arr.ndim(); ++d) o.item_shape.push_back(arr.shape(d));
      if (static_cast<int>(o.item_shape.size()) + lead > kMaxRank) throw py::value_error("an output has too many dims");
    }
    for (size_t i = 0; i < handles.size() && batched; ++i)
      for (const BatchOutput& o : outs)
        if (o.data && (first[i] < 0 || rows[i] < 0 || first[i] + rows[i] > o.rows))
          throw py::value_error("rows outside an output's batch");
    // Let other threads run during large copies only: a small batch's replies take less time
    // than handing the runtime over and back. (The arrays stay referenced by `outputs`.)
    size_t bytes = 0;
    for (const BatchOutput& o : outs) bytes += o.row_bytes * static_cast<size_t>(o.rows);
    if (bytes < kReleaseRuntimeBytes) {
      feeder_->reply_rows(handles, first, rows, outs, batched);
      return;
    }
    py::gil_scoped_release r;
    feeder_->reply_rows(handles, first, rows, outs, batched);
  }

  std::shared_ptr<RingFeeder> feeder_;
  std::unordered_map<uint32_t, py::object> schedulers_;
  int workers_ = 0;
};

}  // namespace

void bind_feeder(py::module_& m) {
  m.attr("RING_HANDLE_BIT") = py::int_(kRingHandleBit);
  py::class_<PyFeeder>(m, "RingFeeder",
                       "The engine's compiled path for the workers' request rings: a drain thread submits the\n"
                       "records of fast targets to their Scheduler and answers them in C++; every other record\n"
                       "waits for Python in take_slow().")
      .def(py::init<shm::Region&, double>(), py::arg("region"), py::kw_only(), py::arg("spin_us") = 50.0,
           py::keep_alive<1, 2>())
      .def("add_target", &PyFeeder::add_target, py::arg("target"), py::arg("scheduler"), py::kw_only(),
           py::arg("fast"), py::arg("input_dims") = py::none(),
           "Route target's records: fast, to `scheduler` in C++ (input_dims: each input's configured dims\n"
           "after the batch dim, -1 for any; None: any extent of the configured rank); else to take_slow().")
      .def("remove_target", &PyFeeder::remove_target, py::arg("target"),
           "Stop routing target (its records go to take_slow()); returns once the drain thread is out of\n"
           "its scheduler. Call it before the scheduler closes.")
      .def("take_slow", &PyFeeder::take_slow,
           "The records left to Python, oldest first, as (worker, target, cancel, header, inputs, client);\n"
           "their input blocks are Python's to free. Resets slow_fd.")
      .def_property_readonly(
          "slow_fd", [](PyFeeder& f) { return f.feeder().slow_fd(); },
          "An eventfd that becomes readable when records wait for take_slow() (once per burst).")
      .def("reply_rows", &PyFeeder::reply_rows, py::arg("handles"), py::arg("first_rows"), py::arg("rows"),
           py::arg("outputs"), py::kw_only(), py::arg("batched"),
           "One batch's ring requests answered: handles[i] (a ring handle) owns rows first_rows[i].. of\n"
           "every output (config order; None: not produced). Copied into to-worker blocks; replies that\n"
           "find no room wait in order and are retried by the drain thread.")
      .def("reply_batch", &PyFeeder::reply_batch, py::arg("batch"), py::arg("outputs"), py::kw_only(),
           py::arg("batched"),
           "reply_rows for every ring request of `batch` (a core Batch, still valid), its rows read in C++.")
      // positional only: pybind11 matches keyword arguments by name on every call, which cost
      // this once-per-batch call several microseconds (interned lookups)
      .def("complete_batch", &PyFeeder::complete_batch, py::arg("batch"), py::arg("produced"), py::arg("states"),
           py::arg("outputs"), py::arg("batched"),
           "A ring-only batch after its execute: output states stored (states: (index, name) each),\n"
           "statistics recorded, replies sent (outputs: (name, dtype) per configured output), in one call.\n"
           "False, with nothing done, when an output is not a C-contiguous array of its dtype with the\n"
           "batch's rows, or `produced` is not a dict.")
      .def_static("ring_handles", &PyFeeder::ring_handles, py::arg("batch"),
                  "The ring handles among the batch's requests, in batch order.")
      .def("fail", &PyFeeder::fail, py::arg("handles"), py::arg("code"), py::arg("message"),
           "Answer these ring handles with an error (others are ignored); their input blocks are freed.")
      .def(
          "forget_worker", [](PyFeeder& f, int w) { f.feeder().forget_worker(f.checked(w)); }, py::arg("worker"),
          "A dead worker: its waiting replies are dropped, and so are its replies from now on.")
      .def(
          "reset_worker",
          [](PyFeeder& f, int w) {
            f.checked(w);
            py::gil_scoped_release r;
            f.feeder().reset_worker(w);
          },
          py::arg("worker"),
          "ShmRegion.reset_worker out of the drain thread's way; the worker's replies flow again. Only\n"
          "once inflight(worker) is 0 and Python holds none of its records.")
      .def(
          "inflight", [](PyFeeder& f, int w) { return f.feeder().inflight(f.checked(w)); }, py::arg("worker"),
          "The worker's fast requests submitted and not yet answered.")
      .def(
          "queued_replies", [](PyFeeder& f, int w) { return f.feeder().queued_replies(f.checked(w)); },
          py::arg("worker"), "Replies waiting for room on the worker's reply ring or in its blocks.")
      .def(
          "refused", [](PyFeeder& f, uint32_t target) { return f.feeder().refused(target); }, py::arg("target"),
          "The target's requests refused or malformed: failed requests, as the in-process path counts them.")
      .def(
          "rejected", [](PyFeeder& f, uint32_t target) { return f.feeder().rejected(target); }, py::arg("target"),
          "Of the target's refused requests, those refused with UNAVAILABLE (a full queue or backlog, a "
          "scheduler stopping): REJECTED in the metrics, as the in-process path counts them.")
      .def("counters",
           [](PyFeeder& f) {
             const FeederCounters c = f.feeder().counters();
             py::dict d;
             d["fast"] = c.fast;
             d["slow"] = c.slow;
             d["refused"] = c.refused;
             d["bad"] = c.bad;
             d["cancels"] = c.cancels;
             d["replies"] = c.replies;
             d["errors"] = c.errors;
             d["deferred"] = c.deferred;
             d["dropped"] = c.dropped;
             return d;
           })
      .def("close", &PyFeeder::close, "Stop the drain thread (records stay on the rings).");
}

}  // namespace seqserve::binding
