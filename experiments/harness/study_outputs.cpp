// A study's description and its output files (see sweep.h): the plan line printed before the
// runs, the setting and seeds lines, and results.json, summary.md and the plot written from
// results.csv after them. Split from sweep.cpp, which runs the sweep.
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <set>
#include <type_traits>

#include "experiments/harness/results.h"
#include "experiments/harness/seed_summary.h"
#include "experiments/harness/sweep.h"

namespace minidl::harness {

namespace {

template <typename T>
std::string joined(const std::set<T>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += sep;
    if constexpr (std::is_same_v<T, std::string>) s += x;
    else s += std::to_string(x);
  }
  return s;
}

}  // namespace

std::string study_plan(const Study& st, const std::set<std::string>& done) {
  std::set<std::string> models, optimizers;
  std::set<int64_t> batches, epochs;
  int left = 0;
  for (const auto& r : st.runs) {
    models.insert(r.config.model);
    optimizers.insert(r.config.optimizer);
    batches.insert(r.config.effective_batch());
    epochs.insert(r.config.epochs);
    left += done.count(r.id) ? 0 : 1;
  }
  std::string s = "plan: " + st.name + (st.quick ? " --quick" : "") + ": " + std::to_string(st.runs.size()) +
                  " runs (" + std::to_string(st.runs.size() - static_cast<size_t>(left)) + " already done, " +
                  std::to_string(left) + " to run); model " + joined(models, ",") + ", optimizer " +
                  joined(optimizers, ",") + ", batch " + joined(batches, ",") + ", epochs " + joined(epochs, ",") + "; " +
                  run_setting(st, st.runs.empty() ? "cpu" : st.runs.front().config.device);
  if (std::any_of(st.runs.begin(), st.runs.end(), [](const SweepRun& r) { return r.find_max_batch; }))
    s += "; each run searches its maximum batch first";
  return s + "; the ETA follows from the first finished run";
}

std::string run_setting(const Study& st, const std::string& device_kind) {
  std::set<int64_t> sizes, epochs;
  std::string data = "synthetic";
  for (const auto& r : st.runs) {
    sizes.insert(r.config.resolved_image_size());
    epochs.insert(r.config.epochs);
    data = r.config.data;
  }
  std::string s = data == "synthetic" ? std::string("synthetic images") : "photos in " + data;
  s += ", " + joined(sizes, "/") + " px, " + joined(epochs, "/") + (epochs.size() == 1 && *epochs.begin() == 1 ? " epoch" : " epochs");
  return s + ", " + device_kind;
}

std::string data_and_seeds(const Study& st) {
  std::set<std::string> difficulty;
  std::set<uint64_t> seeds;
  for (const auto& r : st.runs) {
    seeds.insert(r.config.seed);
    if (r.config.data == "synthetic") difficulty.insert(fmt(r.config.synthetic_difficulty, 2));
  }
  const std::string d = difficulty.empty() ? "" : "synthetic difficulty " + joined(difficulty, "/") + ", ";
  return d + std::to_string(seeds.size()) + (seeds.size() == 1 ? " seed" : " seeds");
}

std::string steps_mode(const Study& st, const std::map<std::string, nlohmann::json>& runs) {
  size_t graphed = 0, fell_back = 0;
  for (const auto& r : st.runs) {
    graphed += r.config.resolved_cuda_graphs() ? 1 : 0;
    const auto it = runs.find(r.id);
    if (it != runs.end() && it->second.contains("result") && it->second["result"].value("graph_fallbacks", 0) > 0)
      ++fell_back;
  }
  if (graphed == 0) return "eager";
  std::string how = "replayed from CUDA graphs after an eager warm-up (partial batches and windows eagerly)";
  if (graphed < st.runs.size())
    how += " in " + std::to_string(graphed) + " of " + std::to_string(st.runs.size()) + " runs, eager in the others";
  if (fell_back > 0)
    how += "; in " + std::to_string(fell_back) + (fell_back == 1 ? " run" : " runs") +
           " a batch shape's capture did not fit and its steps ran eagerly (results.json: "
           "graph_fallbacks)";
  return how;
}

std::string accuracy_cell(const std::string& value, int64_t n) {
  if (value.empty()) return "-";
  double v = 0;
  try {
    v = std::stod(value);
  } catch (const std::exception&) {
    return value;
  }
  return at_chance(v, n) ? value + " (chance)" : value;
}

namespace {

// Images per part (train, val, test) of a run's split, when it is given as counts per class.
std::array<int64_t, 3> evaluated_images(const TrainConfig& c) {
  try {
    const SplitSpec s = parse_split(c.split);
    if (!s.counts) return {0, 0, 0};
    return {2 * static_cast<int64_t>(s.parts[0]), 2 * static_cast<int64_t>(s.parts[1]),
            2 * static_cast<int64_t>(s.parts[2])};
  } catch (const std::exception&) {
    return {0, 0, 0};
  }
}

}  // namespace

