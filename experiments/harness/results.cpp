// CSV, JSON, Markdown and plot writers (see results.h). Every write, an appended row included, goes
// through the atomic writer (core/atomic_file.h), so a killed sweep loses at most the run in
// progress and a full disk never tears a table.
#include "experiments/harness/results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "minidl_build_commit.h"

namespace minidl::harness {
namespace {

std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') cur += '"', ++i;
      else if (ch == '"') quoted = false;
      else cur += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

std::string CsvTable::get(size_t i, const std::string& column) const {
  for (size_t c = 0; c < header.size(); ++c)
    if (header[c] == column) return c < rows.at(i).size() ? rows[i][c] : "";
  return "";
}

std::string csv_escape(const std::string& f) {
  if (f.find_first_of(",\"\n") == std::string::npos) return f;
  std::string out = "\"";
  for (char ch : f) out += ch == '"' ? std::string("\"\"") : std::string(1, ch == '\n' ? ' ' : ch);
  return out + "\"";
}

std::string csv_line(const Row& row) {
  std::string s;
  for (size_t i = 0; i < row.size(); ++i) s += (i ? "," : "") + csv_escape(row[i]);
  return s + "\n";
}

CsvTable read_csv(const std::filesystem::path& file) {
  CsvTable t;
  std::ifstream f(file, std::ios::binary);
  if (!f) return t;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string all = ss.str();
  size_t pos = 0;
  bool first = true;
  while (pos < all.size()) {
    const size_t nl = all.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line
    // A file saved by a spreadsheet or Python's csv module ends its lines with CRLF.
    const size_t end = nl > pos && all[nl - 1] == '\r' ? nl - 1 : nl;
    const std::string line = all.substr(pos, end - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    Row r = split_csv_line(line);
    if (first) {
      t.header = std::move(r);
      first = false;
    } else if (r.size() == t.header.size()) {
      t.rows.push_back(std::move(r));
    }
  }
  return t;
}

void write_file_atomic(const std::filesystem::path& file, const std::string& content) {
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) MINIDL_FAIL("cannot create the folder '", file.parent_path().string(), "' for ", file.filename().string(),
                      ": ", ec.message());
  minidl::write_file_atomic(file, content);
}

void check_writable(const std::string& flag, const std::filesystem::path& file) {
  try {
    std::error_code ec;
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
    if (ec) MINIDL_FAIL("cannot create the folder '", file.parent_path().string(), "': ", ec.message());
    const AtomicFile probe(file);   // removed again: nothing is written
  } catch (const Error& e) {
    throw UsageError(flag + " " + file.string() + ": " + e.what() + "; give a path in a writable folder");
  }
}

namespace {
// Why a file's columns are not ours, for the errors below: the first column that differs.
std::string other_columns(const std::filesystem::path& file, const Row& have, const Row& want) {
  size_t i = 0;
  while (i < have.size() && i < want.size() && have[i] == want[i]) ++i;
  const auto name = [](const Row& r, size_t k) { return k < r.size() ? "'" + r[k] + "'" : std::string("nothing"); };
  return file.string() + " has other columns than this minidl writes (column " + std::to_string(i + 1) + " is " +
         name(have, i) + " where it writes " + name(want, i) + "); move it away or use another --out";
}
}  // namespace

bool upgrade_columns(CsvTable& t, const Row& header) {
  if (t.header == header) return true;
  if (t.header.size() >= header.size() || !std::equal(t.header.begin(), t.header.end(), header.begin())) return false;
  for (Row& r : t.rows) r.resize(header.size());
  t.header = header;
  return true;
}

std::string csv_text(const CsvTable& t) {
  std::string s = csv_line(t.header);
  for (const Row& r : t.rows) s += csv_line(r);
  return s;
}

void append_csv_row(const std::filesystem::path& file, const Row& header, const Row& row) {
  MINIDL_CHECK(header.size() == row.size(), "results: a row of ", row.size(), " fields for a header of ",
               header.size(), " in ", file.string());
  if (!std::filesystem::exists(file)) {
    write_file_atomic(file, csv_line(header) + csv_line(row));
    return;
  }
  CsvTable existing = read_csv(file);
  if (existing.header != header) {
    // A file from an older minidl, whose columns are a prefix of today's: rewritten (atomically)
    // with the new columns empty in its rows, so a resumed sweep keeps what it had.
    const Row have = existing.header;
    MINIDL_CHECK(upgrade_columns(existing, header), "results: ", other_columns(file, have, header));
  }
  // The whole file rewritten through the atomic writer: a kill or a full disk in the middle leaves
  // the rows already there as they were (read_csv has dropped a torn line an older minidl left).
  write_file_atomic(file, csv_text(existing) + csv_line(row));
}

void append_line(const std::filesystem::path& file, const std::string& line) {
  std::string all;
  if (std::ifstream f{file, std::ios::binary}) all.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  if (!all.empty() && all.back() != '\n') all.erase(all.find_last_of('\n') + 1);   // npos + 1 == 0
  write_file_atomic(file, all + line + "\n");
}

void replace_csv_row(const std::filesystem::path& file, const Row& header, const std::string& key, const Row& row) {
  MINIDL_CHECK(header.size() == row.size(), "results: a row of ", row.size(), " fields for a header of ",
               header.size(), " in ", file.string());
  CsvTable t = read_csv(file);
  if (t.header.empty()) t.header = header;
  const Row have = t.header;
  MINIDL_CHECK(upgrade_columns(t, header), "results: ", other_columns(file, have, header));
  const auto col = static_cast<size_t>(std::find(header.begin(), header.end(), key) - header.begin());
  MINIDL_CHECK(col < header.size(), "results: replace_csv_row: no column '", key, "'");
  bool placed = false;
  std::vector<Row> rows;
  for (Row& r : t.rows) {
    if (r[col] != row[col]) rows.push_back(std::move(r));
    else if (!placed) rows.push_back(row), placed = true;
  }
  if (!placed) rows.push_back(row);
  t.rows = std::move(rows);
  write_file_atomic(file, csv_text(t));
}

std::string markdown_table(const Row& header, const std::vector<Row>& rows) {
  std::string s = "|";
  for (const auto& h : header) s += " " + h + " |";
  s += "\n|";
  for (size_t i = 0; i < header.size(); ++i) s += " --- |";
  s += "\n";
  for (const auto& r : rows) {
    s += "|";
    for (const auto& f : r) s += " " + f + " |";
    s += "\n";
  }
  return s;
}

std::string fmt(double v, int digits) {
  if (!std::isfinite(v)) return std::isnan(v) ? "" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

double chance_band(int64_t n) { return n > 0 ? 2.0 * std::sqrt(0.25 / static_cast<double>(n)) : 0.05; }

bool at_chance(double acc, int64_t n) { return std::isfinite(acc) && std::fabs(acc - 0.5) <= chance_band(n); }

nlohmann::json provenance(const std::string& device_name) {
  nlohmann::json j;
  // The commit the program was built from (and whether tracked files outside lab/ differed from it
  // then), not the one the source tree is at when it runs: staged binaries run beside a copy of a
  // tree that may have moved on.
  j["commit"] = std::string(MINIDL_BUILD_COMMIT) + (MINIDL_BUILD_DIRTY ? " (built with uncommitted changes)" : "");
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["date"] = date;
  j["device"] = device_name;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  j["host"] = host;
  return j;
}

nlohmann::json to_json(const TrainConfig& c) {
  return {{"model", c.model},
          {"image_size", c.resolved_image_size()},
          {"conv_bn_chain", c.conv_bn_chain},
          {"data", c.data},
          {"split", c.split},
          {"augment", c.augment},
          {"normalize", c.normalize},
          {"validate_data", c.validate_data},
          {"batch_size", c.batch_size},
          {"accumulation_steps", c.accumulation_steps},
          {"world_size", c.world_size},
          {"effective_batch", c.effective_batch()},
          {"batch_schedule", c.batch_schedule},
          {"batch_schedule_lr", c.batch_schedule_lr},
          {"optimizer", c.optimizer},
          {"lr", c.resolved_lr()},
          {"momentum", c.momentum},
          {"eps", c.eps},
          {"eps_mode", c.eps_mode},
          {"weight_decay", c.resolved_weight_decay()},
          {"lr_scaling", c.lr_scaling},
          {"base_batch", c.base_batch},
          {"warmup_steps", c.warmup_steps},
          {"warmup_epochs", c.warmup_epochs},
          {"schedule", c.schedule},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"max_grad_norm", c.max_grad_norm},
          {"amp", c.amp},
          {"amp_dtype", c.amp ? c.amp_dtype : ""},
          {"amp_init_scale", c.amp_init_scale},
          {"amp_growth_interval", c.amp_growth_interval},
          {"checkpoint", c.checkpoint},
          {"cudnn_benchmark", c.cudnn_benchmark},
          {"channels_last", c.resolved_channels_last()},
          {"cuda_graphs", c.resolved_cuda_graphs()},
          {"gpu", c.gpu},
          {"memory_budget", c.memory_budget},
          {"expandable_segments", c.expandable_segments},
          {"device", c.device},
          {"seed", c.seed},
          {"synthetic_difficulty", c.synthetic_difficulty}};
}

nlohmann::json to_json(const RunResult& r) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const auto& e : r.epochs) {
    epochs.push_back({{"epoch", e.epoch},
                      {"steps", e.steps},
                      {"lr", e.lr},
                      {"train_loss", num(e.train_loss)},
                      {"train_acc", num(e.train_acc)},
                      {"val_loss", num(e.val_loss)},
                      {"val_acc", num(e.val_acc)},
                      {"train_seconds", e.train_seconds},
                      {"images_per_second", e.images_per_second},
                      {"images_per_second_steady", num(e.images_per_second_steady)},
                      {"data_wait_fraction", e.data_wait_fraction},
                      {"device_wait_fraction", e.device_wait_fraction},
                      {"cpu_utilization", e.cpu_utilization},
                      {"gpu_busy", num(e.gpu_busy)},
                      {"gpu_busy_source", e.gpu_busy_source},
                      {"peak_allocated_bytes", e.peak_allocated},
                      {"peak_reserved_bytes", e.peak_reserved},
                      {"images", e.images},
                      {"batch_size", e.batch_size},
                      {"accumulation_steps", e.accumulation_steps}});
  }
  return {{"status", r.status},
          {"note", r.note},
          {"skipped_files", r.skipped_files},
          {"split", r.split},   // the split in force: config.split, or the default's fallback to fractions
          {"steps", r.steps},
          {"parameters", r.parameters},
          {"lr", r.lr},
          {"warmup_steps", r.warmup_steps},
          {"best_val_acc", num(r.best_val_acc)},
          {"best_epoch", r.best_epoch > 0 ? nlohmann::json(r.best_epoch) : nlohmann::json()},
          {"test_acc", num(r.test_acc)},
          {"test_loss", num(r.test_loss)},
          {"first_epoch", r.first_epoch},
          {"time_to_target_seconds", r.time_to_target >= 0 ? nlohmann::json(r.time_to_target) : nlohmann::json()},
          {"total_seconds", r.total_seconds},
          {"train_seconds", r.train_seconds},
          {"images_per_second", r.epochs.empty() ? nlohmann::json() : nlohmann::json(r.mean_images_per_second())},
          {"images_per_second_steady", num(r.steady_images_per_second())},
          {"peak_allocated_bytes", r.peak_allocated},
          {"peak_reserved_bytes", r.peak_reserved},
          {"graph_replays", r.graph_replays},       // CUDA graphs: micro-batches replayed
          {"graph_fallbacks", r.graph_fallbacks},   // batch shapes whose capture did not fit: eager
          {"conv_stats", {{"fused_forward", r.conv_stats.fused_forward},   // --conv-bn-chain's calls
                          {"composed_forward", r.conv_stats.composed_forward},
                          {"fused_backward", r.conv_stats.fused_backward},
                          {"composed_backward", r.conv_stats.composed_backward}}},
          {"data", r.data_description},
          {"epochs", epochs}};
}

