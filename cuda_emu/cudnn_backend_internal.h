// The emulated cuDNN's backend (graph) API: the objects behind cudnnBackendDescriptor_t, shared by
// cudnn_backend_emu.cpp (create, set and get attributes, finalize, the call log) and
// cudnn_backend_graph.cpp (what finalizing a tensor, a convolution, an operation graph, the
// heuristics, an engine and a plan checks and derives, and cudnnBackendExecute). cudnn-frontend
// drives exactly these calls, so with them the backend's convolution plans run on the emulator.
#pragma once
#include <cudnn.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu/cudnn_algos.h"

namespace minidl::cuda::emu::detail {

struct BackendDesc;
struct FusedGraph;   // cudnn_backend_fused.h
struct GraphOp;

// One attribute as set: its type, element count and bytes; descriptor-valued attributes keep
// snapshots of the descriptors they were given (cuDNN copies them: the caller may destroy its own).
struct BackendAttr {
  cudnnBackendAttributeType_t type = CUDNN_TYPE_INT64;
  int64_t count = 0;
  std::vector<unsigned char> bytes;
  std::vector<std::shared_ptr<const BackendDesc>> descs;
};

// The one convolution of an operation graph, as the legacy structs the reference runs on.
struct ConvGraph {
  Dir dir = Dir::Fwd;
  cudnnTensorStruct x, y;   // x-shaped (x or dx), y-shaped (y or dy)
  cudnnFilterStruct w;      // w or dw
  cudnnConvolutionStruct conv;
  int64_t uid_x = 0, uid_w = 0, uid_y = 0;
  int64_t align_x = 0, align_w = 0, align_y = 0;   // CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT
  double alpha = 1.0, beta = 0.0;
  std::string unsupported;   // why no engine runs it (a layout the references cannot load), "" if one does
  // A graph of several operations that matched a fused pattern (the fields above then unused).
  std::shared_ptr<const FusedGraph> fused;
  // A Problem over this graph's structs under an engine's math (tensor cores or FMA).
  Problem problem(bool tensor_cores) const;
};

// A descriptor's state. Descriptors are values: setting a descriptor-valued attribute copies it,
// getting one copies into the caller's descriptor.
struct BackendDesc {
  cudnnBackendDescriptorType_t type = CUDNN_BACKEND_POINTWISE_DESCRIPTOR;
  bool finalized = false;
  std::map<int, BackendAttr> attrs;
  // Derived at finalize: operation graphs, heuristics, engines, engine configs and plans carry the
  // graph; engines, configs and plans their engine; plans the workspace; heuristics their results.
  std::shared_ptr<const ConvGraph> graph;
  std::shared_ptr<const GraphOp> op;   // operations: what a fused graph runs
  int64_t engine = -1;
  size_t workspace = 0;
  std::vector<int64_t> results;
};

// The object a cudnnBackendDescriptor_t points at (tracked by the registry like the legacy ones).
struct BackendObject {
  BackendDesc d;
};

const char* descriptor_type_name(cudnnBackendDescriptorType_t t);
size_t attribute_type_size(cudnnBackendAttributeType_t t);

// A set attribute, or nullptr.
const BackendAttr* find_attr(const BackendDesc& d, cudnnBackendAttributeName_t name);

// Reading set attributes, shared by the finalize and execute code.
inline constexpr const char* kFinalize = "cudnnBackendFinalize";

inline std::vector<int64_t> ints(const BackendAttr* a) {
  std::vector<int64_t> v(a == nullptr ? 0 : static_cast<size_t>(a->count));
  if (!v.empty()) std::memcpy(v.data(), a->bytes.data(), v.size() * sizeof(int64_t));
  return v;
}
template <class T>
T scalar(const BackendAttr* a, T fallback) {
  if (a == nullptr || a->count < 1) return fallback;
  T v{};
  std::memcpy(&v, a->bytes.data(), sizeof v);
  return v;
}
// A scale (alpha, beta) set as FLOAT or DOUBLE.
inline double scale_of(const BackendAttr* a, double fallback) {
  if (a == nullptr || a->count < 1) return fallback;
  return a->type == CUDNN_TYPE_DOUBLE ? scalar<double>(a, fallback) : scalar<float>(a, 0.0f);
}
inline const BackendDesc* desc_of(const BackendAttr* a) { return a == nullptr || a->descs.empty() ? nullptr : a->descs[0].get(); }

inline cudnnStatus_t missing(const BackendDesc& d, const char* attr) {
  return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": ", descriptor_type_name(d.type), " descriptor: ", attr,
                                          " is not set"));
}
#define MINIDL_EMU_REQUIRE(d, name) \
  if (find_attr(d, name) == nullptr) return missing(d, #name)

// Finalizes d after the generic checks (cudnn_backend_graph.cpp): the type-specific rules; the
// engine-side descriptors (heuristics, engines, configs, plans, variant packs) go on to
// finalize_engine_desc (cudnn_backend_engines.cpp).
cudnnStatus_t finalize_desc(BackendDesc& d);
cudnnStatus_t finalize_engine_desc(BackendDesc& d);
// The attributes a finalized descriptor derives rather than stores (heuristic results, notes,
// workspace size, ...): true when `name` is one, with the answer in `out`.
bool derived_attr(const BackendDesc& d, cudnnBackendAttributeName_t name, BackendAttr& out);

// Engines of a graph: each algorithm of the direction (cudnn_algos.cpp's table) with FMA math
// (index < algo_count) and with tensor cores (index algo_count + algo).
int64_t engine_count(const ConvGraph& g);
// SUCCESS, or the status and rule for which the engine does not run g; `info` its workspace etc.
cudnnStatus_t engine_support(const ConvGraph& g, int64_t engine, AlgoInfo& info);

cudnnStatus_t execute_plan(cudnnHandle_t h, const BackendDesc& plan, const BackendDesc& pack);
// The pointer a variant pack binds to `uid`; found false when none.
void* bound(const BackendDesc& pack, int64_t uid, bool& found);
// The variant pack's workspace: given when the plan needs one (BAD_PARAM_NULL_POINTER), inside one
// live allocation (EXECUTION_FAILED, a fault).
cudnnStatus_t plan_workspace(const char* fn, const BackendDesc& plan, const BackendDesc& pack, void*& ws);

// The call log behind emu_libs.h's cudnn_backend_calls.
void log_backend_call(const char* fn, const BackendDesc* d);

}  // namespace minidl::cuda::emu::detail
