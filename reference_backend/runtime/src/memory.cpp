// Device memory (isolated arenas), pinned host memory and copies.
#include "executor_protocol.h"
#include "internal.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace openreg::runtime {

namespace {

constexpr size_t kPage = 4096;
// Frees at least this large give their pages back to the system.
constexpr size_t kPunchThreshold = 1 << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct HostRegistry {
  std::mutex mutex;
  std::map<uintptr_t, size_t> allocations;  // base -> size
};
HostRegistry& host_registry() {
  static auto* r = new HostRegistry();  // leaked: used until process exit
  return *r;
}

bool find_host(const void* ptr, void** base, size_t* size) {
  auto& r = host_registry();
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.allocations.upper_bound(p);
  if (it == r.allocations.begin()) return false;
  --it;
  if (p >= it->first + it->second) return false;
  *base = reinterpret_cast<void*>(it->first);
  *size = it->second;
  return true;
}

}  // namespace

Arena::Arena(int device, size_t capacity)
    : device_(device), capacity_(capacity), mapped_(round_up(capacity, kPage)) {}

bool Arena::init(std::string* error) {
  std::string name = "openreg-device-" + std::to_string(device_);
  fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd_ < 0) {
    *error = std::string("memfd_create failed: ") + std::strerror(errno);
    return false;
  }
  if (ftruncate(fd_, static_cast<off_t>(mapped_)) != 0) {
    *error = std::string("ftruncate failed: ") + std::strerror(errno);
    return false;
  }
  // MAP_NORESERVE: capacity is address space; pages exist once written.
  void* device = mmap(nullptr, mapped_, PROT_NONE, MAP_SHARED | MAP_NORESERVE,
                      fd_, 0);
  void* kernel = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_NORESERVE, fd_, 0);
  if (device == MAP_FAILED || kernel == MAP_FAILED) {
    *error = std::string("mmap failed: ") + std::strerror(errno);
    return false;
  }
  device_base_ = static_cast<char*>(device);
  kernel_base_ = static_cast<char*>(kernel);
  insert_free(0, capacity_);
  return true;
}

bool Arena::init_reserved(std::string* error,
                          std::function<void(void* start, size_t count)> discard) {
  // Both processes must be able to place the range at the same address: ask
  // for one far from where either puts its libraries and heap (the kernel
  // picks another range if this one is taken; the executor then reports it).
  constexpr uintptr_t kHintBase = uintptr_t{1} << 44;  // 16 TiB
  const size_t stride = round_up(mapped_, size_t{1} << 30) + (size_t{1} << 30);
  void* hint = reinterpret_cast<void*>(kHintBase + static_cast<uintptr_t>(device_) * stride);
  void* device = mmap(hint, mapped_, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (device == MAP_FAILED) {
    *error = std::string("cannot reserve the device's addresses: ") + std::strerror(errno);
    return false;
  }
  device_base_ = static_cast<char*>(device);
  kernel_base_ = nullptr;  // the memory is in the executor only
  discard_ = std::move(discard);
  insert_free(0, capacity_);
  return true;
}

void Arena::insert_free(size_t offset, size_t size) {
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

void Arena::erase_free(size_t offset, size_t size) {
  free_by_offset_.erase(offset);
  free_by_size_.erase({size, offset});
}

void* Arena::allocate(size_t requested) {
  const size_t size = round_up(requested, OR_ALLOCATION_ALIGNMENT);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_by_size_.lower_bound({size, 0});  // best fit
  if (it == free_by_size_.end()) return nullptr;
  auto [block_size, offset] = *it;
  erase_free(offset, block_size);
  if (block_size > size) insert_free(offset + size, block_size - size);
  allocated_.emplace(offset, Allocation{size, requested});
  used_ += size;
  return device_base_ + offset;
}

bool Arena::release(void* ptr) {
  const size_t offset = static_cast<char*>(ptr) - device_base_;
  size_t size;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(offset);
    if (it == allocated_.end()) return false;
    size = it->second.reserved;
    // From here the block is neither allocated nor free: no other thread can
    // free it again or be handed it by allocate().
    allocated_.erase(it);
  }
  // Give the block's whole pages back, so that freed memory does not stay
  // resident. This must happen before the block is on the free list: once
  // it is there another thread may allocate it and write to it, and a hole
  // punched after that write would turn the write into zeros. The pages lie
  // inside the block, so no live allocation shares them.
  if (size >= kPunchThreshold) {
    punch(offset, size);
  }
  size_t start = offset, merged = size;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    used_ -= size;
    // Coalesce with free neighbours.
    auto next = free_by_offset_.find(start + merged);
    if (next != free_by_offset_.end()) {
      const size_t next_size = next->second;
      erase_free(next->first, next_size);
      merged += next_size;
    }
    auto prev = free_by_offset_.lower_bound(start);
    if (prev != free_by_offset_.begin()) {
      --prev;
      if (prev->first + prev->second == start) {
        const size_t prev_offset = prev->first, prev_size = prev->second;
        erase_free(prev_offset, prev_size);
        start = prev_offset;
        merged += prev_size;
      }
    }
    insert_free(start, merged);
  }
  return true;
}

