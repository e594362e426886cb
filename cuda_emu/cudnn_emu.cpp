// cuDNN stand-ins for the emulated device, part 1: the handle, the tensor / filter / convolution
// descriptors and the output-size query, with the real headers' signatures. Each checks its
// arguments as cuDNN documents (BAD_PARAM and cuDNN 9's sub-codes, NOT_SUPPORTED) and records
// why in the detail; objects are tracked, so a destroyed or foreign one is caught, not followed.
#include <cstdint>
#include <limits>

#include "cuda_emu/cudnn_emu_internal.h"

namespace minidl::cuda::emu::detail {
namespace {

Registry<cudnnContext>& handles() { return registry_of<cudnnContext>(); }
Registry<cudnnTensorStruct>& tensors() { return registry_of<cudnnTensorStruct>(); }
Registry<cudnnFilterStruct>& filters() { return registry_of<cudnnFilterStruct>(); }
Registry<cudnnConvolutionStruct>& convs() { return registry_of<cudnnConvolutionStruct>(); }

template <class T>
cudnnStatus_t check_live(const char* fn, const char* arg, const Registry<T>& reg, const void* p) {
  if (p == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": ", arg, " is NULL"));
  const ObjState s = reg.state(p);
  if (s != ObjState::Live) return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": ", arg, " ", p, " is ", state_word(s)));
  return CUDNN_STATUS_SUCCESS;
}

// Creates into *out; the output pointer itself must be valid.
template <class T, class H>
cudnnStatus_t create(const char* fn, Registry<T>& reg, H* out) {
  if (out == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": the output pointer is NULL"));
  *out = reg.create();
  return CUDNN_STATUS_SUCCESS;
}

template <class T>
cudnnStatus_t destroy(const char* fn, Registry<T>& reg, T* p) {
  if (p == nullptr) return CUDNN_STATUS_SUCCESS;   // cuDNN accepts destroying a NULL descriptor
  if (cudnnStatus_t st = check_live(fn, "the descriptor", reg, p); st != CUDNN_STATUS_SUCCESS) return st;
  reg.destroy(p);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_dtype(const char* fn, cudnnDataType_t t) {
  Elem e{};
  if (!elem_of(t, e) && t != CUDNN_DATA_UINT8 && t != CUDNN_DATA_INT64 && t != CUDNN_DATA_BOOLEAN)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": dataType ", static_cast<int>(t), " is not a data type the "
                                            "legacy descriptors take (FLOAT, DOUBLE, HALF, BFLOAT16, INT8, INT32, ...)"));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_format(const char* fn, cudnnTensorFormat_t f) {
  if (f == CUDNN_TENSOR_NCHW_VECT_C)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, cat(fn, ": CUDNN_TENSOR_NCHW_VECT_C is not emulated"));
  if (f != CUDNN_TENSOR_NCHW && f != CUDNN_TENSOR_NHWC)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": format ", static_cast<int>(f), " is not a cudnnTensorFormat_t"));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_dims(const char* fn, const char* names, std::initializer_list<int> dims) {
  int64_t total = 1;
  for (const int d : dims) {
    if (d <= 0)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": ", names, " must all be positive, got one = ", d,
                                              " (the legacy API takes no empty tensors)"));
    total *= d;
  }
  if (total > std::numeric_limits<int32_t>::max())
    return fail(CUDNN_STATUS_NOT_SUPPORTED, cat(fn, ": ", total, " elements exceed the 2^31 - 1 limit"));
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t check_handle(const char* fn, cudnnHandle_t h) { return check_live(fn, "handle", handles(), h); }

cudnnStatus_t check_tensor(const char* fn, const char* arg, cudnnTensorDescriptor_t d) {
  if (cudnnStatus_t st = check_live(fn, arg, tensors(), d); st != CUDNN_STATUS_SUCCESS) return st;
  if (!d->set)
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, cat(fn, ": ", arg, " was created but never set"));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t check_filter(const char* fn, const char* arg, cudnnFilterDescriptor_t d) {
  if (cudnnStatus_t st = check_live(fn, arg, filters(), d); st != CUDNN_STATUS_SUCCESS) return st;
  if (!d->set)
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, cat(fn, ": ", arg, " was created but never set"));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t check_conv(const char* fn, const char* arg, cudnnConvolutionDescriptor_t d) {
  if (cudnnStatus_t st = check_live(fn, arg, convs(), d); st != CUDNN_STATUS_SUCCESS) return st;
  if (!d->set)
    return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                cat(fn, ": ", arg, " was never given its geometry (cudnnSetConvolution2dDescriptor)"));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t conv_output_dims(const char* fn, const cudnnConvolutionStruct& cv, const cudnnTensorStruct& x,
                               const cudnnFilterStruct& w, int& n, int& c, int& h, int& wd) {
  if (x.c != w.c * cv.groups)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                cat(fn, ": the input has ", x.c, " channels but the filter has ", w.c, " per group x ", cv.groups,
                    " groups = ", w.c * cv.groups));
  if (w.k % cv.groups != 0)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the filter's ", w.k, " output channels are not a multiple of the ",
                                            cv.groups, " groups"));
  const int64_t eff_h = int64_t{w.h - 1} * cv.dil_h + 1, eff_w = int64_t{w.w - 1} * cv.dil_w + 1;
  const int64_t in_h = int64_t{x.h} + 2 * int64_t{cv.pad_h}, in_w = int64_t{x.w} + 2 * int64_t{cv.pad_w};
  if (eff_h > in_h || eff_w > in_w)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the dilated filter (", eff_h, "x", eff_w,
                                            ") is larger than the padded input (", in_h, "x", in_w, ")"));
  n = x.n;
  c = w.k;
  h = static_cast<int>((in_h - eff_h) / cv.u + 1);
  wd = static_cast<int>((in_w - eff_w) / cv.v + 1);
  return CUDNN_STATUS_SUCCESS;
}

