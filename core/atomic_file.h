// Every file minidl writes that a later run reads (weights and optimizer state, results tables and
// records, split manifests) goes through this one helper, so that a kill -9 in the middle of the
// write, a full disk or a read-only folder leaves the previous file exactly as it was: the bytes
// go to a temporary file in the same folder, are fsynced, and only then renamed over the target.
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace minidl {

class AtomicFile {
 public:
  // Creates `<path>.tmp.<pid>` beside `path` (the folder must exist), after removing the
  // `<path>.tmp.<pid>` files of writers that were killed (their process is gone). Throws
  // minidl::Error naming the path and the system's reason (read-only file system, permission
  // denied, not a folder).
  explicit AtomicFile(std::filesystem::path path);
  // Without commit(): removes the temporary file, so a failed write leaves nothing behind.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Throws minidl::Error on a short write (a full disk, a file-size limit), naming the path.
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, close and rename over the target (then fsync the folder, best effort). After a throw
  // the target is untouched.
  void commit();

  const std::filesystem::path& path() const { return path_; }

 private:
  [[noreturn]] void fail(const char* what, int err) const;

  std::filesystem::path path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
  bool fault_armed_ = false;   // the test-only fault (see atomic_file.cpp) fires at the first write
};

// The whole of `content` through an AtomicFile.
void write_file_atomic(const std::filesystem::path& file, std::string_view content);

}  // namespace minidl