void Arena::punch(size_t offset, size_t size) {
  const size_t first = round_up(offset, kPage);
  const size_t last = (offset + size) / kPage * kPage;
  if (last > first && discard_) {
    discard_(device_base_ + first, last - first);
  } else if (last > first) {
    fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(first), static_cast<off_t>(last - first));
  }
}

bool Arena::find(const void* ptr, size_t count, void** base,
                 size_t* size) const {
  if (!contains(ptr)) return false;
  size_t offset = static_cast<const char*>(ptr) - device_base_;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.upper_bound(offset);
  if (it == allocated_.begin()) return false;
  --it;
  const size_t end = it->first + it->second.requested;
  if (offset >= end) return false;
  if (count > end - offset) return false;
  *base = device_base_ + it->first;
  *size = it->second.requested;
  return true;
}

size_t Arena::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

namespace {

const char* kind_name(orMemcpyKind kind) {
  switch (kind) {
    case orMemcpyHostToHost: return "HostToHost";
    case orMemcpyHostToDevice: return "HostToDevice";
    case orMemcpyDeviceToHost: return "DeviceToHost";
    case orMemcpyDeviceToDevice: return "DeviceToDevice";
    default: return "?";
  }
}

// Checks that [ptr, ptr+count) is inside one live allocation of some device.
orError_t check_device_range(const char* call, const char* argument,
                             const void* ptr, size_t count, Device** owner) {
  Device* d = device_owning(ptr);
  void* base;
  size_t size;
  if (!d || !d->arena.find(ptr, count, &base, &size)) {
    return fail(orErrorInvalidPointer,
                "%s: %s=%p (%zu bytes) is not inside a live OpenReg device "
                "allocation", call, argument, ptr, count);
  }
  if (d->lost.load(std::memory_order_acquire)) return fail_lost(call, d->index);
  *owner = d;
  return orSuccess;
}

orError_t check_host_pointer(const char* call, const char* argument,
                             const void* ptr, orMemcpyKind kind) {
  if (device_owning(ptr)) {
    return fail(orErrorInvalidPointer,
                "%s: %s=%p is device memory but kind=%s expects host memory",
                call, argument, ptr, kind_name(kind));
  }
  return orSuccess;
}

// Validates a copy and returns the stream's device role. `stream_device` is
// the device whose stream will run the copy.
orError_t check_copy(const char* call, void* dst, const void* src, size_t count,
                     orMemcpyKind kind, int* stream_device) {
  const int kind_value = static_cast<int>(kind);
  if (kind_value < orMemcpyHostToHost || kind_value > orMemcpyDeviceToDevice) {
    return fail(orErrorInvalidValue, "%s: kind=%d is invalid: expected one of "
                "orMemcpyHostToHost(0), HostToDevice(1), DeviceToHost(2), "
                "DeviceToDevice(3)", call, kind_value);
  }
  if (count == 0) return orSuccess;
  if (!dst || !src) {
    return fail(orErrorInvalidValue, "%s: dst and src must not be null "
                "(dst=%p, src=%p)", call, dst, src);
  }
  Device* dst_dev = nullptr;
  Device* src_dev = nullptr;
  switch (kind) {
    case orMemcpyHostToHost:
      if (orError_t e = check_host_pointer(call, "dst", dst, kind)) return e;
      if (orError_t e = check_host_pointer(call, "src", src, kind)) return e;
      *stream_device = -1;
      return orSuccess;
    case orMemcpyHostToDevice:
      if (orError_t e = check_device_range(call, "dst", dst, count, &dst_dev)) return e;
      if (orError_t e = check_host_pointer(call, "src", src, kind)) return e;
      *stream_device = dst_dev->index;
      return orSuccess;
    case orMemcpyDeviceToHost:
      if (orError_t e = check_device_range(call, "src", src, count, &src_dev)) return e;
      if (orError_t e = check_host_pointer(call, "dst", dst, kind)) return e;
      *stream_device = src_dev->index;
      return orSuccess;
    case orMemcpyDeviceToDevice:
      if (orError_t e = check_device_range(call, "dst", dst, count, &dst_dev)) return e;
      if (orError_t e = check_device_range(call, "src", src, count, &src_dev)) return e;
      *stream_device = dst_dev->index;  // either side may run a peer copy
      return orSuccess;
    default:
      break;  // unreachable: the kind was checked above
  }
  return orSuccess;  // unreachable: the kind was checked above
}

// Accessible address for either side of a copy, evaluated on the worker.
void* accessible(const void* ptr) {
  Device* d = device_owning(ptr);
  return d ? d->arena.kernel_alias(ptr) : const_cast<void*>(ptr);
}

}  // namespace

}  // namespace openreg::runtime

