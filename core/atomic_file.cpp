// AtomicFile (see atomic_file.h), and the one test hook that makes its failures reproducible:
// MINIDL_TEST_WRITE_FAULT=<action>:<text> makes every AtomicFile whose target path contains
// <text> fail the way a real fault would, which tests need where the real fault cannot be
// arranged (a read-only folder does not stop root; a full disk needs a mount):
//   readonly  creating the temporary file fails with EROFS
//   full      the first write stores half its bytes, then fails with ENOSPC
//   kill      the first write stores half its bytes, then the process gets SIGKILL (kill -9)
#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace minidl {
namespace {

std::string injected_fault(const std::string& path) {
  const char* spec = std::getenv("MINIDL_TEST_WRITE_FAULT");
  if (spec == nullptr) return "";
  const std::string s = spec;
  const size_t colon = s.find(':');
  if (colon == std::string::npos || path.find(s.substr(colon + 1)) == std::string::npos) return "";
  return s.substr(0, colon);
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = ENOSPC;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A writer killed mid-write (kill -9, a power cut) leaves its `<target>.tmp.<pid>` behind: the
// next writer of the same target removes those whose process is gone (kill(pid, 0) says ESRCH),
// never one of a live process, which may be another writer still at work. Best effort.
void remove_stale_tmp_files(const std::filesystem::path& target) {
  const std::string prefix = target.filename().string() + ".tmp.";
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    std::filesystem::remove(it->path(), ignored);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::filesystem::path path)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp." + std::to_string(::getpid())) {
  const std::string fault = injected_fault(path_.string());
  if (fault == "readonly") fail("cannot create", EROFS);
  remove_stale_tmp_files(path_);
  fault_armed_ = fault == "full" || fault == "kill";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what, int err) const {
  MINIDL_FAIL(what, " '", path_.string(), "': ", std::strerror(err), " (",
              std::filesystem::exists(path_) ? "the previous file is unchanged" : "nothing was written", ")");
}

void AtomicFile::write(const void* data, size_t n) {
  MINIDL_CHECK(fd_ >= 0 && !committed_, "AtomicFile: write to '", path_.string(), "' after commit()");
  const auto* p = static_cast<const char*>(data);
  if (fault_armed_) {
    fault_armed_ = false;
    const bool kill = injected_fault(path_.string()) == "kill";
    if (!write_all(fd_, p, n / 2)) fail("cannot write", errno);
    if (kill) ::raise(SIGKILL);
    fail("cannot write", ENOSPC);
  }
  if (!write_all(fd_, p, n)) fail("cannot write", errno);
}

void AtomicFile::commit() {
  MINIDL_CHECK(fd_ >= 0 && !committed_, "AtomicFile: commit of '", path_.string(), "' twice");
  if (::fsync(fd_) != 0) fail("cannot write", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot write", errno);   // where some file systems report a failed write
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename the new file onto", errno);
  committed_ = true;
  // Best effort: make the rename itself durable. The file is complete either way.
  const std::filesystem::path dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::filesystem::path& file, std::string_view content) {
  AtomicFile f(file);
  f.write(content);
  f.commit();
}

}  // namespace minidl