std::string epochs_csv(const std::vector<EpochMetrics>& epochs) {
  std::string s = csv_line({"epoch", "steps", "lr", "train_loss", "train_acc", "val_loss", "val_acc", "train_seconds",
                            "images_per_second", "data_wait_pct", "cpu_util_pct", "gpu_busy_pct", "gpu_busy_source",
                            "peak_allocated_bytes", "peak_reserved_bytes", "images_per_second_steady",
                            "batch_size", "accumulation_steps"});
  for (const auto& e : epochs) {
    s += csv_line({std::to_string(e.epoch), std::to_string(e.steps), fmt(e.lr, 6), fmt(e.train_loss), fmt(e.train_acc),
                   fmt(e.val_loss), fmt(e.val_acc), fmt(e.train_seconds, 3), fmt(e.images_per_second, 1),
                   fmt(100 * e.data_wait_fraction, 1), fmt(100 * e.cpu_utilization, 1), fmt(100 * e.gpu_busy, 1),
                   e.gpu_busy_source, std::to_string(e.peak_allocated), std::to_string(e.peak_reserved),
                   fmt(e.images_per_second_steady, 1), std::to_string(e.batch_size),
                   std::to_string(e.accumulation_steps)});
  }
  return s;
}

std::string resumed_epochs_csv(const std::filesystem::path& existing, const std::vector<EpochMetrics>& epochs,
                               int64_t first_epoch) {
  const std::string fresh = epochs_csv(epochs);
  if (!std::filesystem::exists(existing)) return fresh;
  CsvTable old = read_csv(existing);
  const std::string header = fresh.substr(0, fresh.find('\n') + 1);
  const Row have = old.header, want = split_csv_line(header.substr(0, header.size() - 1));
  MINIDL_CHECK(upgrade_columns(old, want), "the resumed run's metrics.csv: ", other_columns(existing, have, want));
  std::string s = header;
  for (size_t i = 0; i < old.rows.size(); ++i) {
    int64_t epoch = 0;
    try {
      epoch = std::stoll(old.get(i, "epoch"));
    } catch (const std::exception&) {
      continue;  // a damaged row: dropped, as read_csv drops torn lines
    }
    if (epoch < first_epoch) s += csv_line(old.rows[i]);
  }
  return s + fresh.substr(header.size());
}

