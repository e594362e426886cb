// The nvcc build's static resource usage of every kernel (cmake/kernel_resources.cmake captures
// ptxas's --resource-usage report per CUDA source at build time): registers, spill stores and
// loads, stack frame and static shared memory for sm_90, looked up by the kernel's name and
// parameter types as the emulated device sees a launch.
#pragma once
#include <istream>
#include <string>
#include <vector>

namespace minidl::gpumodel {

struct KernelResources {
  std::string mangled;
  std::string name;         // without namespaces, template arguments or parameters: "copy_contig_kernel"
  std::string parameters;   // the demangled parameter list: "(float*, __half const*, long)"
  std::string demangled;    // the whole demangled signature
  std::string source;       // the report it came from ("elementwise.cu")
  int registers = 0;
  int spill_stores = 0;     // bytes
  int spill_loads = 0;      // bytes
  int stack_frame = 0;      // bytes per thread
  int static_smem = 0;      // bytes per block
  int barriers = 0;
};

// Parses one ptxas report (the lines of `nvcc --resource-usage` for one source); entry functions
// only. `source` labels the results.
std::vector<KernelResources> parse_ptxas_report(std::istream& in, const std::string& source);
// Every *.txt report in a folder (MINIDL_KERNEL_RESOURCES_DIR); empty when the folder is missing.
std::vector<KernelResources> load_kernel_resources(const std::string& dir);

// "(copy_contig_kernel<D, S>)" or "minidl::cuda::(anonymous namespace)::copy_contig_kernel<float>"
// -> "copy_contig_kernel".
std::string kernel_base_name(const std::string& text);

// The kernel a launch ran: the entry of that base name whose parameter list equals `parameters`
// (the emulated launch's demangled parameter types); when none does, the entry of that name with
// the most registers (`exact` false). A launch through a function pointer (kernel text "kernel")
// is found by its parameter types alone when exactly one kernel has them. nullptr when unknown.
const KernelResources* find_kernel(const std::vector<KernelResources>& table, const std::string& kernel_text,
                                   const std::string& parameters, bool* exact = nullptr);

}  // namespace minidl::gpumodel
