// safetensors is the contract between minidl, PyTorch and files from older builds: these tests pin
// the exact bytes the writer produces, prove the loader reads what the Python side writes, and
// show that every kind of corrupt file ends in a minidl::Error that names the file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/ops.h"
#include "nn/safetensors.h"
#include "tests/support/safetensors_bytes.h"
#include "tests/support/safetensors_reader.h"
#include "tests/support/temp_dir.h"

namespace minidl::nn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::BadFile;
using testing::floats;
using testing::le64;
using testing::with_header;

fs::path temp_dir(const std::string& name) { return testing::fresh_dir("minidl_safetensors_test", name); }

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string tensor_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

bool no_tmp_files(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return false;
  }
  return true;
}

void expect_load_error(const fs::path& path, const std::string& fragment) {
  testing::expect_read_error([](const std::string& p) { load_safetensors(p); }, path.string(), fragment);
}

std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> t;
  t["f32"] = from_vector({1.5, -2.0, 0.0, 3.25, -0.0, 1e-30}, {2, 3});
  t["f64"] = from_vector({1.0 / 3.0, -1e300, 4.9e-324}, {3}, {.dtype = DType::f64});
  t["f16"] = from_vector({0.5, -2.25, 65504.0, std::ldexp(1.0, -24), -0.0, 1.0 / 3.0}, {3, 2}, {.dtype = DType::f16});
  t["i32"] = from_vector({-2147483648.0, 0, 2147483647.0}, {1, 3}, {.dtype = DType::i32});
  t["i64"] = from_vector({-4611686018427387904.0, 7, 1099511627783.0}, {3}, {.dtype = DType::i64});
  t["u8"] = from_vector({0, 1, 254, 255}, {2, 2}, {.dtype = DType::u8});
  t["bool"] = from_vector({1, 0, 0, 1, 1}, {5}, {.dtype = DType::boolean});
  t["scalar"] = scalar_tensor(2.5);
  t["scalar.i64"] = scalar_tensor(-3, {.dtype = DType::i64});
  t["empty"] = zeros({0, 3});
  t["empty.f16"] = zeros({3, 0, 2}, {.dtype = DType::f16});
  return t;
}

void expect_same_tensors(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    EXPECT_EQ(g.dtype(), w.dtype()) << name;
    EXPECT_EQ(g.shape(), w.shape()) << name;
    EXPECT_TRUE(g.device().is_cpu()) << name;
    EXPECT_TRUE(g.is_contiguous()) << name;
    EXPECT_FALSE(g.requires_grad()) << name;
    // Bytes, not values: -0.0, f16 subnormals and NaN payloads must survive too.
    EXPECT_EQ(tensor_bytes(g), tensor_bytes(w.detach().to(Device::cpu()))) << name;
  }
}

// ---- Round trips ----

TEST(SafetensorsRoundTrip, EveryDTypeZeroDimAndEmpty) {
  const fs::path dir = temp_dir("every_dtype");
  const auto tensors = every_dtype();
  save_safetensors((dir / "t.safetensors").string(), tensors);
  const SafetensorsFile f = load_safetensors((dir / "t.safetensors").string());
  expect_same_tensors(f.tensors, tensors);
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(f.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("scalar").item(), 2.5);
  EXPECT_EQ(f.tensors.at("f16").to_vector()[3], std::ldexp(1.0, -24));
  EXPECT_TRUE(std::signbit(f.tensors.at("f16").to_vector()[4]));
  EXPECT_EQ(f.tensors.at("i64").data<int64_t>()[0], -(int64_t{1} << 62));
  EXPECT_TRUE(no_tmp_files(dir));
}

