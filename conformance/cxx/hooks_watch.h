// Observing the backend's hooks without its help (hooks_watch.cpp).
#pragma once

namespace pu1c {

struct HookCalls {
  int init = 0;            // calls of init() since watch_hooks()
  int pinned = 0;          // calls of getPinnedMemoryAllocator() since watch_hooks()
  int first_init = -1;     // sequence number of the first init() call (-1: none)
  int first_pinned = -1;   // of the first getPinnedMemoryAllocator() call
};

// Starts counting calls of the registered hooks' init() and
// getPinnedMemoryAllocator(); false when it cannot (no hooks, another ABI,
// an unwritable vtable).
bool watch_hooks();
HookCalls hook_calls();

// Whether PyTorch's at::Context has run the PrivateUse1 hooks' init()
// (lazyInitDevice's once_flag).
bool context_initialized();

}  // namespace pu1c
