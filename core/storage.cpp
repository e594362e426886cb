// Storage owns one allocation; the allocator it came from is remembered so the bytes go back there.
#include "core/storage.h"

namespace minidl {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = allocator_->allocate(nbytes);
}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

}  // namespace minidl