TEST(SafetensorsRoundTrip, NonContiguousInputsAreWrittenContiguous) {
  const fs::path dir = temp_dir("non_contiguous");
  const Tensor base = arange(0.0, 24.0, 1.0).view({2, 3, 4});
  std::map<std::string, Tensor> tensors = {
      {"transposed", base.transpose(0, 2)},
      {"strided", base.slice(2, 0, 4, 2)},
      {"expanded", from_vector({1, 2, 3}, {3, 1}).expand({3, 4})},
      {"offset", base.select(0, 1)},
      {"requires_grad", ones({2, 2}).set_requires_grad(true)},
  };
  ASSERT_FALSE(tensors.at("transposed").is_contiguous());
  ASSERT_FALSE(tensors.at("expanded").is_contiguous());
  save_safetensors((dir / "t.safetensors").string(), tensors);
  const SafetensorsFile f = load_safetensors((dir / "t.safetensors").string());
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(f.tensors.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(f.tensors.at(name).to_vector(), t.to_vector()) << name;
  }
}

TEST(SafetensorsRoundTrip, Metadata) {
  const fs::path dir = temp_dir("metadata");
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"quote\"and\\slash", "line\nbreak\ttab"}, {"utf8", "h\xc3\xa9llo"}, {"empty", ""}};
  save_safetensors((dir / "t.safetensors").string(), {{"x", ones({1})}}, meta);
  const SafetensorsFile f = load_safetensors((dir / "t.safetensors").string());
  EXPECT_EQ(f.metadata, meta);
  // Only metadata, no tensor: still a valid file.
  save_safetensors((dir / "m.safetensors").string(), {}, meta);
  const SafetensorsFile m = load_safetensors((dir / "m.safetensors").string());
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_EQ(m.metadata, meta);
}

// ---- The bytes on disk, as the spec describes them ----

TEST(SafetensorsFormat, HeaderAndOffsetsAreExactlyAsSpecified) {
  const fs::path dir = temp_dir("format");
  const fs::path path = dir / "t.safetensors";
  save_safetensors(path.string(),
                   {{"b", from_vector({1, 2, 3}, {3}, {.dtype = DType::i64})},
                    {"a", from_vector({0.5, -1}, {1, 2})},
                    {"c", from_vector({1, 0}, {2}, {.dtype = DType::boolean})}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  const std::string expected_json =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[1,2]},)"
      R"("b":{"data_offsets":[8,32],"dtype":"I64","shape":[3]},"c":{"data_offsets":[32,34],"dtype":"BOOL","shape":[2]}})";
  // Keys sorted, compact JSON, then spaces up to a multiple of 8 so the data starts aligned.
  std::string padded = expected_json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(n, padded.size());
  EXPECT_EQ(bytes.substr(8, n), padded);
  EXPECT_EQ(json::parse(bytes.substr(8, n)), json::parse(expected_json));
  // Data: the tensors back to back in key order, little-endian, nothing after.
  int64_t ints[3] = {1, 2, 3};
  const std::string data = floats({0.5f, -1.f}) + std::string(reinterpret_cast<const char*>(ints), 24) + std::string("\x01\x00", 2);
  EXPECT_EQ(bytes.substr(8 + n), data);
}

TEST(SafetensorsFormat, NoMetadataMeansNoMetadataKey) {
  const fs::path dir = temp_dir("no_metadata");
  save_safetensors((dir / "t.safetensors").string(), {{"x", zeros({0})}});
  const std::string bytes = read_bytes(dir / "t.safetensors");
  // 54 bytes of JSON, padded with 2 spaces to 56.
  EXPECT_EQ(bytes.substr(8), R"({"x":{"data_offsets":[0,0],"dtype":"F32","shape":[0]}})"
                             "  ");
}

// ---- Atomic writes ----

TEST(SafetensorsAtomicWrite, ReplacesAnExistingFileAndLeavesNoTemporary) {
  const fs::path dir = temp_dir("atomic_replace");
  const fs::path path = dir / "t.safetensors";
  save_safetensors(path.string(), {{"x", ones({4})}});
  save_safetensors(path.string(), {{"y", zeros({2})}});
  const SafetensorsFile f = load_safetensors(path.string());
  EXPECT_EQ(f.tensors.size(), 1u);
  EXPECT_TRUE(f.tensors.count("y"));
  EXPECT_TRUE(no_tmp_files(dir));
}

