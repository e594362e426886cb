// What a study run with several seeds (Study::seeds > 1) reports beside each run's row: per group
// and batch, the mean and spread of the plotted accuracy over the seeds, with the published value
// beside it, as a Markdown table and as plot series with error bars. minidl-sweep's summary.md and
// plot use it; a sweep stopped between seeds reports the runs it has.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "experiments/harness/results.h"
#include "experiments/harness/sweep.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

struct SeedCell {
  std::string group;
  int64_t batch = 0;             // effective batch
  int runs = 0;                  // rows in results.csv
  std::vector<double> values;    // plot_y of the rows with status ok
  std::vector<double> val_acc;   // their best_val_acc (where present)
  double images_per_s = 0;       // mean over the ok rows
  std::string statuses;          // "ok", or e.g. "2 ok, 1 diverged"
  std::optional<double> published;
  double mean() const;
  double sd() const;             // sample standard deviation; 0 for fewer than two values
};

// The cells in study order (group as they first appear, then batch), from results.csv.
std::vector<SeedCell> seed_cells(const Study& st, const CsvTable& t);
// The means table (Markdown) and a line saying what mean, sd and the range are.
std::string seed_means_markdown(const Study& st, const std::vector<SeedCell>& cells, int64_t test_images);
// One series per group with a measured point (mean, error bars of +-sd), then one point set per
// such group with published values, coloured as its line.
std::vector<Series> seed_series(const std::vector<SeedCell>& cells);

}  // namespace minidl::harness
