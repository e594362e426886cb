// The ETA of minidl-train's progress lines. Training time alone under-predicts a run by half (an
// ETA of "2 min 54 s" can run 5 minutes): evaluations (each epoch's validation, the final test)
// come on top, and the first steps pay one-time costs that later steps do not. So the rate is the
// steady one (steps after the session's first, evaluations excluded), and the evaluations still to
// come are added at their measured rate, or before the first one at a third of the training time
// per image (a forward pass of the three a training step makes).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/config.h"

namespace minidl::train {

class RunEta {
 public:
  // total_steps: optimizer steps of the run; val_images / test_images: evaluated per epoch / at
  // the end; epochs: of the run.
  RunEta(int64_t total_steps, int64_t epochs, int64_t val_images, int64_t test_images)
      : total_steps_(total_steps), epochs_(epochs), val_images_(val_images), test_images_(test_images) {}

  // After optimizer step `step`, at `now` seconds (any fixed origin), having trained `images`
  // images in the session so far.
  void stepped(int64_t step, double now, int64_t images);
  // An evaluation of `images` images took `seconds` (kept out of the training rate).
  void evaluated(double seconds, int64_t images);
  // Seconds left after `step`, during epoch `epoch` (its validation still to come); 0 when unknown.
  double seconds_left(int64_t step, int64_t epoch) const;

 private:
  int64_t total_steps_, epochs_, val_images_, test_images_;
  int64_t first_step_ = -1, last_step_ = -1, first_images_ = 0, last_images_ = 0;
  double first_time_ = 0.0, last_time_ = 0.0;
  double eval_seconds_ = 0.0, eval_since_first_ = 0.0;
  int64_t eval_images_ = 0;
};

// The images a run trains and evaluates: epochs x (training + validation images) + test images
// (from --split; fractions of 1000 synthetic images per class when it gives no counts).
double run_work(const TrainConfig& c);

// minidl-sweep's ETA. The mean time of the finished runs times the runs left can say 25 s where
// 73 s remain: the runs differ in work (epochs, split) and in cost per image (augmented
// runs go through the loader, small batches run slower). So each run left costs its work at the
// rate (seconds per image of work) of the finished runs of its group (a plot series: the same
// optimizer, augmentation...), or of all finished runs while its group has none.
template <typename Run>
class SweepEtaOf {
 public:
  void finished(const Run& run, double seconds) {
    const double w = run_work(run.config);
    by_group_[run.group].first += seconds;
    by_group_[run.group].second += w;
    seconds_ += seconds;
    work_ += w;
  }
  // Seconds for `runs` (the one starting now included); 0 before any run finished.
  double seconds_for(const std::vector<const Run*>& runs) const {
    if (work_ <= 0) return 0.0;
    double total = 0.0;
    for (const Run* r : runs) {
      const auto it = by_group_.find(r->group);
      const double rate = it != by_group_.end() && it->second.second > 0 ? it->second.first / it->second.second
                                                                          : seconds_ / work_;
      total += rate * run_work(r->config);
    }
    return total;
  }

 private:
  std::map<std::string, std::pair<double, double>> by_group_;   // seconds, work
  double seconds_ = 0.0, work_ = 0.0;
};

}  // namespace minidl::train
