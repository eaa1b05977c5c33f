// Memory for PyTorch: a caching, stream-aware device allocator (registered
// for PrivateUse1, so torch.accelerator.memory_* works) and a pinned host
// allocator (reached through the hooks and at::getHostAllocator).
//
// Device allocator design
//  * Blocks come from orMalloc in size classes: 512-byte steps up to 1 MiB
//    ("small pool"), 2 MiB steps above ("large pool"). A block is never split.
//  * A block belongs to the stream that was current on its device when it was
//    allocated. A freed block goes back to that stream's cache and is reused
//    only by allocations on the same stream: stream order then guarantees
//    that earlier work on the memory is finished before later work starts.
//  * record_stream(block, other) adds a user stream (of any device: peer
//    copies read blocks of another device). When such a block is
//    freed, an event is recorded on each user stream, and the block returns to
//    the cache only after all of them complete.
//  * On out-of-memory the device's cache is released (after synchronizing the
//    device) and the allocation is retried once; then OutOfMemoryError.
//  * empty_cache synchronizes each initialized device and returns every
//    cached block to the runtime, but those of graph pools in use (below):
//    allocated <= reserved always holds, and reserved == allocated right
//    after empty_cache unless a graph holds a pool.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/core/StorageImpl.h>

namespace openreg {

c10::DeviceAllocator* device_allocator();
at::HostAllocator* host_allocator();

// Tells the device allocator that `stream` uses the memory of `data_ptr`.
void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream);

// Tells the host allocator that pinned memory at `ptr` (with allocator
// context `ctx`) is read or written by work queued on `stream`, so that
// freeing it waits for that work.
bool record_host_use(void* ptr, void* ctx, c10::Stream stream);

// Grows or shrinks device storage to `new_nbytes`, keeping the common prefix
// (copied on the device's current stream). Resizing to 0 releases the memory.
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

// set_per_process_memory_fraction: the share of device `device`'s memory
// (in [0, 1]; 1 by default) this process may reserve. An allocation that
// would reserve more releases the cache and, still over, raises
// OutOfMemoryError, as CUDA's allocator does. -1: the current device.
void set_memory_fraction(c10::DeviceIndex device, double fraction);
double memory_fraction(c10::DeviceIndex device);

// Graph pools (Graph.cpp): memory a captured graph's work uses. While
// `stream` captures into `pool`, its allocations come from the pool; a block
// of the pool freed meanwhile or later is reused only by allocations into the
// pool, and empty_cache keeps it, until the pool's last graph releases it
// (CUDA's private graph pools).
c10::MempoolId_t new_graph_pool();
void retain_graph_pool(c10::MempoolId_t pool);
void release_graph_pool(c10::MempoolId_t pool);
void begin_graph_pool_allocation(const c10::Stream& stream, c10::MempoolId_t pool);
void end_graph_pool_allocation(const c10::Stream& stream);

// Whether `ptr` lies inside pinned memory of the runtime.
bool is_pinned_pointer(const void* ptr);

}  // namespace openreg
