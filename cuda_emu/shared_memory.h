// Block-shared memory on the emulated device: views of the running block's shared arena (owned by
// the runner, runner.cpp), whose every access is checked: inside the array it names, and, for a
// read, of bytes some thread of this block has written (the arena's "written" shadow is cleared at
// each block's start). device/shared.cuh's MINIDL_SHARED_ARRAY / MINIDL_SHARED_VAR and
// dynamic_shared<T>() produce these in the emulated build, plain __shared__ memory under nvcc.
#pragma once
#include <cstddef>
#include <cstring>

namespace minidl::cuda::emu {

// The arena bytes of the static shared variable declared at `site` (one per declaration and
// template instantiation; the first thread of a block to reach it places it). Over the 48 KiB a
// block may use (with the launch's dynamic bytes), the kernel fails as ptxas / the launch would.
unsigned char* shared_slot(const void* site, size_t bytes, const char* name);
// The running block's dynamic shared memory (the launch's smem bytes) and its size.
unsigned char* dynamic_shared_bytes();
size_t dynamic_shared_size();
// Checked accesses of [p, p + n) in the array [base, base + bytes): out of bounds, or (a read) a
// byte no thread of the block wrote, fails the kernel naming the array, the offset, block and thread.
void shared_read(const void* p, size_t n, const void* base, size_t bytes);
void shared_write(const void* p, size_t n, const void* base, size_t bytes);

// One element of a shared array: reads convert to T, assignments write through.
template <typename T>
class SharedRef {
 public:
  SharedRef(T* p, const unsigned char* base, size_t bytes) : p_(p), base_(base), bytes_(bytes) {}
  SharedRef(const SharedRef&) = default;
  operator T() const {   // NOLINT(google-explicit-constructor): reads like a T
    shared_read(p_, sizeof(T), base_, bytes_);
    T v;
    std::memcpy(static_cast<void*>(&v), p_, sizeof(T));
    return v;
  }
  const SharedRef& operator=(const T& v) const {
    shared_write(p_, sizeof(T), base_, bytes_);
    std::memcpy(static_cast<void*>(p_), &v, sizeof(T));
    return *this;
  }
  const SharedRef& operator=(const SharedRef& o) const { return *this = static_cast<T>(o); }
  template <typename U>
  const SharedRef& operator+=(const U& v) const {
    return *this = static_cast<T>(static_cast<T>(*this) + v);
  }

 private:
  T* p_;
  const unsigned char* base_;
  size_t bytes_;
};

// A pointer into a shared array (what `name` or dynamic_shared<T>() is in the emulated build).
template <typename T>
class SharedPtr {
 public:
  SharedPtr(unsigned char* base, size_t bytes) : p_(reinterpret_cast<T*>(base)), base_(base), bytes_(bytes) {}
  SharedRef<T> operator[](long long i) const { return SharedRef<T>(p_ + i, base_, bytes_); }
  SharedRef<T> operator*() const { return (*this)[0]; }
  SharedPtr operator+(long long i) const {
    SharedPtr q = *this;
    q.p_ += i;
    return q;
  }

 private:
  T* p_;
  unsigned char* base_;
  size_t bytes_;
};

template <typename T, long long N>
SharedPtr<T> static_shared(const void* site, const char* name) {
  static_assert(N > 0, "a shared array needs at least one element");
  static_assert(sizeof(T) * N <= 48 * 1024,
                "static shared memory over 48 KiB: ptxas rejects the kernel ('uses too much shared data', 0xc000 "
                "max); use dynamic shared memory with the opt-in attribute");
  return SharedPtr<T>(shared_slot(site, sizeof(T) * N, name), sizeof(T) * N);
}

}  // namespace minidl::cuda::emu