using namespace openreg::runtime;

namespace {

#if defined(__x86_64__)
bool has_erms() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 9));  // ERMS
}
#endif

// Every copy the runtime makes. glibc's memmove, on copies large enough for
// its streaming-store path, loses up to 3.5x of its bandwidth when the
// destination sits a little after the source modulo 4 KiB (4K aliasing
// between its loads and stores; measured on the project's AMD EPYC
// machines, docs/performance.md). That is the usual device-to-host copy:
// device blocks are page aligned, PyTorch's large host blocks start 64
// bytes into a page. `rep movsb` (ERMS) is immune when the two are 64-byte
// aligned to each other, so it takes exactly those copies.
void copy_bytes(void* dst, const void* src, size_t count) {
#if defined(__x86_64__)
  static const bool erms = has_erms();
  constexpr size_t kStreamingCopy = size_t{16} << 20;
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t skew = (d - s) & 4095;
  const bool overlap = d < s + count && s < d + count;
  if (erms && count >= kStreamingCopy && !overlap && skew != 0 && skew < 1024 && skew % 64 == 0) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(count) : : "memory");
    return;
  }
#endif
  std::memmove(dst, src, count);
}

}  // namespace

extern "C" {

orError_t orMalloc(void** ptr, size_t size) {
  if (!ptr) return fail(orErrorInvalidValue, "orMalloc: ptr is null");
  *ptr = nullptr;
  int device = 0;
  if (orError_t e = current_device("orMalloc", &device)) return e;
  Device* d = nullptr;
  if (orError_t e = get_device("orMalloc", device, &d)) return e;
  if (size == 0) return orSuccess;
  void* p = size <= d->arena.capacity() ? d->arena.allocate(size) : nullptr;
  if (!p) {
    size_t used = d->arena.used();
    return fail(orErrorMemoryAllocation,
                "orMalloc: out of memory on device %d: tried to allocate %zu "
                "bytes; %zu of %zu bytes are free (capacity set by "
                "OPENREG_DEVICE_MEMORY)", device, size,
                d->arena.capacity() - used, d->arena.capacity());
  }
  g_mallocs.fetch_add(1, std::memory_order_relaxed);
  *ptr = p;
  return orSuccess;
}

orError_t orFree(void* ptr) {
  if (!ptr) return orSuccess;
  if (orError_t e = check_not_forked("orFree")) return e;
  Device* d = device_owning(ptr);
  if (!d || !d->arena.release(ptr)) {
    return fail(orErrorInvalidPointer,
                "orFree: ptr=%p is not the start of a live OpenReg device "
                "allocation (already freed, interior or host pointer?)", ptr);
  }
  g_frees.fetch_add(1, std::memory_order_relaxed);
  return orSuccess;
}

orError_t orMallocHost(void** ptr, size_t size) {
  if (!ptr) return fail(orErrorInvalidValue, "orMallocHost: ptr is null");
  *ptr = nullptr;
  if (orError_t e = check_not_forked("orMallocHost")) return e;
  if (size == 0) return orSuccess;
  void* p = mmap(nullptr, round_up(size, kPage), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return fail(orErrorMemoryAllocation, "orMallocHost: cannot allocate %zu "
                "bytes of pinned host memory: %s", size, std::strerror(errno));
  }
  auto& r = host_registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.allocations.emplace(reinterpret_cast<uintptr_t>(p), size);
  }
  *ptr = p;
  return orSuccess;
}

