// Which cuDNN API the CUDA convolutions go through. The graph API (cudnn-frontend: one operation
// graph and execution plan per shape, a call is a variant pack and an execute) is the default and
// the one maintained; the legacy cudnnConvolution* API stays behind this switch only so that the
// two can be measured against each other (host time per call, step time) on the same build.
// A plain C++ header, so programs and tests can flip it without CUDA headers.
#pragma once

namespace minidl::cuda {

enum class CudnnApi { Graph, Legacy };
// The environment's MINIDL_CUDNN_API=legacy|graph picks the start value (graph when unset).
void set_cudnn_api(CudnnApi api);
CudnnApi cudnn_api();
const char* cudnn_api_name(CudnnApi api);

}  // namespace minidl::cuda
