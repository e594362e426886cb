// The NCCL engine for CUDA tensors: one communicator per group on the rank's device, its unique id
// sent from rank 0 over the group's CPU (MPI) broadcast. Collectives run on a stream of their own
// after minidl's compute stream is drained (synchronize), and Work waits on an event: simple and
// correct; ordering by events instead of a host wait is the next step. Needs a GPU per rank: it is
// compiled in CI but has not run there.
#include <cstring>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/error.h"
#include "distributed/process_group.h"

#ifdef MINIDL_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace minidl::distributed {

#ifndef MINIDL_WITH_NCCL

std::unique_ptr<Transport> make_nccl_transport(ProcessGroup& group, int device_index) {
  MINIDL_FAIL("dist: a collective on a CUDA tensor (cuda:", device_index, ", rank ", group.rank(), " of ",
              group.world_size(), ") needs NCCL, and this build of minidl has none",
              cuda_built() ? ": install NCCL (or point MINIDL_NCCL_ROOT at it) and configure again"
                           : " (it was built without CUDA)");
}

#else

namespace {

#define MINIDL_NCCL_CHECK(call, where)                                                                  \
  do {                                                                                                  \
    const ncclResult_t rc_ = (call);                                                                    \
    MINIDL_CHECK(rc_ == ncclSuccess, where, ": ", #call, " failed: ", ncclGetErrorString(rc_));        \
  } while (0)
#define MINIDL_CUDART_CHECK(call, where)                                                                \
  do {                                                                                                  \
    const cudaError_t rc_ = (call);                                                                     \
    MINIDL_CHECK(rc_ == cudaSuccess, where, ": ", #call, " failed: ", cudaGetErrorString(rc_));        \
  } while (0)

ncclDataType_t nccl_type(DType t, const std::string& where) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8:
    case DType::boolean: return ncclUint8;
  }
  MINIDL_FAIL(where, ": no NCCL type for this dtype");
}

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t ev, Tensor t, std::string where) : ev_(ev), t_(std::move(t)), where_(std::move(where)) {}
  ~NcclWork() override {
    if (ev_ != nullptr) {
      cudaEventSynchronize(ev_);
      cudaEventDestroy(ev_);
    }
  }
  bool test() override {
    const cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaErrorNotReady) return false;
    MINIDL_CUDART_CHECK(rc, where_);
    return true;
  }
  void wait() override { MINIDL_CUDART_CHECK(cudaEventSynchronize(ev_), where_); }

 private:
  cudaEvent_t ev_;
  Tensor t_;  // keeps the device buffer alive while NCCL writes it
  std::string where_;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(ProcessGroup& group, int device) : rank_(group.rank()), world_(group.world_size()), device_(device) {
    const std::string where = detail::concat("dist NCCL setup on rank ", rank_, " (cuda:", device, ")");
    ncclUniqueId id{};
    if (rank_ == 0) MINIDL_NCCL_CHECK(ncclGetUniqueId(&id), where);
    Tensor bytes = empty({static_cast<int64_t>(sizeof(id))}, {.dtype = DType::u8});
    std::memcpy(bytes.data_ptr(), &id, sizeof(id));
    group.broadcast(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof(id));
    MINIDL_CUDART_CHECK(cudaSetDevice(device_), where);
    MINIDL_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where);
    MINIDL_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_), where);
    int version = 0;
    ncclGetVersion(&version);
    name_ = detail::concat("NCCL ", version, " on cuda:", device_);
  }
  ~NcclTransport() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::string name() const override { return name_; }

  std::unique_ptr<Work> allreduce(const Tensor& t, ReduceOp op) override {
    const std::string where = here("allreduce", t);
    const ncclRedOp_t nop = op == ReduceOp::Max ? ncclMax : op == ReduceOp::Min ? ncclMin : ncclSum;
    begin(t, where);
    MINIDL_NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype(), where), nop, comm_, stream_), where);
    return std::make_unique<NcclWork>(record(where), t, where);
  }

  void broadcast(const Tensor& t, int root) override {
    const std::string where = here("broadcast", t);
    begin(t, where);
    MINIDL_NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                    nccl_type(t.dtype(), where), root, comm_, stream_), where);
    NcclWork(record(where), t, where).wait();
  }

  void barrier() override { MINIDL_FAIL("dist: barrier runs on the CPU transport"); }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    std::_Exit(code);
  }

 private:
  std::string here(const char* op, const Tensor& t) const {
    return detail::concat("dist ", op, " on rank ", rank_, " of ", world_, " (tensor ", t.meta(), ", NCCL)");
  }
  void begin(const Tensor& t, const std::string& where) {
    MINIDL_CHECK(t.device().index == device_, where, ": this group's NCCL communicator is on cuda:", device_,
                 "; one process per device (move the tensor, or pick the device from local_rank())");
    synchronize(t.device());  // the tensor's producers on minidl's compute stream are done
    MINIDL_CUDART_CHECK(cudaSetDevice(device_), where);
  }
  cudaEvent_t record(const std::string& where) {
    cudaEvent_t ev = nullptr;
    MINIDL_CUDART_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), where);
    MINIDL_CUDART_CHECK(cudaEventRecord(ev, stream_), where);
    return ev;
  }

  int rank_, world_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string name_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_transport(ProcessGroup& group, int device_index) {
  return std::make_unique<NcclTransport>(group, device_index);
}

#endif

}  // namespace minidl::distributed

// The symbol minidl::distributed's link options name (--undefined=minidl_nccl_engine), so that a static link
// takes this file's engine although process_group.cpp refers to it only weakly.
extern "C" void minidl_nccl_engine() {}
