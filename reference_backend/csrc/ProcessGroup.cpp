// OpenReg's process group (ProcessGroup.h; docs/reference-backend/distributed.md).
//
// Transport: one POSIX shared-memory segment per group, mapped by every rank:
//  * a RankState per rank: how many barriers it has arrived at, its pid, and
//    the Call it is making (peers compare Calls before exchanging data);
//  * a slot per rank (kSlotBytes): a collective moves its data in chunks,
//    each rank writing its share into its own slot, then, after a barrier,
//    reading the slots of the others, then a barrier before slots are reused;
//  * a mailbox per ordered pair of ranks (kMailboxBytes) for send/recv.
// Waits spin briefly, then sleep on a futex of the word they wait for, and
// give up at the group's timeout or when the awaited peer's process is gone.
//
// Streams: each operation is one kernel (DeviceKernel.h) on a communication
// stream of its tensors' device, after an event recorded on the caller's
// current stream; its tensors are recorded on the communication stream so
// that the caching allocator does not hand their memory to other work while
// it runs. Work::wait() makes the caller's current stream wait for an event
// recorded after the kernel, without blocking the host.
#include "ProcessGroup.h"

#include "Allocator.h"
#include "DeviceKernel.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Stream.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace openreg {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = size_t(4) << 20;     // per rank: one chunk of a collective
constexpr size_t kMailboxBytes = size_t(1) << 20;  // per ordered pair of ranks: one chunk of a message
constexpr uint32_t kMagic = 0x4f524731;            // "ORG1"

[[noreturn]] void raise(const std::string& message) {
  C10_THROW_ERROR(DistBackendError, message);
}

std::exception_ptr as_exception(const std::string& message) {
  try {
    raise(message);
  } catch (...) {
    return std::current_exception();
  }
}

enum class Kind : int32_t {
  AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, Barrier
};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::Reduce: return "reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllToAll: return "all_to_all";
    case Kind::Gather: return "gather";
    case Kind::Scatter: return "scatter";
    case Kind::Barrier: return "barrier";
  }
  return "?";
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "?";
  }
}

// What a rank is about to do. Every rank publishes its Call and compares it
// with the others' before any data moves: mismatched calls fail on every
// rank with both sides named instead of exchanging garbage.
struct Call {
  uint64_t seq = 0;  // the group's collective number, from 1
  Kind kind = Kind::Barrier;
  int32_t dtype = 0;  // c10::ScalarType
  int32_t root = 0;
  int32_t op = 0;     // c10d::ReduceOp::RedOpType
  int64_t count = 0;  // elements every rank must agree on
  int64_t send[kMaxRanks] = {};  // all_to_all: elements sent to each rank
  int64_t recv[kMaxRanks] = {};  // all_to_all: elements received from each rank
};

std::string describe(const Call& call, int size) {
  std::ostringstream out;
  out << kind_name(call.kind) << " (collective #" << call.seq << " of the group";
  if (call.kind == Kind::Barrier) return out.str() + ")";
  out << ", " << c10::toString(static_cast<c10::ScalarType>(call.dtype));
  if (call.kind == Kind::AllReduce || call.kind == Kind::Reduce || call.kind == Kind::ReduceScatter) {
    out << ", " << op_name(static_cast<c10d::ReduceOp::RedOpType>(call.op));
  }
  if (call.kind == Kind::Broadcast || call.kind == Kind::Reduce || call.kind == Kind::Gather ||
      call.kind == Kind::Scatter) {
    out << ", root " << call.root;
  }
  if (call.kind == Kind::AllToAll) {
    out << ", sending [";
    for (int r = 0; r < size; ++r) out << (r ? ", " : "") << call.send[r];
    out << "] and receiving [";
    for (int r = 0; r < size; ++r) out << (r ? ", " : "") << call.recv[r];
    out << "] elements)";
  } else {
    out << ", " << call.count << " elements per rank)";
  }
  return out.str();
}

struct alignas(64) RankState {
  std::atomic<uint32_t> arrived;  // barriers this rank has arrived at
  std::atomic<int32_t> pid;
  Call call;
};

struct alignas(64) Mailbox {     // messages from one rank to another
  std::atomic<uint32_t> posted;  // chunks the sender has written
  std::atomic<uint32_t> taken;   // chunks the receiver has copied out
  uint64_t bytes;                // of the chunk posted last
  uint64_t message_bytes;        // of the message it belongs to
  int32_t dtype;
  int32_t tag;
};

struct alignas(64) Header {
  uint32_t magic;
  int32_t size;
};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// Whether `pid` still runs: a process that exited but whose parent has not
// reaped it yet (a zombie) counts as gone.
bool process_alive(int pid) {
  if (pid <= 0) return true;  // not joined yet
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return true;
  const char state = text[close + 2];
  return state != 'Z' && state != 'X';
}

// Runs one channel's operations in the order the host issued them, whatever
// the streams they were queued on (a group may be used on several devices).
class Sequencer {
 public:
  uint64_t issue() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ++issued_;
  }
  template <class Check>
  void await_turn(uint64_t seq, Check&& check) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (done_ + 1 != seq) {
      cv_.wait_for(lock, std::chrono::milliseconds(10));
      if (done_ + 1 != seq) check();
    }
  }
  void finish(uint64_t seq) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = seq;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t issued_ = 0;
  uint64_t done_ = 0;
};

