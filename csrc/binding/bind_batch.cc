// The batch view handed to the runner, and the BYTES codec (wrapped by engine/tensors.py).
#include <pybind11/stl.h>

#include "binding.h"

namespace seqserve::binding {

py::array deserialize_bytes(const uint8_t* p, size_t n, const std::vector<int64_t>& shape) {
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

std::string serialize_bytes(const py::array& arr) {
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

namespace {

py::array view_array(py::object base, const py::dtype& dt, bool is_bytes, const std::vector<int64_t>& shape,
                     uint8_t* data, size_t nbytes, bool writable = false) {
  if (is_bytes) return deserialize_bytes(data, nbytes, shape);
  py::array arr(dt, shape, {}, data, base);
  if (!writable) py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
}

// The buffer for the batch's next value of the state whose input name is `name` (see
// SlotState::next_buffer), or None where the model must return a new array.
py::object next_state(py::object self, const std::string& name) {
  BatchView& v = self.cast<BatchView&>();
  SlotState& st = v.get().state;
  const std::vector<StateSpec>& states = v.sched->spec().states;
  for (size_t k = 0; k < states.size(); ++k) {
    if (states[k].input_name != name) continue;
    uint8_t* buf = st.next_buffer(k);
    if (!buf) return py::none();
    return view_array(self, v.dtypes->states[k], false, st.shape(k), buf, st.nbytes(k), true);
  }
  throw py::key_error("'" + name + "' is not an implicit state of this model");
}

py::array flags_array(py::object self, std::vector<uint8_t> Batch::*flags) {
  Instance& inst = self.cast<BatchView&>().get();
  Batch& b = inst.batch;
  return view_array(self, py::dtype::of<bool>(), false, {b.size}, (b.*flags).data(), b.size);
}

py::array corrid_array(py::object self) {
  Batch& b = self.cast<BatchView&>().get().batch;
  const size_t n = static_cast<size_t>(b.size);
  bool any_str = false;
  for (size_t i = 0; i < n && i < b.rows.size(); ++i) any_str |= b.rows[i].req && b.rows[i].req->id.is_str;
  if (!any_str)
    return view_array(self, py::dtype::of<uint64_t>(), false, {static_cast<int64_t>(n)},
                      reinterpret_cast<uint8_t*>(b.corrid_num.data()), n * 8);
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
}

}  // namespace

void set_output_state(BatchView& v, size_t index, py::array value) {
  Instance& inst = v.get();
  Scheduler& s = *v.sched;
  if (index >= s.spec().states.size()) throw py::index_error("state index out of range");
  const StateSpec& st = s.spec().states[index];
  std::vector<int64_t> shape(value.shape(), value.shape() + value.ndim());
  if (st.type.is_bytes) {
    std::string blob = serialize_bytes(value);
    s.set_output_state(inst, index, reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), shape.data(),
                       static_cast<int>(shape.size()));
    return;
  }
  const py::dtype& dt = v.dtypes->states[index];
  py::array arr = py::array::ensure(value, py::array::c_style);
  if (!arr || !arr.dtype().is(dt)) arr = py::array(py::module_::import("numpy").attr("ascontiguousarray")(value, dt));
  s.set_output_state(inst, index, static_cast<const uint8_t*>(arr.data()), arr.nbytes(), shape.data(),
                     static_cast<int>(shape.size()));
}

void record_batch_stats(BatchView& v, bool ok) {
  Instance& inst = v.get();
  if (inst.inline_batch) {  // the event loop: the lock is brief, and the GIL stays here
    v.sched->record_batch(inst, ok);
    return;
  }
  py::gil_scoped_release r;
  v.sched->record_batch(inst, ok);
}

void bind_batch(py::module_& m) {
  m.def(
      "serialize_bytes", [](py::array arr) { return py::bytes(serialize_bytes(arr)); }, py::arg("array"),
      "Serialize a BYTES tensor (object array) to the 4-byte-length-prefixed wire format.");
  m.def(
      "deserialize_bytes",
      [](py::buffer buf, std::vector<int64_t> shape) {
        py::buffer_info info = buf.request();
        return deserialize_bytes(static_cast<const uint8_t*>(info.ptr), info.size * info.itemsize, shape);
      },
      py::arg("data"), py::arg("shape"), "Parse wire-format BYTES data into an object array of bytes.");

  py::class_<BatchView>(m, "Batch", "One batch formed by the scheduler, valid during the runner call.")
      .def_property_readonly("size", [](BatchView& v) { return v.get().batch.size; })
      .def_property_readonly("instance", [](BatchView& v) { return v.get().index; })
      .def_property_readonly(
          "inline", [](BatchView& v) { return v.get().inline_batch && v.get().inline_on_loop; },
          "True when this batch runs inline on the event loop (the thread that called Scheduler.run_ready_inline).")
      .def_property_readonly("handles",
                             [](BatchView& v) {
                               const std::vector<Row>& rows = v.get().batch.rows;
                               py::list out(rows.size());
                               for (size_t i = 0; i < rows.size(); ++i)
                                 out[i] = py::int_(rows[i].req ? rows[i].req->handle : 0);
                               return out;
                             })
      .def_property_readonly(
          "request_rows",
          [](BatchView& v) {
            const std::vector<Row>& rows = v.get().batch.rows;
            py::list out(rows.size());
            for (size_t i = 0; i < rows.size(); ++i) out[i] = py::int_(rows[i].req ? rows[i].req->rows : 1);
            return out;
          },
          "The batch rows each entry of handles occupies (1 for padding).")
      .def("inputs",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             Batch& b = v.get().batch;
             const ModelSpec& spec = v.sched->spec();
             py::dict out;
             for (size_t k = 0; k < spec.inputs.size(); ++k)
               out[py::str(spec.inputs[k].name)] = view_array(self, v.dtypes->inputs[k], spec.inputs[k].type.is_bytes,
                                                              b.input_shapes[k], b.inputs[k].data(), b.input_nbytes[k]);
             return out;
           })
      .def(
          "ragged",
          [](BatchView& v) {
            Batch& b = v.get().batch;
            const ModelSpec& spec = v.sched->spec();
            py::dict out;
            if (spec.max_batch_size <= 0) return out;
            for (size_t k = 0; k < spec.inputs.size(); ++k) {
              if (!spec.inputs[k].ragged) continue;
              const std::vector<int64_t>& flat = b.ragged_shapes[k];
              py::list shapes;
              for (size_t i = 0; i < flat.size();) {
                const size_t ndim = static_cast<size_t>(flat[i++]);
                py::tuple shape(ndim);
                for (size_t d = 0; d < ndim; ++d) shape[d] = py::int_(flat[i + d]);
                shapes.append(std::move(shape));
                i += ndim;
              }
              out[py::str(spec.inputs[k].name)] = std::move(shapes);
            }
            return out;
          },
          "Ragged inputs: each request's shape (batch dim included), in request order; the input's "
          "array holds their elements end to end.")
      .def("controls",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             Batch& b = v.get().batch;
             const ModelSpec& spec = v.sched->spec();
             const std::vector<int64_t> shape =
                 spec.max_batch_size > 0 ? std::vector<int64_t>{b.size, 1} : std::vector<int64_t>{1};
             py::dict out;
             for (size_t c = 0; c < spec.controls.size(); ++c)
               out[py::str(spec.controls[c].name)] = view_array(self, v.dtypes->controls[c], spec.controls[c].type.is_bytes,
                                                                shape, b.controls[c].data(), b.control_nbytes[c]);
             return out;
           })
      .def("states",
           [](py::object self) {
             BatchView& v = self.cast<BatchView&>();
             SlotState& st = v.get().state;
             const ModelSpec& spec = v.sched->spec();
             py::dict out;
             for (size_t k = 0; k < spec.states.size(); ++k)
               out[py::str(spec.states[k].input_name)] =
                   view_array(self, v.dtypes->states[k], spec.states[k].type.is_bytes, st.shape(k),
                              st.data(k), st.nbytes(k), st.writable(k));
             return out;
           })
      .def_property_readonly("start", [](py::object self) { return flags_array(self, &Batch::start); })
      .def_property_readonly("end", [](py::object self) { return flags_array(self, &Batch::end); })
      .def_property_readonly("ready", [](py::object self) { return flags_array(self, &Batch::ready); })
      .def_property_readonly("corrid", &corrid_array)
      .def_property_readonly(
          "slots",
          [](BatchView& v) {
            const Batch& b = v.get().batch;
            py::array_t<int32_t> out(static_cast<py::ssize_t>(b.size));
            int32_t* p = out.mutable_data();
            for (int64_t i = 0; i < b.size; ++i)
              p[i] = i < static_cast<int64_t>(b.rows.size()) ? static_cast<int32_t>(b.rows[i].slot) : -1;
            return out;
          },
          "The sequence slot of every row (a copy; padding rows too, -1 past the formed rows). Device "
          "state tables index their per-slot rows with it.")

