// Every flag that README.md or a docs/*.md guide gives an experiment program, in a command or in
// prose, exists in that program's --help (help_docs_test.cpp checks docs/experiments.md's flag
// tables; this checks everything else). A guide once cited `--lr-schedule`, a flag no program has.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

// Flags of other tools (cmake, ctest, mpirun, tools/*.sh, bench scripts, compilers) must not be
// checked against the programs, so a flag is checked only where the text says whose it is:
//  - a command (a code block line, or a code span) that runs a program: its flags after the
//    program's name, up to a `#` comment or the next `&&`, `;` or `|` (`bash tools/demo.sh` runs
//    minidl-sweep);
//  - a table row in a section whose heading names one program: the flags of its first cell;
//  - a code span that starts with `--` in prose: against the programs its sentence names; when the
//    sentence names none, and neither its paragraph nor its section names another tool, against the
//    programs its paragraph or heading names, else against every program.
const std::vector<std::string> kPrograms = {"minidl-train", "minidl-maxbatch", "minidl-sweep", "minidl-memest",
                                            "minidl-demo"};
using Accepted = std::map<std::string, std::set<std::string>>;   // program -> its flags

// A table row's first cell ("| `--a`, `--b` | ..." -> " `--a`, `--b` "); a '|' inside a code span
// does not end it.
std::string first_cell(const std::string& row) {
  std::string cell;
  bool code = false;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '`') code = !code;
    if (row[i] == '|' && !code) break;
    cell += row[i];
  }
  return cell;
}

// Every --name in the option column of a --help (CLI11's "  --flag TYPE=default   meaning", and
// minidl-demo's "  --flag N   meaning"): the text of an indented line that starts with '-', up to
// the first run of two spaces.
std::set<std::string> accepted_flags(const std::string& program) {
  std::set<std::string> out;
  std::istringstream in(testing::run_command(testing::program(program).string() + " --help 2>&1").output);
  static const std::regex flag(R"(--[a-z0-9][a-z0-9-]*)");
  std::string line;
  while (std::getline(in, line)) {
    const size_t start = line.find_first_not_of(' ');
    if (start == 0 || start == std::string::npos || line[start] != '-') continue;
    const size_t gap = line.find("  ", start);
    const std::string head = line.substr(start, gap == std::string::npos ? std::string::npos : gap - start);
    for (std::sregex_iterator it(head.begin(), head.end(), flag), end; it != end; ++it) out.insert(it->str());
  }
  return out;
}

// The `--name` tokens of a text: after its start, a space, a backtick, '(', '[', ',' or '=', and
// not followed by a letter, digit or '_' (`--benchmark_filter` is Google Benchmark's).
std::vector<std::string> flags_in(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = s.find("--"); i != std::string::npos; i = s.find("--", i + 2)) {
    if (i > 0 && std::string(" \t`([,=").find(s[i - 1]) == std::string::npos) continue;
    size_t j = i + 2;
    if (j >= s.size() || !(std::islower(static_cast<unsigned char>(s[j])) || std::isdigit(static_cast<unsigned char>(s[j]))))
      continue;
    while (j < s.size() && (std::islower(static_cast<unsigned char>(s[j])) ||
                            std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '-'))
      ++j;
    if (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) continue;
    out.push_back(s.substr(i, j - i));
  }
  return out;
}

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// The programs a text names as words (`minidl-sweep's` names minidl-sweep; `minidl-gpumodel` none).
std::set<std::string> programs_in(const std::string& s) {
  std::set<std::string> out;
  for (const auto& p : kPrograms)
    for (size_t i = s.find(p); i != std::string::npos; i = s.find(p, i + 1))
      if ((i == 0 || !word_char(s[i - 1])) && (i + p.size() >= s.size() || !word_char(s[i + p.size()]))) {
        out.insert(p);
        break;
      }
  return out;
}