// The shared segment and what every operation of the group shares; kernels
// hold it, so it outlives the backend while operations are in flight.
class Comm {
 public:
  Comm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)
      : rank(rank), size(size), timeout(timeout), sends_(size), recvs_(size) {
    TORCH_CHECK_VALUE(size >= 1 && size <= kMaxRanks, "OpenReg process group: the group size must be in [1, ",
                      kMaxRanks, "], got ", size);
    TORCH_CHECK_VALUE(rank >= 0 && rank < size, "OpenReg process group: rank must be in [0, ", size, "), got ",
                      rank);
    layout();
    std::string name;
    int fd = -1;
    if (rank == 0) {
      std::random_device random;
      name = "/openreg-pg-" + std::to_string(getpid()) + "-" + std::to_string(random()) + std::to_string(random());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      TORCH_CHECK(fd >= 0, "OpenReg process group: shm_open(", name, ") failed: ", std::strerror(errno));
      if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        const int error = errno;
        close(fd);
        shm_unlink(name.c_str());
        TORCH_CHECK(false, "OpenReg process group: sizing the shared segment (", bytes_, " bytes) failed: ",
                    std::strerror(error));
      }
      store->set("openreg/segment", std::vector<uint8_t>(name.begin(), name.end()));
    } else {
      const auto value = store->get("openreg/segment");
      name.assign(value.begin(), value.end());
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      TORCH_CHECK(fd >= 0, "OpenReg process group: rank ", rank, " could not open rank 0's segment ", name, ": ",
                  std::strerror(errno));
    }
    base_ = static_cast<char*>(mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      if (rank == 0) shm_unlink(name.c_str());
      TORCH_CHECK(false, "OpenReg process group: mapping the shared segment failed: ", std::strerror(errno));
    }
    if (rank == 0) {
      header().magic = kMagic;
      header().size = size;
    }
    state(rank).pid.store(getpid(), std::memory_order_release);
    store->set("openreg/joined/" + std::to_string(rank), std::vector<uint8_t>{1});
    if (rank == 0) {
      // Every rank has mapped the segment: its name is no longer needed, and
      // unlinking it now leaves nothing behind whichever rank dies later.
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back("openreg/joined/" + std::to_string(r));
      try {
        store->wait(keys, timeout);
      } catch (...) {
        shm_unlink(name.c_str());
        throw;
      }
      shm_unlink(name.c_str());
    }
    TORCH_CHECK(header().magic == kMagic && header().size == size, "OpenReg process group: rank ", rank,
                " found a segment of another group size (", header().size, ", expected ", size, ")");
  }

  ~Comm() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }

  const int rank;
  const int size;
  const std::chrono::milliseconds timeout;

  Sequencer& collectives() { return collectives_; }
  Sequencer& sends(int peer) { return sends_[peer]; }
  Sequencer& recvs(int peer) { return recvs_[peer]; }

  // The first failure makes the group unusable, as an aborted NCCL
  // communicator: later operations fail at once with it.
  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (!failure_) failure_ = message;
  }
  std::optional<std::string> failure() const {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    return failure_;
  }
  void abort() {
    aborted_.store(true);
    fail("OpenReg process group: the group was aborted");
  }
  // destroy_process_group: the group takes no new operations (queued ones finish).
  void shut_down() { closed_.store(true); }
  bool closed() const { return closed_.load(); }
  void check_live(const std::string& what) const {
    TORCH_CHECK(!aborted_.load(), "OpenReg process group: rank ", rank, " gave up ", what,
                ": the group was aborted");
  }

  // ------------------------------------------------------------ collectives
  // Runs `body` as the collective `call`: publishes the call, waits for every
  // rank's, checks that they match, and lets `body` move the data through
  // exchange() steps.
  void collective(const Call& call, const std::function<void()>& body) {
    collective_ = describe(call, size);
    state(rank).call = call;
    barrier();
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const Call& theirs = state(r).call;
      if (!matches(call, theirs, r)) {
        raise("OpenReg process group: rank " + std::to_string(rank) + " called " + collective_ + " but rank " +
              std::to_string(r) + " called " + describe(theirs, size) +
              ": every rank must make the same collective calls in the same order, with matching arguments");
      }
    }
    body();
    barrier();
  }
  // One step: every rank writes its share into its own slot (publish), then
  // reads the others' slots (consume) once all have written.
  void exchange(const std::function<void()>& publish, const std::function<void()>& consume) {
    publish();
    barrier();
    consume();
    barrier();
  }
  // exchange() steps over `count` elements, `per` at a time: publish(at, n)
  // and consume(at, n) move the n elements that start at element `at`.
  using Chunk = std::function<void(int64_t at, int64_t n)>;
  void chunked(int64_t count, int64_t per, const Chunk& publish, const Chunk& consume) {
    for (int64_t at = 0; at < count; at += per) {
      const int64_t n = std::min(per, count - at);
      exchange([&] { publish(at, n); }, [&] { consume(at, n); });
    }
  }
  const Call& call_of(int r) { return state(r).call; }
  // `count` elements of `dtype` at element `offset` of rank r's slot.
  at::Tensor slot(int r, int64_t offset, int64_t count, c10::ScalarType dtype) {
    char* base = base_ + slots_ + static_cast<size_t>(r) * kSlotBytes;
    return at::from_blob(base, {offset + count}, at::TensorOptions().dtype(dtype)).narrow(0, offset, count);
  }

  // -------------------------------------------------------------- messages
  void send(const char* data, uint64_t bytes, int32_t dtype, int32_t tag, int peer, const std::string& what) {
    Mailbox& box = mailbox(rank, peer);
    char* buffer = mailbox_data(rank, peer);
    uint64_t offset = 0;
    do {
      const uint32_t posted = box.posted.load(std::memory_order_relaxed);
      await(box.taken, posted, peer, what);  // the previous chunk was taken
      const uint64_t chunk = std::min<uint64_t>(bytes - offset, kMailboxBytes);
      std::memcpy(buffer, data + offset, chunk);
      box.bytes = chunk;
      box.message_bytes = bytes;
      box.dtype = dtype;
      box.tag = tag;
      box.posted.store(posted + 1, std::memory_order_release);
      futex(&box.posted, FUTEX_WAKE, INT_MAX, nullptr);
      offset += chunk;
    } while (offset < bytes);
  }
  void recv(char* data, uint64_t bytes, int32_t dtype, int32_t tag, int peer, const std::string& what) {
    Mailbox& box = mailbox(peer, rank);
    const char* buffer = mailbox_data(peer, rank);
    uint64_t offset = 0;
    do {
      const uint32_t taken = box.taken.load(std::memory_order_relaxed);
      await(box.posted, taken + 1, peer, what);
      if (box.message_bytes != bytes || box.dtype != dtype || box.tag != tag) {
        std::ostringstream out;
        out << "OpenReg process group: rank " << rank << " " << what << " expects " << bytes << " bytes of "
            << c10::toString(static_cast<c10::ScalarType>(dtype)) << " with tag " << tag << ", but rank " << peer
            << " sent " << box.message_bytes << " bytes of "
            << c10::toString(static_cast<c10::ScalarType>(box.dtype)) << " with tag " << box.tag;
        raise(out.str());
      }
      std::memcpy(data + offset, buffer, box.bytes);
      offset += box.bytes;
      box.taken.store(taken + 1, std::memory_order_release);
      futex(&box.taken, FUTEX_WAKE, INT_MAX, nullptr);
    } while (offset < bytes);
  }

  // Waits for the turn of operation `seq` of `sequencer`, within the timeout.
  void await_turn(Sequencer& sequencer, uint64_t seq, const std::string& what) {
    const auto deadline = Clock::now() + timeout;
    sequencer.await_turn(seq, [&] {
      check_live(what);
      if (Clock::now() > deadline) {
        raise("OpenReg process group: rank " + std::to_string(rank) + " timed out after " +
              std::to_string(timeout.count()) + " ms waiting for this process's earlier operations before " + what);
      }
    });
  }

 private:
  void layout() {
    size_t offset = sizeof(Header);
    states_ = offset;
    offset += sizeof(RankState) * size;
    mailboxes_ = offset;
    offset += sizeof(Mailbox) * size * size;
    offset = (offset + 4095) / 4096 * 4096;
    slots_ = offset;
    offset += kSlotBytes * size;
    mailbox_data_ = offset;
    offset += kMailboxBytes * size * size;
    bytes_ = offset;
  }
  Header& header() { return *reinterpret_cast<Header*>(base_); }
  RankState& state(int r) { return reinterpret_cast<RankState*>(base_ + states_)[r]; }
  Mailbox& mailbox(int src, int dst) { return reinterpret_cast<Mailbox*>(base_ + mailboxes_)[src * size + dst]; }
  char* mailbox_data(int src, int dst) {
    return base_ + mailbox_data_ + static_cast<size_t>(src * size + dst) * kMailboxBytes;
  }

  bool matches(const Call& mine, const Call& theirs, int r) const {
    if (mine.seq != theirs.seq || mine.kind != theirs.kind) return false;
    if (mine.kind == Kind::Barrier) return true;
    if (mine.dtype != theirs.dtype || mine.root != theirs.root || mine.op != theirs.op) return false;
    if (mine.kind == Kind::AllToAll) return theirs.send[rank] == mine.recv[r] && theirs.recv[rank] == mine.send[r];
    return mine.count == theirs.count;
  }

  // Arrives at the next barrier and waits until every rank has.
  void barrier() {
    const uint32_t target = ++barriers_;
    RankState& mine = state(rank);
    mine.arrived.store(target, std::memory_order_release);
    futex(&mine.arrived, FUTEX_WAKE, INT_MAX, nullptr);
    for (int r = 0; r < size; ++r) {
      if (r != rank) await(state(r).arrived, target, r, collective_);
    }
  }

  // Waits until `word` (written by rank `peer`) reaches `target`, in the
  // operation `what` (quoted by its errors).
  void await(std::atomic<uint32_t>& word, uint32_t target, int peer, const std::string& what) {
    const auto start = Clock::now();
    auto next_check = start + std::chrono::milliseconds(50);
    for (int spin = 0;; ++spin) {
      const uint32_t seen = word.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - target) >= 0) return;
      if (spin < 64) {
        sched_yield();
        continue;
      }
      const timespec nap{0, 2'000'000};
      futex(&word, FUTEX_WAIT, seen, &nap);
      const auto now = Clock::now();
      check_live(what);
      if (now - start > timeout) {
        const int32_t pid = state(peer).pid.load();
        raise("OpenReg process group: rank " + std::to_string(rank) + " timed out after " +
              std::to_string(timeout.count()) + " ms in " + what + " waiting for rank " + std::to_string(peer) +
              (pid > 0 ? " (pid " + std::to_string(pid) + ")" : " (which never joined)") +
              ", whose last collective call was " + describe(state(peer).call, size));
      }
      if (now > next_check) {
        next_check = now + std::chrono::milliseconds(50);
        const int32_t pid = state(peer).pid.load();
        if (!process_alive(pid)) {
          raise("OpenReg process group: rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                ") exited while rank " + std::to_string(rank) + " waited for it in " + what);
        }
      }
    }
  }

  char* base_ = nullptr;
  size_t bytes_ = 0, states_ = 0, mailboxes_ = 0, slots_ = 0, mailbox_data_ = 0;
  // Touched only by the running kernel of the collective channel (it runs
  // one operation at a time, in order: Sequencer); sends and receives, on
  // streams of their own, touch neither.
  uint32_t barriers_ = 0;
  std::string collective_;  // the running collective, as its errors quote it
  Sequencer collectives_;
  std::vector<Sequencer> sends_, recvs_;
  mutable std::mutex failure_mutex_;
  std::optional<std::string> failure_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> closed_{false};
};

