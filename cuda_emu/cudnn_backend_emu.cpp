// cuDNN stand-ins for the emulated device, the backend (graph) API, part 1: the C entry points
// cudnn-frontend calls (cudnnBackendCreateDescriptor, SetAttribute, GetAttribute, Finalize, Execute,
// DestroyDescriptor, cudnnGetLastErrorString) and the generic rules they check on every descriptor:
// a live object, an attribute that belongs to the descriptor's type and has the type cuDNN gives
// it, no change after finalize, no read before it. What finalizing each type means, the engines
// and the execution are cudnn_backend_graph.cpp's.
#include <algorithm>
#include <deque>
#include <mutex>

#include "cuda_emu/cudnn_backend_fused.h"
#include "cuda_emu/cudnn_backend_internal.h"

namespace minidl::cuda::emu::detail {
namespace {

Registry<BackendObject>& objects() { return registry_of<BackendObject>(); }

std::mutex g_log_mu;
std::deque<std::string>& call_log_entries() {
  static auto* d = new std::deque<std::string>();
  return *d;
}

// The attribute-name block of each descriptor type (cudnn_graph.h numbers them by hundreds);
// types the emulator does not interpret accept any attribute.
bool attr_belongs(cudnnBackendDescriptorType_t t, int a) {
  const auto in = [a](int lo, int hi) { return a >= lo && a < hi; };
  switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return in(0, 100);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return in(100, 200);
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return in(200, 300);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return in(300, 400);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return in(400, 500);
    case CUDNN_BACKEND_INTERMEDIATE_INFO_DESCRIPTOR: return in(500, 600);
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return in(600, 700);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return in(700, 706);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return in(706, 712);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return in(712, 718);
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return in(750, 770);
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: return in(770, 780);
    case CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR: return in(780, 800);
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR: return in(1620, 1640);
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR: return in(2000, 2100);
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR: return in(2100, 2200);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return in(800, 900);
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return in(900, 1000);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return in(1000, 1100);
    case CUDNN_BACKEND_LAYOUT_INFO_DESCRIPTOR: return in(1100, 1200);
    case CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR: return in(1200, 1300);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return in(1300, 1400);
    default: return true;
  }
}

// The type cuDNN gives the attributes the emulator reads; -1 for the others (any type is kept).
int expected_type(int a) {
  switch (a) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
    case CUDNN_ATTR_POINTWISE_MATH_PREC:
    case CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC:
    case CUDNN_ATTR_OPERATION_BN_FINALIZE_MATH_PREC:
    case CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC:
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE: return CUDNN_TYPE_DATA_TYPE;
    case CUDNN_ATTR_POINTWISE_MODE: return CUDNN_TYPE_POINTWISE_MODE;
    case CUDNN_ATTR_OPERATION_GENSTATS_MODE: return CUDNN_TYPE_GENSTATS_MODE;
    case CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE: return CUDNN_TYPE_BN_FINALIZE_STATS_MODE;
    case CUDNN_ATTR_OPERATION_NORM_FWD_MODE:
    case CUDNN_ATTR_OPERATION_NORM_BWD_MODE: return CUDNN_TYPE_NORM_MODE;
    case CUDNN_ATTR_OPERATION_NORM_FWD_PHASE: return CUDNN_TYPE_NORM_FWD_PHASE;
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
    case CUDNN_ATTR_TENSOR_STRIDES:
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
    case CUDNN_ATTR_CONVOLUTION_DILATIONS:
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS:
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS:
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: return CUDNN_TYPE_INT64;
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL:
    case CUDNN_ATTR_TENSOR_IS_BY_VALUE: return CUDNN_TYPE_BOOLEAN;
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE: return CUDNN_TYPE_CONVOLUTION_MODE;
    case CUDNN_ATTR_ENGINEHEUR_MODE: return CUDNN_TYPE_HEUR_MODE;
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE: return CUDNN_TYPE_VOID_PTR;
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE: return CUDNN_TYPE_HANDLE;
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: return CUDNN_TYPE_NUMERICAL_NOTE;
    case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: return CUDNN_TYPE_BEHAVIOR_NOTE;
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: return CUDNN_TYPE_CHAR;
    case CUDNN_ATTR_OPERATIONGRAPH_OPS:
    case CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH:
    case CUDNN_ATTR_ENGINEHEUR_RESULTS:
    case CUDNN_ATTR_ENGINECFG_ENGINE:
    case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES:
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC:
    case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR:
    case CUDNN_ATTR_OPERATION_POINTWISE_XDESC:
    case CUDNN_ATTR_OPERATION_POINTWISE_BDESC:
    case CUDNN_ATTR_OPERATION_POINTWISE_YDESC:
    case CUDNN_ATTR_OPERATION_POINTWISE_DXDESC:
    case CUDNN_ATTR_OPERATION_POINTWISE_DYDESC:
    case CUDNN_ATTR_OPERATION_GENSTATS_XDESC:
    case CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC:
    case CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC: return CUDNN_TYPE_BACKEND_DESCRIPTOR;
    default:   // the batch-norm operations' tensors
      return (a >= CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC && a <= CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC) ||
                     (a >= CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC && a <= CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS) ||
                     (a >= CUDNN_ATTR_OPERATION_NORM_FWD_XDESC && a <= CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS) ||
                     (a >= CUDNN_ATTR_OPERATION_NORM_BWD_XDESC && a <= CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS)
                 ? CUDNN_TYPE_BACKEND_DESCRIPTOR
                 : -1;
  }
}

