// pybind11 binding of the seqserve core: seqserve.engine._core.
// The API is deliberately small; its typed description is seqserve/engine/_core.pyi.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "scheduler.h"

namespace py = pybind11;
using namespace seqserve;

namespace {

// model_config.proto DataType numbers: this binding's arguments still carry them.
enum DType : int {
  kBool = 1, kUint8 = 2, kUint16 = 3, kUint32 = 4, kUint64 = 5, kInt8 = 6, kInt16 = 7, kInt32 = 8,
  kInt64 = 9, kFp16 = 10, kFp32 = 11, kFp64 = 12, kString = 13, kBf16 = 14,
};

py::dtype numpy_dtype(int dt) {
  switch (dt) {
    case kBool: return py::dtype("?");
    case kUint8: return py::dtype("u1");
    case kUint16: return py::dtype("u2");
    case kUint32: return py::dtype("u4");
    case kUint64: return py::dtype("u8");
    case kInt8: return py::dtype("i1");
    case kInt16: return py::dtype("i2");
    case kInt32: return py::dtype("i4");
    case kInt64: return py::dtype("i8");
    case kFp16: return py::dtype("f2");
    case kFp32: return py::dtype("f4");
    case kFp64: return py::dtype("f8");
    case kString: return py::dtype("O");
    default: throw std::invalid_argument("unsupported data type " + std::to_string(dt));
  }
}

// The core's element type for a config data type.
ElemType elem_type(int dt) {
  ElemType t;
  if (dt == kString) {
    t.numpy = "|O";
    t.is_bytes = true;
    return t;
  }
  if (dt == kBf16) {  // numpy has no bfloat16: its bits as uint16
    t.numpy = "<u2";
    t.itemsize = 2;
    return t;
  }
  py::dtype d = numpy_dtype(dt);
  t.numpy = d.attr("str").cast<std::string>();
  t.itemsize = static_cast<size_t>(d.itemsize());
  return t;
}

// BYTES wire format: per element a 4-byte little-endian length and the bytes, row-major.
py::array deserialize(const uint8_t* p, size_t n, const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (auto d : shape) count *= d;
  py::array out(py::dtype("O"), shape);
  auto** slots = static_cast<PyObject**>(out.mutable_data());
  size_t off = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (off + 4 > n) throw py::value_error("BYTES tensor data is truncated");
    uint32_t len;
    std::memcpy(&len, p + off, 4);
    off += 4;
    if (off + len > n) throw py::value_error("BYTES tensor data is truncated");
    PyObject* b = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(p + off), len);
    if (!b) throw py::error_already_set();
    Py_XDECREF(slots[i]);
    slots[i] = b;
    off += len;
  }
  if (off != n) throw py::value_error("BYTES tensor has " + std::to_string(n - off) + " unexpected trailing bytes");
  return out;
}

std::string serialize(const py::array& arr) {
  std::string out;
  py::array flat = py::array(arr.attr("ravel")());
  const ssize_t n = flat.size();
  for (ssize_t i = 0; i < n; ++i) {
    py::object item = flat.attr("item")(i);
    std::string s;
    if (py::isinstance<py::bytes>(item)) s = item.cast<std::string>();
    else if (py::isinstance<py::str>(item)) s = item.cast<std::string>();
    else s = py::str(item).cast<std::string>();
    const uint32_t len = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out.append(s);
  }
  return out;
}

std::vector<int64_t> to_shape(const py::handle& seq) {
  std::vector<int64_t> v;
  for (auto h : seq) v.push_back(h.cast<int64_t>());
  return v;
}

class PyScheduler;

// One Python thread state per core thread, kept for the thread's life: acquiring the GIL then
// costs ~0.1 us instead of creating and destroying a thread state (~7 us) per batch.
thread_local PyGILState_STATE t_gil_state;
thread_local PyThreadState* t_saved = nullptr;

void attach_thread() {
  t_gil_state = PyGILState_Ensure();
  t_saved = PyEval_SaveThread();
}

