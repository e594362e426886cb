// A flag set for a scope: the mode guards of autograd (core/autograd.h), the allocator's tentative
// requests (core/allocator.h) and the graphed step's busy state are its instances. It sits in a
// header of its own because the allocator, which autograd is built on, needs it too.
#pragma once

namespace minidl {

// Sets `flag` (thread-local for the modes) for its scope and restores the earlier value when the
// scope ends.
class ScopedFlag {
 public:
  ScopedFlag(bool& flag, bool value) : flag_(flag), prev_(flag) { flag_ = value; }
  ~ScopedFlag() { flag_ = prev_; }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  bool& flag_;
  bool prev_;
};

}  // namespace minidl
