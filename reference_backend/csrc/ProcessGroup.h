// OpenReg's process group: a c10d::Backend that torch.distributed uses for
// tensors on OpenReg devices (registered as "orccl" for the device type
// openreg by the Python package; docs/reference-backend/distributed.md).
//
// Ranks are processes of one machine. They meet once through the c10d store
// (the name of a POSIX shared-memory segment) and exchange all data through
// that segment. Every operation is a kernel on a communication stream of the
// tensors' device, ordered after the caller's current stream; Work::wait()
// makes the caller's current stream wait for it, as ProcessGroupNCCL does.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace openreg {

// The name torch.distributed knows the backend by.
constexpr const char* kProcessGroupName = "orccl";

// The creator torch.distributed.Backend.register_backend calls for each
// group: blocks until every rank of the group has joined (bounded by
// `timeout`, which also bounds every later wait for a peer).
c10::intrusive_ptr<c10d::Backend> create_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::milliseconds timeout);

}  // namespace openreg
