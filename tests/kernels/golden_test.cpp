// Checks every op family against PyTorch: tools/make_golden.py stores inputs, the upstream
// gradient, outputs and input gradients computed by torch 1.13; these tests rerun each case with
// minidl and compare forward results, every gradient and batch norm's updated running statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/support/safetensors_bytes.h"
#include "tests/support/safetensors_reader.h"

namespace minidl::testing {
namespace {

using nlohmann::json;

// f32 results against references computed in f64: the tolerance of the brief, one metric for all.
constexpr double kRelTol = 1e-5;

// Passes when max_i |a_i - b_i| <= tol * max(1, max_i |b_i|): relative to the largest expected
// magnitude (so tiny elements near cancellation do not fail on rounding noise) and absolute below 1.
// A NaN on either side counts as an infinite difference. On failure the worst element is printed.
::testing::AssertionResult matches_golden(const Tensor& actual, const Tensor& expected, double tol = kRelTol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "result is undefined (no gradient reached it?)";
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << ", expected "
                                         << shape_str(expected.shape());
  }
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << dtype_name(actual.dtype()) << ", expected "
                                         << dtype_name(expected.dtype());
  }
  const std::vector<double> a = actual.to_vector();
  const std::vector<double> b = expected.to_vector();
  double max_ref = 0.0;
  for (double v : b) max_ref = std::max(max_ref, std::abs(v));
  const double bound = tol * std::max(1.0, max_ref);
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    if (d > worst) {
      worst = d;
      worst_i = i;
    }
  }
  if (worst <= bound) return ::testing::AssertionSuccess();
  // Row-major multi-index of the worst element, so it can be found in the Python reference.
  std::vector<int64_t> index(expected.shape().size());
  int64_t rest = static_cast<int64_t>(worst_i);
  for (size_t d = index.size(); d-- > 0;) {
    index[d] = rest % expected.shape()[d];
    rest /= expected.shape()[d];
  }
  std::ostringstream os;
  os << std::setprecision(9) << "max |actual - expected| = " << worst << " > " << bound << " (= " << tol
     << " * max(1, max|expected| = " << max_ref << ")); worst element " << shape_str(index) << " (flat " << worst_i
     << "): actual " << a[worst_i] << ", expected " << b[worst_i] << "; shape " << shape_str(expected.shape());
  return ::testing::AssertionFailure() << os.str();
}

std::array<int64_t, 2> pair_of(const json& p, const char* key) {
  const auto v = p.at(key).get<std::vector<int64_t>>();
  MINIDL_CHECK(v.size() == 2, "golden parameter '", key, "' must have 2 entries, has ", v.size());
  return {v[0], v[1]};
}

Reduction reduction_of(const json& p) {
  const std::string r = p.at("reduction").get<std::string>();
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  if (r == "none") return Reduction::None;
  MINIDL_FAIL("golden parameter 'reduction' is '", r, "'; expected mean, sum or none");
}

Pool2dOptions pool_options(const json& p) {
  Pool2dOptions o;
  o.kernel = pair_of(p, "kernel");
  o.stride = pair_of(p, "stride");
  o.padding = pair_of(p, "padding");
  o.ceil_mode = p.at("ceil_mode").get<bool>();
  o.count_include_pad = p.at("count_include_pad").get<bool>();
  return o;
}

// One case's tensors and parameters. Every tensor stored for the case must be consumed, so a
// stored gradient can never go unchecked because of a naming slip.
class GoldenCase {
 public:
  GoldenCase(std::string name, json params, const std::map<std::string, Tensor>& all)
      : name_(std::move(name)), params_(std::move(params)), all_(all) {}

  const json& params() const { return params_; }
  bool has(const std::string& key) const { return all_.count(name_ + "." + key) != 0; }
  Tensor get(const std::string& key) {
    const std::string full = name_ + "." + key;
    auto it = all_.find(full);
    MINIDL_CHECK(it != all_.end(), "golden tensor '", full, "' is missing");
    used_.insert(full);
    return it->second;
  }
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    const std::string prefix = name_ + ".";
    for (const auto& [k, v] : all_) {
      if (k.rfind(prefix, 0) == 0 && !used_.count(k)) out.push_back(k);
    }
    return out;
  }

 private:
  std::string name_;
  json params_;
  const std::map<std::string, Tensor>& all_;
  std::set<std::string> used_;
};

// Optional inputs (a bias, batch norm's affine parameters) are simply absent from the file.
Tensor opt(const std::map<std::string, Tensor>& in, const std::string& key) {
  auto it = in.find(key);
  return it == in.end() ? Tensor() : it->second;
}