void enter_runtime() { PyEval_RestoreThread(t_saved); }

void leave_runtime() { t_saved = PyEval_SaveThread(); }

void detach_thread() {
  PyEval_RestoreThread(t_saved);
  PyGILState_Release(t_gil_state);
  t_saved = nullptr;
}

// The batch handed to the runner. Valid only during that call: arrays are views onto the
// instance's reused buffers.
struct BatchView {
  PyScheduler* owner = nullptr;
  Instance* inst = nullptr;
  bool valid = true;
  Instance& get() {
    if (!valid) throw std::runtime_error("this batch has finished executing; its arrays are no longer valid");
    return *inst;
  }
};

class PyScheduler {
 public:
  PyScheduler(ModelSpec spec, py::function runner, py::function on_fail, py::function on_warning,
              py::object on_expire)
      : runner_(std::move(runner)),
        on_fail_(std::move(on_fail)),
        on_warning_(std::move(on_warning)),
        on_expire_(std::move(on_expire)) {
    Hooks h;
    h.thread_start = attach_thread;
    h.thread_stop = detach_thread;
    h.enter = enter_runtime;
    h.leave = leave_runtime;
    h.run = [this](Instance& inst) { return run(inst); };
    h.fail = [this](const std::vector<uint64_t>& handles, Code code, const std::string& msg) {
      py::gil_scoped_acquire g;
      try {
        on_fail_(handles, static_cast<int>(code), msg);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("seqserve scheduler on_fail hook");
      }
    };
    h.log_warning = [this](const std::string& msg) {
      try {
        on_warning_(msg);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("seqserve scheduler on_warning hook");
      }
    };
    if (!on_expire_.is_none()) {
      h.describe = [this](const ExpiredSequence& x) {
        py::gil_scoped_acquire g;
        try {
          py::dict d;
          if (x.id.is_str) d["sequence_id"] = py::str(x.id.str);
          else d["sequence_id"] = py::int_(x.id.num);
          d["age_s"] = x.age_s;
          d["idle_s"] = x.idle_s;
          d["steps"] = x.steps;
          d["state_bytes"] = x.state_bytes;
          d["instance"] = x.instance;
          d["slot"] = x.slot;
          on_expire_(d);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("seqserve scheduler on_expire hook");
        }
      };
    }
    sched_ = Scheduler::create(std::move(spec), std::move(h));
  }

  ~PyScheduler() { close(true); }

