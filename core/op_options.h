// The option structs that op front-ends (core/ops.h) and kernel contracts (core/backend.h) share:
// convolution and pooling windows, and the hyper-parameters of the fused optimizer steps. They sit
// apart so a header that needs one struct does not pull in every op's declaration.
#pragma once
#include <array>
#include <cstdint>

namespace minidl {

// ---- Convolution and pooling (NCHW) ----
struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};   // 0: equal to kernel (PyTorch's default)
  std::array<int64_t, 2> padding{0, 0};
  bool ceil_mode = false;
  bool count_include_pad = true;         // avg_pool2d only
};

// ---- Fused optimizer steps (Backend::fused_sgd_step / fused_adam_step) ----
// The formulas are optim/sgd.h's and optim/adam.h's.
struct SgdHyper {
  double lr, weight_decay, momentum, dampening;
  bool nesterov, maximize;
  // A one-element f32 device flag (GradScaler's found_inf in its device state): nonzero, the
  // kernel changes nothing (the skipped step decided on the device, no host sync). nullptr: none.
  const float* skip_if = nullptr;
  // The optimizer's device state (CUDA graphs): the learning rate is read from this one f64 on the
  // device when the kernel runs, not taken from `lr`, so a replay uses the rate written before it
  // and a schedule never needs a new capture. nullptr: `lr`.
  const double* lr_device = nullptr;
};
struct AdamHyper {
  double lr, weight_decay, beta1, beta2, eps;
  bool amsgrad, maximize, decoupled;   // decoupled: AdamW
  const float* skip_if = nullptr;      // as SgdHyper's
  // Keras' epsilon: added to sqrt(v) before the bias correction, i.e. eps / sqrt(1 - beta2^t)
  // after it (optim/adam.h).
  bool keras_eps = false;
  const double* lr_device = nullptr;   // as SgdHyper's
  // The device state's step counts: a host array of one device i64 per parameter (parallel to
  // params), each the parameter's count before this step. The kernel advances it unless skip_if is
  // set, and computes the bias corrections from it on the device; `steps` is then not read.
  // nullptr: the counts are `steps`, kept by the host.
  int64_t* const* step_device = nullptr;
};

}  // namespace minidl