orError_t orFreeHost(void* ptr) {
  if (!ptr) return orSuccess;
  auto& r = host_registry();
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.allocations.end()) {
      return fail(orErrorInvalidPointer,
                  "orFreeHost: ptr=%p is not the start of a live pinned host "
                  "allocation", ptr);
    }
    size = it->second;
    r.allocations.erase(it);
  }
  munmap(ptr, round_up(size, kPage));
  return orSuccess;
}

orError_t orPointerGetAttributes(orPointerAttributes* attributes,
                                 const void* ptr) {
  if (!attributes) {
    return fail(orErrorInvalidValue, "orPointerGetAttributes: attributes is null");
  }
  *attributes = {orMemoryTypeUnregistered, -1, nullptr, 0};
  void* base = nullptr;
  size_t size = 0;
  if (Device* d = device_owning(ptr)) {
    if (d->arena.find(ptr, 1, &base, &size)) {
      *attributes = {orMemoryTypeDevice, d->index, base, size};
    }
    return orSuccess;
  }
  if (find_host(ptr, &base, &size)) {
    *attributes = {orMemoryTypeHost, -1, base, size};
  }
  return orSuccess;
}

}  // extern "C"

namespace {

// Validates a copy on stream `s` (resolved already by the caller).
orError_t check_stream_copy(const char* call, void* dst, const void* src, size_t count,
                            orMemcpyKind kind, const StreamRef& s) {
  int copy_device = -1;
  if (orError_t e = check_copy(call, dst, src, count, kind, &copy_device)) return e;
  if (count == 0) return orSuccess;
  if (kind == orMemcpyDeviceToDevice) {
    // A peer copy may run on either side's stream.
    Device* src_dev = device_owning(src);
    if (s->device != copy_device && s->device != src_dev->index) {
      return fail(orErrorDeviceMismatch,
                  "%s: stream of device %d cannot copy from device %d to "
                  "device %d; use a stream of either device", call, s->device,
                  src_dev->index, copy_device);
    }
  } else if (copy_device >= 0 && s->device != copy_device) {
    return fail(orErrorDeviceMismatch,
                "%s: the device memory belongs to device %d but the stream "
                "belongs to device %d", call, copy_device, s->device);
  }
  return orSuccess;
}

// Process mode: the device side lives in an executor. Host memory moves
// with process_vm_writev/readv (one copy, no staging), a copy inside one
// device runs in its executor, and a copy between two devices goes through
// host memory in chunks.
orError_t process_copy(void* dst, const void* src, size_t count) {
  const char* call = "copy";
  Device* to = device_owning(dst);
  Device* from = device_owning(src);
  if (to && from && to == from) {
    return to->executor->request(call, openreg::executor::kCopy, reinterpret_cast<uintptr_t>(dst),
                                 reinterpret_cast<uintptr_t>(src), count);
  }
  if (to && from) {
    constexpr size_t kChunk = size_t{8} << 20;
    std::unique_ptr<char[]> bounce(new char[std::min(count, kChunk)]);
    for (size_t done = 0; done < count; done += kChunk) {
      const size_t n = std::min(kChunk, count - done);
      if (orError_t e = from->executor->read(call, bounce.get(),
                                             static_cast<const char*>(src) + done, n)) return e;
      if (orError_t e = to->executor->write(call, static_cast<char*>(dst) + done,
                                            bounce.get(), n)) return e;
    }
    return orSuccess;
  }
  if (to) return to->executor->write(call, dst, src, count);
  if (from) return from->executor->read(call, dst, src, count);
  copy_bytes(dst, src, count);
  return orSuccess;
}

std::function<orError_t()> copy_work(void* dst, const void* src, size_t count) {
  if (config().process_mode) {
    return [dst, src, count]() { return process_copy(dst, src, count); };
  }
  return [dst, src, count]() {
    copy_bytes(accessible(dst), accessible(src), count);
    return orSuccess;
  };
}

}  // namespace

