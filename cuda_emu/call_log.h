// The emulated device's log of the work that is not a kernel of ours: every cuDNN convolution and
// cuBLAS GEMM the stand-ins compute, and every memcpy / memset the runtime runs, with what the
// H100 step-time model (perfmodel) needs to cost it: the op, shapes, dtypes, math, algorithm,
// workspace, FLOPs and the fewest bytes the call can move. Off unless a program turns it on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace minidl::cuda::emu {

// Which peak a call's FLOPs run at (the H100's figures in perfmodel/h100.h).
enum class MathClass { None, F16Tensor, Tf32Tensor, Fp32, Fp64 };
const char* math_class_name(MathClass m);

struct LibCall {
  std::string lib;       // "cuDNN", "cuBLAS", "runtime"
  std::string op;        // "conv forward", "conv backward data", "conv backward filter", "gemm", "memcpy HtoD", ...
  std::string shapes;    // e.g. "x 2x64x56x56 NHWC, w 64x64x3x3 KRSC, y 2x64x56x56, pad 1 stride 1"
  std::string dtype;     // "f16", "f32", "f64", "bf16"
  std::string algo;      // cuDNN's algorithm name, cuBLAS's compute type, "" for copies
  std::string layout;    // "NCHW" / "NHWC" for convolutions, "NN" / "NT" / ... for GEMMs
  // The geometry as numbers, so the model can scale it: conv {n, c, h, w, k, r, s, oh, ow, groups},
  // gemm {m, n, k, batch}, copies {bytes}.
  std::vector<double> dims;
  MathClass math = MathClass::None;
  size_t workspace = 0;  // bytes given to the call
  double flops = 0;      // a multiply-add counts 2
  // Each operand read once and the output written once (read too when beta != 0); a fused graph's
  // convolution: the graph's stored tensors once.
  double min_bytes = 0;
  const void* stream = nullptr;
  uint64_t kernels_before = 0;   // kernels of ours that had run when this call ran (kernel_runs().size())
};

// Logging is off by default; turning it on or off keeps what was logged.
void set_call_logging(bool on);
bool call_logging();
const std::vector<LibCall>& call_log();
void clear_call_log();
void log_call(LibCall c);   // no-op while logging is off

// The runtime's copies and fills, logged when they run (in stream order).
void log_transfer(const char* op, size_t bytes, const void* stream);

// The kernels of ours that ran while logging was on, in the order they ran: the emulated
// launch_kernel queues a marker behind each launch on its stream, so the count at a library call
// is its position among the kernels, and each kernel's parameter types tell which nvcc
// instantiation of a template it was (its registers and shared memory, perfmodel). The
// profiler's list of launches (profiler.h) is in the same order.
struct KernelRun {
  std::string kernel;            // MINIDL_LAUNCH's kernel text, e.g. "(copy_contig_kernel<D, S>)"
  const std::string* parameters;  // demangled, e.g. "(float*, __half const*, long)"; interned
};
const std::vector<KernelRun>& kernel_runs();
void log_kernel_run(const char* kernel, const std::string* parameters);
// "PFvPfPK6__halflE" (typeid of a kernel's function pointer) -> "(float*, __half const*, long)".
std::string parameter_types(const char* mangled_function_pointer_type);

}  // namespace minidl::cuda::emu
