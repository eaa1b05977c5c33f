// Process mode (OPENREG_EXECUTOR=process): host-function kernels
// (orLaunchKernel, orLaunchKernelSync) over staged copies of device memory.
//
// The device's memory lives only in its executor process, but a host
// function runs in this process, on the stream's worker (or, for an idle
// stream, on the caller of orLaunchKernelSync), in stream order, as
// CUDA's cudaLaunchHostFunc. While it runs, orKernelMapPointer hands it a
// host copy: each allocation it maps gets a host buffer of the allocation's
// size (reserved address space), and the pages a map covers are read from
// the executor on first use (process_vm_readv), along with a snapshot. So
// every map of one allocation within a kernel returns addresses in one
// buffer, and overlapping maps see each other's writes. When the function
// returns, the bytes that differ from the snapshot are written back
// (process_vm_writev), run by run: bytes the kernel did not change are not
// written, so kernels on other streams may write other bytes of the same
// allocation meanwhile, as they could in thread mode. A range the kernel
// marked written (orKernelMarkWritten: it wrote every byte) is written back
// whole instead, as one run: comparing tells only which bytes changed, and
// an output whose elements keep some of their bytes (a float32 sum) would
// be millions of runs.
#include "internal.h"

#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace openreg::runtime {

namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

struct StagedAllocation {
  char* device = nullptr;  // the allocation's device address
  size_t size = 0;         // its requested size
  size_t reserved = 0;     // size rounded up to whole pages
  char* data = nullptr;      // what the kernel sees and writes
  char* snapshot = nullptr;  // what the device held when a page was staged
  std::vector<bool> staged;  // per page of the allocation
  // Byte ranges [first, second) the kernel marked written (staged pages).
  std::vector<std::pair<size_t, size_t>> written;

  StagedAllocation() = default;
  StagedAllocation(const StagedAllocation&) = delete;
  StagedAllocation& operator=(const StagedAllocation&) = delete;
  ~StagedAllocation() {
    if (data) munmap(data, reserved);
    if (snapshot) munmap(snapshot, reserved);
  }
};

// The staging of the host kernel running on this thread.
struct Staging {
  Device* device;
  std::map<char*, std::unique_ptr<StagedAllocation>> allocations;  // by device address
};
thread_local Staging* tls_staging = nullptr;

char* reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  // Large stagings fault in 2 MiB pages where the kernel allows it: a
  // fresh 64 MiB buffer is otherwise 16,384 page faults per kernel.
  if (bytes >= (size_t{2} << 20)) madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<char*>(p);
}

// Calls fn(lo, hi) for each run of pages in [first, end) of `a` whose
// staged flag is `staged`, as the byte range [lo, hi) of the allocation.
template <typename Fn>
orError_t for_each_page_run(const StagedAllocation& a, size_t first, size_t end, bool staged, Fn fn) {
  const size_t page = page_size();
  size_t p = first;
  while (p < end) {
    if (a.staged[p] != staged) {
      ++p;
      continue;
    }
    size_t q = p;
    while (q < end && a.staged[q] == staged) ++q;
    if (orError_t e = fn(p * page, std::min(q * page, a.size))) return e;
    p = q;
  }
  return orSuccess;
}

// Reads pages [first, end) of `a` that are not staged yet.
orError_t stage_pages(const char* call, Device* d, StagedAllocation& a, size_t first, size_t end) {
  const orError_t e = for_each_page_run(a, first, end, false, [&](size_t lo, size_t hi) {
    if (orError_t r = d->executor->read(call, a.data + lo, a.device + lo, hi - lo)) return r;
    std::memcpy(a.snapshot + lo, a.data + lo, hi - lo);
    return orSuccess;
  });
  if (e) return e;
  std::fill(a.staged.begin() + first, a.staged.begin() + end, true);
  return orSuccess;
}

// Appends the runs of bytes in [lo, hi) where `a.data` differs from the
// snapshot, as (host, device) pairs.
void changed_runs(const StagedAllocation& a, size_t lo, size_t hi, std::vector<iovec>* local,
                  std::vector<iovec>* remote) {
  const char* now = a.data;
  const char* before = a.snapshot;
  size_t i = lo;
  while (i < hi) {
    // Equal bytes, a word at a time where it can.
    while (i + 8 <= hi && std::memcmp(now + i, before + i, 8) == 0) i += 8;
    while (i < hi && now[i] == before[i]) ++i;
    if (i >= hi) break;
    const size_t start = i;
    while (i < hi && now[i] != before[i]) ++i;
    local->push_back({const_cast<char*>(now) + start, i - start});
    remote->push_back({a.device + start, i - start});
  }
}