bool elem_of(cudnnDataType_t t, Elem& e) {
  switch (t) {
    case CUDNN_DATA_FLOAT: e = Elem::F32; return true;
    case CUDNN_DATA_DOUBLE: e = Elem::F64; return true;
    case CUDNN_DATA_HALF: e = Elem::F16; return true;
    case CUDNN_DATA_BFLOAT16: e = Elem::BF16; return true;
    case CUDNN_DATA_INT8: e = Elem::I8; return true;
    case CUDNN_DATA_INT32: e = Elem::I32; return true;
    default: return false;
  }
}

const char* dtype_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "CUDNN_DATA_FLOAT";
    case CUDNN_DATA_DOUBLE: return "CUDNN_DATA_DOUBLE";
    case CUDNN_DATA_HALF: return "CUDNN_DATA_HALF";
    case CUDNN_DATA_BFLOAT16: return "CUDNN_DATA_BFLOAT16";
    case CUDNN_DATA_INT8: return "CUDNN_DATA_INT8";
    case CUDNN_DATA_INT32: return "CUDNN_DATA_INT32";
    default: return "another cudnnDataType_t";
  }
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "CUDNN_DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH: return "CUDNN_TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "CUDNN_FMA_MATH";
  }
  return "an invalid cudnnMathType_t";
}

void cudnn_live_counts(LibObjectCounts& out) {
  out.cudnn_handles = handles().live_count();
  out.tensor_descriptors = tensors().live_count();
  out.filter_descriptors = filters().live_count();
  out.convolution_descriptors = convs().live_count();
}

}  // namespace minidl::cuda::emu::detail

using namespace minidl::cuda::emu::detail;   // NOLINT: the C entry points below are outside our namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (static_cast<int>(status)) {
#define MINIDL_EMU_CUDNN_STATUS(s) \
  case s: return #s;
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_SUCCESS)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_INITIALIZED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_DEPRECATED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_LICENSE_ERROR)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_EXECUTION_FAILED)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
    MINIDL_EMU_CUDNN_STATUS(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
    case 2001: return "CUDNN_STATUS_INVALID_VALUE";
#undef MINIDL_EMU_CUDNN_STATUS
  }
  return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) { return create("cudnnCreate", handles(), handle); }
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (cudnnStatus_t st = check_handle("cudnnDestroy", handle); st != CUDNN_STATUS_SUCCESS) return st;
  handles().destroy(handle);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (cudnnStatus_t st = check_handle("cudnnSetStream", handle); st != CUDNN_STATUS_SUCCESS) return st;
  if (!stream_ok(streamId))
    return fail(CUDNN_STATUS_BAD_PARAM,
                cat("cudnnSetStream: streamId ", static_cast<const void*>(streamId), " is not a live stream"));
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* streamId) {
  if (cudnnStatus_t st = check_handle("cudnnGetStream", handle); st != CUDNN_STATUS_SUCCESS) return st;
  if (streamId == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnGetStream: streamId is NULL");
  *streamId = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

// ---- tensor descriptors ----

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  return create("cudnnCreateTensorDescriptor", tensors(), tensorDesc);
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  return destroy("cudnnDestroyTensorDescriptor", tensors(), tensorDesc);
}

cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType, int n,
                                           int c, int h, int w, int nStride, int cStride, int hStride, int wStride) {
  constexpr const char* fn = "cudnnSetTensor4dDescriptorEx";
  if (cudnnStatus_t st = check_live(fn, "tensorDesc", tensors(), tensorDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dtype(fn, dataType); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dims(fn, "n, c, h, w", {n, c, h, w}); st != CUDNN_STATUS_SUCCESS) return st;
  for (const int s : {nStride, cStride, hStride, wStride})
    if (s <= 0)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": strides (", nStride, ", ", cStride, ", ", hStride, ", ", wStride,
                                              ") must all be positive"));
  *tensorDesc = {true, dataType, n, c, h, w, nStride, cStride, hStride, wStride};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
  constexpr const char* fn = "cudnnSetTensor4dDescriptor";
  if (cudnnStatus_t st = check_live(fn, "tensorDesc", tensors(), tensorDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_format(fn, format); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dtype(fn, dataType); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dims(fn, "n, c, h, w", {n, c, h, w}); st != CUDNN_STATUS_SUCCESS) return st;
  const int64_t hw = int64_t{h} * w;
  if (format == CUDNN_TENSOR_NCHW) *tensorDesc = {true, dataType, n, c, h, w, c * hw, hw, w, 1};
  else *tensorDesc = {true, dataType, n, c, h, w, c * hw, 1, int64_t{w} * c, c};
  return CUDNN_STATUS_SUCCESS;
}

