// The usable-image bookkeeping of data_account.h: the checks before a folder run starts and after
// each pass over the data, with one message style for both.
#include "train/data_account.h"

#include <algorithm>

#include "train/config.h"
#include "train/data_source.h"

namespace minidl::train {
namespace {

std::string plural(int64_t n, const std::string& word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// "cat 3, dog 0"
std::string named_counts(const std::vector<std::string>& classes, const std::vector<int64_t>& n) {
  std::string s;
  for (size_t c = 0; c < n.size(); ++c) s += (c ? ", " : "") + classes[c] + " " + std::to_string(n[c]);
  return s;
}

// "(usable / files: cat 0 / 20, dog 20 / 20; 20 unreadable files skipped)"
std::string usable_note(const DataAccount& a) {
  return "(usable / files: " + a.counts() + "; " + plural(a.skipped(), "unreadable file") + " skipped)";
}

constexpr const char* kPartNames[] = {"training", "validation", "test"};

std::vector<const std::vector<int64_t>*> parts_of(const DataAccount& a) {
  return {&a.parts.train, &a.parts.val, &a.parts.test};
}

}  // namespace

int64_t DataAccount::skipped() const {
  int64_t n = upfront;
  for (const uint8_t f : late) n += f;
  return n;
}

std::string DataAccount::counts() const {
  std::string s;
  for (size_t c = 0; c < classes.size(); ++c)
    s += (c ? ", " : "") + classes[c] + " " + std::to_string(usable[c]) + " / " + std::to_string(files[c]);
  return s;
}

std::vector<int64_t> class_counts(const data::Dataset& d, const std::vector<int64_t>* idx) {
  std::vector<int64_t> n(d.class_names().size(), 0);
  const int64_t count = idx ? static_cast<int64_t>(idx->size()) : d.size();
  for (int64_t k = 0; k < count; ++k) ++n[static_cast<size_t>(d.label(idx ? (*idx)[static_cast<size_t>(k)] : k))];
  return n;
}

void check_classes(const DataAccount& a, bool with_parts) {
  const std::string folder = "--data '" + a.what + "': ";
  if (a.classes.size() < 2)
    throw UsageError(folder + std::to_string(a.classes.size()) + " class (" + named_counts(a.classes, a.files) +
                     "); training needs at least two classes (a folder per class, or a Kaggle / PetImages layout)");
  for (size_t c = 0; c < a.classes.size(); ++c)
    if (a.usable[c] == 0)
      throw UsageError(folder + "class '" + a.classes[c] + "' has no usable images " + usable_note(a) +
                       "; training needs readable images of every class");
  if (!with_parts) return;
  const auto parts = parts_of(a);
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p]->empty()) continue;   // a part the split does not ask for
    const std::vector<int64_t> n = class_counts(*a.dataset, parts[p]);
    for (size_t c = 0; c < n.size(); ++c)
      if (n[c] == 0)
        throw UsageError("--split " + a.split + " leaves class '" + a.classes[c] + "' without " + kPartNames[p] +
                         " images in '" + a.what + "' (" + kPartNames[p] + " part: " + named_counts(a.classes, n) +
                         "; usable / files: " + a.counts() + ")");
  }
}

int64_t settle_late_skips(DataAccount& a, const std::vector<const BatchSource*>& sources, distributed::ProcessGroup* group) {
  const auto n = static_cast<int64_t>(a.late.size());
  Tensor found = zeros({n}, {.dtype = DType::u8});
  uint8_t* f = found.data<uint8_t>();
  for (const BatchSource* s : sources)
    if (s)
      for (const int64_t i : s->skipped_samples()) f[i] = 1;
  if (group && n > 0) group->allreduce(found, distributed::ReduceOp::Max);
  bool changed = false;
  for (int64_t i = 0; i < n; ++i) {
    if (f[i] == 0 || a.late[static_cast<size_t>(i)] != 0) continue;
    a.late[static_cast<size_t>(i)] = 1;
    --a.usable[static_cast<size_t>(a.dataset->label(i))];
    changed = true;
  }
  if (!changed) return a.skipped();
  const auto parts = parts_of(a);
  for (size_t p = 0; p < parts.size(); ++p) {
    std::vector<int64_t> planned(a.classes.size(), 0), lost(a.classes.size(), 0);
    for (const int64_t i : *parts[p]) {
      const auto c = static_cast<size_t>(a.dataset->label(i));
      ++planned[c];
      lost[c] += a.late[static_cast<size_t>(i)];
    }
    for (size_t c = 0; c < planned.size(); ++c)
      if (planned[c] > 0 && lost[c] == planned[c])
        throw UsageError("--data '" + a.what + "': class '" + a.classes[c] + "' has no usable " + kPartNames[p] +
                         " images left: all " + std::to_string(planned[c]) + " were unreadable when loaded " +
                         usable_note(a) + "; run with --validate-data to find such files before training");
  }
  return a.skipped();
}

}  // namespace minidl::train
