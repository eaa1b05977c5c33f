#include "Allocator.h"

#include "DeviceManagement.h"
#include "Exception.h"
#include "Stream.h"

#include <c10/util/irange.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace openreg {

namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kSmallLimit = 1 << 20;   // blocks up to 1 MiB are "small"
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeStep = 2 << 20;

size_t size_class(size_t n) {
  const size_t step = n <= kSmallLimit ? kSmallStep : kLargeStep;
  return (n + step - 1) / step * step;
}

struct Block {
  c10::DeviceIndex device;
  c10::Stream stream;  // allocation stream: the block is cached for it
  size_t size;         // size class (bytes held from the runtime)
  size_t requested;
  void* ptr;
  std::vector<c10::Stream> uses;  // other streams, from record_stream
  // The graph pool the block was allocated for ({0, 0}: none). While the
  // pool has graphs, its blocks are cached for it alone and never given
  // back to the runtime: replays write them.
  c10::MempoolId_t pool{0, 0};
};

constexpr c10::MempoolId_t kNoPool{0, 0};

// Per-device state. Guarded by `mutex`.
struct DeviceCache {
  std::mutex mutex;
  // Held for a whole release_cache, device wait included. A thread out of
  // memory while another releases the cache waits here for those blocks to
  // reach the runtime, instead of finding the cache empty, retrying at once
  // and failing with memory that is about to be free (CUDA's allocator holds
  // its lock through the release for the same reason).
  std::mutex release_mutex;
  std::unordered_map<void*, Block*> active;
  // (graph pool, stream id, size class) -> cached blocks
  std::map<std::tuple<c10::MempoolId_t, c10::StreamId, size_t>, std::vector<Block*>> cached;
  // Streams capturing a graph, and the pool their allocations come from.
  std::vector<std::pair<c10::Stream, c10::MempoolId_t>> capturing;
  // set_per_process_memory_fraction: reserved memory may not exceed this
  // share of the device's memory (1: all of it).
  double fraction = 1.0;
  // Freed blocks still used by other streams, with one event per user.
  std::vector<std::pair<Block*, std::vector<orEvent_t>>> pending;
  DeviceStats stats;
};

void update(StatArray& array, size_t size, bool small, int64_t delta) {
  auto apply = [&](Stat& s) {
    if (delta > 0) s.increase(static_cast<size_t>(delta));
    else s.decrease(static_cast<size_t>(-delta));
  };
  (void)size;
  apply(array[static_cast<size_t>(StatType::AGGREGATE)]);
  apply(array[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)]);
}

void for_each_stat(DeviceStats& s, const std::function<void(Stat&)>& f) {
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                       &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                       &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& stat : *a) f(stat);
  }
  f(s.oversize_allocations);
  f(s.oversize_segments);
}

// Runs `fn` with `device` as the runtime's current device (raw runtime calls:
// this runs inside deleters, which must not throw).
template <typename Fn>
orError_t on_device(int device, Fn fn) {
  int previous = 0;
  if (orError_t e = orGetDevice(&previous)) return e;
  if (previous != device) orSetDevice(device);
  orError_t status = fn();
  if (previous != device) orSetDevice(previous);
  return status;
}

void delete_block(void* ctx);

class OpenRegDeviceAllocator final : public c10::DeviceAllocator {
 public:
  OpenRegDeviceAllocator() {
    for (int i = 0; i < device_count(); ++i) {
      caches_.push_back(std::make_unique<DeviceCache>());
    }
  }