// Alpha and beta are FLOAT or DOUBLE (the data type's scale type).
bool is_scale(int a) {
  return a == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA || a == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA ||
         a == CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA || a == CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA ||
         a == CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA || a == CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA ||
         a == CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1 || a == CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2 ||
         a == CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP || a == CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP ||
         a == CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE;
}

cudnnStatus_t live(const char* fn, const void* d, BackendObject*& out) {
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": the descriptor is NULL"));
  const ObjState s = objects().state(d);
  if (s != ObjState::Live) return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": descriptor ", d, " is ", state_word(s)));
  out = static_cast<BackendObject*>(const_cast<void*>(d));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_attr_type(const char* fn, const BackendDesc& d, int a, cudnnBackendAttributeType_t t) {
  if (!attr_belongs(d.type, a))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": attribute ", a, " is not an attribute of a ",
                                            descriptor_type_name(d.type), " descriptor"));
  const int want = expected_type(a);
  const bool ok = is_scale(a) ? (t == CUDNN_TYPE_FLOAT || t == CUDNN_TYPE_DOUBLE) : (want < 0 || t == want);
  if (!ok)
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, cat(fn, ": attribute ", a, " of a ", descriptor_type_name(d.type),
                                                           " descriptor has type ", want, ", not ", static_cast<int>(t)));
  return CUDNN_STATUS_SUCCESS;
}

// Copies the caller's descriptors (each live and finalized) into snapshots.
cudnnStatus_t snapshot_descs(const char* fn, int a, int64_t n, const void* elems, BackendAttr& out) {
  const auto* ds = static_cast<const cudnnBackendDescriptor_t*>(elems);
  for (int64_t i = 0; i < n; ++i) {
    BackendObject* o = nullptr;
    if (cudnnStatus_t st = live(fn, ds[i], o); st != CUDNN_STATUS_SUCCESS) return st;
    if (!o->d.finalized)
      return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, cat(fn, ": element ", i, " of attribute ", a, " (a ",
                                                            descriptor_type_name(o->d.type),
                                                            " descriptor) is not finalized"));
    out.descs.push_back(std::make_shared<const BackendDesc>(o->d));
  }
  return CUDNN_STATUS_SUCCESS;
}

// Hands an attribute's elements to GetAttribute's caller; descriptors are copied into the caller's
// own (live, of the same type).
cudnnStatus_t hand_out(const char* fn, const BackendAttr& a, int name, int64_t requested, int64_t* count,
                       void* elems) {
  const int64_t n = elems == nullptr ? a.count : std::min(requested, a.count);
  if (count != nullptr) *count = n;
  if (elems == nullptr) return CUDNN_STATUS_SUCCESS;
  if (a.type != CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    std::memcpy(elems, a.bytes.data(), static_cast<size_t>(n) * attribute_type_size(a.type));
    return CUDNN_STATUS_SUCCESS;
  }
  auto* ds = static_cast<cudnnBackendDescriptor_t*>(elems);
  for (int64_t i = 0; i < n; ++i) {
    BackendObject* o = nullptr;
    if (cudnnStatus_t st = live(fn, ds[i], o); st != CUDNN_STATUS_SUCCESS) return st;
    const BackendDesc& src = *a.descs[static_cast<size_t>(i)];
    if (o->d.type != src.type)
      return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                  cat(fn, ": element ", i, " of attribute ", name, " must be a ", descriptor_type_name(src.type),
                      " descriptor, not a ", descriptor_type_name(o->d.type), " one"));
    o->d = src;
  }
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

const BackendAttr* find_attr(const BackendDesc& d, cudnnBackendAttributeName_t name) {
  auto it = d.attrs.find(static_cast<int>(name));
  return it == d.attrs.end() ? nullptr : &it->second;
}