TEST(SafetensorsAtomicWrite, MissingFolderFailsClearlyAndWritesNothing) {
  const fs::path dir = temp_dir("atomic_missing_dir");
  const fs::path path = dir / "no_such_folder" / "t.safetensors";
  try {
    save_safetensors(path.string(), {{"x", ones({4})}});
    ADD_FAILURE() << "saving into a missing folder did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir / "no_such_folder"));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(SafetensorsAtomicWrite, FailedSaveLeavesTheExistingFileUntouched) {
  const fs::path dir = temp_dir("atomic_failure");
  const fs::path path = dir / "t.safetensors";
  save_safetensors(path.string(), {{"x", ones({4})}});
  const std::string before = read_bytes(path);
  // Fails before writing: an undefined tensor, a reserved name.
  EXPECT_THROW(save_safetensors(path.string(), {{"x", zeros({2})}, {"y", Tensor()}}), Error);
  EXPECT_THROW(save_safetensors(path.string(), {{"__metadata__", zeros({2})}}), Error);
  EXPECT_EQ(read_bytes(path), before);
  // Fails at the rename, after the temporary file was written: the target is a folder.
  const fs::path folder = dir / "folder.safetensors";
  fs::create_directories(folder / "inside");
  try {
    save_safetensors(folder.string(), {{"x", ones({4})}});
    ADD_FAILURE() << "saving over a folder did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot rename"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(folder / "inside"));
  EXPECT_TRUE(no_tmp_files(dir));
  EXPECT_EQ(read_bytes(path), before);
}

// ---- Corrupt files ----

TEST(SafetensorsCorrupt, EveryProblemIsAnErrorNamingTheFile) {
  const fs::path dir = temp_dir("corrupt");
  auto file = [&](const std::string& name, const std::string& bytes) {
    const fs::path p = dir / (name + ".safetensors");
    write_bytes(p, bytes);
    return p;
  };
  const std::string a2 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  auto one = [&](const std::string& entry, const std::string& data) { return with_header("{" + entry + "}", data); };

  expect_load_error(dir / "missing.safetensors", "cannot open");
  expect_load_error(dir, "not a regular file");
  expect_load_error(file("empty", ""), "fewer than the 8-byte");
  expect_load_error(file("short", "abc"), "fewer than the 8-byte");
  expect_load_error(file("header_tiny", le64(1) + "{}"), "declares a header of 1 bytes, too short");
  expect_load_error(file("header_past_end", le64(1000) + "{}"), "declares a header of 1000 bytes but the file has");
  expect_load_error(file("header_huge", le64(uint64_t{1} << 40) + "{}"), "more than the limit of 100000000");
  expect_load_error(file("header_max", le64(~uint64_t{0}) + "{}"), "more than the limit");
  const std::string good = one(a2, floats({1.f, 2.f}));
  expect_load_error(file("truncated_header", good.substr(0, 20)), "declares a header of");
  expect_load_error(file("truncated_data", good.substr(0, good.size() - 1)), "outside the data section of 7 bytes");
  expect_load_error(file("bad_json", with_header("{\"a\":", "")), "not valid JSON");
  expect_load_error(file("bad_utf8", with_header("{\"\xff\":1}", "")), "not valid JSON");
  expect_load_error(file("not_object", with_header("[1,2]", "")), "header is not a JSON object");
  expect_load_error(file("entry_not_object", with_header(R"({"a":5})", "")), "tensor 'a' is not a JSON object");
  expect_load_error(file("meta_not_object", with_header(R"({"__metadata__":[]})", "")),
                    "__metadata__ is not a JSON object");
  expect_load_error(file("meta_not_string", with_header(R"({"__metadata__":{"k":1}})", "")), "is not a string");
  // One tensor entry whose fields, or the data they point at, are wrong.
  const BadFile bad_entries[] = {
      {"no_dtype", R"("a":{"shape":[2],"data_offsets":[0,8]})", floats({1.f, 2.f}), "has no string 'dtype'"},
      {"no_shape", R"("a":{"dtype":"F32","data_offsets":[0,8]})", floats({1.f, 2.f}), "has no array 'shape'"},
      {"no_offsets", R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0]})", floats({1.f, 2.f}),
       "has no 'data_offsets' pair"},
      {"bad_dtype", R"("a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]})", floats({1.f}),
       "unsupported dtype 'F8_E4M3'"},
      {"neg_dim", R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", floats({1.f, 2.f}),
       "not a non-negative integer: -2"},
      {"float_dim", R"("a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", floats({1.f, 2.f}),
       "not a non-negative integer"},
      {"numel_overflow", R"("a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]})",
       floats({1.f, 2.f}), "element count overflows"},
      {"bytes_overflow", R"("a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]})",
       floats({1.f, 2.f}), "element count overflows"},
      {"neg_offset", R"("a":{"dtype":"F32","shape":[2],"data_offsets":[-1,7]})", floats({1.f, 2.f}),
       "not non-negative integers"},
      {"offset_past_end", a2, floats({1.f}), "outside the data section"},
      {"offsets_reversed", R"("a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]})", floats({1.f, 2.f}),
       "outside the data section"},
      {"byte_count", R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})", floats({1.f, 2.f}),
       "holds 8 bytes but F32[3] needs 12"},
  };
  for (const BadFile& b : bad_entries) expect_load_error(file(b.name, one(b.header, b.data)), b.fragment);
  expect_load_error(file("overlap", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                                floats({1.f, 2.f, 3.f}))),
                    "tensor 'b' data_offsets [4, 12] overlap tensor 'a' data_offsets [0, 8]");
  expect_load_error(file("same_range", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                   R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                                                   floats({1.f, 2.f}))),
                    "overlap");
  expect_load_error(file("gap", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                            floats({1.f, 2.f, 0.f, 3.f, 4.f}))),
                    "bytes [8, 12) of the data section belong to no tensor");
  expect_load_error(file("trailing", one(a2, floats({1.f, 2.f, 3.f}))), "4 trailing bytes");
  expect_load_error(file("duplicate_key", with_header("{" + a2 + "," + a2 + "}", floats({1.f, 2.f}))),
                    "the key 'a' twice");
  std::string many_dims = R"("a":{"dtype":"F32","shape":[1)";
  for (int i = 0; i < 64; ++i) many_dims += ",1";
  expect_load_error(file("rank", one(many_dims + R"(],"data_offsets":[0,4]})", floats({1.f}))),
                    "65 dimensions, more than the 64");
  expect_load_error(file("deep", with_header(R"({"a":[[[[[[[[1]]]]]]]]})", "")), "nested deeper");
  expect_load_error(file("bool_value", one(R"("a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]})", "\x01\x02")),
                    "only 0 and 1 are valid");
}

