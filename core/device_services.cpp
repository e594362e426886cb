// The default device services of core/device_services.h, for host memory: a copy_async that
// copies at once and returns a handle that is already complete, no CUDA graphs and no interval timer.
#include "core/device_services.h"

#include <atomic>
#include <cstring>

#include "core/backend.h"
#include "core/error.h"

namespace minidl {

namespace {
std::atomic<bool> g_conv_autotune{false};   // flipped between steps, read by each convolution's plan
}  // namespace

void set_conv_autotune(bool on) { g_conv_autotune = on; }
bool conv_autotune() { return g_conv_autotune; }

std::unique_ptr<DeviceServices::CopyHandle> DeviceServices::copy_async(
    const std::vector<std::pair<const void*, Tensor>>& copies) {
  for (const auto& [src, dst] : copies) {
    MINIDL_CHECK(dst.device().is_cpu() && dst.is_contiguous(), "copy_async (", name(),
                 "): destinations must be contiguous CPU tensors here, got ", dst.meta(),
                 "; a device backend overrides copy_async");
    MINIDL_CHECK(src != nullptr || dst.numel() == 0, "copy_async (", name(), "): null source for ", dst.meta());
    if (dst.nbytes() > 0) std::memcpy(dst.data_ptr(), src, dst.nbytes());
  }
  return std::make_unique<CopyHandle>();
}

std::unique_ptr<DeviceServices::Graph> DeviceServices::capture_graph(int, const std::function<void()>&, const Graph*) {
  MINIDL_FAIL("CUDA graphs (--cuda-graphs) need a CUDA device; the ", name(),
              " backend runs every step eagerly (drop --cuda-graphs)");
}

std::unique_ptr<DeviceServices::IntervalTimer> DeviceServices::interval_timer(int, std::string* why) {
  if (why != nullptr) *why = std::string("the ") + name() + " device has no event timer";
  return nullptr;
}

}  // namespace minidl
