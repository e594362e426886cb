// Parity keyed to the interface: the `virtual` methods declared in core/backend.h and
// core/device_services.h, read from the headers themselves, against the table of
// tests/kernels/parity_cases.h. A method without a row, a row for a method that no longer exists,
// or a row naming a test that is not in its file fails here, in every build (no GPU needed).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <regex>
#include <set>
#include <string>

#include "tests/kernels/parity_cases.h"
#include "tests/support/read_text.h"

namespace minidl {
namespace {

using testing::parity::cpu_bf16_cases;
using testing::parity::cuda_bf16_cases;
using testing::parity::parity_cases;
using testing::parity::ParityCase;

// The repository root: tests/golden's parent's parent (MINIDL_GOLDEN_DIR is set by tests/CMakeLists.txt).
std::filesystem::path source_root() { return std::filesystem::path(MINIDL_GOLDEN_DIR).parent_path().parent_path(); }

using testing::read_text;   // tests/support/read_text.h

// The names of the `virtual` member functions a header declares (destructors left out), with
// comments removed first so a comment that mentions "virtual" counts for nothing.
std::set<std::string> declared_virtuals(const std::string& text) {
  const std::string code = std::regex_replace(text, std::regex(R"(//[^\n]*)"), "");
  std::set<std::string> names;
  const std::regex decl(R"(\bvirtual\s+([^;{}()]*?)(~?)([A-Za-z_]\w*)\s*\()");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), decl); it != std::sregex_iterator(); ++it) {
    if ((*it)[2].length() == 0) names.insert((*it)[3]);
  }
  return names;
}

std::set<std::string> backend_virtuals(std::initializer_list<const char*> headers = {"core/backend.h",
                                                                                     "core/device_services.h"}) {
  std::set<std::string> all;
  for (const char* h : headers) {
    const std::string text = read_text(source_root() / h);
    EXPECT_FALSE(text.empty()) << "cannot read " << (source_root() / h);
    all.merge(declared_virtuals(text));
  }
  return all;
}

TEST(ParityCoverage, TheParserFindsVirtualsAcrossLinesAndSkipsDestructorsAndComments) {
  const std::set<std::string> got = declared_virtuals(
      "class B {\n virtual ~B() = default;\n  // virtual void not_me(int);\n"
      "  virtual std::unique_ptr<H> copy_async(const std::vector<std::pair<const void*, T>>& c);\n"
      "  virtual void conv(const Tensor& x,\n      const Tensor& y) = 0;\n  virtual const char* name() const = 0;\n};");
  EXPECT_EQ(got, (std::set<std::string>{"conv", "copy_async", "name"}));
}

TEST(ParityCoverage, EveryBackendVirtualHasACaseOrASaysWhyNot) {
  const std::set<std::string> virtuals = backend_virtuals();
  ASSERT_GE(virtuals.size(), 30u) << "the headers' virtuals were not found: the parser or the paths are off";
  std::set<std::string> rows;
  for (const auto& c : parity_cases()) {
    EXPECT_TRUE(rows.insert(std::string(c.method)).second) << "two rows for " << c.method;
    EXPECT_NE(c.tests.empty(), c.not_compared.empty())
        << c.method << ": a row names its parity tests or says why there is nothing to compare, not both";
  }
  for (const std::string& v : virtuals) {
    EXPECT_TRUE(rows.count(v)) << "Backend::" << v
                               << " has no parity case: add a CPU-vs-CUDA test and a row in tests/kernels/parity_cases.h "
                                  "(or a row with the reason it cannot be compared)";
  }
  for (const std::string& r : rows) {
    EXPECT_TRUE(virtuals.count(r)) << "tests/kernels/parity_cases.h has a row for " << r
                                   << ", which core/backend.h and core/device_services.h no longer declare";
  }
}

// Every row's "file:Suite.Test" entries name a TEST in that file.
void expect_named_tests_exist(const std::vector<ParityCase>& table) {
  const std::regex entry(R"((\S+):(\w+)\.(\w+))");
  for (const auto& c : table) {
    const std::string tests(c.tests);
    int n = 0;
    for (auto it = std::sregex_iterator(tests.begin(), tests.end(), entry); it != std::sregex_iterator(); ++it, ++n) {
      const std::string file = (*it)[1], suite = (*it)[2], name = (*it)[3];
      const std::string text = read_text(source_root() / "tests" / file);
      const std::regex def("TEST(_F|_P)?\\(\\s*" + suite + ",\\s*" + name + "\\s*\\)");
      EXPECT_TRUE(std::regex_search(text, def)) << c.method << ": " << suite << "." << name << " is not in tests/" << file;
    }
    EXPECT_EQ(n == 0, tests.empty()) << c.method << ": cannot read the entries '" << tests << "'";
  }
}

TEST(ParityCoverage, EveryNamedParityTestExists) {
  expect_named_tests_exist(parity_cases());
  expect_named_tests_exist(cpu_bf16_cases());
  expect_named_tests_exist(cuda_bf16_cases());
}

// A bf16 table has one row per op of core/backend.h: the tests that run it in bf16, or the reason.
void expect_one_row_per_op(const std::vector<ParityCase>& table, const std::string& table_name,
                           const std::string& how) {
  const std::set<std::string> ops = backend_virtuals({"core/backend.h"});
  ASSERT_GE(ops.size(), 25u) << "core/backend.h's virtuals were not found";
  std::set<std::string> rows;
  for (const auto& c : table) {
    EXPECT_TRUE(rows.insert(std::string(c.method)).second) << "two " << table_name << " rows for " << c.method;
    EXPECT_NE(c.tests.empty(), c.not_compared.empty()) << c.method << ": tests or a reason, not both";
  }
  for (const std::string& v : ops) {
    EXPECT_TRUE(rows.count(v)) << "Backend::" << v << " has no " << table_name << " case: " << how << " and a row in "
                               << table_name << " (tests/kernels/parity_cases.h), or a row with the reason";
  }
  for (const std::string& r : rows) {
    EXPECT_TRUE(ops.count(r)) << table_name << " has a row for " << r << ", which core/backend.h no longer declares";
  }
}

TEST(ParityCoverage, EveryBackendOpHasABf16CaseOrSaysWhyNot) {
  expect_one_row_per_op(cpu_bf16_cases(), "cpu_bf16_cases", "add a bf16-vs-f32 test (tests/kernels/cpu_bf16_test.cpp)");
}

TEST(ParityCoverage, EveryBackendOpHasACudaBf16CaseOrSaysWhyNot) {
  expect_one_row_per_op(cuda_bf16_cases(), "cuda_bf16_cases",
                        "add a CUDA-vs-CPU bf16 test (tests/kernels/bf16_parity_cuda_test.cpp)");
}

}  // namespace
}  // namespace minidl
