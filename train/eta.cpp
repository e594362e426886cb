// The progress lines' ETA (see eta.h).
#include "train/eta.h"

#include <algorithm>
#include <exception>

namespace minidl::train {

void RunEta::stepped(int64_t step, double now, int64_t images) {
  if (first_step_ < 0) {   // the first step of the session carries the warm-up: the rate starts after it
    first_step_ = step;
    first_time_ = now;
    first_images_ = images;
  }
  last_step_ = step;
  last_time_ = now;
  last_images_ = images;
}

void RunEta::evaluated(double seconds, int64_t images) {
  eval_seconds_ += seconds;
  eval_images_ += images;
  if (first_step_ >= 0) eval_since_first_ += seconds;
}

double RunEta::seconds_left(int64_t step, int64_t epoch) const {
  if (first_step_ < 0) return 0.0;
  const int64_t steps = last_step_ - first_step_;
  // With one step so far its time (warm-up included) is the best there is.
  const double train = steps > 0 ? std::max(0.0, last_time_ - first_time_ - eval_since_first_) : last_time_;
  const double per_step = steps > 0 ? train / static_cast<double>(steps) : train;
  const int64_t images = steps > 0 ? last_images_ - first_images_ : last_images_;
  const double per_image_train = images > 0 ? train / static_cast<double>(images) : 0.0;
  const double per_image_eval =
      eval_images_ > 0 ? eval_seconds_ / static_cast<double>(eval_images_) : per_image_train / 3.0;
  const int64_t evals_left = std::max<int64_t>(0, epochs_ - epoch + 1);   // this epoch's validation too
  const double eval_left = per_image_eval * static_cast<double>(evals_left * val_images_ + test_images_);
  return per_step * static_cast<double>(std::max<int64_t>(0, total_steps_ - step)) + eval_left;
}

double run_work(const TrainConfig& c) {
  double parts[3] = {0, 0, 0};
  try {
    const SplitSpec s = parse_split(c.split);
    for (size_t i = 0; i < 3 && i < s.parts.size(); ++i)
      parts[i] = 2.0 * (s.counts ? s.parts[i] : s.parts[i] * static_cast<double>(c.synthetic_size > 0 ? c.synthetic_size : 1000));
  } catch (const std::exception&) {
    parts[0] = 1.0;   // an unreadable split: every run the same work per epoch
  }
  return static_cast<double>(std::max<int64_t>(1, c.epochs)) * (parts[0] + parts[1]) + parts[2];
}

}  // namespace minidl::train