TEST(SafetensorsCorrupt, RandomByteFlipsNeverCrash) {
  // A cheap, deterministic stand-in for the fuzzer: every mutation either loads or throws Error.
  const fs::path dir = temp_dir("flips");
  const fs::path good = dir / "good.safetensors";
  save_safetensors(good.string(), every_dtype(), {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  const fs::path bad = dir / "bad.safetensors";
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  constexpr int kRuns = 400;
  int loaded = 0, rejected = 0;
  for (int i = 0; i < kRuns; ++i) {
    std::string m = bytes;
    const int flips = 1 + static_cast<int>(next() % 3);
    for (int k = 0; k < flips; ++k) {
      // Mostly the length and the header, where the parser's decisions are.
      const size_t limit = (next() % 4 == 0) ? m.size() : std::min<size_t>(m.size(), 8 + 64);
      m[next() % limit] = static_cast<char>(next() & 0xffu);
    }
    if (next() % 8 == 0) m.resize(next() % m.size());
    write_bytes(bad, m);
    try {
      load_safetensors(bad.string());
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, kRuns);
}

// ---- Interop with files written on the Python side ----

// tools/make_golden_safetensors.py writes this file; the values below are the ones it lists.
TEST(SafetensorsInterop, ReadsThePythonFileAndWritesTheSameBytes) {
  const std::string path = minidl::testing::golden_path("interop/safetensors_interop.safetensors");
  SafetensorsFile f;
  try {
    f = load_safetensors(path);
  } catch (const std::exception& e) {
    FAIL() << e.what() << "\n(regenerate with: /usr/bin/python3 tools/make_golden_safetensors.py)";
  }
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"},
                                                             {"producer", "tools/make_golden_safetensors.py"}}));
  ASSERT_EQ(f.tensors.size(), 13u);  // the three bf16 tensors: tests/nn/safetensors_bf16_test.cpp
  auto check = [&](const std::string& name, DType dtype, const Shape& shape, const std::vector<double>& values) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.tensors.count(name));
    const Tensor& t = f.tensors.at(name);
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_EQ(t.shape(), shape);
    EXPECT_EQ(t.to_vector(), values);
  };
  check("bool.mask", DType::boolean, {2, 3}, {1, 0, 0, 0, 1, 1});
  check("empty.f32", DType::f32, {0, 3}, {});
  check("f16.values", DType::f16, {5}, {0.5, -2.25, 65504.0, std::ldexp(1.0, -24), -0.0});
  EXPECT_TRUE(std::signbit(f.tensors.at("f16.values").to_vector()[4]));
  check("f32.matrix", DType::f32, {2, 3}, {-1.0, -0.5, 0.0, 0.5, 1.0, 1.5});
  check("f32.scalar", DType::f32, {}, {3.25});
  check("f64.values", DType::f64, {2, 2}, {1.0 / 3.0, -1e300, 2.5, 1e-310});
  check("i32.column", DType::i32, {2, 1}, {-7, 2147483647});
  check("u8.bytes", DType::u8, {4}, {0, 1, 254, 255});
  const Tensor& i64 = f.tensors.at("i64.values");
  ASSERT_EQ(i64.numel(), 3);
  EXPECT_EQ(i64.data<int64_t>()[0], -(int64_t{1} << 62));
  EXPECT_EQ(i64.data<int64_t>()[1], 0);
  EXPECT_EQ(i64.data<int64_t>()[2], (int64_t{1} << 40) + 7);
  std::vector<double> conv(24);
  for (int i = 0; i < 24; ++i) conv[i] = i / 8.0;
  check("layer1.0.conv1.weight", DType::f32, {2, 3, 2, 2}, conv);

  // Python's json.dumps(sort_keys=True, separators=(",", ":")) and nlohmann's dump() agree byte
  // for byte on ASCII names, so the file written back must be identical, header padding included.
  const fs::path dir = temp_dir("interop");
  save_safetensors((dir / "again.safetensors").string(), f.tensors, f.metadata);
  EXPECT_EQ(read_bytes(dir / "again.safetensors"), read_bytes(path));
}

TEST(SafetensorsInterop, GoldenOpFilesRoundTripByteIdentically) {
  // tools/make_golden.py's files are a second, larger sample of Python-written safetensors
  // (metadata holding JSON text with quotes): loading and saving them must change no byte.
  const fs::path dir = temp_dir("golden_round_trip");
  int files = 0;
  for (const auto& e : fs::directory_iterator(minidl::testing::golden_path(""))) {
    if (e.path().extension() != ".safetensors") continue;
    SCOPED_TRACE(e.path().string());
    const SafetensorsFile f = load_safetensors(e.path().string());
    const fs::path out = dir / e.path().filename();
    save_safetensors(out.string(), f.tensors, f.metadata);
    EXPECT_EQ(read_bytes(out), read_bytes(e.path()));
    ++files;
  }
  EXPECT_GT(files, 0);
}

}  // namespace
}  // namespace minidl::nn