// ---- filter descriptors ----

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  return create("cudnnCreateFilterDescriptor", filters(), filterDesc);
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  return destroy("cudnnDestroyFilterDescriptor", filters(), filterDesc);
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  constexpr const char* fn = "cudnnSetFilter4dDescriptor";
  if (cudnnStatus_t st = check_live(fn, "filterDesc", filters(), filterDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dtype(fn, dataType); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_format(fn, format); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_dims(fn, "k, c, h, w", {k, c, h, w}); st != CUDNN_STATUS_SUCCESS) return st;
  *filterDesc = {true, dataType, format, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

// ---- convolution descriptors ----

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  return create("cudnnCreateConvolutionDescriptor", convs(), convDesc);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  return destroy("cudnnDestroyConvolutionDescriptor", convs(), convDesc);
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u,
                                              int v, int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  constexpr const char* fn = "cudnnSetConvolution2dDescriptor";
  if (cudnnStatus_t st = check_live(fn, "convDesc", convs(), convDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (pad_h < 0 || pad_w < 0)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": padding (", pad_h, ", ", pad_w, ") is negative"));
  if (u <= 0 || v <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": stride (u ", u, ", v ", v, ") must be positive"));
  if (dilation_h <= 0 || dilation_w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": dilation (", dilation_h, ", ", dilation_w, ") must be positive"));
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": mode ", static_cast<int>(mode), " is not a cudnnConvolutionMode_t"));
  if (computeType != CUDNN_DATA_FLOAT && computeType != CUDNN_DATA_DOUBLE && computeType != CUDNN_DATA_HALF &&
      computeType != CUDNN_DATA_BFLOAT16 && computeType != CUDNN_DATA_INT32)
    return fail(CUDNN_STATUS_BAD_PARAM,
                cat(fn, ": computeType ", static_cast<int>(computeType), " is not a convolution compute type"));
  cudnnConvolutionStruct& d = *convDesc;
  d.set = true;
  d.pad_h = pad_h;
  d.pad_w = pad_w;
  d.u = u;
  d.v = v;
  d.dil_h = dilation_h;
  d.dil_w = dilation_w;
  d.mode = mode;
  d.compute = computeType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount) {
  constexpr const char* fn = "cudnnSetConvolutionGroupCount";
  if (cudnnStatus_t st = check_live(fn, "convDesc", convs(), convDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (groupCount < 1) return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": groupCount = ", groupCount, " must be >= 1"));
  convDesc->groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType) {
  constexpr const char* fn = "cudnnSetConvolutionMathType";
  if (cudnnStatus_t st = check_live(fn, "convDesc", convs(), convDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (mathType != CUDNN_DEFAULT_MATH && mathType != CUDNN_TENSOR_OP_MATH &&
      mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && mathType != CUDNN_FMA_MATH)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": mathType ", static_cast<int>(mathType), " is not a cudnnMathType_t"));
  convDesc->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                    const cudnnTensorDescriptor_t inputTensorDesc,
                                                    const cudnnFilterDescriptor_t filterDesc, int* n, int* c, int* h,
                                                    int* w) {
  constexpr const char* fn = "cudnnGetConvolution2dForwardOutputDim";
  if (cudnnStatus_t st = check_conv(fn, "convDesc", convDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_tensor(fn, "inputTensorDesc", inputTensorDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_filter(fn, "filterDesc", filterDesc); st != CUDNN_STATUS_SUCCESS) return st;
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": an output pointer (n, c, h or w) is NULL"));
  int on = 0, oc = 0, oh = 0, ow = 0;
  if (cudnnStatus_t st = conv_output_dims(fn, *convDesc, *inputTensorDesc, *filterDesc, on, oc, oh, ow);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  *n = on;
  *c = oc;
  *h = oh;
  *w = ow;
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
