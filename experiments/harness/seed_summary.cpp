// Means and spreads over the seeds of a study (see seed_summary.h).
#include "experiments/harness/seed_summary.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace minidl::harness {

namespace {

double mean_of(const std::vector<double>& v) {
  return v.empty() ? std::nan("") : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

double SeedCell::mean() const { return mean_of(values); }

double SeedCell::sd() const {
  if (values.size() < 2) return 0.0;
  const double m = mean();
  double ss = 0;
  for (double v : values) ss += (v - m) * (v - m);
  return std::sqrt(ss / static_cast<double>(values.size() - 1));
}

std::vector<SeedCell> seed_cells(const Study& st, const CsvTable& t) {
  std::vector<SeedCell> cells;
  std::map<std::pair<std::string, int64_t>, size_t> at;
  for (const auto& run : st.runs) {
    const std::pair<std::string, int64_t> key{run.group, run.config.effective_batch()};
    if (at.count(key)) continue;
    at[key] = cells.size();
    SeedCell c;
    c.group = run.group;
    c.batch = key.second;
    cells.push_back(c);
  }
  std::map<size_t, std::map<std::string, int>> statuses;
  std::map<size_t, std::vector<double>> rates;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    int64_t batch = 0;
    try {
      batch = std::stoll(t.get(i, "effective_batch"));
    } catch (const std::exception&) {
      continue;
    }
    const auto it = at.find({t.get(i, "group"), batch});
    if (it == at.end()) continue;  // a row of an earlier protocol
    SeedCell& c = cells[it->second];
    ++c.runs;
    const std::string status = t.get(i, "status");
    ++statuses[it->second][status];
    if (status != "ok" || t.get(i, st.plot_y).empty()) continue;
    c.values.push_back(std::stod(t.get(i, st.plot_y)));
    if (!t.get(i, "best_val_acc").empty()) c.val_acc.push_back(std::stod(t.get(i, "best_val_acc")));
    if (!t.get(i, "images_per_s").empty()) rates[it->second].push_back(std::stod(t.get(i, "images_per_s")));
  }
  for (size_t k = 0; k < cells.size(); ++k) {
    SeedCell& c = cells[k];
    c.images_per_s = mean_of(rates[k]);
    const auto& s = statuses[k];
    if (s.size() == 1) c.statuses = s.begin()->first;
    for (const auto& [name, n] : s)
      if (s.size() > 1) c.statuses += (c.statuses.empty() ? "" : ", ") + std::to_string(n) + " " + name;
    for (const auto& p : st.published)
      if (p.group == c.group && p.batch == c.batch) c.published = p.value;
  }
  return cells;
}

std::string seed_means_markdown(const Study& st, const std::vector<SeedCell>& cells, int64_t test_images) {
  std::vector<Row> rows;
  for (const auto& c : cells) {
    if (c.runs == 0 && !c.published) continue;
    const bool any = !c.values.empty();
    const auto [lo, hi] = any ? std::minmax_element(c.values.begin(), c.values.end())
                              : std::pair{c.values.end(), c.values.end()};
    const std::string mean = fmt(c.mean());
    const bool chance = any && accuracy_cell(mean, test_images) != mean;
    const std::string runs = std::to_string(c.values.size()) + " of " + std::to_string(st.seeds);
    rows.push_back({c.group, std::to_string(c.batch), runs,
                    any ? mean + " ± " + fmt(c.sd()) + (chance ? " (chance)" : "") : "-",
                    any ? fmt(*lo) + " - " + fmt(*hi) : "-",
                    c.val_acc.empty() ? "-" : fmt(mean_of(c.val_acc)),
                    c.published ? fmt(*c.published, 3) : "-", any ? fmt(c.images_per_s, 1) : "-",
                    c.statuses.empty() ? "not run" : c.statuses});
  }
  std::string md = "Mean over the seeds (" + std::to_string(st.seeds) + " per cell: --seed, --seed + 1, ...; each "
                   "seed also draws its own split) of the runs with status ok; ± is the sample standard deviation "
                   "(the plot's error bars), then the lowest and highest run:\n\n";
  md += markdown_table({"group", "batch", "runs", st.plot_y + " mean ± sd", st.plot_y + " range", "best_val_acc mean",
                        "published", "images_per_s", "status"},
                       rows);
  return md + "\n";
}

std::vector<Series> seed_series(const std::vector<SeedCell>& cells) {
  std::vector<Series> out;
  std::map<std::string, size_t> line_of;  // group -> its series; only groups with a measured point
  for (const auto& c : cells) {
    if (c.values.empty()) continue;
    if (!line_of.count(c.group)) line_of[c.group] = out.size(), out.push_back({c.group, {}, {}, 0});
    Series& s = out[line_of[c.group]];
    s.points.emplace_back(static_cast<double>(c.batch), c.mean());
    s.errors.push_back(c.sd());
  }
  const size_t lines = out.size();
  for (const auto& c : cells) {
    if (!c.published || !line_of.count(c.group)) continue;
    const int colour = static_cast<int>(line_of[c.group]) + 1;
    auto it = std::find_if(out.begin() + static_cast<std::ptrdiff_t>(lines), out.end(),
                           [&](const Series& p) { return p.line_of == colour; });
    if (it == out.end()) it = out.insert(out.end(), {"published: " + c.group, {}, {}, colour});
    it->points.emplace_back(static_cast<double>(c.batch), *c.published);
  }
  return out;
}

}  // namespace minidl::harness