  c10::DataPtr allocate(size_t nbytes) override {
    const auto device = current_device();
    const c10::Device torch_device(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) return c10::DataPtr(nullptr, torch_device);
    used_ = true;
    const c10::Stream stream = current_stream(device);
    const size_t size = size_class(nbytes);
    const bool small = size <= kSmallLimit;
    DeviceCache& cache = *caches_[device];

    Block* block = nullptr;
    c10::MempoolId_t pool = kNoPool;
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      for (const auto& [capturing_stream, capture_pool] : cache.capturing) {
        if (capturing_stream == stream) pool = capture_pool;
      }
      reclaim_finished(cache);
      block = take_cached(cache, pool, stream, size);
    }
    if (!block) {
      // No lock while asking the runtime (and while releasing the cache,
      // which waits for the device): work finishing on a worker may free
      // blocks of this device meanwhile.
      void* ptr = nullptr;
      orError_t status = within_fraction(cache, device, size) ? orMalloc(&ptr, size) : orErrorMemoryAllocation;
      if (status == orErrorMemoryAllocation) {
        // Give the cache back to the runtime and try once more.
        {
          std::lock_guard<std::mutex> lock(cache.mutex);
          cache.stats.num_alloc_retries++;
        }
        release_cache(cache, device);
        status = within_fraction(cache, device, size) ? orMalloc(&ptr, size) : orErrorMemoryAllocation;
      }
      if (status == orErrorMemoryAllocation) {
        DeviceStats s;
        {
          std::lock_guard<std::mutex> lock(cache.mutex);
          cache.stats.num_ooms++;
          s = cache.stats;
        }
        size_t free_bytes = 0, total_bytes = 0;
        orDeviceGetMemoryInfo(device, &free_bytes, &total_bytes);
        const double fraction = memory_fraction(static_cast<c10::DeviceIndex>(device));
        TORCH_CHECK_WITH(OutOfMemoryError, false,
            "OpenReg out of memory on device ", static_cast<int>(device),
            ": tried to allocate ", nbytes, " bytes. The device has ",
            total_bytes, " bytes (OPENREG_DEVICE_MEMORY), of which ",
            free_bytes, " are free; PyTorch has allocated ",
            s.allocated_bytes[0].current, " bytes and reserved ",
            s.reserved_bytes[0].current, " bytes",
            fraction < 1.0 ? c10::str("; this process may reserve ", allowed_bytes(fraction, total_bytes),
                                      " bytes (set_per_process_memory_fraction(", fraction, "))")
                           : std::string(),
            ".");
      }
      OPENREG_CHECK(status);
      block = new Block{device, stream, size, 0, ptr, {}, pool};
      std::lock_guard<std::mutex> lock(cache.mutex);
      cache.stats.num_device_alloc++;
      update(cache.stats.segment, size, small, 1);
      update(cache.stats.reserved_bytes, size, small, static_cast<int64_t>(size));
    }
    std::lock_guard<std::mutex> lock(cache.mutex);
    block->requested = nbytes;
    cache.active.emplace(block->ptr, block);
    update(cache.stats.allocation, size, small, 1);
    update(cache.stats.active, size, small, 1);
    update(cache.stats.allocated_bytes, size, small, static_cast<int64_t>(size));
    update(cache.stats.active_bytes, size, small, static_cast<int64_t>(size));
    update(cache.stats.requested_bytes, size, small, static_cast<int64_t>(nbytes));
    return c10::DataPtr(block->ptr, block, &delete_block, torch_device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count == 0) return;
    orPointerAttributes attributes;
    OPENREG_CHECK(orPointerGetAttributes(&attributes, dest));
    TORCH_CHECK(attributes.type == orMemoryTypeDevice,
                "OpenReg: copy_data: dest is not OpenReg device memory");
    const orStream_t stream = native_stream(current_stream(attributes.device));
    OPENREG_CHECK(orMemcpyAsync(dest, src, count, orMemcpyDeviceToDevice, stream));
    OPENREG_CHECK(orStreamSynchronize(stream));
  }

  bool initialized() override { return used_; }

  void emptyCache(c10::MempoolId_t mempool_id) override {
    TORCH_CHECK(mempool_id.first == 0 && mempool_id.second == 0,
                "OpenReg: memory pools are not supported");
    for (const auto device : c10::irange(caches_.size())) {
      if (!is_device_initialized(static_cast<c10::DeviceIndex>(device))) continue;
      release_cache(*caches_[device], static_cast<int>(device));
    }
  }

  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override {
    if (!data_ptr.get() || data_ptr.get_deleter() != &delete_block) return;
    auto* block = static_cast<Block*>(data_ptr.get_context());
    native_stream(stream);  // validates; streams of other devices are fine (peer copies)
    DeviceCache& cache = *caches_[block->device];
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (stream == block->stream) return;
    for (const auto& s : block->uses) {
      if (s == stream) return;
    }
    block->uses.push_back(stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    device = resolve_device_index(device, "device");
    DeviceCache& cache = *caches_[device];
    std::lock_guard<std::mutex> lock(cache.mutex);
    return cache.stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    device = resolve_device_index(device, "device");
    DeviceCache& cache = *caches_[device];
    std::lock_guard<std::mutex> lock(cache.mutex);
    for_each_stat(cache.stats, [](Stat& s) { s.reset_accumulated(); });
    cache.stats.num_alloc_retries = 0;
    cache.stats.num_ooms = 0;
    cache.stats.num_sync_all_streams = 0;
    cache.stats.num_device_alloc = 0;
    cache.stats.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    device = resolve_device_index(device, "device");
    DeviceCache& cache = *caches_[device];
    std::lock_guard<std::mutex> lock(cache.mutex);
    for_each_stat(cache.stats, [](Stat& s) { s.reset_peak(); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    device = resolve_device_index(device, "device");
    size_t free_bytes = 0, total_bytes = 0;
    OPENREG_CHECK(orDeviceGetMemoryInfo(device, &free_bytes, &total_bytes));
    return {free_bytes, total_bytes};
  }

  void set_memory_fraction(c10::DeviceIndex device, double fraction) {
    DeviceCache& cache = *caches_[resolve_device_index(device, "device")];
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.fraction = fraction;
  }

  double memory_fraction(c10::DeviceIndex device) {
    DeviceCache& cache = *caches_[resolve_device_index(device, "device")];
    std::lock_guard<std::mutex> lock(cache.mutex);
    return cache.fraction;
  }

  // Graph pools (Graph.cpp). A pool lives while graphs use it.
  c10::MempoolId_t new_pool() {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    return {0, ++last_pool_};
  }

  void retain_pool(c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    ++pool_users_[pool];
  }

  // The last user gone, the pool's cached blocks join the ordinary cache
  // (of their stream), and its blocks still in use will when freed.
  void release_pool(c10::MempoolId_t pool) {
    {
      std::lock_guard<std::mutex> lock(pools_mutex_);
      auto it = pool_users_.find(pool);
      if (it == pool_users_.end() || --it->second > 0) return;
      pool_users_.erase(it);
    }
    for (auto& cache : caches_) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      for (auto it = cache->cached.begin(); it != cache->cached.end();) {
        auto [block_pool, stream_id, size] = it->first;
        if (block_pool != pool) {
          ++it;
          continue;
        }
        auto& into = cache->cached[{kNoPool, stream_id, size}];
        for (Block* block : it->second) {
          block->pool = kNoPool;
          into.push_back(block);
        }
        it = cache->cached.erase(it);
      }
    }
  }

  // Allocations on `stream` come from `pool` until end_pool_allocation.
  void begin_pool_allocation(const c10::Stream& stream, c10::MempoolId_t pool) {
    DeviceCache& cache = *caches_[stream.device_index()];
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.capturing.emplace_back(stream, pool);
  }

  void end_pool_allocation(const c10::Stream& stream) {
    DeviceCache& cache = *caches_[stream.device_index()];
    std::lock_guard<std::mutex> lock(cache.mutex);
    std::erase_if(cache.capturing, [&](const auto& entry) { return entry.first == stream; });
  }

  // Called by the DataPtr deleter; never throws.
  void free(Block* block) noexcept {
    DeviceCache& cache = *caches_[block->device];
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.active.erase(block->ptr);
    const bool small = block->size <= kSmallLimit;
    update(cache.stats.allocation, block->size, small, -1);
    update(cache.stats.active, block->size, small, -1);
    update(cache.stats.allocated_bytes, block->size, small, -static_cast<int64_t>(block->size));
    update(cache.stats.active_bytes, block->size, small, -static_cast<int64_t>(block->size));
    update(cache.stats.requested_bytes, block->size, small, -static_cast<int64_t>(block->requested));
    if (block->pool != kNoPool && !pool_alive(block->pool)) block->pool = kNoPool;
    if (block->uses.empty()) {
      cache.cached[{block->pool, block->stream.id(), block->size}].push_back(block);
      return;
    }
    std::vector<orEvent_t> events;
    for (const auto& use : block->uses) {
      orStream_t native = nullptr;
      try {
        native = native_stream(use);
      } catch (...) {
        continue;  // cannot happen for a stream record_stream accepted
      }
      on_device(use.device_index(), [&] {
        orEvent_t event = nullptr;
        if (orEventCreateWithFlags(&event, orEventDisableTiming) == orSuccess) {
          if (orEventRecord(event, native) == orSuccess) {
            events.push_back(event);
          } else {
            orEventDestroy(event);
          }
        }
        return orSuccess;
      });
    }
    block->uses.clear();
    cache.pending.emplace_back(block, std::move(events));
  }

 private:
  // Moves blocks whose other-stream uses have finished back to the cache.
  static void reclaim_finished(DeviceCache& cache) {
    auto& pending = cache.pending;
    for (size_t i = 0; i < pending.size();) {
      auto& [block, events] = pending[i];
      bool done = true;
      for (orEvent_t e : events) {
        if (orEventQuery(e) == orErrorNotReady) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (orEvent_t e : events) orEventDestroy(e);
      cache.cached[{block->pool, block->stream.id(), block->size}].push_back(block);
      pending[i] = std::move(pending.back());
      pending.pop_back();
    }
  }

  static Block* take_cached(DeviceCache& cache, c10::MempoolId_t pool, const c10::Stream& stream,
                            size_t size) {
    auto it = cache.cached.find({pool, stream.id(), size});
    if (it == cache.cached.end() || it->second.empty()) return nullptr;
    Block* block = it->second.back();
    it->second.pop_back();
    return block;
  }

  // Returns every cached block to the runtime. The blocks are taken out of
  // the cache first (nobody can reuse them), then the device is waited for
  // (their last uses were queued before that), then they are freed. The
  // lock is held only around bookkeeping, never while waiting: a worker
  // finishing work may need to free blocks of this device meanwhile.
  static void release_cache(DeviceCache& cache, int device) {
    const std::lock_guard<std::mutex> releasing(cache.release_mutex);
    std::vector<Block*> released;
    std::vector<std::pair<Block*, std::vector<orEvent_t>>> pending;
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      // Blocks of a pool with graphs stay: a replay writes them.
      for (auto it = cache.cached.begin(); it != cache.cached.end();) {
        if (std::get<0>(it->first) != kNoPool) {
          ++it;
          continue;
        }
        released.insert(released.end(), it->second.begin(), it->second.end());
        it = cache.cached.erase(it);
      }
      std::vector<std::pair<Block*, std::vector<orEvent_t>>> kept;
      for (auto& entry : cache.pending) {
        (entry.first->pool == kNoPool ? pending : kept).push_back(std::move(entry));
      }
      cache.pending.swap(kept);
      if (released.empty() && pending.empty()) return;
      cache.stats.num_sync_all_streams++;
    }
    orDeviceSynchronize(device);
    for (auto& [block, events] : pending) {
      for (orEvent_t e : events) {
        orEventSynchronize(e);  // uses on other devices' streams
        orEventDestroy(e);
      }
      released.push_back(block);
    }
    for (Block* block : released) orFree(block->ptr);
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (Block* block : released) {
      const bool small = block->size <= kSmallLimit;
      cache.stats.num_device_free++;
      update(cache.stats.segment, block->size, small, -1);
      update(cache.stats.reserved_bytes, block->size, small, -static_cast<int64_t>(block->size));
      delete block;
    }
  }

  static size_t allowed_bytes(double fraction, size_t total_bytes) {
    return static_cast<size_t>(fraction * static_cast<double>(total_bytes));
  }

  // Whether reserving `size` more bytes keeps the device within the
  // process's memory fraction.
  static bool within_fraction(DeviceCache& cache, int device, size_t size) {
    double fraction;
    int64_t reserved;
    {
      std::lock_guard<std::mutex> lock(cache.mutex);
      fraction = cache.fraction;
      reserved = cache.stats.reserved_bytes[0].current;
    }
    if (fraction >= 1.0) return true;
    size_t free_bytes = 0, total_bytes = 0;
    if (orDeviceGetMemoryInfo(device, &free_bytes, &total_bytes) != orSuccess) return true;  // orMalloc reports it
    return static_cast<size_t>(reserved) + size <= allowed_bytes(fraction, total_bytes);
  }

  bool pool_alive(c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    return pool_users_.count(pool) != 0;
  }

  std::vector<std::unique_ptr<DeviceCache>> caches_;
  std::atomic<bool> used_{false};
  // Taken alone or inside a device cache's mutex, never around one.
  std::mutex pools_mutex_;
  c10::CaptureId_t last_pool_ = 0;
  std::map<c10::MempoolId_t, int> pool_users_;
};

OpenRegDeviceAllocator& the_device_allocator() {
  static auto* allocator = new OpenRegDeviceAllocator();  // lives forever
  return *allocator;
}

void delete_block(void* ctx) {
  the_device_allocator().free(static_cast<Block*>(ctx));
}

// ----------------------------------------------------------------- pinned

struct HostBlock {
  void* ptr;
  size_t size;
  std::vector<orEvent_t> events;  // uses by queued copies
};

void delete_host_block(void* ctx);

class OpenRegHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    reclaim(/*wait=*/false);
    if (nbytes == 0) return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    void* ptr = nullptr;
    OPENREG_CHECK(orMallocHost(&ptr, nbytes));
    auto* block = new HostBlock{ptr, nbytes, {}};
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(ptr, block);
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(nbytes);
    stats_.allocations.increase(1);
    stats_.allocated_bytes.increase(nbytes);
    stats_.num_host_alloc++;
    return c10::DataPtr(ptr, block, &delete_host_block, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    auto* block = static_cast<HostBlock*>(ctx);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(block ? block->ptr : ptr);
    if (it == live_.end()) return false;
    const orStream_t native = native_stream(stream);  // may throw: outside
    orEvent_t event = nullptr;
    const orError_t status = on_device(stream.device_index(), [&] {
      orError_t e = orEventCreateWithFlags(&event, orEventDisableTiming);
      if (e == orSuccess) e = orEventRecord(event, native);
      return e;
    });
    OPENREG_CHECK(status);
    it->second->events.push_back(event);
    return true;
  }

  void empty_cache() override {
    reclaim(/*wait=*/true);
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Stat* s : {&stats_.active_requests, &stats_.active_bytes,
                    &stats_.allocations, &stats_.allocated_bytes}) {
      s->reset_accumulated();
    }
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Stat* s : {&stats_.active_requests, &stats_.active_bytes,
                    &stats_.allocations, &stats_.allocated_bytes}) {
      s->reset_peak();
    }
  }

  // Deleter: frees now unless queued copies still use the memory.
  void free(HostBlock* block) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(block->ptr);
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(block->size);
    if (block->events.empty()) {
      release(block);
    } else {
      deferred_.push_back(block);
    }
  }

 private:
  void release(HostBlock* block) {
    for (orEvent_t e : block->events) orEventDestroy(e);
    orFreeHost(block->ptr);
    stats_.allocations.decrease(1);
    stats_.allocated_bytes.decrease(block->size);
    stats_.num_host_free++;
    delete block;
  }

  // Frees deferred blocks whose copies are done (all of them if `wait`).
  void reclaim(bool wait) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < deferred_.size();) {
      HostBlock* block = deferred_[i];
      bool done = true;
      for (orEvent_t e : block->events) {
        if (wait) orEventSynchronize(e);
        else if (orEventQuery(e) == orErrorNotReady) done = false;
      }
      if (!done) {
        ++i;
        continue;
      }
      release(block);
      deferred_[i] = deferred_.back();
      deferred_.pop_back();
    }
  }

  std::mutex mutex_;
  std::unordered_map<void*, HostBlock*> live_;
  std::vector<HostBlock*> deferred_;
  at::HostStats stats_;
};

