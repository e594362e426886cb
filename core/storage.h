// A block of device memory shared by a tensor and its views. It returns the bytes to the
// allocator it came from when the last view is gone.
#pragma once
#include <cstddef>
#include <memory>

#include "core/allocator.h"

namespace minidl {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

}  // namespace minidl
