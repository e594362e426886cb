// The base of every class that owns something it must not share by copying: a stream, a handle,
// a scope that undoes what its constructor did, a measurement in progress. Deriving from it
// deletes the copy constructor and copy assignment (and so the implicit moves) in one word,
// where each class used to spell out the same two deleted members.
#pragma once

namespace minidl {

class NonCopyable {
 public:
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
  ~NonCopyable() = default;
};

}  // namespace minidl
