// Binding of the checkpoint calls (SequenceScheduler::checkpoint_sequence, restore_sequence):
// a live sequence's implicit state to Python as bytes per state, and back. Called with the GIL held; the scheduler lock is taken under it
// (the lock order), so the state is copied straight into Python bytes, once.
#include <pybind11/stl.h>

#include "binding.h"

namespace seqserve::binding {

py::object checkpoint_sequence(SequenceScheduler& sched, py::handle corrid, bool release) {
  const CorrId id = corrid_from(corrid);
  // Under the scheduler lock only bytes objects are made: they are not tracked by the garbage
  // collector, so no collection (and no finalizer that might call back into this scheduler)
  // can run while the lock is held. Tuples and lists are made once it is dropped.
  std::vector<py::bytes> data;
  std::vector<std::vector<int64_t>> shapes;
  SequenceInfo info;
  bool found = false;
  SubmitResult res = sched.checkpoint_sequence(
      id, release,
      [&](size_t, const std::vector<int64_t>& shape, const uint8_t* p, size_t n) {
        PyObject* b = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(p), static_cast<Py_ssize_t>(n));
        if (b == nullptr) throw py::error_already_set();
        data.push_back(py::reinterpret_steal<py::bytes>(b));
        shapes.push_back(shape);
      },
      info, found);
  if (!res.accepted) return py::cast(std::move(res));
  if (!found) return py::none();
  py::list states;
  for (size_t k = 0; k < data.size(); ++k) states.append(py::make_tuple(data[k], py::cast(shapes[k])));
  return py::make_tuple(info.steps, info.session, states);
}

py::object restore_sequence(SequenceScheduler& sched, py::handle corrid, bool session, uint64_t steps, py::list states) {
  const CorrId id = corrid_from(corrid);
  std::vector<py::buffer_info> keep;
  std::vector<StateValue> values;
  keep.reserve(states.size());
  for (py::handle item : states) {
    auto pair = py::reinterpret_borrow<py::tuple>(item);
    if (pair.size() != 2) throw py::value_error("each state is (data, shape)");
    keep.push_back(py::reinterpret_borrow<py::buffer>(pair[0]).request());
    const py::buffer_info& info = keep.back();
    if (info.ndim > 1 && info.strides.back() != info.itemsize)
      throw py::value_error("state data must be C-contiguous");
    StateValue v;
    v.data = static_cast<const uint8_t*>(info.ptr);
    v.nbytes = static_cast<size_t>(info.size * info.itemsize);
    v.shape = pair[1].cast<std::vector<int64_t>>();
    values.push_back(std::move(v));
  }
  SubmitResult res = sched.restore_sequence(id, session, steps, values);
  if (!res.accepted) return py::cast(std::move(res));
  return py::none();
}

}  // namespace seqserve::binding
