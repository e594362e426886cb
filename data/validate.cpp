// validate_dataset: decode every sample once, up front, on a few threads, so a user learns about
// bad files before a long run instead of from warnings in the middle of it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/dataset.h"

namespace minidl::data {

ValidationReport validate_dataset(const Dataset& d, int threads, Scan scan) {
  MINIDL_CHECK(threads >= 1, "validate_dataset: threads must be >= 1, got ", threads);
  const auto t0 = std::chrono::steady_clock::now();
  ValidationReport r;
  r.samples = d.size();
  r.class_names = d.class_names();
  r.readable_per_class.assign(r.class_names.size(), 0);
  r.threads = threads;
  r.scan = scan;
  std::vector<SampleCheck> checks(static_cast<size_t>(d.size()));
  std::atomic<int64_t> next{0};
  std::mutex err_mu;
  std::exception_ptr error;
  const auto work = [&] {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < d.size();) checks[static_cast<size_t>(i)] = scan == Scan::Decode ? d.check(i) : d.probe(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  for (int64_t i = 0; i < d.size(); ++i) {
    const SampleCheck& c = checks[static_cast<size_t>(i)];
    if (c.ok) {
      ++r.readable;
      const int64_t l = d.label(i);
      if (l >= 0 && l < static_cast<int64_t>(r.readable_per_class.size())) ++r.readable_per_class[static_cast<size_t>(l)];
      if (!c.note.empty()) r.converted.push_back({i, d.describe(i), c.note});
    } else {
      r.unreadable.push_back({i, d.describe(i), c.problem});
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string ValidationReport::text(size_t max_listed) const {
  std::ostringstream os;
  os << "dataset: " << samples << " samples, " << class_names.size() << " classes; readable per class:";
  for (size_t c = 0; c < class_names.size(); ++c) {
    os << (c ? ", " : " ") << class_names[c] << " " << (c < readable_per_class.size() ? readable_per_class[c] : 0);
  }
  os << "\nreadable: " << readable << ", unreadable (skipped by the loader): " << unreadable.size()
     << ", converted: " << converted.size() << "\n";
  const auto list = [&](const char* tag, const std::vector<Entry>& v) {
    for (size_t k = 0; k < v.size() && k < max_listed; ++k) os << "  " << tag << " " << v[k].what << ": " << v[k].why << "\n";
    if (v.size() > max_listed) os << "  ... and " << v.size() - max_listed << " more " << tag << " files\n";
  };
  list("unreadable", unreadable);
  list("converted", converted);
  os << (scan == Scan::Decode ? "checked" : "headers checked") << " in " << std::fixed << std::setprecision(2) << seconds << " s on " << threads << " thread"
     << (threads == 1 ? "" : "s");
  if (seconds > 0) os << " (" << std::setprecision(0) << static_cast<double>(samples) / seconds << " files/s)";
  os << "\n";
  return os.str();
}

}  // namespace minidl::data