// ------------------------------------------------------------ the kernels
// A device tensor's elements as one contiguous CPU vector: the alias itself
// when it is contiguous, else a copy written back by finish().
struct Flat {
  Flat(const at::Tensor& alias, bool read) : alias(alias) {
    if (alias.is_contiguous()) {
      flat = alias.view({-1});
    } else {
      flat = read ? alias.contiguous().view({-1}) : at::empty({alias.numel()}, alias.options());
    }
  }
  // Called once every element holds its result. A tensor whose elements
  // fill one byte range (dense, in any order) tells the runtime it wrote
  // all of it: in process mode that range goes back to the device in one
  // piece (orKernelMarkWritten).
  void finish() {
    if (!alias.is_contiguous()) alias.copy_(flat.view(alias.sizes()));
    if (alias.nbytes() > 0 && alias.is_non_overlapping_and_dense()) {
      OPENREG_CHECK(orKernelMarkWritten(alias.data_ptr(), alias.nbytes()));
    }
  }
  at::Tensor alias;
  at::Tensor flat;
};

// out <- out (op) in. AVG sums here and divides once at the end.
void combine(at::Tensor& out, const at::Tensor& in, c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG: out.add_(in); break;
    case c10d::ReduceOp::PRODUCT: out.mul_(in); break;
    case c10d::ReduceOp::MIN: at::minimum_out(out, out, in); break;
    case c10d::ReduceOp::MAX: at::maximum_out(out, out, in); break;
    case c10d::ReduceOp::BAND: out.bitwise_and_(in); break;
    case c10d::ReduceOp::BOR: out.bitwise_or_(in); break;
    case c10d::ReduceOp::BXOR: out.bitwise_xor_(in); break;
    default: TORCH_CHECK(false, "OpenReg process group: unsupported reduce op ", op_name(op));
  }
}

