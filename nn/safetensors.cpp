// The safetensors reader and writer. Files come from elsewhere (torchvision conversions, other
// machines, half-written checkpoints), so the loader validates the whole header against the file
// size before it allocates a byte; the writer goes through a temporary file so a crash or a full
// disk never leaves a truncated checkpoint where a good one was.
#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/autograd.h"

namespace minidl::nn {
namespace {

using nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this implementation copies it as is");

// The reference implementation's limit (MAX_HEADER_SIZE): a header is names, shapes and offsets,
// so anything larger is corrupt or hostile, not a model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests three levels (root, tensor entry, shape array); deeper JSON is rejected
// while parsing so hostile nesting cannot build a huge or deep tree.
constexpr int kMaxJsonDepth = 4;
// Far beyond any real tensor; it keeps a hostile shape list from becoming a huge Shape vector.
constexpr size_t kMaxRank = 64;

struct DTypeCode {
  const char* code;
  DType dtype;
};
constexpr DTypeCode kCodes[] = {{"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16},
                                {"BF16", DType::bf16}, {"I32", DType::i32}, {"I64", DType::i64},
                                {"U8", DType::u8},     {"BOOL", DType::boolean}};

bool dtype_from_code(const std::string& code, DType* out) {
  for (const auto& c : kCodes) {
    if (code == c.code) {
      *out = c.dtype;
      return true;
    }
  }
  return false;
}

std::string errno_text(int err) { return std::strerror(err); }

// Closes on every exit path, so an exception in the middle of a load leaks no descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly `n` bytes at `offset`, or returns false (short file or I/O error; errno set).
bool pread_all(int fd, void* buf, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

std::string offsets_str(const detail::SafetensorsEntry& e) {
  return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
}

// Parses JSON and rejects duplicate keys (the last one would silently win) and deep nesting.
json parse_json(std::string_view text, const std::string& where) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  bool too_deep = false;
  struct Abort {};
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    if (depth > kMaxJsonDepth) {
      too_deep = true;
      throw Abort{};
    }
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
          throw Abort{};
        }
        break;
      default: break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), callback);
  } catch (const Abort&) {
  } catch (const json::exception& e) {
    MINIDL_FAIL(where, ": header is not valid JSON: ", e.what());
  }
  MINIDL_CHECK(!too_deep, where, ": header is not a safetensors header: JSON nested deeper than ", kMaxJsonDepth,
               " levels");
  MINIDL_CHECK(duplicate.empty(), where, ": header has the key '", duplicate, "' twice");
  return header;
}

}  // namespace