extern "C" {

orError_t orMemcpyAsync(void* dst, const void* src, size_t count,
                        orMemcpyKind kind, orStream_t stream) {
  const char* call = "orMemcpyAsync";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (orError_t e = check_stream_copy(call, dst, src, count, kind, s)) return e;
  if (count == 0) return orSuccess;
  s->enqueue({copy_work(dst, src, count), nullptr, "copy"});
  return orSuccess;
}

orError_t orMemcpySync(void* dst, const void* src, size_t count, orMemcpyKind kind,
                       orStream_t stream) {
  const char* call = "orMemcpySync";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (orError_t e = check_stream_copy(call, dst, src, count, kind, s)) return e;
  if (count == 0) return run_and_wait(call, s, [] { return orSuccess; }, /*is_kernel=*/false);
  return run_and_wait(call, s, copy_work(dst, src, count), /*is_kernel=*/false);
}

orError_t orMemcpy(void* dst, const void* src, size_t count, orMemcpyKind kind) {
  const char* call = "orMemcpy";
  int copy_device = -1;
  if (orError_t e = check_copy(call, dst, src, count, kind, &copy_device)) return e;
  if (count == 0) return orSuccess;
  if (copy_device < 0) {  // host to host
    copy_bytes(dst, src, count);
    return orSuccess;
  }
  if (orError_t e = check_not_forked(call)) return e;
  orStream_t stream = nullptr;
  if (orError_t e = orStreamGetDefault(copy_device, &stream)) return e;
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (orError_t e = check_stream_copy(call, dst, src, count, kind, s)) return e;
  return run_and_wait(call, s, copy_work(dst, src, count), /*is_kernel=*/false);
}

orError_t orMemsetAsync(void* dst, int value, size_t count, orStream_t stream) {
  const char* call = "orMemsetAsync";
  StreamRef s;
  if (orError_t e = resolve_stream(call, stream, &s)) return e;
  if (count == 0) return orSuccess;
  Device* d = nullptr;
  if (orError_t e = check_device_range(call, "dst", dst, count, &d)) return e;
  if (d->index != s->device) {
    return fail(orErrorDeviceMismatch, "%s: dst belongs to device %d but the "
                "stream belongs to device %d", call, d->index, s->device);
  }
  if (d->executor) {
    Executor* ex = d->executor;
    s->enqueue({[ex, dst, value, count]() {
                  return ex->request("orMemsetAsync", openreg::executor::kMemset,
                                     reinterpret_cast<uintptr_t>(dst),
                                     static_cast<unsigned char>(value), count);
                },
                nullptr, "memset"});
    return orSuccess;
  }
  void* alias = d->arena.kernel_alias(dst);
  s->enqueue({[alias, value, count]() {
                std::memset(alias, value, count);
                return orSuccess;
              },
              nullptr, "memset"});
  return orSuccess;
}

}  // extern "C"
