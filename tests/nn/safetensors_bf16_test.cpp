// bf16 across the safetensors contract with PyTorch, both ways: the BF16 tensors PyTorch wrote
// (tools/make_golden_safetensors.py) load bit for bit, minidl's f32 -> bf16 rounding is PyTorch's
// on the same probes, and a file minidl writes loads in PyTorch with the bits torch itself makes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "core/ops.h"
#include "nn/safetensors.h"
#include "tests/support/safetensors_reader.h"
#include "tests/support/temp_dir.h"

namespace minidl::nn {
namespace {

namespace fs = std::filesystem;

SafetensorsFile load_interop() {
  return load_safetensors(minidl::testing::golden_path("interop/safetensors_interop.safetensors"));
}

const uint16_t* bits_of(const Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data<BFloat16>()); }

TEST(SafetensorsBf16, PytorchValuesLoadExactly) {
  const SafetensorsFile f = load_interop();
  ASSERT_TRUE(f.tensors.count("bf16.values")) << "regenerate with: /usr/bin/python3 tools/make_golden_safetensors.py";
  const Tensor& t = f.tensors.at("bf16.values");
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_EQ(t.shape(), (Shape{7}));
  // 1/3 is 0x3eab in bf16 (0.333984375); 0x7f7f the largest finite; 2^-133 the smallest subnormal.
  const std::vector<double> want{1.0, -2.5, 0.333984375, 3.3895313892515355e38, std::ldexp(1.0, -133), -0.0,
                                 INFINITY};
  EXPECT_EQ(t.to_vector(), want);
  EXPECT_TRUE(std::signbit(t.to_vector()[5]));
  EXPECT_EQ(bits_of(t)[2], 0x3eab);
  EXPECT_EQ(bits_of(t)[3], 0x7f7f);
  EXPECT_EQ(bits_of(t)[4], 0x0001);
}

TEST(SafetensorsBf16, MinidlRoundsF32ToBf16AsPytorchDoes) {
  const SafetensorsFile f = load_interop();
  ASSERT_TRUE(f.tensors.count("bf16.probes") && f.tensors.count("bf16.probes.f32"));
  const Tensor& torch_bf16 = f.tensors.at("bf16.probes");
  const Tensor& probes = f.tensors.at("bf16.probes.f32");
  ASSERT_EQ(probes.dtype(), DType::f32);
  const Tensor ours = probes.to(DType::bf16);
  const float* p = probes.data<float>();
  int64_t nans = 0;
  for (int64_t i = 0; i < probes.numel(); ++i) {
    const uint16_t t = bits_of(torch_bf16)[i], m = bits_of(ours)[i];
    if (std::isnan(p[i])) {
      // PyTorch's vector path stores 0xffff for every NaN; minidl keeps the sign and makes it quiet
      // (0x7fc0 | sign), as for f16: both are NaN, the bits are not compared.
      EXPECT_TRUE(std::isnan(BFloat16::to_float(t)) && std::isnan(BFloat16::to_float(m))) << "probe " << i;
      ++nans;
      continue;
    }
    uint32_t x;
    std::memcpy(&x, &p[i], 4);
    ASSERT_EQ(m, t) << "probe " << i << ": f32 0x" << std::hex << x << " (" << p[i] << ")";
  }
  EXPECT_GT(nans, 0);
  EXPECT_GT(probes.numel(), 2000);
}

// The interpreter with torch: Debian's first, then the one on PATH; empty when neither imports it.
std::string python_with_torch() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    const std::string cmd = std::string(py) + " -c \"import torch\" > /dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return "";
}

// Runs cmd, returning its exit status and what it printed.
int run(const std::string& cmd, std::string* output) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) *output += buf;
  return pclose(pipe);
}

TEST(SafetensorsBf16, AFileMinidlWritesLoadsInPytorch) {
  const std::string py = python_with_torch();
  if (py.empty()) GTEST_SKIP() << "no python3 with torch (install python3-torch): PyTorch's side is not checked";
  // The probes PyTorch wrote, rounded by minidl, beside the f32 values: the script rounds those
  // with torch and compares the bits; plus a strided view and a 2-D tensor.
  const SafetensorsFile f = load_interop();
  const Tensor probes = f.tensors.at("bf16.probes.f32");
  const Tensor grid = (arange(0.0, 24.0) * 0.37 - 4.0).reshape({4, 6});
  std::map<std::string, Tensor> out{{"probes", probes.to(DType::bf16)},
                                    {"probes.f32", probes},
                                    {"grid.t", grid.t().to(DType::bf16)},
                                    {"grid.t.f32", grid.t().contiguous()}};
  const fs::path dir = minidl::testing::fresh_dir("minidl_safetensors_bf16_test", "to_torch");
  const std::string file = (dir / "minidl_bf16.safetensors").string();
  save_safetensors(file, out, {{"producer", "safetensors_bf16_test"}});
  const fs::path script = fs::path(MINIDL_GOLDEN_DIR).parent_path().parent_path() / "tools" / "torch_reads_safetensors.py";
  std::string printed;
  const int status = run(py + " " + script.string() + " " + file, &printed);
  EXPECT_EQ(status, 0) << printed;
  EXPECT_EQ(printed, "ok " + std::to_string(probes.numel() + grid.numel()) + "\n");
}

}  // namespace
}  // namespace minidl::nn