Tensor run_forward(const std::string& op, const json& p, const std::map<std::string, Tensor>& in) {
  auto x = [&] { return in.at("x"); };
  if (op == "add") return add(in.at("a"), in.at("b"));
  if (op == "sub") return sub(in.at("a"), in.at("b"));
  if (op == "mul") return mul(in.at("a"), in.at("b"));
  if (op == "div") return div(in.at("a"), in.at("b"));
  if (op == "maximum") return maximum(in.at("a"), in.at("b"));
  if (op == "minimum") return minimum(in.at("a"), in.at("b"));
  if (op == "exp") return exp(x());
  if (op == "log") return log(x());
  if (op == "log1p") return log1p(x());
  if (op == "sqrt") return sqrt(x());
  if (op == "abs") return abs(x());
  if (op == "neg") return neg(x());
  if (op == "square") return square(x());
  if (op == "relu") return relu(x());
  if (op == "sigmoid") return sigmoid(x());
  if (op == "tanh") return tanh(x());
  if (op == "pow") return pow(x(), p.at("exponent").get<double>());

  if (op == "sum" || op == "mean" || op == "max" || op == "min") {
    const auto dims = p.at("dims").get<std::vector<int64_t>>();
    const bool keepdim = p.at("keepdim").get<bool>();
    if (op == "sum") return sum(x(), dims, keepdim);
    if (op == "mean") return mean(x(), dims, keepdim);
    if (op == "max") return max(x(), dims, keepdim);
    return min(x(), dims, keepdim);
  }
  if (op == "argmax") return argmax(x(), p.at("dim").get<int64_t>(), p.at("keepdim").get<bool>());
  if (op == "argmin") return argmin(x(), p.at("dim").get<int64_t>(), p.at("keepdim").get<bool>());

  if (op == "matmul") return matmul(in.at("a"), in.at("b"));
  if (op == "linear") return linear(x(), in.at("w"), opt(in, "b"));
  if (op == "conv2d") {
    Conv2dOptions o;
    o.stride = pair_of(p, "stride");
    o.padding = pair_of(p, "padding");
    o.dilation = pair_of(p, "dilation");
    o.groups = p.at("groups").get<int64_t>();
    return conv2d(x(), in.at("w"), opt(in, "b"), o);
  }
  if (op == "batch_norm") {
    return batch_norm(x(), opt(in, "w"), opt(in, "b"), in.at("running_mean"), in.at("running_var"),
                      p.at("training").get<bool>(), p.at("momentum").get<double>(), p.at("eps").get<double>());
  }
  if (op == "max_pool2d") return max_pool2d(x(), pool_options(p));
  if (op == "avg_pool2d") return avg_pool2d(x(), pool_options(p));
  if (op == "adaptive_avg_pool2d") return adaptive_avg_pool2d(x(), pair_of(p, "output_size"));
  if (op == "softmax") return softmax(x(), p.at("dim").get<int64_t>());
  if (op == "log_softmax") return log_softmax(x(), p.at("dim").get<int64_t>());
  if (op == "cross_entropy") {
    return cross_entropy(x(), in.at("target"), reduction_of(p), p.at("label_smoothing").get<double>());
  }
  if (op == "nll_loss") return nll_loss(x(), in.at("target"), reduction_of(p));
  if (op == "binary_cross_entropy_with_logits") {
    return binary_cross_entropy_with_logits(x(), in.at("target"), reduction_of(p));
  }
  if (op == "composite_block") {
    // conv3x3 -> batch_norm(train) -> relu -> max_pool -> flatten -> linear -> cross_entropy.
    Conv2dOptions co;
    co.stride = pair_of(p, "conv_stride");
    co.padding = pair_of(p, "conv_padding");
    Tensor y = conv2d(x(), in.at("conv_w"), in.at("conv_b"), co);
    y = batch_norm(y, in.at("bn_w"), in.at("bn_b"), in.at("running_mean"), in.at("running_var"),
                   p.at("bn_training").get<bool>(), p.at("bn_momentum").get<double>(), p.at("bn_eps").get<double>());
    Pool2dOptions po;
    po.kernel = pair_of(p, "pool_kernel");
    po.stride = pair_of(p, "pool_stride");
    y = max_pool2d(relu(y), po);
    y = linear(y.flatten(1), in.at("lin_w"), in.at("lin_b"));
    return cross_entropy(y, in.at("target"), reduction_of(p), p.at("label_smoothing").get<double>());
  }
  MINIDL_FAIL("golden op '", op, "' has no minidl counterpart in golden_test.cpp; add it to run_forward");
}

void run_case(GoldenCase& c) {
  const json& p = c.params();
  std::map<std::string, Tensor> in;
  std::vector<std::string> with_grad;
  for (const auto& name : p.at("inputs").get<std::vector<std::string>>()) {
    Tensor t = c.get(name);
    if (c.has("g" + name)) {
      t.set_requires_grad(true);
      with_grad.push_back(name);
    }
    in.emplace(name, t);
  }
  const std::string op = p.at("op").get<std::string>();
  Tensor y = run_forward(op, p, in);
  EXPECT_TRUE(matches_golden(y, c.get("y"))) << op << " output y";

  // State an op updates in place (batch norm's running statistics) is stored as "<input>_new".
  for (const auto& [name, t] : in) {
    if (c.has(name + "_new")) {
      EXPECT_TRUE(matches_golden(t, c.get(name + "_new"))) << op << " updated " << name;
    }
  }

  if (c.has("gy")) {
    y.backward(c.get("gy"));
    for (const auto& name : with_grad) {
      EXPECT_TRUE(matches_golden(in.at(name).grad(), c.get("g" + name))) << op << " gradient g" << name;
    }
  }
  for (const auto& key : c.unused()) ADD_FAILURE() << "golden tensor '" << key << "' was never compared";
}