// The ranges `a` marked written, sorted, with overlapping and adjacent
// ones merged.
std::vector<std::pair<size_t, size_t>> merged_written(const StagedAllocation& a) {
  std::vector<std::pair<size_t, size_t>> ranges = a.written;
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<size_t, size_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

orError_t write_back(const char* call, const Staging& staging) {
  std::vector<iovec> local, remote;
  for (const auto& entry : staging.allocations) {
    const StagedAllocation& a = *entry.second;
    const auto written = merged_written(a);
    for_each_page_run(a, 0, a.staged.size(), true, [&](size_t lo, size_t hi) {
      // Within staged pages: marked ranges whole, the rest where it changed.
      size_t at = lo;
      for (const auto& [first, end] : written) {
        if (end <= at) continue;
        if (first >= hi) break;
        const size_t from = std::max(first, at);
        const size_t to = std::min(end, hi);
        changed_runs(a, at, from, &local, &remote);
        local.push_back({a.data + from, to - from});
        remote.push_back({a.device + from, to - from});
        at = to;
      }
      changed_runs(a, at, hi, &local, &remote);
      return orSuccess;
    });
  }
  if (local.empty()) return orSuccess;
  return staging.device->executor->write_runs(call, local.data(), remote.data(), local.size());
}

}  // namespace

orError_t run_staged_host_kernel(Device* d, orKernelFn fn, void* arg) {
  Staging staging{d, {}};
  struct Scope {
    Staging* outer;
    explicit Scope(Staging* s) : outer(tls_staging) { tls_staging = s; }
    ~Scope() { tls_staging = outer; }
  };
  orError_t result;
  {
    Scope scope(&staging);
    try {
      result = fn(arg);
    } catch (...) {
      // What the kernel wrote before it threw reaches the device, as it
      // would in thread mode; the exception is the kernel's failure.
      write_back("orLaunchKernel", staging);
      throw;
    }
  }
  // A failed kernel's writes reach the device too (as in thread mode); its
  // own failure is the one reported.
  const orError_t written = write_back("orLaunchKernel", staging);
  return result != orSuccess ? result : written;
}

orError_t staged_map_pointer(const char* call, Device* d, const void* device_ptr, size_t count,
                             void** accessible) {
  Staging* staging = tls_staging;
  if (!staging || staging->device != d) {
    return fail(orErrorNotPermitted, "%s: in process mode only host-function kernels "
                "(orLaunchKernel, orLaunchKernelSync) map device memory; module kernels use "
                "their context's map_pointer", call);
  }
  void* base_address;
  size_t size;
  if (!d->arena.find(device_ptr, count, &base_address, &size)) {
    return fail(orErrorInvalidPointer, "%s: [%p, +%zu bytes) is not inside a "
                "live allocation of device %d", call, device_ptr, count, d->index);
  }
  char* base = static_cast<char*>(base_address);
  auto& slot = staging->allocations[base];
  if (!slot) {
    auto a = std::make_unique<StagedAllocation>();
    a->device = base;
    a->size = size;
    const size_t page = page_size();
    a->reserved = (size + page - 1) / page * page;
    a->data = reserve(a->reserved);
    a->snapshot = a->data ? reserve(a->reserved) : nullptr;
    if (!a->snapshot) {
      staging->allocations.erase(base);
      return fail(orErrorMemoryAllocation, "%s: cannot reserve %zu bytes of host memory to "
                  "stage an allocation of device %d", call, a->reserved, d->index);
    }
    a->staged.assign(a->reserved / page, false);
    slot = std::move(a);
  }
  StagedAllocation& a = *slot;
  const size_t offset = static_cast<size_t>(static_cast<const char*>(device_ptr) - base);
  const size_t page = page_size();
  const size_t first = offset / page;
  const size_t end = count == 0 ? first : (offset + count + page - 1) / page;
  if (orError_t e = stage_pages(call, d, a, first, end)) return e;
  *accessible = a.data + offset;
  return orSuccess;
}

orError_t staged_mark_written(const char* call, Device* d, void* accessible, size_t count) {
  Staging* staging = tls_staging;
  if (!staging || staging->device != d) {
    return fail(orErrorNotPermitted, "%s: in process mode only host-function kernels "
                "(orLaunchKernel, orLaunchKernelSync) write staged device memory", call);
  }
  if (count == 0) return orSuccess;
  const char* p = static_cast<const char*>(accessible);
  for (auto& entry : staging->allocations) {
    StagedAllocation& a = *entry.second;
    if (p < a.data || p >= a.data + a.size || count > static_cast<size_t>(a.data + a.size - p)) continue;
    const size_t offset = static_cast<size_t>(p - a.data);
    // Staged, so that write-back covers it (a kernel only reaches pages it mapped).
    const size_t page = page_size();
    if (orError_t e = stage_pages(call, d, a, offset / page, (offset + count + page - 1) / page)) return e;
    a.written.emplace_back(offset, offset + count);
    return orSuccess;
  }
  return fail(orErrorInvalidPointer, "%s: [%p, +%zu bytes) is not inside one allocation of device %d "
              "mapped by this kernel (orKernelMapPointer)", call, accessible, count, d->index);
}

}  // namespace openreg::runtime
