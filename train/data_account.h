// What became of a folder's files: a run must never report on images it did not have (20 unreadable
// "cats" must not give "test acc 100%"). Usable images are counted per class after the
// unreadable files are dropped, up front and again when the loaders find more while reading, and
// a class or part left without images stops the run (UsageError, exit 2) naming the counts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "distributed/process_group.h"

namespace minidl::train {

class BatchSource;

// A folder run's files per class, how many are usable, and the split of the usable ones.
struct DataAccount {
  std::string what;                              // the folder, as given
  std::string split;                             // --split, for messages
  std::vector<std::string> classes;
  std::vector<int64_t> files;                    // per class: image files found
  std::vector<int64_t> usable;                   // per class: files minus those found unreadable
  int64_t upfront = 0;                           // found unreadable before the split (header or decode scan)
  std::shared_ptr<const data::Dataset> dataset;  // the usable samples, which `parts` index
  data::Split parts;
  std::vector<uint8_t> late;                     // per sample of `dataset`: found unreadable while loading

  int64_t skipped() const;                       // unreadable files, up front and while loading
  std::string counts() const;                    // "cat 0 / 20, dog 20 / 20" (usable / files)
};

// Per-class counts of `idx` (all of d when null).
std::vector<int64_t> class_counts(const data::Dataset& d, const std::vector<int64_t>* idx = nullptr);

// Throws UsageError unless the folder has two classes with files (before the scan: counts of
// files), every class has a usable image, and every part the split asks for has images of every
// class (with parts: after the split).
void check_classes(const DataAccount& a, bool with_parts);

// The samples the loaders found unreadable since the last call (BatchSource::skipped_samples),
// united over the ranks (every rank must call it at the same point; one allreduce), are counted
// out of their class; a class that loses its last usable image of a part throws UsageError as
// check_classes does. Returns skipped().
int64_t settle_late_skips(DataAccount& a, const std::vector<const BatchSource*>& sources, distributed::ProcessGroup* group);

}  // namespace minidl::train
