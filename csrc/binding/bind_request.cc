// Binding of RequestHeader (request.h): a request's scalars, by name, as Python hands them to
// Scheduler.submit. Python builds one per request (the model's validator lays the request out
// for the core: this header and the input buffers apart).
#include <pybind11/stl.h>

#include "binding.h"

namespace seqserve::binding {

void bind_request(py::module_& m) {
  py::class_<PyRequestHeader>(m, "RequestHeader",
                              "A request's scalars for Scheduler.submit, by name; its tensors go apart.")
      .def(py::init([](uint64_t handle, py::handle sequence_id, bool start, bool end, bool session,
                       uint64_t timeout_us, int64_t rows, int32_t priority) {
             PyRequestHeader h;
             RequestHeader& f = h.fixed;
             f.handle = handle;
             f.timeout_us = timeout_us;
             f.rows = rows;
             f.priority = priority;
             f.flags = (start ? kFlagStart : 0u) | (end ? kFlagEnd : 0u) | (session ? kFlagSession : 0u);
             if (py::isinstance<py::str>(sequence_id)) {
               h.string_id = sequence_id.cast<std::string>();
               f.flags |= kFlagStringId;
               f.string_id_bytes = static_cast<uint32_t>(h.string_id.size());
             } else {
               f.sequence_id = sequence_id.cast<uint64_t>();
             }
             return h;
           }),
           py::kw_only(), py::arg("handle"), py::arg("sequence_id") = 0, py::arg("start") = false,
           py::arg("end") = false, py::arg("session") = false, py::arg("timeout_us") = 0, py::arg("rows") = 1,
           py::arg("priority") = 0)
      .def_property_readonly("handle", [](const PyRequestHeader& h) { return h.fixed.handle; })
      .def_property_readonly("sequence_id",
                             [](const PyRequestHeader& h) -> py::object {
                               if (h.fixed.has(kFlagStringId)) return py::str(h.string_id);
                               return py::int_(h.fixed.sequence_id);
                             })
      .def_property_readonly("start", [](const PyRequestHeader& h) { return h.fixed.has(kFlagStart); })
      .def_property_readonly("end", [](const PyRequestHeader& h) { return h.fixed.has(kFlagEnd); })
      .def_property_readonly("session", [](const PyRequestHeader& h) { return h.fixed.has(kFlagSession); })
      .def_property_readonly("timeout_us", [](const PyRequestHeader& h) { return h.fixed.timeout_us; })
      .def_property_readonly("rows", [](const PyRequestHeader& h) { return h.fixed.rows; })
      .def_property_readonly("priority", [](const PyRequestHeader& h) { return h.fixed.priority; })
      .def("__repr__", [](const PyRequestHeader& h) {
        const RequestHeader& f = h.fixed;
        const std::string id =
            f.has(kFlagStringId) ? py::repr(py::str(h.string_id)).cast<std::string>() : std::to_string(f.sequence_id);
        auto flag = [](bool b) { return b ? "True" : "False"; };
        return "RequestHeader(handle=" + std::to_string(f.handle) + ", sequence_id=" + id +
               ", start=" + flag(f.has(kFlagStart)) + ", end=" + flag(f.has(kFlagEnd)) +
               ", session=" + flag(f.has(kFlagSession)) + ", timeout_us=" + std::to_string(f.timeout_us) +
               ", rows=" + std::to_string(f.rows) + ", priority=" + std::to_string(f.priority) + ")";
      });
}

}  // namespace seqserve::binding