size_t attribute_type_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT: return sizeof(float);
    case CUDNN_TYPE_DOUBLE: return sizeof(double);
    case CUDNN_TYPE_VOID_PTR: return sizeof(void*);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_FRACTION: return sizeof(cudnnFraction_t);
    case CUDNN_TYPE_INT32: return sizeof(int32_t);
    default: return sizeof(int);   // the enums
  }
}

const char* descriptor_type_name(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return "POINTWISE";
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return "CONVOLUTION";
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return "ENGINE";
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return "ENGINECFG";
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return "ENGINEHEUR";
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return "EXECUTION_PLAN";
    case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return "KNOB_CHOICE";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: return "OPERATION_CONVOLUTION_FORWARD";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_DATA";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return "OPERATION_CONVOLUTION_BACKWARD_FILTER";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return "OPERATION_POINTWISE";
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: return "OPERATION_GEN_STATS";
    case CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR: return "OPERATION_BN_FINALIZE_STATISTICS";
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR: return "OPERATION_BN_BWD_WEIGHTS";
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR: return "OPERATION_NORM_FORWARD";
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR: return "OPERATION_NORM_BACKWARD";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "OPERATION_MATMUL";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: return "OPERATION_REDUCTION";
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return "OPERATIONGRAPH";
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return "VARIANT_PACK";
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return "TENSOR";
    default: return "other";
  }
}

void log_backend_call(const char* fn, const BackendDesc* d) {
  constexpr size_t kKept = 1 << 16;   // the latest calls of a long run
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::deque<std::string>& log = call_log_entries();
  log.push_back(d == nullptr ? std::string(fn) : cat(fn, "(", descriptor_type_name(d->type), ")"));
  if (log.size() > kKept) log.pop_front();
}

int cudnn_backend_live_descriptors() { return objects().live_count(); }

}  // namespace minidl::cuda::emu::detail

