// Results writers shared by the programs: CSV tables that can be appended one finished run at a
// time without ever leaving a torn file (what makes sweeps resumable), the results JSON with the
// configuration, commit id, device and date, Markdown summaries, and gnuplot plots.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "train/run.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

using Row = std::vector<std::string>;

struct CsvTable {
  Row header;
  std::vector<Row> rows;
  // The value of `column` in row i ("" when the column does not exist).
  std::string get(size_t i, const std::string& column) const;
};

std::string csv_escape(const std::string& field);
std::string csv_line(const Row& row);            // with the trailing newline
// Reads a CSV written by these functions. A last line without its newline (a write cut short by
// a kill) and lines with the wrong number of fields are dropped.
CsvTable read_csv(const std::filesystem::path& file);

// Creates the folder if needed, then minidl::write_file_atomic (core/atomic_file.h): a temporary
// file beside `file`, fsynced and renamed over it, so `file` is the old or the new content, never
// a mix. Throws minidl::Error naming the file and the reason (full disk, read-only folder).
void write_file_atomic(const std::filesystem::path& file, const std::string& content);
// Appends one row: a new file gets the header first; an existing file must have the same header
// (else throws; an older file whose columns are a prefix is upgraded). The whole table is written
// again atomically, so a failed append leaves every earlier row as it was.
void append_csv_row(const std::filesystem::path& file, const Row& header, const Row& row);
// Throws UsageError ("<flag> <file>: cannot create ...: Read-only file system") unless `file`
// could be written now (its folder created if needed, a temporary file made and removed): what a
// program checks before it trains, not after hours of training.
void check_writable(const std::string& flag, const std::filesystem::path& file);
// Appends one line (runs.jsonl) the same way, dropping a torn last line an older writer left.
void append_line(const std::filesystem::path& file, const std::string& line);

// Replaces the row(s) whose `key` column equals the new row's (appends when there is none), keeping
// every other row as it was, and rewrites the file atomically; an older file's columns are upgraded
// as by append_csv_row. What minidl-sweep --retry-failed does with a failed run's row.
void replace_csv_row(const std::filesystem::path& file, const Row& header, const std::string& key, const Row& row);

std::string markdown_table(const Row& header, const std::vector<Row>& rows);

// Formats a double for tables: fixed `digits` decimals; NaN as "" (missing).
std::string fmt(double v, int digits = 4);

// Where an accuracy of two balanced classes is at chance: within chance_band(n) of 50%, two binomial
// standard errors for `n` evaluated images (n <= 0: 5 points). One rule for summary.md's "(chance)",
// the plots' shaded band and minidl-train's last line.
double chance_band(int64_t n);
bool at_chance(double acc, int64_t n);

// Commit id of the source tree (git, or the id captured at configure time), the date (UTC, ISO
// 8601) and the host: the provenance every results.json carries.
nlohmann::json provenance(const std::string& device_name);

nlohmann::json to_json(const TrainConfig& c);
nlohmann::json to_json(const RunResult& r);

// Per-epoch metrics as CSV (metrics.csv of minidl-train --out).
std::string epochs_csv(const std::vector<EpochMetrics>& epochs);
// metrics.csv of a resumed run: the rows of `existing` (an earlier session's metrics.csv; may be
// missing) for epochs before first_epoch, then `epochs`. An epoch split across sessions keeps only
// the later session's row (its images column says how much of the epoch it covers), so resuming
// twice from the same file gives the same table.
std::string resumed_epochs_csv(const std::filesystem::path& existing, const std::vector<EpochMetrics>& epochs,
                               int64_t first_epoch);

// One line per series: points (x, y) of a plot. With `errors` (one per point, the same order) the
// line gets error bars of +-error. A series with `line_of` > 0 is a set of points without a line
// (published values) in the colour of the line series number line_of (1-based, counting lines).
struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;
  std::vector<double> errors;
  int line_of = 0;
};
struct PlotSpec {
  std::string title, xlabel, ylabel;
  bool logx = true;
  std::vector<Series> series;
  // An accuracy plot's chance band: the half-width around 50% (two binomial standard errors for
  // the images evaluated) is shaded, and the points inside it are circled, so results at chance
  // do not read as trends. 0: no band.
  double chance_band = 0.0;
};
// Writes the data as <png>.dat (its first line, "# plot: plottitle=...; xlab=...", holds the
// settings; errbars=1, nlines and pointcolors when a series has error bars or is a point set) and
// renders the PNG with gnuplot (tools/plot_results.gnuplot). Returns "" on success,
// else why there is no plot; without gnuplot (the GPU machines) the .dat is still written, so the
// plot can be drawn elsewhere (the script's header says how).
std::string plot_png(const PlotSpec& spec, const std::filesystem::path& png);

}  // namespace minidl::harness
