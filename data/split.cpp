// Stratified, seeded splits and the manifest that records them. Each class is shuffled on its own
// Philox stream, so adding images of one class does not reshuffle another, and the manifest keys
// are root-relative paths, so a split made on one machine replays on another.
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/philox.h"
#include "data/dataset.h"
#include "data/transform.h"

namespace minidl::data {

namespace {

constexpr uint64_t kSplitStream = 0x53504C4954ull;  // "SPLIT"

std::vector<std::vector<int64_t>> indices_by_class(const Dataset& d) {
  std::vector<std::vector<int64_t>> by(d.class_names().size());
  for (int64_t i = 0; i < d.size(); ++i) {
    const int64_t l = d.label(i);
    MINIDL_CHECK(l >= 0 && l < static_cast<int64_t>(by.size()), "split: sample ", i, " (", d.describe(i), ") has label ",
                 l, " outside [0, ", by.size(), ")");
    by[static_cast<size_t>(l)].push_back(i);
  }
  return by;
}

// Fisher-Yates with 64-bit Philox draws (modulo bias below 2^-40 for any real dataset).
void shuffle(std::vector<int64_t>& v, uint64_t key) {
  for (size_t i = v.size(); i > 1; --i) {
    const philox::U4 u = philox::draw(key, i);
    const uint64_t r = (static_cast<uint64_t>(u.x) << 32) | u.y;
    std::swap(v[i - 1], v[static_cast<size_t>(r % i)]);
  }
}

Split split_counts(const Dataset& d, const std::vector<std::array<int64_t, 3>>& counts, uint64_t seed) {
  auto by = indices_by_class(d);
  Split s;
  for (size_t c = 0; c < by.size(); ++c) {
    auto& v = by[c];
    const auto [tr, va, te] = counts[c];
    MINIDL_CHECK(tr >= 0 && va >= 0 && te >= 0, "split: negative count for class ", d.class_names()[c]);
    MINIDL_CHECK(tr + va + te <= static_cast<int64_t>(v.size()), "split: class '", d.class_names()[c], "' has ", v.size(),
                 " samples, fewer than the ", tr, " + ", va, " + ", te, " requested; lower the counts");
    shuffle(v, epoch_key(seed, static_cast<int64_t>(c), kSplitStream));
    auto from = v.begin();
    s.train.insert(s.train.end(), from, from + tr);
    s.val.insert(s.val.end(), from + tr, from + tr + va);
    s.test.insert(s.test.end(), from + tr + va, from + tr + va + te);
  }
  // Each part in dataset order: the loader shuffles anyway, and sorted parts read well in a manifest.
  std::sort(s.train.begin(), s.train.end());
  std::sort(s.val.begin(), s.val.end());
  std::sort(s.test.begin(), s.test.end());
  return s;
}

const char* kHeader = "# minidl split manifest v1";

}  // namespace

Split split_by_counts(const Dataset& d, int64_t train_per_class, int64_t val_per_class, int64_t test_per_class,
                      uint64_t seed) {
  std::vector<std::array<int64_t, 3>> counts(d.class_names().size(), {train_per_class, val_per_class, test_per_class});
  return split_counts(d, counts, seed);
}

Split split_by_fractions(const Dataset& d, double train, double val, double test, uint64_t seed) {
  MINIDL_CHECK(train >= 0 && val >= 0 && test >= 0 && train + val + test <= 1.0 + 1e-9,
               "split_by_fractions: fractions must be >= 0 and sum to at most 1, got ", train, " + ", val, " + ", test);
  const auto by = indices_by_class(d);
  std::vector<std::array<int64_t, 3>> counts;
  for (const auto& v : by) {
    const auto n = static_cast<double>(v.size());
    // floor (with a tolerance for 0.6 * 1000 = 599.999...) so the parts never exceed the class.
    const auto f = [&](double x) { return static_cast<int64_t>(std::floor(x * n + 1e-6)); };
    counts.push_back({f(train), f(val), f(test)});
  }
  return split_counts(d, counts, seed);
}

void write_manifest(const std::filesystem::path& file, const Dataset& d, const Split& s) {
  std::ostringstream os;
  os << kHeader << "\n# samples " << d.size() << "\n# classes";
  for (const auto& c : d.class_names()) os << ' ' << c;
  os << "\n# part\tlabel\tkey (path relative to the dataset root)\n";
  const auto part = [&](const char* name, const std::vector<int64_t>& v) {
    for (int64_t i : v) {
      MINIDL_CHECK(i >= 0 && i < d.size(), "write_manifest: index ", i, " out of range [0, ", d.size(), ")");
      const std::string k = d.key(i);
      MINIDL_CHECK(k.find_first_of("\t\n") == std::string::npos, "write_manifest: sample key '", k,
                   "' contains a tab or newline");
      os << name << '\t' << d.label(i) << '\t' << k << '\n';
    }
  };
  part("train", s.train);
  part("val", s.val);
  part("test", s.test);
  // Through the atomic writer: a crash or a full disk never leaves half a manifest behind.
  write_file_atomic(file, os.str());
}

Split read_manifest(const std::filesystem::path& file, const Dataset& d) {
  std::ifstream in(file, std::ios::binary);
  MINIDL_CHECK(in.good(), "read_manifest: cannot open ", file.string());
  return read_manifest(in, file, d);
}

Split read_manifest(std::istream& in, const std::filesystem::path& file, const Dataset& d) {
  std::unordered_map<std::string, int64_t> index;
  index.reserve(static_cast<size_t>(d.size()));
  for (int64_t i = 0; i < d.size(); ++i) index.emplace(d.key(i), i);
  Split s;
  std::string line;
  int64_t lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line == kHeader) header = true;
      if (line.rfind("# classes", 0) == 0) {
        std::string want = "# classes";
        for (const auto& c : d.class_names()) want += " " + c;
        MINIDL_CHECK(line == want, "read_manifest: ", file.string(), " was written for '", line.substr(2),
                     "' but the dataset has '", want.substr(2), "'");
      }
      continue;
    }
    MINIDL_CHECK(header, "read_manifest: ", file.string(), " does not start with '", kHeader, "'");
    const size_t t1 = line.find('\t');
    const size_t t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    MINIDL_CHECK(t2 != std::string::npos, "read_manifest: ", file.string(), ":", lineno,
                 ": expected 'part<TAB>label<TAB>key', got '", line, "'");
    const std::string part = line.substr(0, t1), key = line.substr(t2 + 1);
    int64_t label = -1;
    try {
      label = std::stoll(line.substr(t1 + 1, t2 - t1 - 1));
    } catch (const std::exception&) {
      MINIDL_FAIL("read_manifest: ", file.string(), ":", lineno, ": bad label in '", line, "'");
    }
    const auto it = index.find(key);
    MINIDL_CHECK(it != index.end(), "read_manifest: ", file.string(), ":", lineno, ": sample '", key,
                 "' is not in the dataset (a different folder or a changed dataset?)");
    MINIDL_CHECK(d.label(it->second) == label, "read_manifest: ", file.string(), ":", lineno, ": sample '", key,
                 "' has label ", label, " in the manifest but ", d.label(it->second), " in the dataset");
    if (part == "train") {
      s.train.push_back(it->second);
    } else if (part == "val") {
      s.val.push_back(it->second);
    } else if (part == "test") {
      s.test.push_back(it->second);
    } else {
      MINIDL_FAIL("read_manifest: ", file.string(), ":", lineno, ": unknown part '", part, "' (train, val or test)");
    }
  }
  MINIDL_CHECK(header, "read_manifest: ", file.string(), " is empty or not a minidl manifest");
  return s;
}

}  // namespace minidl::data