// out <- the reduction, over ranks 0..size-1 in that order (so that every
// rank computes bit-identical results), of each rank's `count` elements at
// element `offset` of its slot.
void reduce_slots(Comm& comm, at::Tensor out, int64_t offset, int64_t count, c10d::ReduceOp::RedOpType op) {
  const auto dtype = out.scalar_type();
  out.copy_(comm.slot(0, offset, count, dtype));
  for (int r = 1; r < comm.size; ++r) combine(out, comm.slot(r, offset, count, dtype), op);
  if (op == c10d::ReduceOp::AVG) out.div_(comm.size);
}

int64_t chunk_elements(size_t bytes, const at::Tensor& like) {
  return std::max<int64_t>(1, static_cast<int64_t>(bytes / like.element_size()));
}

int64_t chunks_of(int64_t count, int64_t per_chunk) {
  return (count + per_chunk - 1) / per_chunk;
}

// ----------------------------------------------------------- validation
constexpr const char* kPrefix = "OpenReg process group: ";

void check_tensor(const at::Tensor& tensor, const char* op, const char* argument) {
  TORCH_CHECK_VALUE(tensor.defined(), kPrefix, op, ": ", argument, " is an undefined tensor");
  TORCH_CHECK_VALUE(tensor.device().type() == c10::DeviceType::PrivateUse1, kPrefix, op, ": ", argument,
                    " must be on an OpenReg device, got a tensor on ", tensor.device());
  TORCH_CHECK_VALUE(tensor.layout() == c10::kStrided, kPrefix, op, ": ", argument,
                    " must be a strided (dense) tensor, got layout ", tensor.layout());
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op, const char* argument) {
  TORCH_CHECK_VALUE(tensors.size() == 1, kPrefix, op, " takes exactly one tensor in ", argument, ", got ",
                    tensors.size());
  check_tensor(tensors[0], op, argument);
  return tensors[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* argument) {
  check_tensor(b, op, argument);
  TORCH_CHECK_VALUE(a.device() == b.device(), kPrefix, op, ": ", argument, " is on ", b.device(),
                    " but the input is on ", a.device(), " (all tensors of a call must be on one device)");
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), kPrefix, op, ": ", argument, " has dtype ",
                   b.scalar_type(), " but the input has ", a.scalar_type());
}

void check_root(int64_t root, int size, const char* op) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, kPrefix, op, ": the root rank must be in [0, ", size, "), got ",
                    root);
}

void check_peer(int peer, int rank, int size, const char* op) {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size, kPrefix, op, ": the peer rank must be in [0, ", size, "), got ",
                    peer);
  TORCH_CHECK_VALUE(peer != rank, kPrefix, op, ": rank ", rank, " cannot ", op, " itself");
}

c10d::ReduceOp::RedOpType check_op(const c10d::ReduceOp& reduce_op, const at::Tensor& tensor, const char* op) {
  const auto type = reduce_op.op_;
  const auto dtype = tensor.scalar_type();
  const bool integral = c10::isIntegralType(dtype, /*includeBool=*/true);
  switch (type) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PRODUCT:
      return type;
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      TORCH_CHECK_VALUE(!c10::isComplexType(dtype), kPrefix, op, ": ", op_name(type),
                        " is not defined for complex dtype ", dtype);
      return type;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(!integral, kPrefix, op, ": AVG needs a floating-point or complex dtype, got ", dtype);
      return type;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK_VALUE(integral, kPrefix, op, ": ", op_name(type), " needs an integral or bool dtype, got ",
                        dtype);
      return type;
    default:
      TORCH_CHECK_VALUE(false, kPrefix, op, ": reduce op ", op_name(type),
                        " is not supported (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR are)");
  }
}

// ------------------------------------------------------------- Work
struct Completion {
  std::atomic<bool> done{false};
  mutable std::mutex mutex;
  std::optional<std::string> error;

  void finish(std::optional<std::string> failure) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::move(failure);
    }
    done.store(true, std::memory_order_release);
  }
  std::optional<std::string> failure() const {
    std::lock_guard<std::mutex> lock(mutex);
    return error;
  }
};

class WorkOpenReg final : public c10d::Work {
 public:
  WorkOpenReg(int rank, c10d::OpType type, const char* title, std::shared_ptr<Completion> completion,
              c10::Event end, c10::Device device, std::vector<at::Tensor> outputs, bool blocks_host,
              c10::intrusive_ptr<c10::ivalue::Future> future)
      : Work(rank, type, title),
        completion_(std::move(completion)),
        end_(std::move(end)),
        device_(device),
        outputs_(std::move(outputs)),
        blocks_host_(blocks_host),
        future_(std::move(future)) {}

