// The plumbing shared by the cuBLAS and cuDNN stand-ins: the hooks of emu_libs.h, the per-thread
// error detail, and element access with our own f16 / bf16 / TF32 conversions (written from the
// IEEE 754 formats, not taken from minidl's, so the emulated libraries stay a second opinion).
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

#include "cuda_emu/emu_libs_internal.h"

namespace minidl::cuda::emu {
namespace {

std::atomic<RangeChecker> g_range_checker{nullptr};
std::atomic<StreamChecker> g_stream_checker{nullptr};
std::atomic<StreamFlusher> g_stream_flusher{nullptr};
std::atomic<FaultReporter> g_fault_reporter{nullptr};
std::atomic<CaptureRecorder> g_capture_recorder{nullptr};
thread_local std::string t_detail;

}  // namespace

void set_device_range_checker(RangeChecker f) { g_range_checker.store(f); }
void set_stream_checker(StreamChecker f) { g_stream_checker.store(f); }
void set_stream_flusher(StreamFlusher f) { g_stream_flusher.store(f); }
void set_capture_recorder(CaptureRecorder f) { g_capture_recorder.store(f); }
void set_fault_reporter(FaultReporter f) { g_fault_reporter.store(f); }
const char* last_error_detail() { return t_detail.c_str(); }
void clear_last_error_detail() { t_detail.clear(); }

long long cudnn_algorithm_queries() { return detail::cudnn_query_count().load(); }

namespace {
std::mutex g_find_delay_mu;
FindDelay g_find_delay;
long long g_find_calls = 0;
}  // namespace
void set_cudnn_find_delay(FindDelay delay) {
  std::lock_guard<std::mutex> lock(g_find_delay_mu);
  g_find_delay = std::move(delay);
  g_find_calls = 0;
}
namespace detail {
long long next_cudnn_find_call() {
  std::lock_guard<std::mutex> lock(g_find_delay_mu);
  return g_find_calls++;
}
float cudnn_find_delay(long long call, int algo) {
  std::lock_guard<std::mutex> lock(g_find_delay_mu);
  return g_find_delay ? g_find_delay(call, algo) : 0.0f;
}
}  // namespace detail

LibObjectCounts live_object_counts() {
  LibObjectCounts c;
  c.cublas_handles = detail::cublas_live_handles();
  detail::cudnn_live_counts(c);
  c.backend_descriptors = detail::cudnn_backend_live_descriptors();
  return c;
}

namespace detail {

void set_detail(const std::string& s) { t_detail = s; }

void report_fault(const std::string& s) {
  t_detail = s;
  if (FaultReporter f = g_fault_reporter.load()) f(s.c_str());
}

bool range_ok(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  if (p == nullptr) return false;
  const RangeChecker f = g_range_checker.load();
  return f == nullptr || f(p, bytes);
}

bool stream_ok(cudaStream_t s) {
  const StreamChecker f = g_stream_checker.load();
  return f == nullptr || f(s);
}

void flush_stream(cudaStream_t s) {
  if (const StreamFlusher f = g_stream_flusher.load()) f(s);
}

bool record_if_capturing(cudaStream_t s, const std::function<void()>& work, const char* label) {
  const CaptureRecorder f = g_capture_recorder.load();
  return f != nullptr && f(s, work, label);
}

const char* state_word(ObjState s) {
  switch (s) {
    case ObjState::Live: return "live";
    case ObjState::Destroyed: return "already destroyed";
    case ObjState::Unknown: break;
  }
  return "not created by this library";
}

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::F16:
    case Elem::BF16: return 2;
    case Elem::F32:
    case Elem::I32: return 4;
    case Elem::F64: return 8;
    case Elem::I8: return 1;
  }
  return 1;
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::F16: return "f16";
    case Elem::BF16: return "bf16";
    case Elem::F32: return "f32";
    case Elem::F64: return "f64";
    case Elem::I8: return "i8";
    case Elem::I32: return "i32";
  }
  return "?";
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; binary32: 8 exponent (bias 127), 23.
float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {   // zero or subnormal: m * 2^-24, exact in f32
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign != 0 ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t float_to_half_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));   // NaN, quiet
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);   // >= 65520 (or inf): inf
  const uint32_t e = ax >> 23;
  if (e < 113) {   // below 2^-14: a half subnormal (units of 2^-24) or zero
    if (e < 102) return sign;   // below 2^-25: rounds to zero
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;   // value = m * 2^(e - 150) = (m >> shift) * 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u) != 0)) ++q;   // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t r = ax - (112u << 23);   // rebias; a carry out of the mantissa bumps the exponent
  return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

float bf16_bits_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);   // NaN, quiet
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float round_to_tf32(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7f800000u) == 0x7f800000u) return f;   // inf, NaN
  return std::bit_cast<float>((x + 0x1000u) & ~0x1fffu);   // on the magnitude bits: ties away from zero
}

namespace {
double round_input(float v, InputRounding r) {
  switch (r) {
    case InputRounding::None: break;
    case InputRounding::Tf32: return round_to_tf32(v);
    case InputRounding::F16: return half_bits_to_float(float_to_half_bits(v));
    case InputRounding::Bf16: return bf16_bits_to_float(float_to_bf16_bits(v));
  }
  return v;
}
}  // namespace

double read_elem(const void* p, Elem e, int64_t i, InputRounding r) {
  const auto* b = static_cast<const unsigned char*>(p) + static_cast<size_t>(i) * elem_size(e);
  switch (e) {
    case Elem::F16: {
      uint16_t h;
      std::memcpy(&h, b, 2);
      return half_bits_to_float(h);   // exact in TF32, bf16 is never asked of f16 data
    }
    case Elem::BF16: {
      uint16_t h;
      std::memcpy(&h, b, 2);
      return bf16_bits_to_float(h);
    }
    case Elem::F32: {
      float v;
      std::memcpy(&v, b, 4);
      return round_input(v, r);
    }
    case Elem::F64: {
      double v;
      std::memcpy(&v, b, 8);
      return v;
    }
    case Elem::I8: return static_cast<double>(static_cast<const int8_t*>(static_cast<const void*>(b))[0]);
    case Elem::I32: {
      int32_t v;
      std::memcpy(&v, b, 4);
      return v;
    }
  }
  return 0.0;
}

void write_elem(void* p, Elem e, int64_t i, double v) {
  auto* b = static_cast<unsigned char*>(p) + static_cast<size_t>(i) * elem_size(e);
  auto saturate = [v](double lo, double hi) {
    if (std::isnan(v)) return 0.0;
    return std::fmin(std::fmax(std::nearbyint(v), lo), hi);
  };
  switch (e) {
    case Elem::F16: {
      const uint16_t h = float_to_half_bits(static_cast<float>(v));
      std::memcpy(b, &h, 2);
      return;
    }
    case Elem::BF16: {
      const uint16_t h = float_to_bf16_bits(static_cast<float>(v));
      std::memcpy(b, &h, 2);
      return;
    }
    case Elem::F32: {
      const auto f = static_cast<float>(v);
      std::memcpy(b, &f, 4);
      return;
    }
    case Elem::F64: std::memcpy(b, &v, 8); return;
    case Elem::I8: {
      const auto q = static_cast<int8_t>(saturate(-128.0, 127.0));
      std::memcpy(b, &q, 1);
      return;
    }
    case Elem::I32: {
      const auto q = static_cast<int32_t>(
          saturate(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
      std::memcpy(b, &q, 4);
      return;
    }
  }
}

}  // namespace detail
}  // namespace minidl::cuda::emu
