// ptxas's resource report as the build captures it (cmake/kernel_resources.cmake): parsing, the
// demangled names and parameter lists, and finding the instantiation a launch ran.
#include <gtest/gtest.h>

#include <sstream>

#include "perfmodel/kernel_resources.h"

namespace minidl::gpumodel {
namespace {

// nvcc 13's --resource-usage output for three kernels (one with a device function's properties in
// between, which must not be taken for an entry's).
constexpr const char* kReport = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a252k1IfEEvPKT_PS1_l' for 'sm_90'
ptxas info    : Function properties for _ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a252k1IfEEvPKT_PS1_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Compile time = 29.081 ms
ptxas info    : Function properties for _Z6helperv
    64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a252shEPf' for 'sm_90'
ptxas info    : Function properties for _ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a252shEPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compiling entry function '_ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a253bigEPfi' for 'sm_90'
ptxas info    : Function properties for _ZN36_GLOBAL__N__aabca8b4_4_t_cu_7d5b8a253bigEPfi
    256 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 256 bytes cumulative stack size
)";

TEST(KernelResources, ParsesEveryEntryFunctionOfAPtxasReport) {
  std::istringstream in(kReport);
  const std::vector<KernelResources> t = parse_ptxas_report(in, "t.cu");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].name, "k1");
  EXPECT_EQ(t[0].parameters, "(float const*, float*, long)");
  EXPECT_EQ(t[0].demangled, "void (anonymous namespace)::k1<float>(float const*, float*, long)");
  EXPECT_EQ(t[0].registers, 10);
  EXPECT_EQ(t[0].static_smem, 0);
  EXPECT_EQ(t[1].name, "sh");
  EXPECT_EQ(t[1].static_smem, 4096);
  EXPECT_EQ(t[1].barriers, 1);
  EXPECT_EQ(t[1].spill_stores, 0);   // the device function's spills between k1 and sh are not sh's
  EXPECT_EQ(t[2].name, "big");
  EXPECT_EQ(t[2].registers, 255);
  EXPECT_EQ(t[2].spill_stores, 24);
  EXPECT_EQ(t[2].spill_loads, 16);
  EXPECT_EQ(t[2].stack_frame, 256);
  EXPECT_EQ(t[2].source, "t.cu");
}

TEST(KernelResources, BaseNamesOfLaunchTextsAndSignatures) {
  EXPECT_EQ(kernel_base_name("(copy_contig_kernel<D, S>)"), "copy_contig_kernel");
  EXPECT_EQ(kernel_base_name("unscale_kernel"), "unscale_kernel");
  EXPECT_EQ(kernel_base_name("minidl::cuda::(anonymous namespace)::reduce_kernel<float, OutT<1> >"), "reduce_kernel");
  EXPECT_EQ(kernel_base_name("minidl::cuda::(anonymous namespace)::apply_kernel<__half>(__half const*, long)"),
            "apply_kernel");
}

TEST(KernelResources, FindsTheInstantiationByParameterTypes) {
  std::vector<KernelResources> t(3);
  t[0].name = t[1].name = "apply_kernel";
  t[0].parameters = "(float const*, float*, long)";
  t[0].registers = 20;
  t[1].parameters = "(__half const*, __half*, long)";
  t[1].registers = 24;
  t[2].name = "sgd_kernel";
  t[2].parameters = "(minidl::cuda::(anonymous namespace)::SgdChunk const*, long, Args)";
  bool exact = false;
  EXPECT_EQ(find_kernel(t, "(apply_kernel<T>)", "(__half const*, __half*, long)", &exact), &t[1]);
  EXPECT_TRUE(exact);
  // Unknown parameters: the name's instantiation with the most registers, flagged inexact.
  EXPECT_EQ(find_kernel(t, "(apply_kernel<T>)", "(double const*, double*, long)", &exact), &t[1]);
  EXPECT_FALSE(exact);
  // A launch through a function pointer: by its parameter types alone.
  EXPECT_EQ(find_kernel(t, "kernel", t[2].parameters, &exact), &t[2]);
  EXPECT_TRUE(exact);
  EXPECT_EQ(find_kernel(t, "nothing_kernel", "(int)", &exact), nullptr);
}

// The build's own report (CUDA builds): every kernel minidl launches is in it, with registers.
TEST(KernelResources, TheBuildsReportCoversTheBackendsKernels) {
  if (std::string(MINIDL_KERNEL_RESOURCES_DIR).empty()) GTEST_SKIP() << "a build without the CUDA backend";
  const std::vector<KernelResources> t = load_kernel_resources(MINIDL_KERNEL_RESOURCES_DIR);
  ASSERT_FALSE(t.empty()) << "no ptxas report in " << MINIDL_KERNEL_RESOURCES_DIR << " (build the minidl target)";
  for (const char* k : {"copy_contig_kernel", "binary_vec_kernel", "apply_kernel", "stats_kernel", "reduce_kernel",
                        "max_fwd_kernel", "ce_fwd_kernel", "sgd_kernel", "adam_kernel", "unscale_kernel"}) {
    const KernelResources* r = find_kernel(t, k, "");
    ASSERT_NE(r, nullptr) << k;
    EXPECT_GT(r->registers, 0) << k;
  }
}

}  // namespace
}  // namespace minidl::gpumodel