OpenRegHostAllocator& the_host_allocator() {
  static auto* allocator = new OpenRegHostAllocator();
  return *allocator;
}

void delete_host_block(void* ctx) {
  the_host_allocator().free(static_cast<HostBlock*>(ctx));
}

}  // namespace

c10::DeviceAllocator* device_allocator() { return &the_device_allocator(); }

void set_memory_fraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK_VALUE(fraction >= 0.0 && fraction <= 1.0, "OpenReg: set_per_process_memory_fraction: fraction=", fraction,
                    " is out of range: valid fractions are [0, 1]");
  the_device_allocator().set_memory_fraction(device, fraction);
}
double memory_fraction(c10::DeviceIndex device) { return the_device_allocator().memory_fraction(device); }

c10::MempoolId_t new_graph_pool() { return the_device_allocator().new_pool(); }
void retain_graph_pool(c10::MempoolId_t pool) { the_device_allocator().retain_pool(pool); }
void release_graph_pool(c10::MempoolId_t pool) { the_device_allocator().release_pool(pool); }
void begin_graph_pool_allocation(const c10::Stream& stream, c10::MempoolId_t pool) {
  the_device_allocator().begin_pool_allocation(stream, pool);
}
void end_graph_pool_allocation(const c10::Stream& stream) {
  the_device_allocator().end_pool_allocation(stream);
}

