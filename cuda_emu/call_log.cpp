// The call log of the emulated libraries and runtime (call_log.h): a mutex-guarded vector, since
// a loader thread may copy while the main thread computes.
#include "cuda_emu/call_log.h"

#include <cxxabi.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace minidl::cuda::emu {
namespace {

struct Log {
  std::mutex mu;
  std::vector<LibCall> calls;
  std::vector<KernelRun> runs;
};
Log& log() {
  static auto* l = new Log();
  return *l;
}
std::atomic<bool> g_on{false};

}  // namespace

const char* math_class_name(MathClass m) {
  switch (m) {
    case MathClass::None: return "none";
    case MathClass::F16Tensor: return "f16 tensor";
    case MathClass::Tf32Tensor: return "tf32 tensor";
    case MathClass::Fp32: return "fp32";
    case MathClass::Fp64: return "fp64";
  }
  return "?";
}

void set_call_logging(bool on) { g_on.store(on); }
bool call_logging() { return g_on.load(); }

const std::vector<LibCall>& call_log() { return log().calls; }

void clear_call_log() {
  std::lock_guard<std::mutex> lock(log().mu);
  log().calls.clear();
  log().runs.clear();
}

void log_call(LibCall c) {
  if (!g_on.load()) return;
  std::lock_guard<std::mutex> lock(log().mu);
  c.kernels_before = log().runs.size();
  log().calls.push_back(std::move(c));
}

void log_transfer(const char* op, size_t bytes, const void* stream) {
  if (!g_on.load()) return;
  LibCall c;
  c.lib = "runtime";
  c.op = op;
  c.shapes = std::to_string(bytes) + " bytes";
  c.min_bytes = static_cast<double>(bytes);
  c.stream = stream;
  log_call(std::move(c));
}

const std::vector<KernelRun>& kernel_runs() { return log().runs; }

void log_kernel_run(const char* kernel, const std::string* parameters) {
  if (!g_on.load()) return;
  std::lock_guard<std::mutex> lock(log().mu);
  log().runs.push_back({kernel, parameters});
}

std::string parameter_types(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  if (const size_t p = s.find("(*)"); p != std::string::npos) s = s.substr(p + 3);   // "void (*)(float*, long)"
  return s;
}

}  // namespace minidl::cuda::emu