namespace detail {

const char* safetensors_dtype_code(DType t) {
  for (const auto& c : kCodes) {
    if (c.dtype == t) return c.code;
  }
  MINIDL_FAIL("safetensors: no dtype code for ", dtype_name(t));
}

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t data_size, const std::string& path) {
  const std::string file = "safetensors file '" + path + "'";
  const json header = parse_json(text, file);
  MINIDL_CHECK(header.is_object(), file, ": header is not a JSON object");

  SafetensorsHeader out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      MINIDL_CHECK(entry.is_object(), file, ": __metadata__ is not a JSON object");
      for (const auto& [key, value] : entry.items()) {
        MINIDL_CHECK(value.is_string(), file, ": __metadata__[\"", key, "\"] is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = file + ": tensor '" + name + "'";
    MINIDL_CHECK(entry.is_object(), where, " is not a JSON object");
    MINIDL_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where, " has no string 'dtype'");
    MINIDL_CHECK(entry.contains("shape") && entry["shape"].is_array(), where, " has no array 'shape'");
    MINIDL_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                     entry["data_offsets"].size() == 2,
                 where, " has no 'data_offsets' pair");

    SafetensorsEntry e;
    e.name = name;
    const std::string code = entry["dtype"].get<std::string>();
    MINIDL_CHECK(dtype_from_code(code, &e.dtype), where, " has unsupported dtype '", code,
                 "' (known: F32, F64, F16, BF16, I32, I64, U8, BOOL)");

    MINIDL_CHECK(entry["shape"].size() <= kMaxRank, where, " has ", entry["shape"].size(),
                 " dimensions, more than the ", kMaxRank, " minidl supports");
    // Checked multiplication: a hostile shape must not wrap around and pass the byte-count check.
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      MINIDL_CHECK(d.is_number_unsigned(), where, " has a shape entry that is not a non-negative integer: ",
                   d.dump());
      const uint64_t v = d.get<uint64_t>();
      MINIDL_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                       !__builtin_mul_overflow(numel, v, &numel),
                   where, " has a shape ", entry["shape"].dump(), " whose element count overflows");
      e.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t expected = 0;
    MINIDL_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &expected) &&
                     numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 where, " has a shape ", entry["shape"].dump(), " whose element count overflows");

    const auto& offs = entry["data_offsets"];
    MINIDL_CHECK(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(), where,
                 " has data_offsets that are not non-negative integers: ", offs.dump());
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    MINIDL_CHECK(e.begin <= e.end && e.end <= data_size, where, " has data_offsets ", offsets_str(e),
                 " outside the data section of ", data_size, " bytes");
    MINIDL_CHECK(e.end - e.begin == expected, where, " holds ", e.end - e.begin, " bytes but ", code,
                 shape_str(e.shape), " needs ", expected);
    out.entries.push_back(std::move(e));
  }

  // The spec requires the tensors to tile the data section: no overlap (two tensors aliasing
  // bytes), no gap and no trailing bytes (hidden data, or a file glued to another).
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : out.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    MINIDL_CHECK(e->begin >= cursor, file, ": tensor '", e->name, "' data_offsets ", offsets_str(*e),
                 " overlap tensor '", prev ? prev->name : "", "' data_offsets ", prev ? offsets_str(*prev) : "");
    MINIDL_CHECK(e->begin == cursor, file, ": bytes [", cursor, ", ", e->begin,
                 ") of the data section belong to no tensor (a gap before tensor '", e->name, "')");
    cursor = e->end;
    prev = e;
  }
  MINIDL_CHECK(cursor == data_size, file, ": the data section has ", data_size - cursor,
               " trailing bytes after the last tensor (the tensors cover ", cursor, " of ", data_size, " bytes)");
  return out;
}

}  // namespace detail

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string file = "safetensors file '" + path + "'";
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  MINIDL_CHECK(fd.get() >= 0, "load_safetensors: cannot open '", path, "': ", errno_text(errno));
  struct stat st {};
  MINIDL_CHECK(::fstat(fd.get(), &st) == 0, file, ": cannot stat: ", errno_text(errno));
  MINIDL_CHECK(S_ISREG(st.st_mode), file, " is not a regular file");
  const auto file_size = static_cast<uint64_t>(st.st_size);
  MINIDL_CHECK(file_size >= 8, file, " has ", file_size, " bytes, fewer than the 8-byte header length");

  unsigned char len_bytes[8];
  MINIDL_CHECK(pread_all(fd.get(), len_bytes, 8, 0), file, ": cannot read the header length: ", errno_text(errno));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  MINIDL_CHECK(header_len <= kMaxHeaderBytes, file, " declares a header of ", header_len,
               " bytes, more than the limit of ", kMaxHeaderBytes, " (corrupt or not a safetensors file)");
  MINIDL_CHECK(header_len >= 2, file, " declares a header of ", header_len,
               " bytes, too short for a JSON object (corrupt or not a safetensors file)");
  MINIDL_CHECK(header_len <= file_size - 8, file, " declares a header of ", header_len,
               " bytes but the file has ", file_size, " bytes (truncated or not a safetensors file)");

  std::string text(header_len, '\0');
  MINIDL_CHECK(pread_all(fd.get(), text.data(), header_len, 8), file, ": cannot read the header: ",
               errno_text(errno));
  const uint64_t data_start = 8 + header_len;
  detail::SafetensorsHeader header = detail::parse_safetensors_header(text, file_size - data_start, path);

  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  for (const auto& e : header.entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    const uint64_t n = e.end - e.begin;
    if (n > 0) {
      MINIDL_CHECK(pread_all(fd.get(), t.data_ptr(), n, data_start + e.begin), file, ": cannot read tensor '",
                   e.name, "' (was the file truncated while loading?): ", errno ? errno_text(errno) : "end of file");
    }
    if (e.dtype == DType::boolean) {
      // Bytes other than 0 and 1 are not booleans; letting them through would make comparisons lie.
      const auto* p = static_cast<const unsigned char*>(t.data_ptr());
      for (uint64_t i = 0; i < n; ++i) {
        MINIDL_CHECK(p[i] <= 1, file, ": BOOL tensor '", e.name, "' holds the byte ", static_cast<int>(p[i]),
                     " at element ", i, " (only 0 and 1 are valid)");
      }
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  NoGradGuard no_grad;  // the CPU/contiguous copies below are for writing, not for autograd
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> blobs;
  blobs.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MINIDL_CHECK(name != "__metadata__", "save_safetensors: '", path,
                 "': a tensor cannot be named __metadata__ (the format reserves that key)");
    MINIDL_CHECK(t.defined(), "save_safetensors: '", path, "': tensor '", name, "' is undefined");
    Tensor c = t.detach();
    if (!c.device().is_cpu()) c = c.to(Device::cpu());
    c = c.contiguous();
    const uint64_t n = c.nbytes();
    header[name] = {{"dtype", detail::safetensors_dtype_code(c.dtype())},
                    {"shape", c.shape()},
                    {"data_offsets", json::array({offset, offset + n})}};
    offset += n;
    blobs.push_back(std::move(c));
  }
  // Compact, keys sorted at every level (nlohmann's object is a std::map): the same bytes as
  // Python's json.dumps(sort_keys=True, separators=(",", ":")) for ASCII names.
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    MINIDL_FAIL("save_safetensors: '", path, "': a tensor name or metadata entry is not valid UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xffu);

  // Through the one atomic writer: a kill, a full disk or a read-only folder leaves an existing
  // file as it was, and a failed save leaves no temporary file behind.
  AtomicFile out(path);
  out.write(len_bytes, 8);
  out.write(text);
  for (const Tensor& b : blobs) out.write(b.data_ptr(), b.nbytes());
  out.commit();
}

}  // namespace minidl::nn