  void close(bool force) {
    if (!sched_) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release r;
      sched_->close(force);
    } else {
      sched_->close(force);
    }
  }

  bool run(Instance& inst) {
    py::gil_scoped_acquire g;
    auto view_obj = py::cast(BatchView{this, &inst, true});
    bool ok = false;
    try {
      ok = runner_(view_obj).cast<bool>();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("seqserve batch runner");
    }
    view_obj.cast<BatchView&>().valid = false;
    return ok;
  }

  py::object submit(uint64_t handle, py::tuple inputs, py::object corrid, bool start, bool end,
                    uint64_t timeout_us, int64_t rows, int priority) {
    const ModelSpec& spec = sched_->spec();
    if (static_cast<size_t>(inputs.size()) != spec.inputs.size())
      throw py::value_error("expected " + std::to_string(spec.inputs.size()) + " inputs, got " +
                            std::to_string(inputs.size()));
    Request* r = sched_->new_request();
    r->handle = handle;
    r->start = start;
    r->end = end;
    r->timeout_ns = static_cast<int64_t>(timeout_us) * 1000;
    r->rows = rows;
    try {
      if (py::isinstance<py::str>(corrid)) {
        r->id.is_str = true;
        r->id.num = 0;
        r->id.str = corrid.cast<std::string>();
      } else {
        r->id.is_str = false;
        r->id.str.clear();
        r->id.num = corrid.cast<uint64_t>();
      }
      r->inputs.resize(spec.inputs.size());
      for (size_t k = 0; k < spec.inputs.size(); ++k) {
        py::handle item = inputs[k];
        TensorRef& t = r->inputs[k];
        if (py::isinstance<py::array>(item)) {
          auto arr = py::reinterpret_borrow<py::array>(item);
          if (!(arr.flags() & py::array::c_style)) throw py::value_error("input arrays must be C-contiguous");
          if (arr.ndim() > kMaxRank) throw py::value_error("input rank is above the supported maximum of 16");
          t.data = static_cast<const uint8_t*>(arr.data());
          t.nbytes = static_cast<size_t>(arr.nbytes());
          t.ndim = static_cast<int>(arr.ndim());
          for (int d = 0; d < t.ndim; ++d) t.shape[d] = arr.shape(d);
        } else {
          // BYTES: (serialized buffer, shape)
          auto pair = py::reinterpret_borrow<py::tuple>(item);
          py::buffer_info info = py::reinterpret_borrow<py::buffer>(pair[0]).request();
          auto shape = to_shape(pair[1]);
          if (shape.size() > kMaxRank) throw py::value_error("input rank is above the supported maximum of 16");
          t.data = static_cast<const uint8_t*>(info.ptr);
          t.nbytes = static_cast<size_t>(info.size * info.itemsize);
          t.ndim = static_cast<int>(shape.size());
          for (int d = 0; d < t.ndim; ++d) t.shape[d] = shape[d];
        }
      }
    } catch (...) {
      sched_->recycle(r);
      throw;
    }
    SubmitResult res = sched_->submit(r, priority);
    if (res.accepted) return py::none();
    return py::make_tuple(static_cast<int>(res.code), res.message);
  }

  Scheduler& sched() { return *sched_; }

 private:
  std::unique_ptr<Scheduler> sched_;
  py::function runner_, on_fail_, on_warning_;
  py::object on_expire_;
};

py::array view_array(py::object base, const ElemType& type, const std::vector<int64_t>& shape, uint8_t* data,
                     size_t nbytes, bool writeable) {
  if (type.is_bytes) return deserialize(data, nbytes, shape);
  py::array arr(py::dtype(type.numpy), shape, {}, data, base);
  if (!writeable) py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
}

std::vector<int64_t> row_shape(const Instance& inst, bool batched) {
  return batched ? std::vector<int64_t>{inst.batch.size, 1} : std::vector<int64_t>{1};
}

const ElemType kFlagType{"|b1", 1, false};
const ElemType kCorridType{"<u8", 8, false};