// Every family tools/make_golden.py writes; GoldenFiles.AllListed keeps this list complete.
const char* const kFamilies[] = {"elementwise", "reductions", "matmul",  "linear",
                                 "conv2d",      "batch_norm", "max_pool2d", "avg_pool2d",
                                 "adaptive_avg_pool2d", "softmax", "losses", "composite"};

class GoldenFamily : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenFamily, MatchesPyTorch) {
  const std::string path = golden_path(std::string(GetParam()) + ".safetensors");
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;
  // The files are committed: a missing one is a failure, not a skip.
  try {
    tensors = read_safetensors(path, &meta);
  } catch (const std::exception& e) {
    FAIL() << "cannot load golden file " << path << ": " << e.what()
           << "\n(regenerate with: /usr/bin/python3 tools/make_golden.py)";
  }
  ASSERT_TRUE(meta.count("cases")) << path << " has no 'cases' metadata";
  const auto cases = json::parse(meta.at("cases")).get<std::vector<std::string>>();
  ASSERT_FALSE(cases.empty()) << path << " lists no cases";
  for (const auto& name : cases) {
    SCOPED_TRACE(std::string(GetParam()) + "/" + name + " " + (meta.count(name) ? meta.at(name) : "(no metadata)"));
    if (!meta.count(name)) {
      ADD_FAILURE() << "case '" << name << "' has no metadata";
      continue;
    }
    try {
      GoldenCase c(name, json::parse(meta.at(name)), tensors);
      run_case(c);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case '" << name << "' threw: " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenFamily, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<const char*>& family) { return std::string(family.param); });

TEST(GoldenFiles, AllListed) {
  std::set<std::string> listed(std::begin(kFamilies), std::end(kFamilies));
  const std::filesystem::path dir = golden_path("");
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir << " is not a directory";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    EXPECT_TRUE(listed.count(entry.path().stem().string()))
        << entry.path() << " is not checked by any test: add its family to kFamilies";
  }
}

// ---- The reader itself: malformed files must throw an Error naming the file ----

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "minidl_golden_reader_" + name + ".safetensors";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

void expect_error(const std::string& path, const std::string& fragment) {
  expect_read_error([](const std::string& p) { read_safetensors(p); }, path, fragment);
}

TEST(GoldenReader, ReadsTensorsAndMetadata) {
  const std::string path = write_temp(
      "ok", with_header(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                        R"("s":{"dtype":"F32","shape":[],"data_offsets":[16,20]},)"
                        R"("e":{"dtype":"I64","shape":[0,3],"data_offsets":[20,20]}})",
                        floats({1.f, 2.f, 3.f, -4.f, 0.5f})));
  std::map<std::string, std::string> meta;
  auto t = read_safetensors(path, &meta);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(meta.at("k"), "v");
  EXPECT_EQ(t.at("a").shape(), (Shape{2, 2}));
  EXPECT_EQ(t.at("a").to_vector(), (std::vector<double>{1, 2, 3, -4}));
  EXPECT_EQ(t.at("s").dim(), 0);
  EXPECT_EQ(t.at("s").item(), 0.5);
  EXPECT_EQ(t.at("e").dtype(), DType::i64);
  EXPECT_EQ(t.at("e").numel(), 0);
}

TEST(GoldenReader, RejectsMalformedFiles) {
  const std::string tensor = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_error(golden_path("no_such_family.safetensors"), "cannot open");
  expect_error(write_temp("short", "abc"), "fewer than the 8-byte");
  std::string huge = with_header("{" + tensor + "}", floats({1.f, 2.f}));
  huge[0] = '\x7f';
  huge[1] = '\x7f';
  expect_error(write_temp("huge_header", huge), "declares a header of");
  const BadFile bad[] = {
      {"bad_json", "{\"a\":", "", "not valid JSON"},
      {"bad_dtype", R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", floats({1.f}),
       "unsupported dtype 'F8_E4M3'"},
      {"outside", "{" + tensor + "}", floats({1.f}), "outside the data section"},
      {"count", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", floats({1.f, 2.f}), "needs 12"},
      {"neg_shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", floats({1.f, 2.f}), "non-negative"},
  };
  for (const BadFile& b : bad) expect_error(write_temp(b.name, with_header(b.header, b.data)), b.fragment);
}

}  // namespace
}  // namespace minidl::testing