namespace minidl::cuda::emu {
std::vector<std::string> cudnn_backend_calls() {
  std::lock_guard<std::mutex> lock(detail::g_log_mu);
  return {detail::call_log_entries().begin(), detail::call_log_entries().end()};
}
void clear_cudnn_backend_calls() {
  std::lock_guard<std::mutex> lock(detail::g_log_mu);
  detail::call_log_entries().clear();
}
long long cudnn_autotune_trial() {
  ++detail::cudnn_query_count();
  return detail::next_cudnn_find_call();
}
float cudnn_plan_time_ms(const void* plan, long long trial) {
  const auto* o = static_cast<const detail::BackendObject*>(plan);
  if (detail::registry_of<detail::BackendObject>().state(plan) != detail::ObjState::Live || o->d.graph == nullptr ||
      o->d.type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    return 0.0f;
  const detail::ConvGraph& g = *o->d.graph;
  if (g.fused != nullptr)   // the fused engine at 100 fake TFLOP/s
    return static_cast<float>(g.fused->flops / 1e11) + detail::cudnn_find_delay(trial, 0);
  const int n = detail::algo_count(g.dir);
  const detail::Problem p = g.problem(o->d.engine >= n);
  const auto algo = static_cast<int>(o->d.engine % n);
  return detail::fake_time_ms(p, detail::algo_info(g.dir, algo, p, p.math)) + detail::cudnn_find_delay(trial, algo);
}
}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu::detail;   // NOLINT: the C entry points below are outside our namespace

extern "C" {

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t* descriptor) {
  const char* fn = "cudnnBackendCreateDescriptor";
  if (descriptor == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": the output pointer is NULL"));
  const int t = raw_enum(descriptorType);
  if (t < 0 || t > CUDNN_BACKEND_OPERATION_EXPAND_BAND_MATRIX_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": descriptorType ", t, " is not a cudnnBackendDescriptorType_t"));
  BackendObject* o = objects().create();
  o->d.type = descriptorType;
  *descriptor = o;
  log_backend_call(fn, &o->d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  const char* fn = "cudnnBackendDestroyDescriptor";
  BackendObject* o = nullptr;
  if (cudnnStatus_t st = live(fn, descriptor, o); st != CUDNN_STATUS_SUCCESS) return st;
  log_backend_call(fn, &o->d);
  o->d = BackendDesc{};   // drop the snapshots now; the registry keeps the address as a tombstone
  objects().destroy(o);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                       const void* arrayOfElements) {
  const char* fn = "cudnnBackendSetAttribute";
  BackendObject* o = nullptr;
  if (cudnnStatus_t st = live(fn, descriptor, o); st != CUDNN_STATUS_SUCCESS) return st;
  log_backend_call(fn, &o->d);
  const int a = raw_enum(attributeName);
  if (o->d.finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the ", descriptor_type_name(o->d.type),
                                            " descriptor is finalized; attribute ", a, " cannot change"));
  if (cudnnStatus_t st = check_attr_type(fn, o->d, a, attributeType); st != CUDNN_STATUS_SUCCESS) return st;
  if (elementCount < 0) return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": elementCount = ", elementCount, " < 0"));
  if (elementCount > 0 && arrayOfElements == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": arrayOfElements is NULL for ", elementCount,
                                                         " elements of attribute ", a));
  BackendAttr attr;
  attr.type = attributeType;
  attr.count = elementCount;
  if (attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    if (cudnnStatus_t st = snapshot_descs(fn, a, elementCount, arrayOfElements, attr); st != CUDNN_STATUS_SUCCESS)
      return st;
  } else {
    const auto* p = static_cast<const unsigned char*>(arrayOfElements);
    attr.bytes.assign(p, p + static_cast<size_t>(elementCount) * attribute_type_size(attributeType));
  }
  o->d.attrs[a] = std::move(attr);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType, int64_t requestedElementCount,
                                       int64_t* elementCount, void* arrayOfElements) {
  const char* fn = "cudnnBackendGetAttribute";
  BackendObject* o = nullptr;
  if (cudnnStatus_t st = live(fn, descriptor, o); st != CUDNN_STATUS_SUCCESS) return st;
  log_backend_call(fn, &o->d);
  const int a = raw_enum(attributeName);
  if (!o->d.finalized)
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, cat(fn, ": the ", descriptor_type_name(o->d.type),
                                                          " descriptor is not finalized"));
  if (cudnnStatus_t st = check_attr_type(fn, o->d, a, attributeType); st != CUDNN_STATUS_SUCCESS) return st;
  if (requestedElementCount < 0 || (arrayOfElements == nullptr && elementCount == nullptr))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": requestedElementCount = ", requestedElementCount,
                                            " with ", arrayOfElements == nullptr ? "no" : "an", " output array"));
  BackendAttr derived;
  const BackendAttr* attr = derived_attr(o->d, attributeName, derived) ? &derived : find_attr(o->d, attributeName);
  if (attr == nullptr) {   // never set: no elements
    if (elementCount != nullptr) *elementCount = 0;
    return CUDNN_STATUS_SUCCESS;
  }
  if (attr->type != attributeType && !(is_scale(a) && attr->count > 0))
    return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, cat(fn, ": attribute ", a, " was set as type ",
                                                           static_cast<int>(attr->type), ", read as ",
                                                           static_cast<int>(attributeType)));
  return hand_out(fn, *attr, a, requestedElementCount, elementCount, arrayOfElements);
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  const char* fn = "cudnnBackendFinalize";
  BackendObject* o = nullptr;
  if (cudnnStatus_t st = live(fn, descriptor, o); st != CUDNN_STATUS_SUCCESS) return st;
  log_backend_call(fn, &o->d);
  if (o->d.finalized)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the ", descriptor_type_name(o->d.type),
                                            " descriptor is finalized already"));
  if (cudnnStatus_t st = finalize_desc(o->d); st != CUDNN_STATUS_SUCCESS) return st;
  o->d.finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
  const char* fn = "cudnnBackendExecute";
  if (cudnnStatus_t st = check_handle(fn, handle); st != CUDNN_STATUS_SUCCESS) return st;
  BackendObject *plan = nullptr, *pack = nullptr;
  if (cudnnStatus_t st = live(fn, executionPlan, plan); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = live(fn, variantPack, pack); st != CUDNN_STATUS_SUCCESS) return st;
  log_backend_call(fn, &plan->d);
  if (plan->d.type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || pack->d.type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                cat(fn, ": executionPlan is a ", descriptor_type_name(plan->d.type), " descriptor and variantPack a ",
                    descriptor_type_name(pack->d.type), " one"));
  if (!plan->d.finalized || !pack->d.finalized)
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, cat(fn, ": the ", plan->d.finalized ? "variant pack" : "plan",
                                                          " is not finalized"));
  return execute_plan(handle, plan->d, pack->d);
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const std::string s = minidl::cuda::emu::last_error_detail();
  const size_t n = std::min(s.size(), max_size - 1);
  std::memcpy(message, s.data(), n);
  message[n] = '\0';
}

// cudnn-frontend's headers refer to these for int8 filter reordering, which minidl never asks for.
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int,
                                         const int[]) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnSetFilterNdDescriptor: not emulated (the backend never calls it)");
}
cudnnStatus_t cudnnReorderFilterAndBias(cudnnHandle_t, const cudnnFilterDescriptor_t, cudnnReorderType_t, const void*,
                                        void*, int, const void*, void*) {
  return fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnReorderFilterAndBias: not emulated (the backend never calls it)");
}

}  // extern "C"
