// docs/experiments.md's flag tables against each program's --help, so the two cannot drift: every
// flag a program accepts is documented for it (its own table, or the minidl-train table it shares),
// every documented flag exists, the documented defaults are the ones --help shows, and --out says
// what that program writes.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

struct Flag {
  std::string default_value;  // as shown ("" when none)
  bool has_default = false;
  std::string meaning;
};
using Flags = std::map<std::string, Flag>;

// CLI11's help: "  --flag TYPE=default   meaning" (the meaning may wrap to the next line).
Flags help_flags(const std::string& program) {
  Flags f;
  std::istringstream in(testing::run_command(testing::program(program).string() + " --help").output);
  static const std::regex opt(R"(^  (?:-\w,)?(--[a-z0-9-]+)(?: ([A-Z]+)(?:=(\S*))?)?\s*(.*)$)");
  std::string line, last;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, opt)) {
      last = m[1];
      f[last] = {m[3], m[3].matched, m[4]};
    } else if (!last.empty() && line.rfind("      ", 0) == 0) {
      f[last].meaning += " " + line;
    }
  }
  f.erase("--help");
  f.erase("--config");   // Common behaviour, not a table row
  return f;
}

std::string strip(std::string s) {
  s = std::regex_replace(s, std::regex("`"), "");
  s = std::regex_replace(s, std::regex(R"(^\s+|\s+$)"), "");
  return s;
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> c;
  std::string cur;
  bool code = false;
  for (size_t i = 1; i < row.size(); ++i) {   // row starts with '|'
    if (row[i] == '`') code = !code;
    if (row[i] == '|' && !code) {
      c.push_back(cur);
      cur.clear();
    } else {
      cur += row[i];
    }
  }
  return c;
}

// The "| flag | default | meaning |" table of `## <program>`; `shared` is set when it starts with
// "all `minidl-train` flags". A row naming several flags ("`--beta1`, `--beta2`") with as many
// defaults ("0.9, 0.999") gives each its own.
Flags doc_flags(const std::string& program, bool* shared) {
  std::ifstream f(std::string(MINIDL_GOLDEN_DIR) + "/../../docs/experiments.md");
  EXPECT_TRUE(f.good()) << "docs/experiments.md not found";
  Flags out;
  std::string line;
  bool in_section = false, in_table = false;
  *shared = false;
  while (std::getline(f, line)) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == "## " + program;
      continue;
    }
    if (!in_section) continue;
    if (line.rfind("| flag | default | meaning |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;   // the table ended
    if (line.rfind("| ---", 0) == 0) continue;
    const auto c = cells(line);
    if (c.size() < 3) continue;
    if (c[0].find("all `minidl-train` flags") != std::string::npos) {
      *shared = true;
      continue;
    }
    std::vector<std::string> names;
    static const std::regex flag(R"(--[a-z0-9-]+)");
    for (std::sregex_iterator it(c[0].begin(), c[0].end(), flag), end; it != end; ++it) names.push_back(it->str());
    std::vector<std::string> defaults;
    const std::string d = strip(c[1]);
    if (names.size() > 1) {
      std::stringstream ss(std::regex_replace(d, std::regex(" / "), ", "));
      std::string item;
      while (std::getline(ss, item, ',')) defaults.push_back(strip(item));
    }
    for (size_t i = 0; i < names.size(); ++i)
      out[names[i]] = {defaults.size() == names.size() ? defaults[i] : (names.size() == 1 ? d : "?"), true, c[2]};
  }
  return out;
}

bool same_default(const std::string& doc, const Flag& help) {
  if (doc == "?") return true;   // a combined row whose defaults are not listed one by one
  if (!help.has_default || help.default_value.empty()) return doc.empty() || doc == "none" || doc == "off";
  if (doc == help.default_value) return true;
  try {
    size_t a = 0, b = 0;
    const double x = std::stod(doc, &a), y = std::stod(help.default_value, &b);
    return a == doc.size() && b == help.default_value.size() && x == y;
  } catch (const std::exception&) {
    return false;
  }
}

void check_program(const std::string& program, const std::string& out_writes) {
  SCOPED_TRACE(program);
  const Flags help = help_flags(program);
  ASSERT_GT(help.size(), 10u) << "no --help output from " << testing::program(program);
  bool shared = false;
  Flags docs = doc_flags(program, &shared);
  ASSERT_FALSE(docs.empty()) << "no flag table under '## " << program << "'";
  if (program != "minidl-train") {
    ASSERT_TRUE(shared) << "its table should start with the row 'all `minidl-train` flags'";
    bool unused = false;
    for (const auto& [name, f] : doc_flags("minidl-train", &unused)) docs.emplace(name, f);   // own rows win
  }
  for (const auto& [name, f] : help) {
    const auto it = docs.find(name);
    if (it == docs.end()) {
      ADD_FAILURE() << name << " is in --help but in no table of docs/experiments.md for " << program;
      continue;
    }
    EXPECT_TRUE(same_default(it->second.default_value, f))
        << name << ": docs say default '" << it->second.default_value << "', --help '" << f.default_value << "'";
  }
  for (const auto& [name, f] : docs)
    EXPECT_TRUE(help.count(name)) << name << " is documented for " << program << " but --help does not list it";
  // --out is shared, but each program writes something else there.
  ASSERT_TRUE(help.count("--out") && docs.count("--out"));
  EXPECT_NE(help.at("--out").meaning.find(out_writes), std::string::npos) << help.at("--out").meaning;
  EXPECT_NE(docs.at("--out").meaning.find(out_writes), std::string::npos) << docs.at("--out").meaning;
}

TEST(ExperimentsHelpDocs, TrainFlagsMatchTheDocs) { check_program("minidl-train", "metrics.csv"); }
TEST(ExperimentsHelpDocs, MaxbatchFlagsMatchTheDocs) { check_program("minidl-maxbatch", "maxbatch.json"); }
TEST(ExperimentsHelpDocs, SweepFlagsMatchTheDocs) { check_program("minidl-sweep", "summary.md"); }
TEST(ExperimentsHelpDocs, MemestFlagsMatchTheDocs) { check_program("minidl-memest", "memest.json"); }

}  // namespace
}  // namespace minidl::harness
