// From a few small steps to the requested shape: every counter of every launch is fitted as a
// polynomial in the batch N and the image side S, c = sum of a_ij N^i S^j over i <= 1, j <= 2
// (activations scale with N S^2, padding borders with N S, per-image work with N, weights with 1
// or, for a dense layer after the convolutions, S^2), exactly through the samples. Launches are
// matched across samples by position and launch site, so the sizes must run the same sequence.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "perfmodel/step.h"

namespace minidl::gpumodel {

struct Fit {
  std::vector<std::string> terms;   // the monomials used, e.g. {"1", "N", "N*S^2", ...}
  std::vector<Work> sites;          // the first sample's work (identity of each launch)
  // coefficients[i][f][t]: work i, field f, term t (in scaled units, see extrapolate.cpp).
  std::vector<std::vector<std::vector<double>>> coefficients;
  double n_scale = 1.0, s_scale = 1.0;
};

// Throws minidl::Error naming the first launch where two samples differ (a different kernel, or
// a different number of launches), and when the samples cannot determine any polynomial.
Fit fit_samples(const std::vector<StepProfile>& samples);
// The step at (batch, image): each launch with its fitted counters (rounded to integers, floored
// at 0) and a library call's shapes rebuilt from its fitted geometry.
StepProfile predict(const Fit& fit, int64_t batch, int64_t image);

// How far a prediction is from a measured step of the same size.
struct FitError {
  double max_relative = 0.0;           // over every (launch, field) with a nonzero measured value
  std::string worst;                   // which: "launch 17 (batch_norm apply / ...): gld sectors 1234 vs 1240"
  int exact_fields = 0, fields = 0;    // how many (launch, field) pairs were predicted exactly
  double dram_bytes_relative = 0.0;    // the whole step's unique DRAM bytes (kernels) and min bytes (libraries)
  double flops_relative = 0.0;         // the whole step's library FLOPs
};
FitError compare(const StepProfile& predicted, const StepProfile& measured);

}  // namespace minidl::gpumodel
