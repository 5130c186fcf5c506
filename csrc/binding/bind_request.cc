// Binding of RequestHeader (request.h): a request's scalars, by name, as Python hands them to
// Scheduler.submit. Python builds one per request (the model's validator lays the request out
// for the core: this header and the input buffers apart), so it is a plain CPython type with a
// vectorcall constructor rather than a pybind11 class: building one costs a fraction of a
// pybind11 constructor call, which parses its arguments generically.
#include "binding.h"

namespace seqserve::binding {

namespace {

enum Field { kHandle, kSequenceId, kStart, kEnd, kSession, kTimeoutUs, kRows, kPriority, kClient, kFieldCount };
constexpr const char* kFieldNames[kFieldCount] = {"handle",     "sequence_id", "start",    "end",   "session",
                                                   "timeout_us", "rows",        "priority", "client"};
PyObject* g_field_names[kFieldCount];  // interned, in Field order

PyTypeObject g_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

int field_of(PyObject* name) {
  for (int i = 0; i < kFieldCount; ++i)
    if (name == g_field_names[i]) return i;  // the usual case: the caller's names are interned too
  for (int i = 0; i < kFieldCount; ++i)
    if (PyUnicode_Check(name) && PyUnicode_Compare(name, g_field_names[i]) == 0) return i;
  return -1;
}

bool read_u64(PyObject* v, uint64_t* out) {
  PyObject* i = PyNumber_Index(v);
  if (i == nullptr) return false;
  *out = PyLong_AsUnsignedLongLong(i);
  Py_DECREF(i);
  return !PyErr_Occurred();
}

bool read_i64(PyObject* v, int64_t* out) {
  PyObject* i = PyNumber_Index(v);
  if (i == nullptr) return false;
  *out = PyLong_AsLongLong(i);
  Py_DECREF(i);
  return !PyErr_Occurred();
}

bool read_flag(PyObject* v, RequestFlag flag, uint32_t* flags) {
  const int b = PyObject_IsTrue(v);
  if (b < 0) return false;
  if (b) *flags |= flag;
  return true;
}

// Fills `h` from the keyword values (nullptr: the default); false with a Python error set.
bool fill(RequestHeaderObject* h, PyObject* const* vals) {
  RequestHeader& f = h->fixed;
  if (!read_u64(vals[kHandle], &f.handle)) return false;
  if (PyObject* id = vals[kSequenceId]) {
    if (PyUnicode_Check(id)) {
      Py_ssize_t n = 0;
      if (PyUnicode_AsUTF8AndSize(id, &n) == nullptr) return false;
      Py_INCREF(id);
      h->string_id = id;
      f.flags |= kFlagStringId;
      f.string_id_bytes = static_cast<uint32_t>(n);
    } else if (!read_u64(id, &f.sequence_id)) {
      return false;
    }
  }
  if (vals[kStart] && !read_flag(vals[kStart], kFlagStart, &f.flags)) return false;
  if (vals[kEnd] && !read_flag(vals[kEnd], kFlagEnd, &f.flags)) return false;
  if (vals[kSession] && !read_flag(vals[kSession], kFlagSession, &f.flags)) return false;
  if (vals[kTimeoutUs] && !read_u64(vals[kTimeoutUs], &f.timeout_us)) return false;
  if (vals[kRows] && !read_i64(vals[kRows], &f.rows)) return false;
  if (PyObject* p = vals[kPriority]) {
    int64_t priority = 0;
    if (!read_i64(p, &priority)) return false;
    if (priority < INT32_MIN || priority > INT32_MAX) {
      PyErr_SetString(PyExc_OverflowError, "priority does not fit in 32 bits");
      return false;
    }
    f.priority = static_cast<int32_t>(priority);
  }
  if (vals[kClient] && !read_u64(vals[kClient], &h->client)) return false;
  return true;
}

PyObject* header_vectorcall(PyObject* type, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 0) {
    PyErr_SetString(PyExc_TypeError, "RequestHeader() takes keyword arguments only");
    return nullptr;
  }
  PyObject* vals[kFieldCount] = {};
  const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nk; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    const int k = field_of(name);
    if (k < 0) {
      PyErr_Format(PyExc_TypeError, "RequestHeader() got an unexpected keyword argument '%S'", name);
      return nullptr;
    }
    vals[k] = args[i];
  }
  if (vals[kHandle] == nullptr) {
    PyErr_SetString(PyExc_TypeError, "RequestHeader() missing required keyword argument: 'handle'");
    return nullptr;
  }
  auto* tp = reinterpret_cast<PyTypeObject*>(type);
  auto* h = reinterpret_cast<RequestHeaderObject*>(tp->tp_alloc(tp, 0));
  if (h == nullptr) return nullptr;
  h->fixed = RequestHeader{};
  h->string_id = nullptr;
  h->client = 0;
  if (!fill(h, vals)) {
    Py_DECREF(h);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(h);
}

// Calls that do not use vectorcall (a tuple and a dict) end up here.
PyObject* header_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  return PyVectorcall_Call(reinterpret_cast<PyObject*>(type), args, kwargs);
}

