// The emulated cuDNN graph API's fused graphs: the batch-norm fusions of a ResNet (scale-bias-ReLU
// into a convolution with per-channel statistics out, the batch-norm finalize, dgrad with the ReLU's
// and the batch norm's backward, wgrad reading its input through scale-bias-ReLU). Operations are
// finalized into GraphOps (cudnn_backend_fused.cpp, which also recognises the patterns), and a plan
// of a fused graph runs them in dependency order on host reference kernels
// (cudnn_backend_fused_exec.cpp), virtual tensors as temporaries.
#pragma once
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu/cudnn_backend_internal.h"

namespace minidl::cuda::emu::detail {

// One tensor of a graph, as its descriptor set it.
struct GraphTensor {
  int64_t uid = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  int64_t align = 1;
  bool is_virtual = false, by_value = false;
  int64_t count() const;
  // Bytes from the first element to one past the last (the memory a bound pointer must cover).
  size_t span_bytes() const;
  bool same_as(const GraphTensor& o) const;
};
GraphTensor graph_tensor(const BackendDesc& t);
size_t dtype_size(cudnnDataType_t t);

enum class OpKind { ConvFwd, ConvBwdData, ConvBwdFilter, Pointwise, GenStats, BnFinalize, BnBwdWeights, NormFwd, NormBwd };

// A finalized operation: its tensors by the attribute each was set under, which of them it reads
// and writes, and what its kind needs to run.
struct GraphOp {
  OpKind kind = OpKind::Pointwise;
  cudnnBackendDescriptorType_t type = CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR;
  std::map<int, GraphTensor> slot;   // attribute name -> tensor
  std::vector<int> inputs, outputs;  // attribute names
  // Pointwise: mode, alpha1 / alpha2, the ReLU's clips.
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY;
  double alpha1 = 1.0, alpha2 = 1.0, lower_clip = 0.0, upper_clip = std::numeric_limits<double>::max(), slope = 0.0;
  // Convolutions: the geometry and alpha / beta (the single-convolution graph's structs).
  std::shared_ptr<const ConvGraph> conv;
  cudnnBnFinalizeStatsMode_t bn_mode = CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  int64_t uid(int attr) const { return slot.at(attr).uid; }
  bool has(int attr) const { return slot.count(attr) != 0; }
};

// An operation graph of several operations that matched a fused pattern.
struct FusedGraph {
  std::string pattern;                    // the pattern's name, as the guide lists them
  std::vector<GraphOp> ops;               // in dependency order
  std::map<int64_t, GraphTensor> tensors;  // every tensor by unique id
  const GraphOp* conv() const;            // the graph's convolution, or nullptr
  double flops = 0;                       // for the fake autotuning time
  size_t workspace = 0;
};

const char* op_kind_name(OpKind k);

// The operands of a batch norm's running-statistics update (all five set, or none): the factor,
// the previous mean and variance, the updated mean and variance.
using RunningStats = std::array<int, 5>;
inline constexpr RunningStats kBnFinalizeRunningStats{
    CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC,
    CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC};
inline constexpr RunningStats kNormFwdRunningStats{
    CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC, CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC,
    CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC, CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC,
    CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC};

// Finalizes the operation descriptors of the fused graphs (pointwise, gen-stats, bn-finalize,
// bn-bwd-weights, norm forward and backward) and the pointwise descriptor: cuDNN's rules, then d.op
// (left empty for what the emulator does not run: another normalization, its inference phase,
// peer statistics; a graph of them is refused at the heuristics).
cudnnStatus_t finalize_fused_op(BackendDesc& d);
cudnnStatus_t finalize_pointwise_desc(BackendDesc& d);
// The GraphOp of a finalized convolution operation (its graph's structs and tensors).
std::shared_ptr<const GraphOp> conv_graph_op(const BackendDesc& d, std::shared_ptr<const ConvGraph> g);

// An operation graph of several operations (or one that is not a plain convolution): checks the
// graph (one descriptor per unique id, each tensor written once, every virtual tensor written and
// read, no cycle), orders the operations and names the fused pattern. A graph the emulator does
// not run gets g.unsupported starting "graph pattern".
cudnnStatus_t finalize_fused_graph(const BackendAttr& ops, ConvGraph& g);

// cudnnBackendExecute of a plan whose graph is fused.
cudnnStatus_t execute_fused(cudnnHandle_t h, const BackendDesc& plan, const BackendDesc& pack);

}  // namespace minidl::cuda::emu::detail
