// Moving modules and saving tensors across devices: parameters keep their identity (an optimizer
// holding them stays valid) and CUDA tensors are saved through the CPU. Needs a CUDA device, so it
// runs as nn_cuda on a GPU and as nn_cuda_emu on the emulated device (docs/cuda/emulator.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tests/nn/small_net.h"
#include "nn/safetensors.h"
#include "tests/support/temp_dir.h"

namespace minidl::nn {
namespace {

namespace fs = std::filesystem;

using testing::small_net;

fs::path temp_dir(const std::string& name) { return minidl::testing::fresh_dir("minidl_device_move_test", name); }

TEST(ModuleTest, ToCudaKeepsParameterIdentity) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the cross-device move is not exercised";
  Generator gen(4);
  auto net = small_net(gen);
  sum((*net)(randn({2, 3, 8, 8}, {}, &gen))).backward();
  const Tensor w = net->named_parameters()[0].second;
  const Tensor before = w.detach().clone();
  net->to(Device::cuda(0));
  EXPECT_TRUE(w.device().is_cuda());
  EXPECT_TRUE(w.grad().device().is_cuda());
  const Tensor y = (*net)(randn({2, 3, 8, 8}, {}, &gen).to(Device::cuda(0)));
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  EXPECT_TRUE(w.is_leaf() && w.requires_grad());
  EXPECT_TRUE(net->named_buffers()[2].second.device().is_cuda());
  net->to(Device::cpu());
  EXPECT_TRUE(allclose(w, before, 0, 0));
}

TEST(SafetensorsRoundTrip, CudaTensorsAreCopiedToTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = temp_dir("cuda");
  const Tensor cpu = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  save_safetensors((dir / "t.safetensors").string(),
                   {{"w", cpu.to(Device::cuda()).t()}, {"h", cpu.to(DType::f16).to(Device::cuda())}});
  const SafetensorsFile f = load_safetensors((dir / "t.safetensors").string());
  EXPECT_EQ(f.tensors.at("w").to_vector(), cpu.t().to_vector());
  EXPECT_EQ(f.tensors.at("h").to_vector(), cpu.to_vector());
}

}  // namespace
}  // namespace minidl::nn