      .def(
          "state",
          [](py::object self, const std::string& name) {
            BatchView& v = self.cast<BatchView&>();
            SlotState& st = v.get().state;
            const std::vector<StateSpec>& states = v.sched->spec().states;
            for (size_t k = 0; k < states.size(); ++k)
              if (states[k].input_name == name)
                return view_array(self, v.dtypes->states[k], states[k].type.is_bytes, st.shape(k), st.data(k),
                                  st.nbytes(k), st.writable(k));
            throw py::key_error("'" + name + "' is not an implicit state of this model");
          },
          py::arg("name"),
          "The state whose input name is `name`, as states() has it; an out-of-order Oldest batch "
          "gathers it on this first access.")
      .def("next_state", &next_state, py::arg("name"),
           "A writable buffer for the next value of the state named `name` (its input name), valid "
           "during the runner call; returned as the output state it becomes the state without a copy "
           "where the layout allows. None for variable-shape and BYTES states.")
      .def("set_state", &set_output_state, py::arg("index"), py::arg("value"),
           "Store the output state for every real row of the batch.")
      .def(
          "mark_executed", [](BatchView& v) { v.get().t_executed = now_ns(); },
          "Record the end of the model call (splits compute_infer from compute_output).")
      .def(
          "finish", &record_batch_stats, py::arg("ok"), "Record this batch's statistics now, before its replies are sent.");
}

}  // namespace seqserve::binding