  bool isCompleted() override { return completion_->done.load(std::memory_order_acquire); }
  bool isSuccess() const override {
    return completion_->done.load(std::memory_order_acquire) && !completion_->failure();
  }
  std::exception_ptr exception() const override {
    const auto failure = completion_->failure();
    return failure ? as_exception(*failure) : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The caller's current stream waits for the operation; the host does not
  // (except for barrier, whose point is the host's). A failure found later
  // reaches the caller's stream too: a kernel queued there after the wait
  // fails with it, so whoever reads the outputs on that stream gets the error
  // instead of the unfinished outputs.
  void synchronize() override {
    if (const auto failure = completion_->failure()) raise(*failure);
    const c10::Stream current = current_stream(device_.index());
    end_.block(current);
    launch_kernel(current, [completion = completion_] {
      if (const auto failure = completion->failure()) raise(*failure);
    }, /*wait=*/false);
  }
  bool wait(std::chrono::milliseconds timeout) override {
    synchronize();
    if (blocks_host_) {
      end_.synchronize();
      if (const auto failure = completion_->failure()) raise(*failure);
    }
    return true;
  }

 private:
  std::shared_ptr<Completion> completion_;
  c10::Event end_;
  c10::Device device_;
  std::vector<at::Tensor> outputs_;
  bool blocks_host_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work of a coalesced call (allreduce_coalesced,
// allgather_into_tensor_coalesced, reduce_scatter_tensor_coalesced): one
// operation per tensor, queued in order on the communication stream. It is
// done when all are, failed when one failed, and its future completes with
// every output once the last operation has run.
class WorkCoalesced final : public c10d::Work {
 public:
  WorkCoalesced(int rank, c10d::OpType type, const char* title, std::vector<c10::intrusive_ptr<c10d::Work>> works,
                std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future)
      : Work(rank, type, title), works_(std::move(works)), outputs_(std::move(outputs)), future_(std::move(future)) {}

  bool isCompleted() override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isCompleted(); });
  }
  bool isSuccess() const override {
    return std::all_of(works_.begin(), works_.end(), [](const auto& w) { return w->isSuccess(); });
  }
  std::exception_ptr exception() const override {
    for (const auto& w : works_) {
      if (auto error = w->exception()) return error;
    }
    return nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void synchronize() override {
    for (const auto& w : works_) w->synchronize();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (const auto& w : works_) w->wait(timeout);
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ------------------------------------------------------------ the group
enum class Channel { Collective, Send, Recv };

class ProcessGroupOpenReg final : public c10d::Backend {
 public:
  ProcessGroupOpenReg(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout)
      : Backend(rank, size), comm_(std::make_shared<Comm>(store, rank, size, timeout)) {}

  const std::string getBackendName() const override { return kProcessGroupName; }
  void abort() override { comm_->abort(); }
  void shutdown() override { comm_->shut_down(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& tensor = single(tensors, "all_reduce", "tensors");
    const auto op = check_op(opts.reduceOp, tensor, "all_reduce");
    Call call = make_call(Kind::AllReduce, tensor, tensor.numel(), 0, op);
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::ALLREDUCE, "openreg:all_reduce", {tensor}, {tensor},
                  false, [call, op](Comm& comm, std::vector<at::Tensor>& t) {
      Flat data(t[0], true);
      const auto dtype = data.flat.scalar_type();
      comm.collective(call, [&] {
        const int64_t per = chunk_elements(kSlotBytes, data.flat);
        comm.chunked(
            call.count, per,
            [&](int64_t at, int64_t n) { comm.slot(comm.rank, 0, n, dtype).copy_(data.flat.narrow(0, at, n)); },
            [&](int64_t at, int64_t n) { reduce_slots(comm, data.flat.narrow(0, at, n), 0, n, op); });
      });
      data.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& tensor = single(tensors, "broadcast", "tensors");
    check_root(opts.rootRank, getSize(), "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    Call call = make_call(Kind::Broadcast, tensor, tensor.numel(), root);
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::BROADCAST, "openreg:broadcast", {tensor}, {tensor},
                  false,
                  [call, root](Comm& comm, std::vector<at::Tensor>& t) {
      Flat data(t[0], comm.rank == root);
      const auto dtype = data.flat.scalar_type();
      comm.collective(call, [&] {
        comm.chunked(
            call.count, chunk_elements(kSlotBytes, data.flat),
            [&](int64_t at, int64_t n) {
              if (comm.rank == root) comm.slot(root, 0, n, dtype).copy_(data.flat.narrow(0, at, n));
            },
            [&](int64_t at, int64_t n) {
              if (comm.rank != root) data.flat.narrow(0, at, n).copy_(comm.slot(root, 0, n, dtype));
            });
      });
      if (comm.rank != root) data.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    const at::Tensor& tensor = single(tensors, "reduce", "tensors");
    check_root(opts.rootRank, getSize(), "reduce");
    const auto op = check_op(opts.reduceOp, tensor, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    Call call = make_call(Kind::Reduce, tensor, tensor.numel(), root, op);
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::REDUCE, "openreg:reduce", {tensor}, {tensor}, false,
                  [call, root, op](Comm& comm, std::vector<at::Tensor>& t) {
      Flat data(t[0], true);
      const auto dtype = data.flat.scalar_type();
      comm.collective(call, [&] {
        comm.chunked(
            call.count, chunk_elements(kSlotBytes, data.flat),
            [&](int64_t at, int64_t n) { comm.slot(comm.rank, 0, n, dtype).copy_(data.flat.narrow(0, at, n)); },
            [&](int64_t at, int64_t n) {
              if (comm.rank == root) reduce_slots(comm, data.flat.narrow(0, at, n), 0, n, op);
            });
      });
      if (comm.rank == root) data.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const at::Tensor& input = single(inputs, "all_gather", "input_tensor");
    TORCH_CHECK_VALUE(outputs.size() == 1, kPrefix, "all_gather takes one output list, got ", outputs.size());
    const auto& list = outputs[0];
    TORCH_CHECK_VALUE(static_cast<int>(list.size()) == getSize(), kPrefix, "all_gather: tensor_list must hold ",
                      getSize(), " tensors (one per rank), got ", list.size());
    for (const auto& out : list) {
      check_same(input, out, "all_gather", "tensor_list");
      TORCH_CHECK_VALUE(out.numel() == input.numel(), kPrefix, "all_gather: every tensor of tensor_list must have ",
                        input.numel(), " elements like the input, got ", out.numel());
    }
    std::vector<at::Tensor> tensors{input};
    tensors.insert(tensors.end(), list.begin(), list.end());
    return gather_blocks(Kind::AllGather, c10d::OpType::ALLGATHER, "openreg:all_gather", input, tensors, list, -1);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_all_gather_into(output, input);
    return gather_blocks(Kind::AllGather, c10d::OpType::_ALLGATHER_BASE, "openreg:all_gather_into_tensor", input,
                         {input, output}, {output}, -1);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    const at::Tensor& input = single(inputs, "gather", "tensor");
    check_root(opts.rootRank, getSize(), "gather");
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> list;
    if (getRank() == root) {
      TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), kPrefix,
                        "gather: the root's gather_list must hold ", getSize(), " tensors (one per rank)");
      list = outputs[0];
      for (const auto& out : list) {
        check_same(input, out, "gather", "gather_list");
        TORCH_CHECK_VALUE(out.numel() == input.numel(), kPrefix, "gather: every tensor of gather_list must have ",
                          input.numel(), " elements like the input, got ", out.numel());
      }
    } else {
      TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), kPrefix,
                        "gather: gather_list must be empty on ranks other than the root");
    }
    std::vector<at::Tensor> tensors{input};
    tensors.insert(tensors.end(), list.begin(), list.end());
    return gather_blocks(Kind::Gather, c10d::OpType::GATHER, "openreg:gather", input, tensors, list, root);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor& output = single(outputs, "scatter", "tensor");
    check_root(opts.rootRank, getSize(), "scatter");
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> tensors{output};
    if (getRank() == root) {
      TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), kPrefix,
                        "scatter: the root's scatter_list must hold ", getSize(), " tensors (one per rank)");
      for (const auto& in : inputs[0]) {
        check_same(output, in, "scatter", "scatter_list");
        TORCH_CHECK_VALUE(in.numel() == output.numel(), kPrefix, "scatter: every tensor of scatter_list must have ",
                          output.numel(), " elements like the output, got ", in.numel());
      }
      tensors.insert(tensors.end(), inputs[0].begin(), inputs[0].end());
    } else {
      TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), kPrefix,
                        "scatter: scatter_list must be empty on ranks other than the root");
    }
    Call call = make_call(Kind::Scatter, output, output.numel(), root);
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::SCATTER, "openreg:scatter", tensors, {output}, false,
                  [call, root](Comm& comm, std::vector<at::Tensor>& t) {
      Flat out(t[0], false);
      std::vector<Flat> ins;
      for (size_t k = 1; k < t.size(); ++k) ins.emplace_back(t[k], true);
      const auto dtype = out.flat.scalar_type();
      comm.collective(call, [&] {
        const int64_t per = chunk_elements(kSlotBytes / comm.size, out.flat);
        comm.chunked(
            call.count, per,
            [&](int64_t at, int64_t n) {
              if (comm.rank != root) return;
              for (int r = 0; r < comm.size; ++r) {
                comm.slot(root, r * per, n, dtype).copy_(ins[r].flat.narrow(0, at, n));
              }
            },
            [&](int64_t at, int64_t n) {
              out.flat.narrow(0, at, n).copy_(comm.slot(root, comm.rank * per, n, dtype));
            });
      });
      out.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    const auto op = check_reduce_scatter_into(output, input, opts);
    return scatter_reduce(c10d::OpType::_REDUCE_SCATTER_BASE, "openreg:reduce_scatter_tensor", output, {input, output},
                          op);
  }

  // The coalesced calls, which the functional collectives (and so DTensor
  // and torch.compile's collectives) use even for one tensor: every pair is
  // checked before any is queued, then each runs as its own collective.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK_VALUE(!tensors.empty(), kPrefix, "all_reduce_coalesced needs at least one tensor");
    for (const auto& t : tensors) {
      check_tensor(t, "all_reduce_coalesced", "tensors");
      check_op(opts.reduceOp, t, "all_reduce_coalesced");
    }
    return coalesced(c10d::OpType::ALLREDUCE_COALESCED, "openreg:all_reduce_coalesced", tensors, [&](size_t k) {
      std::vector<at::Tensor> one{tensors[k]};
      return allreduce(one, opts);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    check_pairs(outputs, inputs, "all_gather_into_tensor_coalesced");
    for (size_t k = 0; k < inputs.size(); ++k) check_all_gather_into(outputs[k], inputs[k]);
    return coalesced(c10d::OpType::COALESCED, "openreg:all_gather_into_tensor_coalesced", outputs,
                     [&](size_t k) { return _allgather_base(outputs[k], inputs[k], opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    check_pairs(outputs, inputs, "reduce_scatter_tensor_coalesced");
    for (size_t k = 0; k < inputs.size(); ++k) check_reduce_scatter_into(outputs[k], inputs[k], opts);
    return coalesced(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "openreg:reduce_scatter_tensor_coalesced",
                     outputs, [&](size_t k) { return _reduce_scatter_base(outputs[k], inputs[k], opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& output = single(outputs, "reduce_scatter", "output");
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), kPrefix,
                      "reduce_scatter: input_list must hold ", getSize(), " tensors (one per rank)");
    std::vector<at::Tensor> tensors;
    for (const auto& in : inputs[0]) {
      check_same(output, in, "reduce_scatter", "input_list");
      TORCH_CHECK_VALUE(in.numel() == output.numel(), kPrefix, "reduce_scatter: every tensor of input_list must have ",
                        output.numel(), " elements like the output, got ", in.numel());
      tensors.push_back(in);
    }
    tensors.push_back(output);
    const auto op = check_op(opts.reduceOp, output, "reduce_scatter");
    return scatter_reduce(c10d::OpType::REDUCE_SCATTER, "openreg:reduce_scatter", output, tensors, op);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_tensor(input, "all_to_all_single", "input");
    check_same(input, output, "all_to_all_single", "output");
    const auto send = element_splits(input, input_splits, "input_split_sizes");
    const auto recv = element_splits(output, output_splits, "output_split_sizes");
    Call call = make_call(Kind::AllToAll, input, 0, 0);
    for (int r = 0; r < getSize(); ++r) {
      call.send[r] = send[r];
      call.recv[r] = recv[r];
    }
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::ALLTOALL_BASE, "openreg:all_to_all_single",
                  {input, output}, {output}, false, [call](Comm& comm, std::vector<at::Tensor>& t) {
      Flat in(t[0], true);
      Flat out(t[1], false);
      const auto dtype = in.flat.scalar_type();
      comm.collective(call, [&] {
        const int64_t per = chunk_elements(kSlotBytes / comm.size, in.flat);
        int64_t longest = 0;  // the same on every rank: every rank's call is known now
        for (int r = 0; r < comm.size; ++r) {
          for (int j = 0; j < comm.size; ++j) longest = std::max(longest, comm.call_of(r).send[j]);
        }
        std::vector<int64_t> send_at(comm.size, 0), recv_at(comm.size, 0);
        for (int r = 1; r < comm.size; ++r) {
          send_at[r] = send_at[r - 1] + call.send[r - 1];
          recv_at[r] = recv_at[r - 1] + call.recv[r - 1];
        }
        for (int64_t at = 0; at < longest; at += per) {
          comm.exchange(
              [&] {
                for (int j = 0; j < comm.size; ++j) {
                  const int64_t n = std::clamp<int64_t>(call.send[j] - at, 0, per);
                  if (n > 0) {
                    comm.slot(comm.rank, j * per, n, dtype).copy_(in.flat.narrow(0, send_at[j] + at, n));
                  }
                }
              },
              [&] {
                for (int r = 0; r < comm.size; ++r) {
                  const int64_t n = std::clamp<int64_t>(call.recv[r] - at, 0, per);
                  if (n > 0) {
                    out.flat.narrow(0, recv_at[r] + at, n).copy_(comm.slot(r, comm.rank * per, n, dtype));
                  }
                }
              });
        }
      });
      out.finish();
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    c10::DeviceIndex index = current_device();
    if (opts.device.has_value() && opts.device->type() == c10::DeviceType::PrivateUse1 && opts.device->has_index()) {
      index = opts.device->index();
    } else if (!opts.device_ids.empty()) {
      index = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
    }
    check_device_index(index, "barrier's device");
    Call call;
    call.kind = Kind::Barrier;
    call.seq = comm_->collectives().issue();
    return launch(Channel::Collective, -1, call.seq, c10d::OpType::BARRIER, "openreg:barrier", {}, {}, true,
                  [call](Comm& comm, std::vector<at::Tensor>&) { comm.collective(call, [] {}); }, index);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const at::Tensor& tensor = single(tensors, "send", "tensor");
    check_peer(dst, getRank(), getSize(), "send");
    const std::string what = "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
    return launch(Channel::Send, dst, 0, c10d::OpType::SEND, "openreg:send", {tensor}, {}, false,
                  [dst, tag, what](Comm& comm, std::vector<at::Tensor>& t) {
      const at::Tensor data = t[0].contiguous();
      comm.send(static_cast<const char*>(data.const_data_ptr()), data.nbytes(),
                static_cast<int32_t>(data.scalar_type()), tag, dst, what);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    const at::Tensor& tensor = single(tensors, "recv", "tensor");
    check_peer(src, getRank(), getSize(), "recv");
    const std::string what = "recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
    return launch(Channel::Recv, src, 0, c10d::OpType::RECV, "openreg:recv", {tensor}, {tensor}, false,
                  [src, tag, what](Comm& comm, std::vector<at::Tensor>& t) {
      Flat data(t[0], false);
      comm.recv(static_cast<char*>(data.flat.data_ptr()), data.flat.nbytes(),
                static_cast<int32_t>(data.flat.scalar_type()), tag, src, what);
      data.finish();
    });
  }

 private:
  using Body = std::function<void(Comm&, std::vector<at::Tensor>&)>;

  Call make_call(Kind kind, const at::Tensor& like, int64_t count, int root,
                 c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM) {
    Call call;
    call.seq = comm_->collectives().issue();
    call.kind = kind;
    call.dtype = static_cast<int32_t>(like.scalar_type());
    call.count = count;
    call.root = root;
    call.op = op;
    return call;
  }

  std::vector<int64_t> element_splits(const at::Tensor& tensor, const std::vector<int64_t>& splits,
                                      const char* argument) {
    const int size = getSize();
    std::vector<int64_t> elements(size, 0);
    if (tensor.dim() == 0) {
      TORCH_CHECK_VALUE(splits.empty() && size == 1, kPrefix, "all_to_all_single needs tensors of at least one "
                        "dimension to split among ", size, " ranks");
      elements[0] = tensor.numel();
      return elements;
    }
    const int64_t rows = tensor.size(0);
    const int64_t row = rows == 0 ? 0 : tensor.numel() / rows;
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size == 0, kPrefix, "all_to_all_single: without ", argument,
                        " the first dimension (", rows, ") must divide evenly among ", size, " ranks");
      for (auto& e : elements) e = rows / size * row;
      return elements;
    }
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, kPrefix, "all_to_all_single: ", argument,
                      " must have one entry per rank (", size, "), got ", splits.size());
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      TORCH_CHECK_VALUE(splits[r] >= 0, kPrefix, "all_to_all_single: ", argument, " must not be negative, got ",
                        splits[r], " for rank ", r);
      total += splits[r];
      elements[r] = splits[r] * row;
    }
    TORCH_CHECK_VALUE(total == rows, kPrefix, "all_to_all_single: ", argument, " sums to ", total,
                      " but the tensor's first dimension is ", rows);
    return elements;
  }

  // all_gather (blocks: one per rank, on every rank) and gather (blocks only
  // on the root): rank r's input lands in blocks[r].
  void check_all_gather_into(const at::Tensor& output, const at::Tensor& input) const {
    check_tensor(input, "all_gather_into_tensor", "input_tensor");
    check_same(input, output, "all_gather_into_tensor", "output_tensor");
    TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), kPrefix,
                      "all_gather_into_tensor: output_tensor must have world size x input elements (",
                      input.numel() * getSize(), "), got ", output.numel());
  }

  c10d::ReduceOp::RedOpType check_reduce_scatter_into(const at::Tensor& output, const at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) const {
    check_tensor(input, "reduce_scatter_tensor", "input");
    check_same(input, output, "reduce_scatter_tensor", "output");
    TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(), kPrefix,
                      "reduce_scatter_tensor: input must have world size x output elements (",
                      output.numel() * getSize(), "), got ", input.numel());
    return check_op(opts.reduceOp, input, "reduce_scatter_tensor");
  }

  static void check_pairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                          const char* op) {
    TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(), kPrefix, op,
                      " takes one output per input (at least one), got ", outputs.size(), " outputs and ",
                      inputs.size(), " inputs");
  }

  // Queues one(k) for each of `results` (the outputs) in order and returns their Work.
  c10::intrusive_ptr<c10d::Work> coalesced(c10d::OpType type, const char* title, const std::vector<at::Tensor>& results,
                                           const std::function<c10::intrusive_ptr<c10d::Work>(size_t)>& one) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t k = 0; k < results.size(); ++k) works.push_back(one(k));
    const c10::DeviceIndex index = results[0].device().index();
    const c10::Device device(c10::DeviceType::PrivateUse1, index);
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                           std::vector<c10::Device>{device});
    {
      // After the last operation on the communication stream, as in launch().
      const c10::StreamGuard guard(channel_stream(Channel::Collective, index));
      future->markCompleted(c10::IValue(results));
    }
    return c10::make_intrusive<WorkCoalesced>(getRank(), type, title, std::move(works), results, std::move(future));
  }

  c10::intrusive_ptr<c10d::Work> gather_blocks(Kind kind, c10d::OpType type, const char* title,
                                               const at::Tensor& input, std::vector<at::Tensor> tensors,
                                               std::vector<at::Tensor> outputs, int root) {
    Call call = make_call(kind, input, input.numel(), std::max(root, 0));
    const bool one_output = kind == Kind::AllGather && outputs.size() == 1;  // all_gather_into_tensor
    return launch(Channel::Collective, -1, call.seq, type, title, std::move(tensors), outputs, false,
                  [call, root, one_output](Comm& comm, std::vector<at::Tensor>& t) {
      Flat in(t[0], true);
      std::vector<Flat> outs;
      for (size_t k = 1; k < t.size(); ++k) outs.emplace_back(t[k], false);
      const int64_t count = call.count;
      auto block = [&](int r) {
        return one_output ? outs[0].flat.narrow(0, r * count, count) : outs[r].flat;
      };
      const bool receives = root < 0 || comm.rank == root;
      const auto dtype = in.flat.scalar_type();
      comm.collective(call, [&] {
        comm.chunked(
            count, chunk_elements(kSlotBytes, in.flat),
            [&](int64_t at, int64_t n) { comm.slot(comm.rank, 0, n, dtype).copy_(in.flat.narrow(0, at, n)); },
            [&](int64_t at, int64_t n) {
              if (!receives) return;
              for (int r = 0; r < comm.size; ++r) {
                block(r).narrow(0, at, n).copy_(comm.slot(r, 0, n, dtype));
              }
            });
      });
      for (auto& out : outs) out.finish();
    });
  }

  // reduce_scatter: tensors holds the inputs (one tensor of size x count
  // elements, or one per rank) and last the output of `count` elements.
  c10::intrusive_ptr<c10d::Work> scatter_reduce(c10d::OpType type, const char* title, const at::Tensor& output,
                                                std::vector<at::Tensor> tensors, c10d::ReduceOp::RedOpType op) {
    Call call = make_call(Kind::ReduceScatter, output, output.numel(), 0, op);
    return launch(Channel::Collective, -1, call.seq, type, title, std::move(tensors), {output}, false,
                  [call, op](Comm& comm, std::vector<at::Tensor>& t) {
      std::vector<Flat> ins;
      for (size_t k = 0; k + 1 < t.size(); ++k) ins.emplace_back(t[k], true);
      Flat out(t.back(), false);
      const int64_t count = call.count;
      auto block = [&](int r) { return ins.size() == 1 ? ins[0].flat.narrow(0, r * count, count) : ins[r].flat; };
      const auto dtype = out.flat.scalar_type();
      comm.collective(call, [&] {
        const int64_t per = chunk_elements(kSlotBytes / comm.size, out.flat);
        comm.chunked(
            count, per,
            [&](int64_t at, int64_t n) {
              for (int r = 0; r < comm.size; ++r) {
                comm.slot(comm.rank, r * per, n, dtype).copy_(block(r).narrow(0, at, n));
              }
            },
            [&](int64_t at, int64_t n) { reduce_slots(comm, out.flat.narrow(0, at, n), comm.rank * per, n, op); });
      });
      out.finish();
    });
  }

  c10::Stream channel_stream(Channel channel, c10::DeviceIndex index) {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    const auto key = std::make_pair(static_cast<int>(channel), static_cast<int>(index));
    auto found = streams_.find(key);
    if (found == streams_.end()) {
      // High-priority pool streams, as ProcessGroupNCCL takes its own.
      found = streams_.emplace(key, stream_from_pool(index, kGreatestPriority)).first;
    }
    return found->second;
  }

  // Queues `body` as a kernel on the channel's stream of the tensors' device,
  // after the work queued so far on the caller's current stream.
  // Collectives carry the number their Call was issued; messages are
  // numbered here, per peer and direction.
  c10::intrusive_ptr<c10d::Work> launch(Channel channel, int peer, uint64_t seq, c10d::OpType type,
                                        const char* title, std::vector<at::Tensor> tensors,
                                        std::vector<at::Tensor> outputs, bool blocks_host, Body body,
                                        c10::DeviceIndex index = -1) {
    const std::string what = std::strchr(title, ':') + 1;  // "openreg:all_reduce" -> "all_reduce"
    if (index < 0) {
      for (const auto& t : tensors) check_same(tensors[0], t, what.c_str(), "every tensor");
      index = tensors[0].device().index();
    }
    if (comm_->closed()) {
      raise(std::string(kPrefix) + "rank " + std::to_string(getRank()) + " cannot start " + what +
            ": the group was shut down (destroy_process_group)");
    }
    if (const auto failure = comm_->failure()) {
      raise(std::string(kPrefix) + "rank " + std::to_string(getRank()) + " cannot start " + what +
            ": the group failed earlier: " + *failure);
    }
    Sequencer& sequencer = channel == Channel::Collective ? comm_->collectives()
                           : channel == Channel::Send     ? comm_->sends(peer)
                                                          : comm_->recvs(peer);
    if (channel != Channel::Collective) seq = sequencer.issue();
    const c10::Device device(c10::DeviceType::PrivateUse1, index);
    const c10::Stream stream = channel_stream(channel, index);
    const c10::Stream current = current_stream(index);

    c10::Event ready(c10::DeviceType::PrivateUse1);
    ready.record(current);
    ready.block(stream);
    for (const auto& t : tensors) {
      if (t.storage().data_ptr().get() != nullptr) record_stream(t.storage().data_ptr(), stream);
    }
    std::vector<TensorRef> refs;
    refs.reserve(tensors.size());
    for (const auto& t : tensors) refs.emplace_back(t);

    auto completion = std::make_shared<Completion>();
    launch_kernel(stream, [comm = comm_, refs = std::move(refs), completion, body = std::move(body), &sequencer,
                           seq, what] {
      std::optional<std::string> failure;
      try {
        comm->await_turn(sequencer, seq, what);
        if (const auto earlier = comm->failure()) {
          raise(std::string(kPrefix) + what + " did not run: the group failed earlier: " + *earlier);
        }
        AliasBuilder builder;
        std::vector<at::Tensor> aliases;
        aliases.reserve(refs.size());
        for (const auto& ref : refs) aliases.push_back(builder.alias(ref));
        body(*comm, aliases);
      } catch (const c10::Error& error) {
        failure = error.what_without_backtrace();
      } catch (const std::exception& error) {
        failure = error.what();
      }
      if (failure) comm->fail(*failure);
      sequencer.finish(seq);
      completion->finish(failure);
      if (failure) raise(*failure);
    }, /*wait=*/false);

    c10::Event end(c10::DeviceType::PrivateUse1);
    end.record(stream);
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                           std::vector<c10::Device>{device});
    {
      // The future completes when the communication stream reaches this
      // point: its value's users wait for it on their own streams.
      const c10::StreamGuard guard(stream);
      future->markCompleted(c10::IValue(outputs));
    }
    return c10::make_intrusive<WorkOpenReg>(getRank(), type, title, std::move(completion), std::move(end), device,
                                            std::move(outputs), blocks_host, std::move(future));
  }

  std::shared_ptr<Comm> comm_;
  std::mutex streams_mutex_;
  std::map<std::pair<int, int>, c10::Stream> streams_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> create_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                       int size, std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupOpenReg>(store, rank, size, timeout);
}

}  // namespace openreg
