// The whole-run check of minidl-maxbatch's answer, shared by the CPU suite (whole_run_test.cpp) and
// the emulated GPU's (whole_run_cuda_test.cpp): the run minidl-train makes at the answer trains, and
// the run at the answer + 1 runs out of memory. A step on random inputs alone fits a few more
// images than the run, which also holds its data set, prefetched batches and evaluation pass.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "experiments/harness/maxbatch.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness::testing {

// The small CNN on synthetic images of `image_size`, `split` images a class, under `budget`, with
// --workers 0, whose loader holds one batch at a time (the answer + 1 then runs out every time).
inline TrainConfig small_cnn(int64_t image_size, const std::string& split, const std::string& budget) {
  TrainConfig c = tiny_config();
  c.image_size = image_size;
  c.split = split;
  c.memory_budget = budget;
  c.workers = 0;
  return c;
}

// minidl-train with c at `batch`: two optimizer steps of one epoch, then the evaluation passes.
inline RunResult train_at(TrainConfig c, int64_t batch) {
  c.batch_size = batch;
  c.epochs = 1;
  c.max_steps = 2;
  c.quiet = true;
  return run_training(c);
}

// minidl-train with c at `batch` for `epochs` whole epochs. On a GPU the caching allocator places
// each block by every request before it, so the check of an answer is the whole run: its epochs'
// smaller last batches, the evaluation passes, and from the second epoch the partial batch's
// graph (CUDA graphs). On the CPU, whose allocator releases its cache before a request fails, a
// run's memory is its live bytes, and two steps show them.
inline RunResult train_whole(TrainConfig c, int64_t batch, int64_t epochs) {
  c.batch_size = batch;
  c.epochs = epochs;
  c.max_steps = 0;
  c.quiet = true;
  return run_training(c);
}

inline RunResult train_for_the_answer(const TrainConfig& c, int64_t batch) {
  return c.device.rfind("cuda", 0) == 0 ? train_whole(c, batch, 2) : train_at(c, batch);
}

// The answer for c (which must set --memory-budget), checked against two runs (train_for_the_answer):
// at the answer, and at answer + 1 + slack, which runs out of memory (slack > 0 where the trials are known to place
// the run's long-lived tensors more tightly than the run does, and so may answer low).
inline int64_t expect_answer_trains(const TrainConfig& c, int64_t slack = 0) {
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const int64_t answer = rep.finder.max_batch;
  EXPECT_GT(answer, 1) << rep.text;
  EXPECT_FALSE(rep.finder.hit_limit) << rep.text;
  const RunResult fits = train_for_the_answer(c, answer);
  EXPECT_EQ(fits.status, "ok") << "minidl-maxbatch answered " << answer << " but the run there ended '"
                               << fits.status << "': " << fits.note << "\n" << rep.text;
  const RunResult over = train_for_the_answer(c, answer + 1 + slack);
  EXPECT_EQ(over.status, "oom") << "the run at " << answer + 1 + slack << " (" << 1 + slack
                                << " over the answer) fits, peak allocated "
                                << over.peak_allocated << " B: the answer is not the largest batch that trains\n"
                                << rep.text;
  return answer;
}

}  // namespace minidl::harness::testing
