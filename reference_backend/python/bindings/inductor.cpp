// The OpenReg side of the interface between Inductor-generated kernels and
// the runtime (openreg/include/openreg_inductor.h): describing tensor
// arguments on the host, launching a kernel call on the current stream of a
// device, and mapping device memory for the kernel on the stream's worker.
#include "inductor.h"

#include <Stream.h>

#include <openreg/runtime.h>
#include <openreg_inductor.h>

#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <exception>
#include <sstream>
#include <string>

namespace {

int describe_tensor(PyObject* object, const char* kernel_name, int argument, OpenRegInductorTensor* out) {
  if (!THPVariable_Check(object)) {
    PyErr_Format(PyExc_TypeError, "OpenReg: Inductor kernel %s: argument %d is a %s, not a tensor", kernel_name,
                 argument, Py_TYPE(object)->tp_name);
    return -1;
  }
  const at::Tensor& t = THPVariable_Unpack(object);
  if (t.device().is_cpu() && t.dim() == 0 && t.layout() == c10::kStrided) {
    // A host scalar: its value now, as a GPU kernel's by-value argument (the
    // host may change the tensor before the kernel runs, as an optimizer
    // increments its step counter).
    const at::Tensor resolved = t.resolve_conj().resolve_neg();
    TORCH_INTERNAL_ASSERT(resolved.nbytes() <= sizeof(out->value));
    *out = OpenRegInductorTensor{};
    out->device = -1;
    std::memcpy(out->value, resolved.const_data_ptr(), resolved.nbytes());
    return 0;
  }
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    // A kernel of the device never reads host memory: the host may change it
    // before the kernel runs (as a CUDA kernel cannot read pageable memory).
    std::ostringstream device;
    device << t.device();
    PyErr_Format(PyExc_TypeError, "OpenReg: Inductor kernel %s: argument %d is on %s; a kernel launched on an "
                 "OpenReg device takes OpenReg tensors only", kernel_name, argument, device.str().c_str());
    return -1;
  }
  const c10::Storage& storage = t.storage();
  out->device = t.device().index();
  out->storage = storage.data();
  out->storage_nbytes = storage.nbytes();
  out->offset = static_cast<ptrdiff_t>(t.storage_offset() * static_cast<int64_t>(t.itemsize()));
  return 0;
}

struct Launch {
  OpenRegInductorKernel run;
  void* call;
  void (*release)(void*);
};

orError_t run_launch(void* argument) {
  auto* launch = static_cast<Launch*>(argument);
  int status = 1;
  try {
    status = launch->run(launch->call);
  } catch (const std::exception& e) {
    orKernelSetError((std::string("OpenReg: an Inductor kernel threw: ") + e.what()).c_str());
  } catch (...) {
    orKernelSetError("OpenReg: an Inductor kernel threw an exception");
  }
  launch->release(launch->call);
  delete launch;
  return status == 0 ? orSuccess : orErrorKernelFailed;
}

int launch_call(int device, OpenRegInductorKernel run, void* call, void (*release)(void*)) {
  try {
    const auto index = static_cast<c10::DeviceIndex>(device);
    const c10::Stream stream = openreg::current_stream(index);
    auto* launch = new Launch{run, call, release};
    const orStream_t native = openreg::native_stream(stream);
    const orError_t status = orLaunchKernel(native, &run_launch, launch);
    if (status != orSuccess) {
      delete launch;
      release(call);
      PyErr_Format(PyExc_RuntimeError, "OpenReg: launching an Inductor kernel on openreg:%d failed: %s", device,
                   orGetLastErrorMessage());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    release(call);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return -1;
  }
}

void* map_tensor(const OpenRegInductorTensor* tensor, int* failed) {
  *failed = 0;
  if (tensor->device == -1) return const_cast<unsigned char*>(tensor->value);  // a host scalar, by value
  if (tensor->storage == nullptr || tensor->storage_nbytes == 0) return nullptr;
  void* accessible = nullptr;
  const orError_t status = orKernelMapPointer(tensor->storage, tensor->storage_nbytes, &accessible);
  if (status != orSuccess) {
    std::ostringstream message;
    message << "OpenReg: an Inductor kernel on openreg:" << orKernelCurrentDevice()
            << " cannot reach a tensor of openreg:" << tensor->device << ": " << orGetLastErrorMessage();
    orKernelSetError(message.str().c_str());
    *failed = 1;
    return nullptr;
  }
  return static_cast<char*>(accessible) + tensor->offset;
}

void fail(const char* message) { orKernelSetError(message); }

const OpenRegInductorApi kApi = {
    OPENREG_INDUCTOR_API_VERSION, &describe_tensor, &launch_call, &map_tensor, &fail,
};

}  // namespace

namespace openreg_bindings {

void add_inductor_api(pybind11::module_& m) {
  m.attr("_inductor_api") = pybind11::capsule(static_cast<const void*>(&kApi), OPENREG_INDUCTOR_API_CAPSULE);
}

}  // namespace openreg_bindings
