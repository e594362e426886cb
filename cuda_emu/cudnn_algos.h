// The emulated cuDNN's convolution problem (the checked descriptors of one call) and its fake
// algorithm table: which algorithms a configuration supports, the workspace each needs (a formula
// in the problem size) and a deterministic fake speed. Modelled on cuDNN's documented limits, so
// the backend's heuristic order, Find*Ex path and leaner-algorithm fallback all get exercised.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cuda_emu/call_log.h"
#include "cuda_emu/conv_reference.h"
#include "cuda_emu/cudnn_emu_internal.h"

namespace minidl::cuda::emu::detail {

enum class Dir { Fwd, BwdData, BwdFilter };

struct Problem {
  ConvGeometry g;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  Elem elem = Elem::F32;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;   // the convolution descriptor's, at the call
  const cudnnTensorStruct* x = nullptr;        // the x-shaped tensor (x or dx)
  const cudnnFilterStruct* w = nullptr;        // the filter (w or dw)
  const cudnnTensorStruct* y = nullptr;        // the y-shaped tensor (y or dy)
};

struct AlgoInfo {
  const char* name = "";
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;   // NOT_SUPPORTED_* when the configuration is not supported
  std::string why;                               // the unsupported rule
  size_t workspace = 0;                          // bytes, under the given math type
  double tflops = 1.0;                           // fake speed, for Find*Ex's fake times
  cudnnDeterminism_t determinism = CUDNN_DETERMINISTIC;
};

int algo_count(Dir d);
const char* dir_name(Dir d);
// algo must be in [0, algo_count(d)).
AlgoInfo algo_info(Dir d, int algo, const Problem& p, cudnnMathType_t math);
// The math type an algorithm reports it runs with (perfResults[i].mathType): tensor cores for
// f32 / f16 / bf16 unless the descriptor asks for FMA, as on an H100.
cudnnMathType_t reported_math(const Problem& p, cudnnMathType_t math);
// Whether f32 inputs are rounded to TF32 (f32 data and any math type but FMA).
bool uses_tf32(const Problem& p);
// Every algorithm: the supported ones fastest first, then the unsupported in enum order.
std::vector<int> ranked_algos(Dir d, const Problem& p, cudnnMathType_t math);
// Deterministic fake time in ms: the convolution's flops at the algorithm's fake speed.
float fake_time_ms(const Problem& p, const AlgoInfo& a);

// Checks the handle and the descriptors of one call as cuDNN does (each live and set, one data
// type for all three, a compute type that goes with it, the y-shaped tensor's dims what
// cudnnGetConvolution2dForwardOutputDim gives) and fills p from them.
cudnnStatus_t make_problem(const char* fn, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                           cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, Problem& p);

// Runs direction d of a checked problem on the references (conv_reference.cpp): in_a, in_b are
// (x, w) forward, (dy, w) backward-data, (x, dy) backward-filter; out = alpha * conv + beta * out
// (out not read when beta is 0). Checks the buffers' alignment and ranges and the handle's
// stream first; alpha and beta are double for f64 data and float otherwise, as in cuDNN.
// The computation runs now, or goes into the capture of the handle's stream (a CUDA graph) with the
// descriptors copied; `tail` runs after it each time (logging, scribbling on the workspace).
cudnnStatus_t run_conv(const char* fn, cudnnHandle_t h, Dir d, const Problem& p, const void* alpha, const void* in_a,
                       const void* in_b, const void* beta, void* out,
                       const std::function<void(const Problem&)>& tail = {});

// One executed convolution as the call log keeps it (call_log.h), under the algorithm's or
// engine's name; log_conv logs it.
LibCall conv_call(Dir d, const Problem& p, const char* algo, size_t ws_bytes, bool accumulate, cudaStream_t stream);
void log_conv(Dir d, const Problem& p, const char* algo, size_t ws_bytes, bool accumulate, cudaStream_t stream);

}  // namespace minidl::cuda::emu::detail
