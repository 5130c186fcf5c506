// DLPackView: memory the engine owns (a device state store's rows, a pinned staging buffer),
// handed to torch, cupy or numpy without a copy through the DLPack protocol (__dlpack__ and
// __dlpack_device__). The engine allocates device memory through cuda-python, which produces
// no DLPack objects itself, and no array library is required to hold them: this is the one
// producer. It knows nothing of CUDA: it describes a pointer, so it is tested on the CPU with
// numpy as the consumer (device type kDLCPU).
//
// The structs are the DLPack ABI (dlpack.h, version 0.8 "legacy" unversioned capsule, which
// every consumer accepts): their layout is a fixed fact of that specification.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "binding.h"

namespace seqserve::binding {

namespace {

struct DLDevice {
  int32_t device_type;  // kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// What a capsule's consumer keeps alive: the shape array and a reference to the owner of the
// memory (the Python object whose lifetime bounds the pointer).
struct Export {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  PyObject* owner = nullptr;
};

void delete_export(DLManagedTensor* self) {
  auto* e = static_cast<Export*>(self->manager_ctx);
  // Consumers may call the deleter from any thread, with or without the GIL.
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF(e->owner);
  PyGILState_Release(gil);
  delete e;
}

// A capsule nobody consumed (still named "dltensor") frees its tensor; a consumed one was
// renamed "used_dltensor" and its consumer calls the deleter.
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

DLDataType dl_dtype(const std::string& name) {
  // numpy's dtype names for the element types a model config allows (BYTES never reaches here).
  static const std::pair<const char*, DLDataType> table[] = {
      {"bool", {6, 8, 1}},     {"int8", {0, 8, 1}},     {"int16", {0, 16, 1}},   {"int32", {0, 32, 1}},
      {"int64", {0, 64, 1}},   {"uint8", {1, 8, 1}},    {"uint16", {1, 16, 1}},  {"uint32", {1, 32, 1}},
      {"uint64", {1, 64, 1}},  {"float16", {2, 16, 1}}, {"float32", {2, 32, 1}}, {"float64", {2, 64, 1}},
      {"bfloat16", {4, 16, 1}},
  };
  for (const auto& [n, t] : table)
    if (name == n) return t;
  throw py::value_error("DLPackView: no DLPack type for dtype '" + name + "'");
}

class DLPackView {
 public:
  DLPackView(uintptr_t address, std::vector<int64_t> shape, std::string dtype, int device_type, int device_id,
             py::object owner)
      : address_(address),
        shape_(std::move(shape)),
        dtype_name_(std::move(dtype)),
        dtype_(dl_dtype(dtype_name_)),
        device_type_(device_type),
        device_id_(device_id),
        owner_(std::move(owner)) {
    if (device_type_ != 1 && device_type_ != 2 && device_type_ != 3)
      throw py::value_error("DLPackView: device_type must be 1 (CPU), 2 (CUDA) or 3 (CUDA host)");
    for (int64_t d : shape_)
      if (d < 0) throw py::value_error("DLPackView: negative dimension");
  }

  // `stream` is the consumer's stream; the engine runs a device model on the stream its
  // state copies were issued on, so no event is needed (documented in engine/device).
  py::capsule dlpack(py::object /*stream*/, py::object max_version, py::object /*dl_device*/, py::object copy) const {
    if (!copy.is_none() && copy.cast<bool>())
      throw py::buffer_error("DLPackView: copy=True is not supported (this is a view)");
    (void)max_version;  // the legacy capsule is what every consumer accepts
    auto* e = new Export();
    e->shape = shape_;
    e->owner = owner_.ptr();
    Py_XINCREF(e->owner);
    DLTensor& t = e->managed.dl_tensor;
    t.data = reinterpret_cast<void*>(address_);
    t.device = DLDevice{device_type_, device_type_ == 1 ? 0 : device_id_};
    t.ndim = static_cast<int32_t>(e->shape.size());
    t.dtype = dtype_;
    t.shape = e->shape.data();
    t.strides = nullptr;
    t.byte_offset = 0;
    e->managed.manager_ctx = e;
    e->managed.deleter = &delete_export;
    PyObject* cap = PyCapsule_New(&e->managed, "dltensor", &capsule_destructor);
    if (!cap) {
      delete_export(&e->managed);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
  }

  py::tuple device() const { return py::make_tuple(device_type_, device_type_ == 1 ? 0 : device_id_); }
  uintptr_t address() const { return address_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::string& dtype() const { return dtype_name_; }

 private:
  uintptr_t address_;
  std::vector<int64_t> shape_;
  std::string dtype_name_;
  DLDataType dtype_;
  int32_t device_type_, device_id_;
  py::object owner_;
};

}  // namespace

void bind_dlpack(py::module_& m) {
  py::class_<DLPackView>(m, "DLPackView",
                         "A view of memory the engine owns, exported through DLPack without a copy. "
                         "The owner object is kept alive by the view and by every export of it.")
      .def(py::init<uintptr_t, std::vector<int64_t>, std::string, int, int, py::object>(), py::arg("address"),
           py::arg("shape"), py::arg("dtype"), py::arg("device_type"), py::arg("device_id"), py::arg("owner"))
      .def("__dlpack__", &DLPackView::dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", &DLPackView::device)
      .def_property_readonly("address", &DLPackView::address)
      .def_property_readonly("shape", &DLPackView::shape)
      .def_property_readonly("dtype", &DLPackView::dtype);
}

}  // namespace seqserve::binding