std::string plot_png(const PlotSpec& spec, const std::filesystem::path& png) {
  auto quote = [](std::string s) {
    for (char& ch : s) if (ch == '\'' || ch == '"') ch = ' ';
    return "'" + s + "'";
  };
  std::string settings = "plottitle=" + quote(spec.title) + "; xlab=" + quote(spec.xlabel) +
                         "; ylab=" + quote(spec.ylabel) + "; logx=" + (spec.logx ? "1" : "0");
  // Error bars or point sets: lines first (x y err), then the point sets (x y), with the colour of
  // the line each belongs to in pointcolors.
  const bool marked = std::any_of(spec.series.begin(), spec.series.end(),
                                  [](const Series& s) { return !s.errors.empty() || s.line_of > 0; });
  std::vector<const Series*> order;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& s : spec.series)
      if (!s.points.empty() && (s.line_of > 0) == (pass == 1)) order.push_back(&s);
  if (marked) {
    int lines = 0;
    std::string colors;
    for (const Series* s : order) {
      if (s->line_of == 0) ++lines;
      else colors += (colors.empty() ? "" : " ") + std::to_string(s->line_of);
    }
    settings += "; errbars=1; nlines=" + std::to_string(lines) + "; pointcolors=" + quote(colors);
  }
  // The lines' points at chance, as one more block, last, that the script circles over the lines.
  Series at_chance{"at chance (50% +- " + fmt(100.0 * spec.chance_band, 1) + " points)", {}, {}, 0};
  if (spec.chance_band > 0) {
    for (const Series* s : order)
      if (s->line_of == 0)
        for (const auto& p : s->points)
          if (std::fabs(p.second - 0.5) <= spec.chance_band) at_chance.points.push_back(p);
    settings += "; band_lo=" + fmt(0.5 - spec.chance_band, 6) + "; band_hi=" + fmt(0.5 + spec.chance_band, 6) +
                "; chance_block=" + (at_chance.points.empty() ? "0" : "1");
  }
  if (!at_chance.points.empty()) order.push_back(&at_chance);
  // The data first, whether or not gnuplot is here: a GPU machine has none, and the plot is then
  // drawn on another machine from the .dat alone (gnuplot skips the "#" line).
  std::string dat = "# plot: " + settings + "\n";
  int blocks = 0;
  for (const Series* s : order) {
    if (blocks++) dat += "\n\n";
    std::string title = s->title;
    for (char& ch : title) if (ch == '"') ch = '\'';
    dat += "\"" + title + "\" \"y\"" + (marked ? " \"error\"" : "") + "\n";
    for (size_t i = 0; i < s->points.size(); ++i) {
      dat += fmt(s->points[i].first, 6) + " " + fmt(s->points[i].second, 6);
      if (marked) dat += " " + fmt(i < s->errors.size() ? s->errors[i] : 0.0, 6);
      dat += "\n";
    }
  }
  if (blocks == 0) return "nothing to plot";
  const std::filesystem::path datfile = png.string() + ".dat";
  write_file_atomic(datfile, dat);
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0)
    return "gnuplot is not installed (apt-get install gnuplot-nox); the data is in " + datfile.filename().string() +
           " (tools/plot_results.gnuplot says how to draw it)";
  std::string script = std::getenv("MINIDL_PLOT_SCRIPT") ? std::getenv("MINIDL_PLOT_SCRIPT") : "";
  if (script.empty()) {
    for (const char* p : {MINIDL_HARNESS_SOURCE_DIR "/tools/plot_results.gnuplot",
                          MINIDL_HARNESS_INSTALL_SHARE "/plot_results.gnuplot"}) {
      if (std::filesystem::exists(p)) {
        script = p;
        break;
      }
    }
  }
  if (script.empty()) return "plot_results.gnuplot not found (set MINIDL_PLOT_SCRIPT)";
  const std::string cmd = "gnuplot -e \"datafile=" + quote(datfile.string()) + "; outfile=" + quote(png.string()) +
                          "; " + settings + "\" '" + script + "' 2>&1";
  const std::string out = run_command(cmd);
  if (!std::filesystem::exists(png)) return "gnuplot failed: " + out;
  return "";
}

}  // namespace minidl::harness
