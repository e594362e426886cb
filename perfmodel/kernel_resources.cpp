// ptxas report parsing (kernel_resources.h). A report reads, per entry function:
//   ptxas info    : Compiling entry function '_Z...' for 'sm_90'
//   ptxas info    : Function properties for _Z...
//       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 10 registers, used 1 barriers, 4096 bytes smem
// Non-entry functions have "Function properties" too but no "Compiling entry function": skipped.
#include "perfmodel/kernel_resources.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

namespace minidl::gpumodel {
namespace {

std::string demangle(const std::string& m) {
  int status = 0;
  char* d = abi::__cxa_demangle(m.c_str(), nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : m;
  std::free(d);
  return s;
}

// The parameter list of a demangled function: the last top-level "(...)".
std::string parameter_list(const std::string& d) {
  int depth = 0;
  for (size_t i = d.size(); i-- > 0;) {
    if (d[i] == ')') ++depth;
    if (d[i] == '(' && --depth == 0) return d.substr(i);
  }
  return "";
}

int first_int(const std::smatch& m, size_t i) { return m[i].matched ? std::atoi(m[i].str().c_str()) : 0; }

}  // namespace

std::string kernel_base_name(const std::string& text) {
  std::string s = text;
  // Drop the parameter list of a demangled signature ("...kernel<float>(float*, long)").
  if (!s.empty() && s.back() == ')' && s.front() != '(') {
    const std::string p = parameter_list(s);
    s = s.substr(0, s.size() - p.size());
  }
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return c == '(' || c == ')' || c == ' '; }), s.end());
  // Drop template arguments (balanced <...>), then namespaces.
  std::string out;
  int depth = 0;
  for (char c : s) {
    if (c == '<') ++depth;
    else if (c == '>') --depth;
    else if (depth == 0) out += c;
  }
  if (const size_t p = out.rfind("::"); p != std::string::npos) out = out.substr(p + 2);
  // "void minidl::..." leaves "voidminidl": a return type precedes the name in a demangled signature.
  return out;
}

std::vector<KernelResources> parse_ptxas_report(std::istream& in, const std::string& source) {
  static const std::regex entry(R"(Compiling entry function '([^']+)')");
  static const std::regex props(R"(Function properties for (\S+))");
  static const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex used(R"(Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?)");
  std::vector<KernelResources> out;
  std::string line, current;   // the entry function the next lines describe
  bool in_entry = false;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, entry)) {
      KernelResources k;
      k.mangled = m[1];
      k.demangled = demangle(k.mangled);
      k.parameters = parameter_list(k.demangled);
      // The demangled text up to the parameters, e.g. "void minidl::cuda::(anonymous namespace)::f<float>".
      std::string head = k.demangled.substr(0, k.demangled.size() - k.parameters.size());
      if (const size_t sp = head.find(' '); sp != std::string::npos && head.compare(0, 5, "void ") == 0)
        head = head.substr(sp + 1);
      k.name = kernel_base_name(head);
      k.source = source;
      out.push_back(k);
      current = k.mangled;
      in_entry = true;
    } else if (std::regex_search(line, m, props)) {
      in_entry = in_entry && m[1] == current;   // a device function's properties: not ours
    } else if (in_entry && std::regex_search(line, m, frame)) {
      out.back().stack_frame = first_int(m, 1);
      out.back().spill_stores = first_int(m, 2);
      out.back().spill_loads = first_int(m, 3);
    } else if (in_entry && std::regex_search(line, m, used)) {
      out.back().registers = first_int(m, 1);
      out.back().barriers = first_int(m, 2);
      out.back().static_smem = first_int(m, 3);
      in_entry = false;
    }
  }
  return out;
}

std::vector<KernelResources> load_kernel_resources(const std::string& dir) {
  std::vector<KernelResources> all;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return all;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string source = f.stem().string();   // "elementwise.cu"
    for (KernelResources& k : parse_ptxas_report(in, source)) all.push_back(std::move(k));
  }
  return all;
}

const KernelResources* find_kernel(const std::vector<KernelResources>& table, const std::string& kernel_text,
                                   const std::string& parameters, bool* exact) {
  const std::string name = kernel_base_name(kernel_text);
  const KernelResources* best = nullptr;
  for (const KernelResources& k : table) {
    if (k.name != name) continue;
    if (!parameters.empty() && k.parameters == parameters) {
      if (exact != nullptr) *exact = true;
      return &k;
    }
    if (best == nullptr || k.registers > best->registers) best = &k;
  }
  if (exact != nullptr) *exact = false;
  if (best != nullptr || parameters.empty()) return best;
  // A kernel launched through a function pointer ("kernel"): its parameter types alone, if unique.
  const KernelResources* only = nullptr;
  for (const KernelResources& k : table) {
    if (k.parameters != parameters) continue;
    if (only != nullptr) return nullptr;
    only = &k;
  }
  if (only != nullptr && exact != nullptr) *exact = true;
  return only;
}

}  // namespace minidl::gpumodel
