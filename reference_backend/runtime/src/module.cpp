// Module kernels: named kernels of shared libraries, launched with a copied
// parameter block, runnable in both execution modes (runtime.h).
#include "executor_protocol.h"
#include "internal.h"

#include <dlfcn.h>

#include <cstring>
#include <memory>

struct orModule {
  std::string path;
  void* handle = nullptr;
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<orFunction>> functions;
};

struct orFunction {
  orModule* module = nullptr;
  std::string name;
  orModuleKernelFn fn = nullptr;
};

namespace openreg::runtime {
namespace {

struct Modules {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<orModule>> by_path;
  std::set<const orModule*> live;
  std::set<const orFunction*> functions;
};
Modules& modules() {
  static auto* m = new Modules();  // modules live until the process ends
  return *m;
}

// In thread mode a module kernel reaches memory as any kernel does.
void kernel_set_error(const char* message) { orKernelSetError(message); }

}  // namespace
}  // namespace openreg::runtime

using namespace openreg::runtime;

extern "C" {

orError_t orModuleLoad(orModule_t* module, const char* path) {
  const char* call = "orModuleLoad";
  if (!module) return fail(orErrorInvalidValue, "%s: module is null", call);
  if (!path || !*path) return fail(orErrorInvalidValue, "%s: path is null or empty", call);
  Modules& m = modules();
  std::lock_guard<std::mutex> lock(m.mutex);
  auto it = m.by_path.find(path);
  if (it != m.by_path.end()) {
    *module = it->second.get();
    return orSuccess;
  }
  // Loaded here in both modes: names are checked at orModuleGetFunction, and
  // thread mode runs the kernels from this copy.
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    return fail(orErrorInvalidValue, "%s: cannot load module '%s': %s", call, path, dlerror());
  }
  auto fresh = std::make_unique<orModule>();
  fresh->path = path;
  fresh->handle = handle;
  *module = fresh.get();
  m.live.insert(fresh.get());
  m.by_path.emplace(path, std::move(fresh));
  return orSuccess;
}

orError_t orModuleGetFunction(orFunction_t* function, orModule_t module, const char* name) {
  const char* call = "orModuleGetFunction";
  if (!function) return fail(orErrorInvalidValue, "%s: function is null", call);
  if (!name || !*name) return fail(orErrorInvalidValue, "%s: name is null or empty", call);
  Modules& m = modules();
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.live.count(module)) {
      return fail(orErrorInvalidHandle, "%s: module=%p is not a loaded module", call,
                  static_cast<void*>(module));
    }
  }
  std::lock_guard<std::mutex> lock(module->mutex);
  auto it = module->functions.find(name);
  if (it == module->functions.end()) {
    auto fn = reinterpret_cast<orModuleKernelFn>(dlsym(module->handle, name));
    if (!fn) {
      return fail(orErrorInvalidValue, "%s: module '%s' has no kernel '%s'", call,
                  module->path.c_str(), name);
    }
    auto fresh = std::make_unique<orFunction>();
    fresh->module = module;
    fresh->name = name;
    fresh->fn = fn;
    {
      std::lock_guard<std::mutex> registry(m.mutex);
      m.functions.insert(fresh.get());
    }
    it = module->functions.emplace(name, std::move(fresh)).first;
  }
  *function = it->second.get();
  return orSuccess;
}

orError_t orLaunchModuleKernel(orStream_t stream, orFunction_t function, const void* params,
                               size_t params_size) {
  const char* call = "orLaunchModuleKernel";
  {
    Modules& m = modules();
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.functions.count(function)) {
      return fail(orErrorInvalidHandle, "%s: function=%p is not a module kernel", call,
                  static_cast<void*>(function));
    }
  }
  if (params_size > OR_MAX_KERNEL_PARAMS) {
    return fail(orErrorInvalidValue, "%s: params_size=%zu is out of range: at most %d bytes",
                call, params_size, OR_MAX_KERNEL_PARAMS);
  }
  if (params_size && !params) {
    return fail(orErrorInvalidValue, "%s: params is null but params_size=%zu", call,
                params_size);
  }
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  // A live stream's device is initialized (resolve_stream checked it is not lost).
  Device* d = device_if_initialized(s->device);
  g_kernels.fetch_add(1, std::memory_order_relaxed);
  if (d->executor) {
    // The request as the executor reads it: header, path, name, parameters.
    const std::string& path = function->module->path;
    const std::string& name = function->name;
    openreg::executor::KernelHeader h{};
    h.path_size = static_cast<uint32_t>(path.size());
    h.name_size = static_cast<uint32_t>(name.size());
    h.params_offset = static_cast<uint32_t>((sizeof(h) + path.size() + name.size() + 15) / 16 * 16);
    h.params_size = static_cast<uint32_t>(params_size);
    auto request = std::make_shared<std::vector<unsigned char>>(h.params_offset + params_size);
    std::memcpy(request->data(), &h, sizeof(h));
    std::memcpy(request->data() + sizeof(h), path.data(), path.size());
    std::memcpy(request->data() + sizeof(h) + path.size(), name.data(), name.size());
    if (params_size) std::memcpy(request->data() + h.params_offset, params, params_size);
    if (request->size() > openreg::executor::kPayload) {
      return fail(orErrorInvalidValue, "%s: the module path and kernel name are too long "
                  "(%zu bytes with the parameters; at most %zu)", call, request->size(),
                  openreg::executor::kPayload);
    }
    Executor* ex = d->executor;
    s->enqueue({[ex, request]() {
                  return ex->request("module kernel", openreg::executor::kKernel, 0, 0, 0,
                                     request->data(), request->size());
                },
                nullptr, "module kernel"});
    return orSuccess;
  }
  // 16-byte aligned copy of the parameters (std::max_align_t storage).
  auto copy = std::make_shared<std::vector<std::max_align_t>>(
      (params_size + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t));
  if (params_size) std::memcpy(copy->data(), params, params_size);
  orModuleKernelFn fn = function->fn;
  const int device = s->device;
  s->enqueue({[fn, copy, params_size, device]() {
                orKernelContext ctx{};
                ctx.device = device;
                ctx.map_pointer = orKernelMapPointer;
                ctx.set_error = kernel_set_error;
                return fn(&ctx, copy->data(), params_size);
              },
              nullptr, "module kernel"});
  return orSuccess;
}

}  // extern "C"
