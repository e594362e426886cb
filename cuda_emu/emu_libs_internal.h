// What the cuBLAS and cuDNN stand-ins share: the error detail and fault plumbing behind
// emu_libs.h, the registry that makes handles and descriptors real objects (so a destroyed or
// foreign one is recognised instead of dereferenced), and element access with our own f16 / bf16 /
// TF32 roundings, independent of minidl's, so the reference results are a second implementation.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_set>

#include "cuda_emu/emu_libs.h"

namespace minidl::cuda::emu::detail {

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

// Records why a call failed (emu_libs.h's last_error_detail) and hands back its status.
void set_detail(const std::string& s);
template <class Status>
Status fail(Status st, const std::string& s) {
  set_detail(s);
  return st;
}
// The same for a fault (bad range, dead stream, misaligned element): also tells the runtime.
void report_fault(const std::string& s);

// [p, p + bytes) inside one live device allocation. Without a checker any non-null range is
// accepted; an empty range always is.
bool range_ok(const void* p, size_t bytes);
bool stream_ok(cudaStream_t s);
// Runs the work queued on `s` before a call computes (the libraries' work is in stream order).
void flush_stream(cudaStream_t s);
// Whether the call's computation `work` went into the capture of `s` (then it runs at each replay of
// the graph, not now; its operands' ranges are checked again there).
bool record_if_capturing(cudaStream_t s, const std::function<void()>& work, const char* label);

// Handles and descriptors: each a heap object whose address is the handle. A destroyed object is
// kept (up to kTombstones per kind, oldest freed first) so that its address is not reused while a
// stale handle may still be around, and a later use of it is reported as "destroyed".
enum class ObjState { Live, Destroyed, Unknown };
template <class T>
class Registry {
 public:
  static constexpr size_t kTombstones = 1 << 14;
  T* create() {
    T* p = new T();
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
    return p;
  }
  ObjState state(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.count(p) != 0) return ObjState::Live;
    if (dead_.count(p) != 0) return ObjState::Destroyed;
    return ObjState::Unknown;
  }
  bool destroy(T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_.erase(p) == 0) return false;
    dead_.insert(p);
    order_.push_back(p);
    if (order_.size() > kTombstones) {
      dead_.erase(order_.front());
      delete order_.front();
      order_.pop_front();
    }
    return true;
  }
  int live_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(live_.size());
  }

 private:
  mutable std::mutex mu_;
  std::unordered_set<const void*> live_, dead_;
  std::deque<T*> order_;
};

// The one registry of each kind of object. Never destroyed, so that a handle released during
// static destruction (after main returns) still finds it.
template <class T>
Registry<T>& registry_of() {
  static auto* r = new Registry<T>();
  return *r;
}

const char* state_word(ObjState s);

// An enum argument's value as the caller passed it, read without loading it as the enum: a
// value outside the enum's range is what the check is for, and loading one is undefined.
template <class E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}   // "destroyed" / "not created by this library"

// Each library's share of emu_libs.h's live_object_counts.
int cublas_live_handles();
void cudnn_live_counts(LibObjectCounts& out);
int cudnn_backend_live_descriptors();
// emu_libs.h's cudnn_algorithm_queries: the algorithm queries cudnn_algos.cpp answered.
inline std::atomic<long long>& cudnn_query_count() {
  static std::atomic<long long> n{0};
  return n;
}

// emu_libs.h's set_cudnn_find_delay: the delay in ms a Find reports on top of an algorithm's time.
float cudnn_find_delay(long long call, int algo);
long long next_cudnn_find_call();

// ---- elements ----

// The element types both libraries' calls use, whatever each library's enum calls them.
enum class Elem { F16, BF16, F32, F64, I8, I32 };
size_t elem_size(Elem e);
const char* elem_name(Elem e);

// How a float input is rounded before the multiply: as stored, or as the fast compute modes do.
enum class InputRounding { None, Tf32, F16, Bf16 };

float half_bits_to_float(uint16_t h);
uint16_t float_to_half_bits(float f);   // round to nearest even, overflow to inf, NaN kept quiet
float bf16_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);   // round to nearest even
float round_to_tf32(float f);           // 10-bit mantissa, nearest with ties away (PTX cvt.rna.tf32.f32)

// Element i (in elements from p) as a double; f32 inputs rounded as asked.
double read_elem(const void* p, Elem e, int64_t i, InputRounding r);
// Writes v to element i: rounded to f32 first, then to f16/bf16 (the f32 accumulator's path);
// integers saturate.
void write_elem(void* p, Elem e, int64_t i, double v);

}  // namespace minidl::cuda::emu::detail