py::dict stats_dict(const Stats& s) {
  auto dur = [](const DurationStat& d) {
    py::dict o;
    o["count"] = d.count;
    o["ns"] = d.ns;
    return o;
  };
  py::dict out;
  out["inference_count"] = s.inference_count;
  out["execution_count"] = s.execution_count;
  out["last_inference"] = s.last_inference_ms;
  out["success"] = dur(s.success);
  out["fail"] = dur(s.fail);
  out["queue"] = dur(s.queue);
  out["compute_input"] = dur(s.compute_input);
  out["compute_infer"] = dur(s.compute_infer);
  out["compute_output"] = dur(s.compute_output);
  py::list batches;
  for (auto& kv : s.batches) {
    py::dict b;
    b["batch_size"] = kv.first;
    b["compute_input"] = dur(kv.second.compute_input);
    b["compute_infer"] = dur(kv.second.compute_infer);
    b["compute_output"] = dur(kv.second.compute_output);
    batches.append(b);
  }
  out["batch_stats"] = batches;
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "seqserve compiled core: sequence slots, backlog, idle reaper, batch assembly, state.";
  m.attr("STATELESS") = static_cast<int>(kStateless);
  m.attr("DIRECT") = static_cast<int>(kDirect);
  m.attr("OLDEST") = static_cast<int>(kOldest);
  m.attr("DYNAMIC") = static_cast<int>(kDynamic);

  m.def(
      "serialize_bytes", [](py::array arr) { return py::bytes(serialize(arr)); }, py::arg("array"),
      "Serialize a BYTES tensor (object array) to the 4-byte-length-prefixed wire format.");
  m.def(
      "deserialize_bytes",
      [](py::buffer buf, std::vector<int64_t> shape) {
        py::buffer_info info = buf.request();
        return deserialize(static_cast<const uint8_t*>(info.ptr), info.size * info.itemsize, shape);
      },
      py::arg("data"), py::arg("shape"), "Parse wire-format BYTES data into an object array of bytes.");

  py::class_<BatchView>(m, "Batch", "One batch formed by the scheduler, valid during the runner call.")
      .def_property_readonly("size", [](BatchView& v) { return v.get().batch.size; })
      .def_property_readonly("instance", [](BatchView& v) { return v.get().index; })
      .def_property_readonly("handles",
                             [](BatchView& v) {
                               const std::vector<Row>& rows = v.get().batch.rows;
                               py::list out(rows.size());
                               for (size_t i = 0; i < rows.size(); ++i)
                                 out[i] = py::int_(rows[i].req ? rows[i].req->handle : 0);
                               return out;
                             })
      .def("inputs",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             Instance& inst = v.get();
             const ModelSpec& spec = v.owner->sched().spec();
             py::dict out;
             for (size_t k = 0; k < spec.inputs.size(); ++k)
               out[py::str(spec.inputs[k].name)] = view_array(self, spec.inputs[k].type, inst.batch.input_shapes[k],
                                                              inst.batch.inputs[k].data(), inst.batch.input_nbytes[k], false);
             return out;
           })
      .def("controls",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             Instance& inst = v.get();
             const ModelSpec& spec = v.owner->sched().spec();
             const auto shape = row_shape(inst, spec.max_batch_size > 0);
             py::dict out;
             for (size_t c = 0; c < spec.controls.size(); ++c)
               out[py::str(spec.controls[c].name)] = view_array(self, spec.controls[c].type, shape,
                                                                inst.batch.controls[c].data(), inst.batch.control_nbytes[c], false);
             return out;
           })
      .def("states",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             Instance& inst = v.get();
             const ModelSpec& spec = v.owner->sched().spec();
             py::dict out;
             for (size_t k = 0; k < spec.states.size(); ++k) {
               const StateSpec& st = spec.states[k];
               out[py::str(st.input_name)] = view_array(self, st.type, inst.state.shape(k), inst.state.data(k),
                                                        inst.state.nbytes(k), false);
             }
             return out;
           })
      .def_property_readonly("start",
                             [](py::object self) {
                               Instance& inst = self.cast<BatchView&>().get();
                               return view_array(self, kFlagType, {inst.batch.size}, inst.batch.start.data(), inst.batch.size, false);
                             })
      .def_property_readonly("end",
                             [](py::object self) {
                               Instance& inst = self.cast<BatchView&>().get();
                               return view_array(self, kFlagType, {inst.batch.size}, inst.batch.end.data(), inst.batch.size, false);
                             })
      .def_property_readonly("ready",
                             [](py::object self) {
                               Instance& inst = self.cast<BatchView&>().get();
                               return view_array(self, kFlagType, {inst.batch.size}, inst.batch.ready.data(), inst.batch.size, false);
                             })
      .def_property_readonly("corrid",
                             [](py::object self) -> py::array {
                               Instance& inst = self.cast<BatchView&>().get();
                               Batch& b = inst.batch;
                               const size_t n = static_cast<size_t>(b.size);
                               bool any_str = false;
                               for (size_t i = 0; i < n && i < b.rows.size(); ++i)
                                 any_str |= b.rows[i].req && b.rows[i].req->id.is_str;
                               if (!any_str)
                                 return view_array(self, kCorridType, {static_cast<int64_t>(n)},
                                                   reinterpret_cast<uint8_t*>(b.corrid_num.data()), n * 8, false);
                               // Mixed batch: str for string ids, int for numeric ids and padding.
                               py::array out(py::dtype("O"), std::vector<int64_t>{static_cast<int64_t>(n)});
                               auto** slots = static_cast<PyObject**>(out.mutable_data());
                               for (size_t i = 0; i < n; ++i) {
                                 Py_XDECREF(slots[i]);
                                 const Request* r = b.rows[i].req;
                                 if (r && r->id.is_str) {
                                   const std::string& s = b.corrid_str[i];
                                   slots[i] = PyUnicode_DecodeUTF8(s.data(), s.size(), "surrogateescape");
                                 } else {
                                   slots[i] = PyLong_FromUnsignedLongLong(b.corrid_num[i]);
                                 }
                                 if (!slots[i]) throw py::error_already_set();
                               }
                               return out;
                             })
      .def(
          "set_state",
          [](BatchView& v, size_t index, py::array value) {
            Instance& inst = v.get();
            Scheduler& s = v.owner->sched();
            if (index >= s.spec().states.size()) throw py::index_error("state index out of range");
            const StateSpec& st = s.spec().states[index];
            std::vector<int64_t> shape(value.shape(), value.shape() + value.ndim());
            if (st.type.is_bytes) {
              std::string blob = serialize(value);
              s.set_output_state(inst, index, reinterpret_cast<const uint8_t*>(blob.data()), blob.size(),
                                 shape.data(), static_cast<int>(shape.size()));
              return;
            }
            py::array arr = py::array::ensure(value, py::array::c_style);
            const py::dtype dt(st.type.numpy);
            if (!arr || !arr.dtype().is(dt))
              arr = py::array(py::module_::import("numpy").attr("ascontiguousarray")(value, dt));
            s.set_output_state(inst, index, static_cast<const uint8_t*>(arr.data()), arr.nbytes(), shape.data(),
                               static_cast<int>(shape.size()));
          },
          py::arg("index"), py::arg("value"), "Store the output state for every real row of the batch.")
      .def(
          "mark_executed", [](BatchView& v) { v.get().t_executed = now_ns(); },
          "Record the end of the model call (splits compute_infer from compute_output).")
      .def(
          "finish",
          [](BatchView& v, bool ok) {
            Instance& inst = v.get();
            py::gil_scoped_release r;
            v.owner->sched().record_batch(inst, ok);
          },
          py::arg("ok"), "Record this batch's statistics now, before its replies are sent.");

  py::class_<PyScheduler>(m, "Scheduler", "Scheduler and executors of one model.")
      .def(py::init([](std::string name, int strategy, int max_batch_size, int instance_count,
                       int slots_per_instance, uint64_t idle_us, uint64_t max_queue_delay_us,
                       double min_slot_utilization,
                       std::vector<std::tuple<std::string, int, bool, std::vector<int64_t>>> inputs,
                       std::vector<std::tuple<std::string, int, int, double, double>> controls,
                       std::vector<std::tuple<std::string, std::string, int, std::vector<int64_t>, bool, py::bytes,
                                              std::vector<int64_t>>>
                           states,
                       int64_t delay_requests, int64_t delay_backlog_requests, py::function runner,
                       py::function on_fail, py::function on_warning, std::vector<int64_t> preferred_batch_sizes,
                       uint64_t batch_delay_us, int priority_levels, int default_priority,
                       std::vector<std::tuple<bool, uint64_t, bool, uint32_t>> queue_policies,
                       bool timeout_complete, py::object on_expire) {
             ModelSpec spec;
             spec.name = std::move(name);
             if (strategy < kStateless || strategy > kDynamic) throw py::value_error("unknown strategy");
             spec.strategy = static_cast<Strategy>(strategy);
             spec.max_batch_size = max_batch_size;
             spec.instance_count = instance_count;
             spec.slots_per_instance = slots_per_instance;
             spec.idle_ns = static_cast<int64_t>(idle_us) * 1000;
             spec.max_queue_delay_ns = static_cast<int64_t>(max_queue_delay_us) * 1000;
             spec.min_slot_utilization = min_slot_utilization;
             for (auto& [n, dt, mm, dflt] : inputs) spec.inputs.push_back(InputSpec{n, elem_type(dt), mm, dflt});
             for (auto& [n, kind, dt, f, t] : controls) {
               ControlSpec c{n, static_cast<ControlKind>(kind), elem_type(dt), f, t, {}, {}};
               if (!c.type.is_bytes) {  // the two values as elements of the dtype
                 py::array v = py::module_::import("numpy").attr("array")(py::make_tuple(f, t), numpy_dtype(dt));
                 const auto* p = static_cast<const char*>(v.data());
                 c.false_bytes.assign(p, c.type.itemsize);
                 c.true_bytes.assign(p + c.type.itemsize, c.type.itemsize);
               }
               spec.controls.push_back(std::move(c));
             }
             for (auto& [in, out, dt, dims, var, init, init_dims] : states) {
               StateSpec st;
               st.input_name = in;
               st.output_name = out;
               st.type = elem_type(dt);
               st.dims = dims;
               st.variable = var;
               st.initial = std::string(init);
               st.initial_dims = init_dims;
               spec.states.push_back(std::move(st));
             }
             spec.delay_requests = delay_requests;
             spec.delay_backlog_requests = delay_backlog_requests;
             spec.preferred_batch_sizes = preferred_batch_sizes;
             spec.batch_delay_ns = static_cast<int64_t>(batch_delay_us) * 1000;
             spec.priority_levels = priority_levels;
             spec.default_priority = default_priority;
             for (auto& [delay, timeout_us, override_ok, max_size] : queue_policies)
               spec.queue_policies.push_back(
                   QueuePolicy{delay, static_cast<int64_t>(timeout_us) * 1000, override_ok, max_size});
             spec.timeout_complete = timeout_complete;
             spec.describe_on_expiry = !on_expire.is_none();
             return std::make_unique<PyScheduler>(std::move(spec), std::move(runner), std::move(on_fail),
                                                  std::move(on_warning), std::move(on_expire));
           }),
           py::kw_only(), py::arg("name"), py::arg("strategy"), py::arg("max_batch_size"), py::arg("instance_count"),
           py::arg("slots_per_instance"), py::arg("idle_us"), py::arg("max_queue_delay_us"),
           py::arg("min_slot_utilization"), py::arg("inputs"), py::arg("controls"), py::arg("states"),
           py::arg("delay_requests"), py::arg("delay_backlog_requests"), py::arg("runner"), py::arg("on_fail"),
           py::arg("on_warning"), py::arg("preferred_batch_sizes") = std::vector<int64_t>{},
           py::arg("batch_delay_us") = 0, py::arg("priority_levels") = 1, py::arg("default_priority") = 1,
           py::arg("queue_policies") = std::vector<std::tuple<bool, uint64_t, bool, uint32_t>>{},
           py::arg("timeout_complete") = false, py::arg("on_expire") = py::none())
      .def("start", [](PyScheduler& s) { s.sched().start(); })
      .def("submit", &PyScheduler::submit, py::arg("handle"), py::arg("inputs"), py::arg("corrid") = 0,
           py::arg("start") = false, py::arg("end") = false, py::arg("timeout_us") = 0, py::arg("rows") = 1,
           py::arg("priority") = 0,
           "Queue a request. Returns None when accepted, else (code, message).")
      .def("stop_accepting", [](PyScheduler& s) { s.sched().stop_accepting(); })
      .def("inflight_sequences", [](PyScheduler& s) { return s.sched().inflight_sequences(); })
      .def("pending_requests", [](PyScheduler& s) { return s.sched().pending_requests(); })
      .def("free_slots", [](PyScheduler& s) { return s.sched().free_slots(); })
      .def("backlog_sequences", [](PyScheduler& s) { return s.sched().backlog_sequences(); })
      .def("sequences",
           [](PyScheduler& s) {
             std::vector<std::pair<std::string, int>> out;
             s.sched().describe_slots(out);
             return out;
           })
      .def("stats", [](PyScheduler& s) { return stats_dict(s.sched().stats()); })
      .def("close", &PyScheduler::close, py::arg("force") = false,
           "Stop the executors once queues drain (force: now); unanswered requests fail UNAVAILABLE.");
}