at::HostAllocator* host_allocator() { return &the_host_allocator(); }

void record_stream(const c10::DataPtr& data_ptr, c10::Stream stream) {
  the_device_allocator().recordStream(data_ptr, stream);
}

bool record_host_use(void* ptr, void* ctx, c10::Stream stream) {
  return the_host_allocator().record_event(ptr, ctx, stream);
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes) {
  TORCH_CHECK(storage->resizable(), "OpenReg: trying to resize storage that "
              "is not resizable");
  const c10::Device device = storage->device();
  check_openreg_device(device, "storage.device");
  const auto previous = exchange_device(device.index());
  try {
    c10::DataPtr fresh = new_nbytes == 0
        ? c10::DataPtr(nullptr, device)
        : the_device_allocator().allocate(new_nbytes);
    const size_t common = std::min(storage->nbytes(), new_nbytes);
    if (common > 0) {
      const c10::Stream stream = current_stream(device.index());
      OPENREG_CHECK(orMemcpyAsync(fresh.get(), storage->data(), common,
                                  orMemcpyDeviceToDevice, native_stream(stream)));
      // The old block may belong to another stream: keep it until the copy ran.
      record_stream(storage->data_ptr(), stream);
    }
    storage->set_data_ptr_noswap(std::move(fresh));
    storage->set_nbytes(new_nbytes);
  } catch (...) {
    maybe_exchange_device(previous);
    throw;
  }
  maybe_exchange_device(previous);
}

bool is_pinned_pointer(const void* ptr) {
  orPointerAttributes attributes;
  return orPointerGetAttributes(&attributes, ptr) == orSuccess &&
      attributes.type == orMemoryTypeHost;
}

// Registered at library load; used once `import openreg` loads us.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &the_device_allocator());
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &the_host_allocator());

}  // namespace openreg
