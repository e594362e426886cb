// The one table of CPU-vs-CUDA parity cases, keyed by the Backend interface (core/backend.h and
// its base core/device_services.h), in the manner of ggml's test-backend-ops and supports_op:
// every virtual method has a row naming the parity tests that run it on both backends, or an
// explicit reason why there is nothing to compare. tests/kernels/parity_coverage_test.cpp reads
// the headers' `virtual` declarations and fails on a method without a row, or a row whose tests
// do not exist; a new Backend method therefore cannot land without its parity case.
#pragma once
#include <string_view>
#include <vector>

namespace minidl::testing::parity {

struct ParityCase {
  std::string_view method;   // the virtual's name, as declared
  // "file:Suite.Test" entries (file relative to tests/), separated by spaces; empty when none.
  std::string_view tests;
  // Non-empty: the method has no CPU-vs-CUDA comparison, and this says why (supports_op's "no").
  std::string_view not_compared = {};
};

inline const std::vector<ParityCase>& parity_cases() {
  static const std::vector<ParityCase> table{
      // ---- device services (core/device_services.h) ----
      {"name", "", "a label, nothing to compare"},
      {"allocator", "kernels/backend_parity_cuda_test.cpp:Parity.AllocatorStatsBudgetAndNoDriftAfterOoms"},
      {"synchronize", "", "a barrier with no value of its own; every CUDA case that reads a result runs it"},
      {"pinned_alloc", "kernels/pinned_loader_cuda_test.cpp:PinnedLoader.DeviceBatchesEqualCpuBatches"},
      {"pinned_free", "kernels/pinned_loader_cuda_test.cpp:PinnedLoader.KeptBatchesAreNotOverwritten"},
      {"copy_async", "kernels/pinned_loader_cuda_test.cpp:PinnedLoader.DeviceBatchesEqualCpuBatches"},
      {"make_compute_wait", "kernels/pinned_loader_cuda_test.cpp:PinnedLoader.KeptBatchesAreNotOverwritten"},
      {"host_wait", "kernels/pinned_loader_cuda_test.cpp:PinnedLoader.BatchSizeChangesBetweenEpochs"},
      {"capture_graph", "optim/graph_step_cuda_test.cpp:GraphStep.SmallInputResNetsReplayBitIdenticallyToEager"},
      {"capturing", "optim/graph_step_cuda_test.cpp:GraphStep.AHostReadInsideTheCaptureFailsNamingTheFix"},
      {"draw_library_workspaces",
       "kernels/meta_device_cuda_test.cpp:MetaDeviceCuda.LibraryWorkspacesAreDrawnUpFrontAsOnTheDevice"},
      {"release_library_workspaces",
       "kernels/meta_device_cuda_test.cpp:MetaDeviceCuda.TheAllocatorModeChangesWhenTheLibraryWorkspacesAreAllItHolds"},
      {"replay", "optim/graph_step_cuda_test.cpp:GraphStep.SmallCnnFp32ReplayIsBitIdenticalToEager"},
      {"pool_bytes", "optim/graph_step_cuda_test.cpp:GraphStep.EagerAllocationsAfterTheCaptureDoNotReuseItsPool"},
      {"pool", "experiments/cuda_graphs_cuda_test.cpp:ExperimentsCudaGraphs.AccumulationWindowsReplayTwoGraphsLikeTheEagerRun"},
      {"begin_lending", "experiments/cuda_graphs_cuda_test.cpp:ExperimentsCudaGraphs.AmpAdamAccumulationSkipsWholeWindowsOnTheDevice"},
      {"end_lending", "experiments/cuda_graphs_cuda_test.cpp:ExperimentsCudaGraphs.AnEpochOfOneFullAndOnePartialBatchReplaysBoth"},
      {"interval_timer", "experiments/gpu_monitor_cuda_test.cpp:ExperimentsGpuMonitorCuda.TheCudaBackendTimesIntervalsOfQueuedWork"},
      {"start", "experiments/gpu_monitor_cuda_test.cpp:ExperimentsGpuMonitorCuda.TheCudaBackendTimesIntervalsOfQueuedWork"},
      {"stop", "experiments/gpu_monitor_cuda_test.cpp:ExperimentsGpuMonitorCuda.TheCudaBackendTimesIntervalsOfQueuedWork"},
      {"elapsed_seconds", "", "a time, not a value the CPU has: the CUDA case checks it is finite and >= 0"},
      // ---- op contracts (core/backend.h) ----
      {"copy", "kernels/backend_parity_cuda_test.cpp:Parity.CopiesAndCastsBetweenEveryDtype "
               "kernels/backend_parity_cuda_test.cpp:Parity.StridedCopiesFillsAndLargeTransfers"},
      {"fill", "kernels/backend_parity_cuda_test.cpp:Parity.StridedCopiesFillsAndLargeTransfers"},
      {"unary", "kernels/backend_parity_cuda_test.cpp:Parity.UnaryOpsForwardBackward"},
      {"binary", "kernels/backend_parity_cuda_test.cpp:Parity.BinaryOpsWithBroadcastingForwardBackward "
                 "kernels/backend_parity_cuda_test.cpp:Parity.ComparisonsAndIntegerArithmetic"},
      {"reduce", "kernels/reduce_pool_parity_cuda_test.cpp:Parity.ReductionsOverAnyDims "
                 "kernels/reduce_pool_parity_cuda_test.cpp:Parity.ArgmaxArgminTiesAndNaN "
                 "kernels/reduce_pool_parity_cuda_test.cpp:Parity.ReductionsSplitAcrossBlocksKeepTheirRules"},
      {"matmul", "kernels/backend_parity_cuda_test.cpp:Parity.MatmulLayoutsAndBatches "
                 "kernels/backend_parity_cuda_test.cpp:Parity.MatmulTf32AndHalf"},
      {"random", "kernels/backend_parity_cuda_test.cpp:Parity.RandomDrawsMatchTheCpuStream"},
      {"conv2d_forward", "kernels/backend_parity_cuda_test.cpp:Parity.Conv2dHeuristicAlgorithms"},
      {"conv2d_backward_input", "kernels/backend_parity_cuda_test.cpp:Parity.Conv2dHeuristicAlgorithms"},
      {"conv2d_backward_weight", "kernels/backend_parity_cuda_test.cpp:Parity.Conv2dHeuristicAlgorithms"},
      // The CPU declines (false); the CUDA join's gradient against the CPU's engine-added one.
      {"conv2d_backward_input_add",
       "kernels/channels_last_cuda_test.cpp:Parity.AResidualJoinAddsTheConvolutionsGradientIntoTheShortcuts"},
      {"conv2d_stats_forward", "kernels/conv_stats_cuda_test.cpp:ConvStatsParity.TheChainMatchesTheCpuForwardAndBackward"},
      {"conv2d_stats_backward",
       "kernels/conv_stats_cuda_test.cpp:ConvStatsParity.TheChainMatchesTheCpuForwardAndBackward"},
      // The CPU declines these (false) and composes; the CUDA kernels against that composition.
      {"conv2d_stats_output_grad",
       "kernels/conv_stats_cuda_test.cpp:ConvStatsParity.TheChainMatchesTheCpuForwardAndBackward"},
      {"bn_finalize_forward",
       "kernels/conv_stats_cuda_test.cpp:ConvStatsParity.TheFinalizeMatchesTheCpuCompositionInOneLaunchEachWay"},
      {"bn_finalize_backward",
       "kernels/conv_stats_cuda_test.cpp:ConvStatsParity.TheFinalizeMatchesTheCpuCompositionInOneLaunchEachWay"},
      {"max_pool2d_forward", "kernels/reduce_pool_parity_cuda_test.cpp:Parity.MaxAndAvgPooling"},
      {"max_pool2d_backward",
       "kernels/reduce_pool_parity_cuda_test.cpp:Parity.MaxPoolBackwardOverlappingWindowsIsDeterministic"},
      {"avg_pool2d_forward", "kernels/reduce_pool_parity_cuda_test.cpp:Parity.MaxAndAvgPooling"},
      {"avg_pool2d_backward", "kernels/reduce_pool_parity_cuda_test.cpp:Parity.MaxAndAvgPooling"},
      {"batch_norm_forward_train", "kernels/backend_parity_cuda_test.cpp:Parity.BatchNormTrainEvalAndRunningStats"},
      {"batch_norm_forward_eval", "kernels/backend_parity_cuda_test.cpp:Parity.BatchNormTrainEvalAndRunningStats"},
      {"batch_norm_backward", "kernels/backend_parity_cuda_test.cpp:Parity.BatchNormTrainEvalAndRunningStats"},
      {"batch_norm_act_forward",
       "kernels/batch_norm_act_cuda_test.cpp:BatchNormActParity.FusedMatchesTheCpuAndTheComposedOpsInBothLayouts"},
      {"batch_norm_act_backward",
       "kernels/batch_norm_act_cuda_test.cpp:BatchNormActParity.FusedMatchesTheCpuAndTheComposedOpsInBothLayouts"},
      {"softmax_forward", "kernels/backend_parity_cuda_test.cpp:Parity.SoftmaxLogSoftmaxOverAnyDim"},
      {"softmax_backward", "kernels/backend_parity_cuda_test.cpp:Parity.SoftmaxLogSoftmaxOverAnyDim"},
      {"nll_forward", "kernels/loss_parity_cuda_test.cpp:LossParity.NllLossOverLogSoftmax"},
      {"nll_backward", "kernels/loss_parity_cuda_test.cpp:LossParity.NllLossOverLogSoftmax"},
      {"cross_entropy_forward", "kernels/loss_parity_cuda_test.cpp:LossParity.CrossEntropyOddShapesSmoothingAndReductions"},
      {"cross_entropy_backward", "kernels/loss_parity_cuda_test.cpp:LossParity.CrossEntropyOddShapesSmoothingAndReductions"},
      {"bce_with_logits_forward", "kernels/loss_parity_cuda_test.cpp:LossParity.BceWithLogitsForwardBackward"},
      {"bce_with_logits_backward", "kernels/loss_parity_cuda_test.cpp:LossParity.BceWithLogitsForwardBackward"},
      {"unscale_grads", "kernels/amp_f16_cuda_test.cpp:AmpF16.UnscaleGradsOneLaunchMatchesCpu"},
      {"unscale_grads_device", "optim/graph_step_cuda_test.cpp:GraphStep.SmallCnnAmpWithASkippedStepIsBitIdenticalToEager"},
      {"update_scale_device", "optim/graph_step_cuda_test.cpp:GraphStep.SmallCnnAmpWithASkippedStepIsBitIdenticalToEager"},
      {"fused_sgd_step", "optim/optimizer_fused_cuda_test.cpp:FusedOptim.SgdVariantsMatchCpuOver20Steps"},
      {"fused_adam_step", "optim/optimizer_fused_cuda_test.cpp:FusedOptim.AdamAndAdamWMatchCpuOver20Steps"},
  };
  return table;
}

// The second table: bf16 against f32 on the CPU, one row per op contract of core/backend.h (the
// device services move bytes and have no dtype arithmetic). Same row shape: the tests that run
// the op in bf16, or why nothing is compared; tests/kernels/parity_coverage_test.cpp checks both.
inline const std::vector<ParityCase>& cpu_bf16_cases() {
  static const std::vector<ParityCase> table{
      {"copy", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.CopiesAndCastsToAndFromEveryDtype "
               "core/bfloat16_test.cpp:BFloat16.EveryPatternRoundTripsThroughTensorCopies"},
      {"fill", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.FillsAndFactories"},
      {"unary", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.UnaryOpsRoundOnce"},
      {"binary", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BinaryOpsBroadcastingAndComparisons"},
      {"reduce", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.ReductionsAccumulateInF32"},
      {"matmul", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.MatmulAccumulatesInF32 "
                 "kernels/bf16_gemm_test.cpp:Bf16Gemm.ThePathsGiveTheSameBitsOnEveryShape"},
      {"random", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.RandomDrawsAndDropout"},
      {"conv2d_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.Conv2dForwardAndBackward"},
      {"conv2d_backward_input", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.Conv2dForwardAndBackward"},
      {"conv2d_backward_weight", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.Conv2dForwardAndBackward"},
      {"conv2d_backward_input_add", "",
       "the CPU declines it (false) for every dtype; the engine then adds the gradient of "
       "conv2d_backward_input, whose row this is not"},
      // The CPU declines both (false) for every dtype: the op composes them from the kernels above.
      {"conv2d_stats_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.ConvStatsChainComposedInBf16"},
      {"conv2d_stats_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.ConvStatsChainComposedInBf16"},
      {"conv2d_stats_output_grad", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.ConvStatsChainComposedInBf16"},
      {"bn_finalize_forward", "",
       "its tensors are the statistics' dtype, f32 under bf16 activations: no bf16 arithmetic (and the CPU "
       "declines it: the op composes in f32)"},
      {"bn_finalize_backward", "",
       "its tensors are the statistics' dtype, f32 under bf16 activations: no bf16 arithmetic (and the CPU "
       "declines it: the op composes in f32)"},
      {"max_pool2d_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.PoolingForwardAndBackward"},
      {"max_pool2d_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.PoolingForwardAndBackward"},
      {"avg_pool2d_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.PoolingForwardAndBackward"},
      {"avg_pool2d_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.PoolingForwardAndBackward"},
      {"batch_norm_forward_train", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BatchNormTrainEvalAndBackward"},
      {"batch_norm_forward_eval", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BatchNormTrainEvalAndBackward"},
      {"batch_norm_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BatchNormTrainEvalAndBackward"},
      {"batch_norm_act_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BatchNormReluAndAddReluFused"},
      {"batch_norm_act_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BatchNormReluAndAddReluFused"},
      {"softmax_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.SoftmaxAndLogSoftmaxOverAnyDim"},
      {"softmax_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.SoftmaxAndLogSoftmaxOverAnyDim"},
      {"nll_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.NllLossForwardAndBackward"},
      {"nll_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.NllLossForwardAndBackward"},
      {"cross_entropy_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.CrossEntropyWithSmoothing"},
      {"cross_entropy_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.CrossEntropyWithSmoothing"},
      {"bce_with_logits_forward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BceWithLogitsForwardAndBackward"},
      {"bce_with_logits_backward", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.BceWithLogitsForwardAndBackward"},
      {"unscale_grads", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.UnscaleGradsAndTheNonFiniteFlag"},
      {"unscale_grads_device", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.UnscaleGradsAndTheNonFiniteFlag"},
      {"update_scale_device", "",
       "the scale, growth tracker and flag are f32 and i32 whatever the gradients' dtype"},
      {"fused_sgd_step", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.FusedOptimizerStepsDeclineBf16"},
      {"fused_adam_step", "kernels/cpu_bf16_test.cpp:CpuBf16Parity.FusedOptimizerStepsDeclineBf16"},
  };
  return table;
}

// The third table: bf16 on the CUDA backend against the CPU backend's bf16, one row per op contract
// of core/backend.h, checked like the second (tests/kernels/parity_coverage_test.cpp).
inline const std::vector<ParityCase>& cuda_bf16_cases() {
  static const std::vector<ParityCase> table{
      {"copy", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.CastsToAndFromEveryDtypeBitForBit"},
      {"fill", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.FillsAndRandomDrawsBitForBit"},
      {"unary", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.UnaryAndBinaryOpsComputeInF32AndRoundOnce"},
      {"binary", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.UnaryAndBinaryOpsComputeInF32AndRoundOnce"},
      {"reduce", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.ReductionsAccumulateInF32"},
      {"matmul", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.MatmulOnCublasWithF32Accumulation"},
      {"random", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.FillsAndRandomDrawsBitForBit"},
      {"conv2d_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.Conv2dForwardAndBackwardInBothLayouts"},
      {"conv2d_backward_input", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.Conv2dForwardAndBackwardInBothLayouts"},
      {"conv2d_backward_weight", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.Conv2dForwardAndBackwardInBothLayouts"},
      {"conv2d_backward_input_add",
       "kernels/channels_last_cuda_test.cpp:Parity.AResidualJoinAddsTheConvolutionsGradientIntoTheShortcuts "
       "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.ConvolutionsCarryingBatchNormAndTheResidualJoin"},
      {"conv2d_stats_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.ConvolutionsCarryingBatchNormAndTheResidualJoin"},
      {"conv2d_stats_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.ConvolutionsCarryingBatchNormAndTheResidualJoin"},
      {"conv2d_stats_output_grad", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.ConvolutionsCarryingBatchNormAndTheResidualJoin"},
      {"bn_finalize_forward", "",
       "its tensors are the statistics' dtype, f32 under bf16 activations: no bf16 arithmetic (its f32 parity "
       "row is in the first table)"},
      {"bn_finalize_backward", "",
       "its tensors are the statistics' dtype, f32 under bf16 activations: no bf16 arithmetic (its f32 parity "
       "row is in the first table)"},
      {"max_pool2d_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.MaxAndAvgPooling"},
      {"max_pool2d_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.MaxAndAvgPooling"},
      {"avg_pool2d_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.MaxAndAvgPooling"},
      {"avg_pool2d_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.MaxAndAvgPooling"},
      {"batch_norm_forward_train", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.BatchNormTrainEvalAndFusedActivations"},
      {"batch_norm_forward_eval", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.BatchNormTrainEvalAndFusedActivations"},
      {"batch_norm_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.BatchNormTrainEvalAndFusedActivations"},
      {"batch_norm_act_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.BatchNormTrainEvalAndFusedActivations"},
      {"batch_norm_act_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.BatchNormTrainEvalAndFusedActivations"},
      {"softmax_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"softmax_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"nll_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"nll_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"cross_entropy_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"cross_entropy_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"bce_with_logits_forward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"bce_with_logits_backward", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.SoftmaxAndTheLosses"},
      {"unscale_grads", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.UnscaleGradsAndTheNonFiniteFlag"},
      {"unscale_grads_device", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.UnscaleGradsAndTheNonFiniteFlag"},
      {"update_scale_device", "", "the scale, growth tracker and flag are f32 and i32 whatever the gradients' dtype"},
      {"fused_sgd_step", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.FusedOptimizerStepsDeclineBf16"},
      {"fused_adam_step", "kernels/bf16_parity_cuda_test.cpp:Bf16Parity.FusedOptimizerStepsDeclineBf16"},
  };
  return table;
}

}  // namespace minidl::testing::parity