void header_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<RequestHeaderObject*>(self)->string_id);
  Py_TYPE(self)->tp_free(self);
}

const RequestHeader& fixed_of(PyObject* self) { return reinterpret_cast<RequestHeaderObject*>(self)->fixed; }

PyObject* get_sequence_id(PyObject* self, void*) {
  auto* h = reinterpret_cast<RequestHeaderObject*>(self);
  if (h->string_id) return Py_NewRef(h->string_id);
  return PyLong_FromUnsignedLongLong(h->fixed.sequence_id);
}
PyObject* get_handle(PyObject* self, void*) { return PyLong_FromUnsignedLongLong(fixed_of(self).handle); }
PyObject* get_start(PyObject* self, void*) { return PyBool_FromLong(fixed_of(self).has(kFlagStart)); }
PyObject* get_end(PyObject* self, void*) { return PyBool_FromLong(fixed_of(self).has(kFlagEnd)); }
PyObject* get_session(PyObject* self, void*) { return PyBool_FromLong(fixed_of(self).has(kFlagSession)); }
PyObject* get_timeout_us(PyObject* self, void*) { return PyLong_FromUnsignedLongLong(fixed_of(self).timeout_us); }
PyObject* get_rows(PyObject* self, void*) { return PyLong_FromLongLong(fixed_of(self).rows); }
PyObject* get_priority(PyObject* self, void*) { return PyLong_FromLong(fixed_of(self).priority); }
PyObject* get_client(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<RequestHeaderObject*>(self)->client);
}

PyGetSetDef g_getset[] = {
    {"handle", get_handle, nullptr, "The caller's name for the request: answers and cancel() use it.", nullptr},
    {"sequence_id", get_sequence_id, nullptr, "Its sequence's id (0: none).", nullptr},
    {"start", get_start, nullptr, nullptr, nullptr},
    {"end", get_end, nullptr, nullptr, nullptr},
    {"session", get_session, nullptr,
     "Named by a session: START is implied when the sequence is not live, unless it is a\n"
     "session that ended or expired.",
     nullptr},
    {"timeout_us", get_timeout_us, nullptr, "Queue timeout (0: the queue policy's default).", nullptr},
    {"rows", get_rows, nullptr, "Batch rows the request occupies.", nullptr},
    {"priority", get_priority, nullptr, "Priority level (0: the model's default).", nullptr},
    {"client", get_client, nullptr, "The client a session's tombstones count against (0: the shared key).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyObject* header_repr(PyObject* self) {
  const RequestHeader& f = fixed_of(self);
  py::object id = py::reinterpret_steal<py::object>(get_sequence_id(self, nullptr));
  if (!id) return nullptr;
  auto flag = [](bool b) { return b ? "True" : "False"; };
  return PyUnicode_FromFormat(
      "RequestHeader(handle=%llu, sequence_id=%R, start=%s, end=%s, session=%s, timeout_us=%llu, rows=%lld, "
      "priority=%d)",
      static_cast<unsigned long long>(f.handle), id.ptr(), flag(f.has(kFlagStart)), flag(f.has(kFlagEnd)),
      flag(f.has(kFlagSession)), static_cast<unsigned long long>(f.timeout_us), static_cast<long long>(f.rows),
      static_cast<int>(f.priority));
}

}  // namespace

const RequestHeaderObject* as_request_header(py::handle obj) {
  if (Py_TYPE(obj.ptr()) != &g_type) return nullptr;
  return reinterpret_cast<const RequestHeaderObject*>(obj.ptr());
}

void bind_request(py::module_& m) {
  for (int i = 0; i < kFieldCount; ++i) {
    g_field_names[i] = PyUnicode_InternFromString(kFieldNames[i]);
    if (g_field_names[i] == nullptr) throw py::error_already_set();
  }
  g_type.tp_name = "seqserve.engine._core.RequestHeader";
  g_type.tp_basicsize = sizeof(RequestHeaderObject);
  g_type.tp_flags = Py_TPFLAGS_DEFAULT;
  g_type.tp_doc =
      "RequestHeader(*, handle, sequence_id=0, start=False, end=False, session=False, timeout_us=0, rows=1, "
      "priority=0, client=0)\n--\n\nA request's scalars for Scheduler.submit, by name; its tensors go apart.";
  g_type.tp_new = header_new;
  g_type.tp_dealloc = header_dealloc;
  g_type.tp_repr = header_repr;
  g_type.tp_getset = g_getset;
  g_type.tp_vectorcall = header_vectorcall;
  if (PyType_Ready(&g_type) < 0) throw py::error_already_set();
  Py_INCREF(&g_type);
  m.add_object("RequestHeader", reinterpret_cast<PyObject*>(&g_type));
}

}  // namespace seqserve::binding
