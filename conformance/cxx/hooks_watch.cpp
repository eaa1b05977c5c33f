// Observing how often, and in which order, the backend's hooks are called,
// without the backend's help (no instrumentation module needed).
//
// PyTorch reaches the hooks only through at::PrivateUse1HooksInterface&, a
// virtual call through the object's vtable. watch() replaces the vtable
// entries of init() and getPinnedMemoryAllocator() with counting functions
// that call the originals. The vtable is patched in place (its page made
// writable for the write, then read-only again), so every caller, PyTorch and
// the backend alike, goes through the counters. Test processes are forked
// per test, so a patch never outlives the test that made it.
//
// This relies on the Itanium C++ ABI (Linux, macOS: GCC and Clang), where a
// pointer to a virtual member function holds 1 + the byte offset of its
// vtable slot. watch() says false when it cannot patch, and the checks then
// rely on what they can observe otherwise.
//
// context_initialized() reads PyTorch's own "lazily initialized" flag for
// PrivateUse1 (at::Context's once_flag, set when Context::lazyInitDevice ran
// the hooks' init()). It is private; an explicit template instantiation may
// name private members, which is how it is read.
#include "hooks_watch.h"

#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace pu1c {
namespace {

using Hooks = at::PrivateUse1HooksInterface;
using InitFn = void (*)(const Hooks*);
using PinnedFn = at::Allocator* (*)(const Hooks*);

std::atomic<int> init_calls{0};
std::atomic<int> pinned_calls{0};
std::atomic<int> sequence{0};
std::atomic<int> first_init{-1};
std::atomic<int> first_pinned{-1};
InitFn original_init = nullptr;
PinnedFn original_pinned = nullptr;

void note_first(std::atomic<int>& first) {
  const int now = sequence.fetch_add(1);
  int unset = -1;
  first.compare_exchange_strong(unset, now);
}

void counting_init(const Hooks* self) {
  init_calls.fetch_add(1);
  note_first(first_init);
  original_init(self);
}

at::Allocator* counting_pinned(const Hooks* self) {
  pinned_calls.fetch_add(1);
  note_first(first_pinned);
  return original_pinned(self);
}

// The vtable slot of a virtual member function (Itanium C++ ABI).
template <typename PMF>
std::ptrdiff_t slot_of(PMF pmf) {
  struct {
    std::uintptr_t ptr;
    std::ptrdiff_t adj;
  } raw;
  static_assert(sizeof(raw) == sizeof(pmf));
  std::memcpy(&raw, &pmf, sizeof raw);
  if ((raw.ptr & 1) == 0) return -1;  // not virtual: not this ABI
  return static_cast<std::ptrdiff_t>((raw.ptr - 1) / sizeof(void*));
}

// Writes `value` into `*entry`, making its page writable for the write.
bool write_entry(void** entry, void* value) {
  const long page = sysconf(_SC_PAGESIZE);
  auto* start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(entry) & ~(page - 1));
  if (mprotect(start, static_cast<size_t>(page), PROT_READ | PROT_WRITE) != 0) return false;
  *entry = value;
  mprotect(start, static_cast<size_t>(page), PROT_READ);
  return true;
}

std::mutex watch_mutex;
bool watching = false;

}  // namespace

bool watch_hooks() {
  std::lock_guard<std::mutex> lock(watch_mutex);
  if (watching) return true;
  if (!at::isPrivateUse1HooksRegistered()) return false;
  const std::ptrdiff_t init_slot = slot_of(&Hooks::init);
  const std::ptrdiff_t pinned_slot = slot_of(&Hooks::getPinnedMemoryAllocator);
  if (init_slot < 0 || pinned_slot < 0) return false;
  const Hooks& hooks = at::detail::getPrivateUse1Hooks();
  void** vtable = *reinterpret_cast<void** const*>(&hooks);
  original_init = reinterpret_cast<InitFn>(vtable[init_slot]);
  original_pinned = reinterpret_cast<PinnedFn>(vtable[pinned_slot]);
  if (!write_entry(&vtable[init_slot], reinterpret_cast<void*>(&counting_init))) return false;
  if (!write_entry(&vtable[pinned_slot], reinterpret_cast<void*>(&counting_pinned))) {
    write_entry(&vtable[init_slot], reinterpret_cast<void*>(original_init));
    return false;
  }
  watching = true;
  return true;
}

HookCalls hook_calls() {
  return {init_calls.load(), pinned_calls.load(), first_init.load(), first_pinned.load()};
}

// ------------------------------------------------ PyTorch's lazy-init flag

namespace {
struct ContextInitFlags {
  using type = std::array<c10::once_flag, at::COMPILE_TIME_MAX_DEVICE_TYPES> at::Context::*;
};
template <typename Tag, typename Tag::type Member>
struct Expose {
  friend typename Tag::type member(Tag) { return Member; }
};
template struct Expose<ContextInitFlags, &at::Context::init_>;
ContextInitFlags::type member(ContextInitFlags);
}  // namespace

bool context_initialized() {
  auto& flags = at::globalContext().*member(ContextInitFlags{});
  return flags[static_cast<size_t>(c10::DeviceType::PrivateUse1)].test_once();
}

}  // namespace pu1c
