// Backend metadata: flags a tensor carries next to its data, kept by
// torch.save / torch.load and by PyTorch's shallow copies.
//
// PyTorch gives every TensorImpl an optional c10::BackendMeta
// (c10/core/TensorImpl.h). Its serialization goes through one pair of
// functions per device type, registered with
// torch::jit::TensorBackendMetaRegistry
// (torch/csrc/jit/serialization/pickler_helper.h):
//
// * the getter adds the tensor's metadata to a map<string, bool>; PyTorch
//   calls it for torch._utils.get_tensor_metadata and when it pickles a
//   tensor (torch.save, pickle), which stores the map next to the storage;
// * the setter reads the map back; PyTorch calls it for
//   torch._utils.set_tensor_metadata and when it rebuilds a loaded tensor
//   (_rebuild_tensor_v2/v3), after taking out its own keys (conj, neg).
//
// TensorImpl::copy_tensor_metadata copies the BackendMeta through clone(), so
// detach(), .data and nn.Parameter keep it; operators, views, clone() and
// .to() make new TensorImpls without it.
//
// OpenReg has no metadata of its own to keep. It shows the mechanism with
// user flags: it keeps every key that starts with "openreg." and ignores the
// others, as PyTorch does for devices that register no functions (a tensor
// saved on another backend can still be loaded onto OpenReg).

#include <c10/core/TensorImpl.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

namespace openreg {

namespace {

constexpr std::string_view kPrefix = "openreg.";

struct OpenRegMeta final : c10::BackendMeta {
  std::map<std::string, bool> flags;

  // A copy, not the same object: setting flags on a detached tensor must not
  // change the tensor it was detached from.
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>& ptr) const override {
    auto copy = c10::make_intrusive<OpenRegMeta>();
    copy->flags = flags;
    return copy;
  }
};

// The tensor's flags, or nullptr when it has none. FakeTensors and tensors
// made by operators have no BackendMeta at all.
const OpenRegMeta* meta_of(const at::Tensor& t) {
  c10::BackendMeta* meta = t.unsafeGetTensorImpl()->get_backend_meta();
  return dynamic_cast<const OpenRegMeta*>(meta);
}

void get_metadata(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (const OpenRegMeta* meta = meta_of(t)) {
    for (const auto& [key, value] : meta->flags) metadata[key] = value;
  }
}

void set_metadata(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  auto updated = c10::make_intrusive<OpenRegMeta>();
  if (const OpenRegMeta* meta = meta_of(t)) updated->flags = meta->flags;
  bool any = false;
  for (const auto& [key, value] : metadata) {
    if (std::string_view(key).substr(0, kPrefix.size()) != kPrefix) continue;
    updated->flags[key] = value;
    any = true;
  }
  // Copy on write: a BackendMeta another TensorImpl may share is never changed.
  if (any) t.unsafeGetTensorImpl()->set_backend_meta(updated);
}

struct Registration {
  Registration() {
    torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &get_metadata, &set_metadata);
  }
} registration;

}  // namespace

}  // namespace openreg