// A text that names a tool with flags of its own; its bare flags may be that tool's.
bool names_other_tool(const std::string& s) {
  static const std::regex other(
      R"(\b(cmake|ctest|mpirun|mpiexec|python3?|compute-sanitizer|nsys|ncu|gnuplot|libFuzzer|GCC|gcc|nvcc|clang|linker)\b)"
      R"(|tools/\S+|bench/\S+|perfmodel/\S+|minidl_bench\w*|minidl-gpumodel|lab\.gpulab|\.py\b|install_deps)");
  return std::regex_search(s, other);
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// The program a shell command runs and its arguments, or nothing: the first word after any VAR=value
// (or a word after mpirun / mpiexec / time / exec, or one given by a path such as build/bin/).
std::optional<std::pair<std::string, std::string>> invoked(const std::string& segment) {
  const auto w = words(segment);
  static const std::regex env(R"([A-Za-z_][A-Za-z0-9_]*=\S*)");
  size_t i = 0;
  while (i < w.size() && std::regex_match(w[i], env)) ++i;
  if (i == w.size()) return std::nullopt;
  const bool lead = w[i] == "mpirun" || w[i] == "mpiexec" || w[i] == "time" || w[i] == "exec";
  for (size_t j = i; j < w.size(); ++j) {
    std::string t = w[j];
    t.erase(0, t.find_first_not_of("\"'"));
    t.erase(t.find_last_not_of("\"'") + 1);
    const std::string base = t.substr(t.rfind('/') == std::string::npos ? 0 : t.rfind('/') + 1);
    std::string rest;
    for (size_t k = j + 1; k < w.size(); ++k) rest += w[k] + " ";
    const bool runs = j == i || t.find('/') != std::string::npos || lead;
    if (runs && std::find(kPrograms.begin(), kPrograms.end(), base) != kPrograms.end()) return {{base, rest}};
    if (t.ends_with("tools/demo.sh") && (j == i || w[i] == "bash")) return {{"minidl-sweep", rest}};
  }
  return std::nullopt;
}

// A command line's parts: the comment cut off, then split at &&, ||, ; and |.
std::vector<std::string> command_segments(std::string cmd) {
  for (size_t i = cmd.find('#'); i != std::string::npos; i = cmd.find('#', i + 1))
    if (i == 0 || std::isspace(static_cast<unsigned char>(cmd[i - 1]))) {
      cmd.erase(i);
      break;
    }
  std::vector<std::string> out;
  std::string cur;
  for (char c : cmd) {
    if (c == '&' || c == '|' || c == ';') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> code_spans(const std::string& text) {
  std::vector<std::string> out;
  for (size_t a = text.find('`'); a != std::string::npos;) {
    const size_t b = text.find('`', a + 1);
    if (b == std::string::npos) break;
    out.push_back(text.substr(a + 1, b - a - 1));
    a = text.find('`', b + 1);
  }
  return out;
}

// Sentences of a paragraph: split after '.', '!', '?' or ';' and white space, before a capital, a
// backtick, '*', '(' or '[', never inside a code span.
std::vector<std::string> sentences(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool code = false;
  for (size_t i = 0; i < text.size(); ++i) {
    cur += text[i];
    if (text[i] == '`') code = !code;
    if (code || std::string(".!?;").find(text[i]) == std::string::npos || i + 1 >= text.size() ||
        !std::isspace(static_cast<unsigned char>(text[i + 1])))
      continue;
    size_t j = i + 1;
    while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j < text.size() && (std::isupper(static_cast<unsigned char>(text[j])) || std::string("`*([").find(text[j]) != std::string::npos)) {
      out.push_back(cur);
      cur.clear();
      i = j - 1;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

struct Unit {
  enum Kind { kCode, kRow, kParagraph } kind;
  int line;
  std::string text;
  std::string heading;
};

// A markdown file as code lines (continuations joined), table rows and paragraphs (each list item
// its own), each with the heading above it; `sections` gets each heading's text.
std::vector<Unit> units_of(const std::string& markdown, std::map<std::string, std::string>* sections) {
  std::vector<Unit> out;
  std::istringstream in(markdown);
  std::string line, heading, pending, para;
  int n = 0, para_line = 0, pending_line = 0;
  bool fence = false;
  auto flush = [&] {
    if (!para.empty()) out.push_back({Unit::kParagraph, para_line, para, heading});
    para.clear();
  };
  while (std::getline(in, line)) {
    ++n;
    const size_t first = line.find_first_not_of(" \t");
    const std::string trimmed = first == std::string::npos ? "" : line.substr(first);
    if (trimmed.rfind("```", 0) == 0) {
      flush();
      fence = !fence;
      continue;
    }
    if (fence) {
      (*sections)[heading] += line + "\n";   // a section that runs cmake may give cmake's flags in prose
      if (pending.empty()) pending_line = n;
      if (!trimmed.empty() && line.back() == '\\') {
        pending += line.substr(0, line.size() - 1) + " ";
      } else {
        out.push_back({Unit::kCode, pending_line, pending + line, heading});
        pending.clear();
      }
      continue;
    }
    (*sections)[heading] += line + "\n";
    if (trimmed.empty()) {
      flush();
    } else if (line[0] == '#') {
      flush();
      heading = line;
    } else if (line[0] == '|') {
      flush();
      out.push_back({Unit::kRow, n, line, heading});
    } else {
      static const std::regex item(R"(^\s*([-*]|\d+\.)\s.*)");
      if (std::regex_match(line, item)) flush();
      if (para.empty()) para_line = n;
      para += line + "\n";
    }
  }
  flush();
  return out;
}

// "file:line: --flag ..." for every flag the markdown gives a program that does not accept it.
std::vector<std::string> unknown_flags(const std::string& file, const std::string& markdown, const Accepted& accepted) {
  std::vector<std::string> problems;
  auto check = [&](int line, const std::vector<std::string>& flags, const std::set<std::string>& programs,
                   const char* where) {
    for (const auto& f : flags) {
      bool ok = false;
      std::string names;
      for (const auto& p : programs) {
        ok = ok || (accepted.count(p) && accepted.at(p).count(f));
        names += (names.empty() ? "" : ", ") + p;
      }
      if (!ok) problems.push_back(file + ":" + std::to_string(line) + ": " + f + " is not a flag of " + names + " (" + where + ")");
    }
  };
  auto check_commands = [&](int line, const std::string& text) {
    for (const auto& seg : command_segments(text))
      if (auto r = invoked(seg)) check(line, flags_in(r->second), {r->first}, "in its command");
  };
  std::map<std::string, std::string> sections;
  const std::set<std::string> all(kPrograms.begin(), kPrograms.end());
  for (const Unit& u : units_of(markdown, &sections)) {
    const std::set<std::string> heading_programs = programs_in(u.heading);
    if (u.kind == Unit::kCode) {
      check_commands(u.line, u.text);
      continue;
    }
    for (const auto& span : code_spans(u.text)) check_commands(u.line, span);
    if (u.kind == Unit::kRow) {
      if (heading_programs.size() != 1) continue;
      for (const auto& span : code_spans(first_cell(u.text)))
        if (span.rfind("--", 0) == 0) check(u.line, flags_in(span), heading_programs, "a row of its section's table");
      continue;
    }
    const bool other_nearby = names_other_tool(u.text) || names_other_tool(sections[u.heading]);
    for (const auto& sentence : sentences(u.text)) {
      for (const auto& span : code_spans(sentence)) {
        if (span.rfind("--", 0) != 0 || names_other_tool(sentence)) continue;
        const auto flags = flags_in(span);
        if (auto named = programs_in(sentence); !named.empty()) {
          check(u.line, flags, named, "named in its sentence");
        } else if (other_nearby) {
          continue;
        } else if (auto in_para = programs_in(u.text); !in_para.empty()) {
          check(u.line, flags, in_para, "named in its paragraph");
        } else {
          check(u.line, flags, heading_programs.empty() ? all : heading_programs, "no other tool named near it");
        }
      }
    }
  }
  return problems;
}

TEST(DocsFlags, TheScannerChecksOnlyWhatBelongsToAProgram) {
  const Accepted accepted = {{"minidl-train", {"--epochs", "--schedule", "--amp"}},
                             {"minidl-sweep", {"--study", "--quick", "--out"}}};
  const std::string md =
      "# Guide\n\n"
      "```bash\n"
      "build/bin/minidl-train --epochs 2 --lr-schedule cosine   # and --nothing in a comment\n"
      "cmake --build build -j2 --target minidl-train && bash tools/demo.sh --study x --nope\n"
      "mpirun --oversubscribe -np 2 build/bin/minidl-sweep --quick \\\n"
      "    --wrong\n"
      "```\n\n"
      "Run `minidl-train --amp --bad` or pass `--schedule`, not `--lr-schedulex`.\n"
      "With mpirun add `--allow-run-as-root`.\n\n"
      "- `--rehearse` of lab.gpulab check.\n\n"
      "## Pieces\n\n"
      "- `optim::parse_schedule` with the grammar of `--lr-schedule`.\n\n"
      "## minidl-sweep\n\n| flag | default |\n| --- | --- |\n| `--quick` | off |\n| `--slow` | off |\n";
  const auto p = unknown_flags("x.md", md, accepted);
  const std::vector<std::string> expected = {
      "x.md:4: --lr-schedule is not a flag of minidl-train (in its command)",
      "x.md:5: --nope is not a flag of minidl-sweep (in its command)",
      "x.md:6: --wrong is not a flag of minidl-sweep (in its command)",
      "x.md:10: --bad is not a flag of minidl-train (in its command)",
      "x.md:10: --lr-schedulex is not a flag of minidl-train (named in its sentence)",
      "x.md:17: --lr-schedule is not a flag of minidl-demo, minidl-maxbatch, minidl-memest, minidl-sweep, minidl-train "
      "(no other tool named near it)",
      "x.md:24: --slow is not a flag of minidl-sweep (a row of its section's table)"};
  EXPECT_EQ(p, expected);
}

TEST(DocsFlags, EveryFlagTheGuidesGiveAProgramExists) {
  Accepted accepted;
  for (const auto& p : kPrograms) {
    accepted[p] = accepted_flags(p);
    ASSERT_GT(accepted[p].size(), 5u) << "no --help output from " << testing::program(p);
  }
  const std::filesystem::path root = std::filesystem::path(MINIDL_GOLDEN_DIR) / ".." / "..";
  std::vector<std::filesystem::path> files = {root / "README.md"};
  for (const auto& e : std::filesystem::recursive_directory_iterator(root / "docs"))  // docs/cuda/ too
    if (e.path().extension() == ".md") files.push_back(e.path());
  std::sort(files.begin() + 1, files.end());
  int commands = 0;
  for (const auto& f : files) {
    std::ifstream in(f);
    ASSERT_TRUE(in.good()) << f;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string name = std::filesystem::relative(f, root).string();
    for (const auto& problem : unknown_flags(name, ss.str(), accepted)) ADD_FAILURE() << problem;
    std::map<std::string, std::string> unused;
    for (const auto& u : units_of(ss.str(), &unused))
      for (const auto& seg : command_segments(u.text)) commands += invoked(seg).has_value();
  }
  EXPECT_GT(commands, 20) << "the scan found almost no program commands in the guides: is it reading them?";
}

}  // namespace
}  // namespace minidl::harness
