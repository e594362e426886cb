// The CPU backend: the reference implementation of every op family (Eigen + OpenMP). Each family's
// methods live in their own file (elementwise.cpp, reduce.cpp, matmul.cpp, random.cpp, conv.cpp,
// pool.cpp, batch_norm.cpp, softmax.cpp, loss.cpp, amp.cpp, optim.cpp; f16 helpers in half.h); this header
// only gathers the declarations.
#pragma once
#include <initializer_list>
#include "core/backend.h"
#include "kernels/common/backend_overrides.h"

namespace minidl::cpu {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Allocator& allocator(int device_index) override;

  // Every kernel of core/backend.h, one file per family (listed above).
  MINIDL_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)
};

CpuBackend& cpu_backend();

// Whether CpuBackend::fused_adam_step takes these tensors (contiguous f32, one shape per
// parameter, on the CPU or the meta device standing for it, no device skip flag): the meta
// backend answers with it so that a dry run's Adam step allocates what the real one does.
bool fused_adam_qualifies(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                          const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                          const AdamHyper& h);

// Whether any defined operand is channels-last (prefers_channels_last): the CPU reference runs
// such calls through contiguous NCHW copies (conv.cpp, pool.cpp, batch_norm.cpp), so the
// channels-last mode is exact against NCHW and the NCHW loops stay as they are.
inline bool any_channels_last(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && prefers_channels_last(*t)) return true;
  return false;
}
// The channels-last path of such a call: run(c) computes into c, a contiguous NCHW tensor of out's
// shape, which is then copied into out (by out's backend: the meta device's dry run of a CPU step
// stages the same tensors, kernels/meta).
template <typename Run>
void in_nchw(const Tensor& out, Run&& run) {
  const Tensor c = empty(out.shape(), out.options());
  run(c);
  backend(out.device()).copy(c, out);
}

}  // namespace minidl::cpu
