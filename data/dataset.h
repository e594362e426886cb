// The dataset and loader API shared by the data layer and the experiment harness: a
// Dataset maps an index to a decoded 8-bit image and a label; a Loader turns a
// Dataset into shuffled, transformed, batched tensors on worker threads. Declared first so both
// sides can be built against the same contract; data/*.cpp implement it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minidl::data {

struct SampleCheck;

// An 8-bit RGB image, rows of interleaved channels (HWC). pixels.size() == height * width * 3.
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t label(int64_t i) const = 0;                  // in [0, class_names().size())
  virtual const std::vector<std::string>& class_names() const = 0;
  // The decoded sample i, or nullopt when it cannot be read or decoded (the dataset reports each
  // bad file once, by path). Thread-safe: loader workers call it concurrently.
  virtual std::optional<Image> load(int64_t i) const = 0;
  virtual std::string describe(int64_t i) const = 0;           // a path, or "synthetic #i"
  // A stable name for manifests: the path relative to the dataset's root (so a manifest works on
  // another machine), or describe(i) where there is no root.
  virtual std::string key(int64_t i) const { return describe(i); }
  // Decodes sample i without reporting it: whether it is readable, why not, and any conversion
  // (grayscale, CMYK, a PNG named .jpg). The default only knows what load() returns.
  virtual SampleCheck check(int64_t i) const;
  // A quick look at sample i without decoding its pixels (a file's header: format, dimensions):
  // what the experiment programs do to every file before they count and split (docs/data.md). The
  // default, for datasets with nothing to look at (the synthetic set), says ok.
  virtual SampleCheck probe(int64_t i) const;
};

struct SampleCheck {
  bool ok = false;
  std::string problem;   // why it is unreadable (ok == false)
  std::string note;      // a conversion it needed (ok == true), or ""
};

// A folder in any supported layout (one folder per class; Kaggle flat train/ with cat.N.jpg and
// dog.N.jpg; Microsoft PetImages/Cat|Dog), detected automatically. Throws minidl::Error naming
// the folder and the layouts tried when none matches or it holds no images.
std::shared_ptr<Dataset> open_image_folder(const std::filesystem::path& root);
// The layout open_image_folder detected ("class folders", "Kaggle flat", "PetImages"), or "" for
// another kind of dataset.
std::string layout_of(const Dataset& d);

// The built-in two-class synthetic set (data/synthetic.h) as 8-bit images, generated in memory.
std::shared_ptr<Dataset> synthetic_dataset(int64_t n, int64_t image_size, uint64_t seed,
                                           double difficulty = 0.6);

// A view of `base` restricted to `indices` (in that order).
std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);

// Stratified, seeded splits: indices into the dataset for each part.
struct Split {
  std::vector<int64_t> train, val, test;
};
// Counts per class (the Keras study: 600 / 200 / 200). Throws when a class has too few samples.
Split split_by_counts(const Dataset& d, int64_t train_per_class, int64_t val_per_class, int64_t test_per_class,
                      uint64_t seed);
// Fractions of each class (train + val + test <= 1).
Split split_by_fractions(const Dataset& d, double train, double val, double test, uint64_t seed);
// The manifest: one line per sample with its part, label and describe() string, so a run can be
// reproduced exactly. read_manifest checks it against the dataset and throws on a mismatch.
void write_manifest(const std::filesystem::path& file, const Dataset& d, const Split& s);
Split read_manifest(const std::filesystem::path& file, const Dataset& d);
// The same from a stream; `file` only names it in messages (what fuzz/config_fuzz.cpp drives).
Split read_manifest(std::istream& in, const std::filesystem::path& file, const Dataset& d);

// Scan::Decode decodes every sample (check(), --validate-data); Scan::Header only reads each file's
// header (probe(), what every folder run does first): it finds empty, non-image and random-bytes
// files and absurd sizes, not a corrupt or truncated JPEG body.
enum class Scan { Header, Decode };

// The up-front scan behind the experiment programs' --validate-data: decodes every sample on
// `threads` threads and lists the unreadable ones (which every loader skips) and the converted ones.
struct ValidationReport {
  struct Entry {
    int64_t index = 0;
    std::string what;   // describe(index): the path
    std::string why;    // the problem or the conversion
  };
  int64_t samples = 0;
  int64_t readable = 0;
  std::vector<std::string> class_names;
  std::vector<int64_t> readable_per_class;
  std::vector<Entry> unreadable;  // in index order
  std::vector<Entry> converted;   // in index order
  int threads = 1;
  double seconds = 0;
  Scan scan = Scan::Decode;
  // A printable report: totals per class, then each unreadable and converted file (at most
  // max_listed of each, then a count of the rest).
  std::string text(size_t max_listed = 50) const;
};
ValidationReport validate_dataset(const Dataset& d, int threads = 2, Scan scan = Scan::Decode);

}  // namespace minidl::data
