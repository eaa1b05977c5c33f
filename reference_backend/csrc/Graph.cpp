// torch.accelerator.Graph on OpenReg: capture the work queued on the current
// stream, then replay it. The runtime records the stream's work while it
// captures (orStreamBeginCapture, runtime.h); this file adds what PyTorch
// needs around it:
//  * memory: allocations made while capturing come from a graph pool
//    (Allocator.h), so the addresses the recorded work uses stay the
//    graph's until the graph is reset or destroyed;
//  * the queries: torch.Stream.is_capturing() (the guard's
//    isStreamCapturing) tells the truth while the stream captures;
//  * refusals: work that cannot be recorded raises at its call (a
//    synchronous operator, a copy to the host, a synchronization of the
//    capturing stream, a random operator), and capture_end then raises too.
#include "Allocator.h"
#include "DeviceManagement.h"
#include "Exception.h"
#include "Stream.h"

#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceGuard.h>

namespace openreg {

namespace {

class OpenRegGraph final : public at::GraphImplInterface {
 public:
  explicit OpenRegGraph(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}

  ~OpenRegGraph() override {
    try {
      reset();
    } catch (...) {
      // A device lost meanwhile: nothing more to give back.
    }
  }

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode capture_mode) override {
    TORCH_CHECK(!capturing_ && graph_ == nullptr,
                "OpenReg: capture_begin: this graph already holds a capture; call reset() before capturing again");
    // Every mode records the same way: capture is per stream, and only calls
    // that depend on the capturing stream are refused (runtime.h). The
    // interface lets a backend treat the modes as the default one.
    (void)capture_mode;
    const c10::DeviceIndex device = current_device();
    const c10::Stream stream = current_stream(device);
    TORCH_CHECK(stream.id() != 0, "OpenReg: capture_begin: the current stream of device ", static_cast<int>(device),
                " is its default stream, which cannot capture; capture under a stream of your own "
                "(with torch.Stream(): ...), as on CUDA");
    const c10::MempoolId_t graph_pool = pool == c10::MempoolId_t{0, 0} ? new_graph_pool() : pool;
    retain_graph_pool(graph_pool);
    begin_graph_pool_allocation(stream, graph_pool);
    const orError_t status = orStreamBeginCapture(native_stream(stream));
    if (status != orSuccess) {
      end_graph_pool_allocation(stream);
      release_graph_pool(graph_pool);
      OPENREG_CHECK(status);
    }
    device_ = device;
    stream_ = stream;
    pool_ = graph_pool;
    holds_pool_ = true;
    capturing_ = true;
  }

  void capture_end() override {
    TORCH_CHECK(capturing_, "OpenReg: capture_end: the graph is not capturing (call capture_begin first)");
    const c10::Stream stream = current_stream(device_);
    TORCH_CHECK(stream == stream_, "OpenReg: capture_end: capture must end on the stream it began on (stream ",
                stream_.id(), " of device ", static_cast<int>(device_), "), but the current stream is ", stream.id());
    end_graph_pool_allocation(stream_);
    capturing_ = false;
    orGraph_t graph = nullptr;
    const orError_t status = orStreamEndCapture(native_stream(stream_), &graph);
    if (status != orSuccess) {
      release_graph_pool(pool_);
      holds_pool_ = false;
      OPENREG_CHECK(status);
    }
    graph_ = graph;
    if (!keep_graph_) instantiate();
  }

  // OpenReg's recorded work runs as it is: instantiating only marks the
  // graph ready (replay() does it when keep_graph left it to the user).
  void instantiate() override {
    TORCH_CHECK(graph_ != nullptr, "OpenReg: instantiate: the graph holds no capture (capture_begin and "
                "capture_end come first)");
    instantiated_ = true;
  }

  void replay() override {
    TORCH_CHECK(graph_ != nullptr, "OpenReg: replay: the graph holds no capture (capture_begin and "
                "capture_end come first)");
    if (!instantiated_) instantiate();
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device_));
    // On the current stream, after the work queued on it, as on CUDA.
    const c10::Stream stream = current_stream(device_);
    OPENREG_CHECK(orGraphLaunch(graph_, native_stream(stream)));
  }

  void reset() override {
    if (capturing_) {
      end_graph_pool_allocation(stream_);
      capturing_ = false;
      orGraph_t discarded = nullptr;
      if (orStreamEndCapture(native_stream(stream_), &discarded) == orSuccess) orGraphDestroy(discarded);
    }
    if (graph_ != nullptr) {
      orGraphDestroy(graph_);
      graph_ = nullptr;
    }
    instantiated_ = false;
    if (holds_pool_) {
      holds_pool_ = false;
      release_graph_pool(pool_);
    }
  }

  c10::MempoolId_t pool() const override { return pool_; }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "OpenReg: debug_dump: call enable_debug_mode() first");
    TORCH_CHECK(graph_ != nullptr, "OpenReg: debug_dump: the graph holds no capture");
    OPENREG_CHECK(orGraphDebugDotPrint(graph_, path.c_str()));
  }

 private:
  const bool keep_graph_;
  bool capturing_ = false;
  bool instantiated_ = false;
  bool debug_ = false;
  bool holds_pool_ = false;
  c10::DeviceIndex device_ = -1;
  c10::Stream stream_{c10::Stream::DEFAULT, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  c10::MempoolId_t pool_{0, 0};
  orGraph_t graph_ = nullptr;
};

}  // namespace

bool is_capturing(const c10::Stream& stream) {
  int capturing = 0;
  OPENREG_CHECK(orStreamIsCapturing(native_stream(stream), &capturing));
  return capturing != 0;
}

}  // namespace openreg

// PyTorch finds the implementation under c10::DeviceTypeName(PrivateUse1,
// false): the renamed backend's name in upper case, "OPENREG" (not
// "PrivateUse1" or "PRIVATEUSEONE", which no lookup uses once the backend is
// renamed).
namespace at {
C10_REGISTER_CLASS(GraphImplRegistry, OPENREG, openreg::OpenRegGraph);
}  // namespace at