std::string write_study_outputs(const Study& st, const std::filesystem::path& out) {
  const CsvTable t = read_csv(out / "results.csv");
  // results.json: provenance, the study, and every run's full record (latest record per id).
  std::map<std::string, nlohmann::json> runs;
  std::string device = "unknown";
  {
    std::ifstream f(out / "runs.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      try {
        auto j = nlohmann::json::parse(line);
        runs[j.value("id", "")] = j;
      } catch (const std::exception&) {
        // a torn last line of a killed sweep
      }
    }
  }
  const TrainConfig& base = st.runs.empty() ? TrainConfig{} : st.runs.front().config;
  try {
    device = device_description(resolve_device(base.device));
  } catch (const std::exception&) {
  }
  nlohmann::json j = provenance(device);
  j["program"] = "minidl-sweep";
  j["study"] = st.name;
  j["title"] = st.title;
  j["quick"] = st.quick;
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& run : st.runs)
    if (runs.count(run.id)) arr.push_back(runs[run.id]);
  j["runs"] = arr;
  write_file_atomic(out / "results.json", j.dump(2) + "\n");

  // Study-specific outputs, or the plot: one series per group, x = (effective) batch size.
  const std::string extra_md = st.extra_outputs ? st.extra_outputs(st, t, runs, out) : "";
  const std::string device_kind = device.rfind("cuda", 0) == 0 ? device.substr(0, device.find(' ')) : "cpu";
  const std::string setting = run_setting(st, device_kind);
  PlotSpec plot;
  // Short enough for the plot's width; summary.md has the study's full title.
  plot.title = st.name + ": " + setting + (st.quick ? ", a scaled-down check" : "");
  plot.xlabel = st.name == "techniques" ? "technique (row order)" : "batch size";
  plot.ylabel = st.plot_ylabel;
  plot.logx = st.name != "techniques";
  std::map<std::string, size_t> series;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const std::string y = t.get(i, st.plot_y);
    if (y.empty()) continue;
    const std::string g = t.get(i, "group");
    if (!series.count(g)) series[g] = plot.series.size(), plot.series.push_back({g, {}, {}, 0});
    const double x = st.name == "techniques" ? static_cast<double>(plot.series[series[g]].points.size() + 1)
                                             : std::stod(t.get(i, "effective_batch"));
    plot.series[series[g]].points.emplace_back(x, std::stod(y));
  }
  for (auto& s : plot.series) std::sort(s.points.begin(), s.points.end());
  const std::vector<SeedCell> cells = st.seeds > 1 ? seed_cells(st, t) : std::vector<SeedCell>{};
  if (st.seeds > 1) plot.series = seed_series(cells), plot.ylabel += " (mean and sd over seeds)";
  if ((st.plot_y == "best_val_acc" || st.plot_y == "test_acc") && !st.runs.empty()) {
    // The same band summary.md's "(chance)" marks: two standard errors of 50% for the images evaluated.
    const int64_t n = evaluated_images(st.runs.front().config)[st.plot_y == "test_acc" ? 2 : 1];
    plot.chance_band = chance_band(n);
  }
  const std::string png = st.name + ".png";
  const std::string note = st.extra_outputs ? "" : plot_png(plot, out / png);

  // summary.md
  std::vector<Row> rows;
  for (const auto& run : st.runs) {
    for (size_t i = 0; i < t.rows.size(); ++i) {
      if (t.get(i, "run_id") != run.id) continue;
      Row r;
      const auto n = evaluated_images(run.config);
      for (const auto& col : st.summary_columns) {
        const std::string v = t.get(i, col);
        if (col == "test_acc") r.push_back(accuracy_cell(v, n[2]));
        else if (col == "best_val_acc") r.push_back(accuracy_cell(v, n[1]));
        else r.push_back(v.empty() ? "-" : v);
      }
      rows.push_back(r);
    }
  }
  std::string md = "# " + st.title + (st.quick ? " (quick)" : "") + "\n\n";
  md += "- study: `" + st.name + "`" + (st.quick ? " with `--quick`" : "") + "\n";
  md += "- commit: " + j["commit"].get<std::string>() + "\n- device: " + device + "\n- date: " +
        j["date"].get<std::string>() + "\n";
  md += "- runs: " + std::to_string(rows.size()) + " of " + std::to_string(st.runs.size()) + "\n";
  md += "- what ran: " + setting + "; " + data_and_seeds(st) + "\n";
  md += "- steps: " + steps_mode(st, runs) + "\n";
  if (!st.published_setup.empty()) {
    const bool synthetic = !st.runs.empty() && st.runs.front().config.data == "synthetic";
    md += "- setting: " +
          (st.quick ? "**a scaled-down check, not a reproduction** (--quick); published: " + st.published_setup
           : synthetic ? "the published sizes and epochs, but on synthetic images, not the photos; published: " +
                             st.published_setup
                       : "the published one (" + st.published_setup + ")") +
          "\n";
  }
  md += "- `-`: no value (no validation or test split, or a run that stopped); `(chance)`: within two standard "
        "errors of 50% for the images evaluated\n\n";
  if (st.seeds > 1) {
    md += seed_means_markdown(st, cells, st.runs.empty() ? 0 : evaluated_images(st.runs.front().config)[2]);
    md += "Every run:\n\n";
  }
  md += markdown_table(st.summary_columns, rows) + "\n";
  if (st.extra_outputs) md += extra_md;
  else md += note.empty() ? "![" + st.plot_ylabel + "](" + png + ")\n\n" : "No plot: " + note + "\n\n";
  md += (st.quick && !st.published_setup.empty() ? "**This table is a scaled-down check, not a reproduction.** " : "") + st.notes +
        "\n";
  write_file_atomic(out / "summary.md", md);
  return note;
}


}  // namespace minidl::harness
