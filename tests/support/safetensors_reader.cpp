// Parses safetensors with every bound checked before a byte is copied: a truncated or hand-edited
// golden file must fail with a message that names it, never read past the buffer and make a test
// compare garbage.
#include "tests/support/safetensors_reader.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

namespace minidl::testing {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

// The header is JSON text; anything near this size is not a golden file.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

bool dtype_from_code(const std::string& code, DType* out) {
  static const std::map<std::string, DType> codes = {
      {"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16}, {"I32", DType::i32},
      {"I64", DType::i64}, {"U8", DType::u8},   {"BOOL", DType::boolean}};
  auto it = codes.find(code);
  if (it == codes.end()) return false;
  *out = it->second;
  return true;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "read_safetensors: cannot open '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MINIDL_CHECK(!in.bad(), "read_safetensors: error while reading '", path, "'");
  return bytes;
}

}  // namespace

std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  using nlohmann::json;
  const std::vector<char> bytes = read_file(path);
  const uint64_t file_size = bytes.size();
  MINIDL_CHECK(file_size >= 8, "read_safetensors: '", path, "' has ", file_size,
               " bytes, fewer than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  MINIDL_CHECK(header_len >= 2 && header_len <= kMaxHeaderBytes && header_len <= file_size - 8,
               "read_safetensors: '", path, "' declares a header of ", header_len, " bytes but the file has ",
               file_size, " bytes (truncated or not a safetensors file)");
  const char* data = bytes.data() + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception& e) {
    MINIDL_FAIL("read_safetensors: '", path, "': header is not valid JSON: ", e.what());
  }
  MINIDL_CHECK(header.is_object(), "read_safetensors: '", path, "': header is not a JSON object");

  if (metadata) metadata->clear();
  std::map<std::string, Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      MINIDL_CHECK(entry.is_object(), "read_safetensors: '", path, "': __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        MINIDL_CHECK(value.is_string(), "read_safetensors: '", path, "': __metadata__[\"", key,
                     "\"] is not a string");
        if (metadata) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "read_safetensors: '" + path + "': tensor '" + name + "'";
    MINIDL_CHECK(entry.is_object(), where, " is not a JSON object");
    MINIDL_CHECK(entry.contains("dtype") && entry["dtype"].is_string(), where, " has no string 'dtype'");
    MINIDL_CHECK(entry.contains("shape") && entry["shape"].is_array(), where, " has no array 'shape'");
    MINIDL_CHECK(entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                     entry["data_offsets"].size() == 2,
                 where, " has no 'data_offsets' pair");

    const std::string code = entry["dtype"].get<std::string>();
    DType dtype{};
    MINIDL_CHECK(dtype_from_code(code, &dtype), where, " has unsupported dtype '", code,
                 "' (known: F32, F64, F16, I32, I64, U8, BOOL)");

    Shape shape;
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      MINIDL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                   " has a shape entry that is not a non-negative integer: ", d.dump());
      const uint64_t v = d.get<uint64_t>();
      // Guard the product so a hostile shape cannot wrap around and pass the byte-count check.
      MINIDL_CHECK(v == 0 || numel <= std::numeric_limits<uint64_t>::max() / 16 / v, where, " has a shape ",
                   entry["shape"].dump(), " too large to address");
      numel *= v;
      shape.push_back(static_cast<int64_t>(v));
    }

    const auto& offs = entry["data_offsets"];
    MINIDL_CHECK(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(), where,
                 " has data_offsets that are not non-negative integers: ", offs.dump());
    const uint64_t begin = offs[0].get<uint64_t>();
    const uint64_t end = offs[1].get<uint64_t>();
    MINIDL_CHECK(begin <= end && end <= data_size, where, " has data_offsets [", begin, ", ", end,
                 "] outside the data section of ", data_size, " bytes");
    const uint64_t expected = numel * dtype_size(dtype);
    MINIDL_CHECK(end - begin == expected, where, " holds ", end - begin, " bytes but ", code, shape_str(shape),
                 " needs ", expected);

    Tensor t = empty(shape, {.dtype = dtype});
    if (expected > 0) std::memcpy(t.data_ptr(), data + begin, expected);
    out.emplace(name, std::move(t));
  }
  return out;
}

std::string golden_path(const std::string& name) { return std::string(MINIDL_GOLDEN_DIR) + "/" + name; }

}  // namespace minidl::testing
