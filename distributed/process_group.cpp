// ProcessGroup: the checks every collective shares (contiguity, dtype, which engine), the Mean
// division, the counters, and the world of one that needs no MPI. The engines themselves are in
// mpi_transport.cpp and nccl_transport.cpp.
#include "distributed/process_group.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/autograd.h"
#include "core/error.h"

namespace minidl::distributed {
namespace {

// A world of one: every collective is the identity.
class LocalTransport final : public Transport {
 public:
  std::string name() const override { return "local (world of 1)"; }
  std::unique_ptr<Work> allreduce(const Tensor&, ReduceOp) override { return std::make_unique<DoneWork>(); }
  void broadcast(const Tensor&, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  struct DoneWork final : Work {
    bool test() override { return true; }
    void wait() override {}
  };
};

// Mean = Sum, then one division by the world size once the sum has arrived.
class MeanWork final : public Work {
 public:
  MeanWork(std::unique_ptr<Work> inner, Tensor t, int world) : inner_(std::move(inner)), t_(std::move(t)), world_(world) {}
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (world_ == 1) return;
    NoGradGuard no_grad;
    t_.mul_(1.0 / world_);
  }
  std::unique_ptr<Work> inner_;
  Tensor t_;
  int world_;
  bool done_ = false;
};

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

bool mpi_built() {
#ifdef MINIDL_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#ifdef MINIDL_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

// The engines are referenced weakly: a static link takes their objects (and MPI, NCCL) only when
// the program asks for them (minidl::distributed's --undefined=minidl_*_engine), so they are null
// in a program linked with the trainer alone.
[[gnu::weak]] std::unique_ptr<Transport> make_mpi_transport(const LaunchInfo& info);
[[gnu::weak]] std::unique_ptr<Transport> make_nccl_transport(ProcessGroup& group, int device_index);

namespace {

void require_engine(bool linked, const char* engine, const LaunchInfo& info) {
  MINIDL_CHECK(linked, "dist: a world of ", info.world_size, " (", info.source, ") needs the ", engine,
               " engine, which this program did not link: link minidl::distributed (the trainer library, "
               "minidl::train, alone runs as a world of one)");
}

}  // namespace

ProcessGroup::ProcessGroup(const LaunchInfo& info) : info_(info) {
  MINIDL_CHECK(info_.world_size >= 1 && info_.rank >= 0 && info_.rank < info_.world_size, "dist: rank ", info_.rank,
               " of a world of ", info_.world_size, " is not a valid position");
  // mpirun -np 1 still gets MPI (so the job behaves as with more ranks); a plain run does not.
  const bool launched_by_mpi = info_.source != LaunchInfo{}.source && info_.source.rfind("MINIDL", 0) != 0;
  const char* check = std::getenv("MINIDL_DIST_CHECK");
  check_shapes_ = check != nullptr && std::string(check) == "1";
  const bool mpi_linked = &make_mpi_transport != nullptr;
  if (info_.world_size > 1 || (launched_by_mpi && mpi_built() && mpi_linked)) {
    require_engine(mpi_linked, "MPI", info_);
    cpu_ = make_mpi_transport(info_);
  } else {
    cpu_ = make_local_transport();
  }
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::describe() const {
  return detail::concat("rank ", rank(), " of ", world_size(), " (", info_.source, "); CPU: ", cpu_->name(),
                        "; CUDA: ", cuda_ ? cuda_->name() : (nccl_built() ? "NCCL (not started)" : "none (no NCCL)"));
}

std::string ProcessGroup::where(const char* op, const Tensor& t) const {
  return detail::concat("dist ", op, " on rank ", rank(), " of ", world_size(), " (tensor ", t.meta(), ")");
}

Transport& ProcessGroup::transport_for(const Tensor& t, const char* op) {
  MINIDL_CHECK(t.defined(), "dist ", op, " on rank ", rank(), ": undefined tensor");
  MINIDL_CHECK(t.is_contiguous(), where(op, t), ": the tensor is not contiguous; pass t.contiguous() and copy the "
               "result back");
  if (t.device().type == DeviceType::CPU) return *cpu_;
  // A world of one needs no NCCL: the identity, whatever the device.
  if (!cuda_ && world_size() > 1) require_engine(&make_nccl_transport != nullptr, "NCCL", info_);
  if (!cuda_) cuda_ = world_size() == 1 ? make_local_transport() : make_nccl_transport(*this, t.device().index);
  return *cuda_;
}

void ProcessGroup::check_across_ranks(const char* op, const Tensor& t) {
  if (!check_shapes_ || world_size() == 1) return;
  // Max of (n, -n, dtype, -dtype) gives each value's largest and smallest over the ranks.
  const auto n = static_cast<double>(t.numel());
  const auto d = static_cast<double>(static_cast<int>(t.dtype()));
  Tensor v = from_vector({n, -n, d, -d}, {4}, {.dtype = DType::i64});
  cpu_->allreduce(v, ReduceOp::Max)->wait();
  const auto r = v.to_vector();
  MINIDL_CHECK(r[0] == -r[1] && r[2] == -r[3], where(op, t), ": the ranks disagree on the tensor (element counts ",
               -r[1], " to ", r[0], r[2] == -r[3] ? "" : ", and dtypes differ",
               "): every rank must pass a tensor of the same size and dtype, in the same order of calls");
}

std::unique_ptr<Work> ProcessGroup::allreduce_async(const Tensor& t, ReduceOp op) {
  Transport& tr = transport_for(t, "allreduce");
  check_across_ranks("allreduce", t);
  MINIDL_CHECK(op != ReduceOp::Mean || is_floating(t.dtype()), where("allreduce(mean)", t),
               ": mean needs a floating dtype; use sum and divide");
  MINIDL_CHECK(t.dtype() != DType::boolean || op == ReduceOp::Max || op == ReduceOp::Min, where("allreduce", t),
               ": bool tensors reduce with max (any) or min (all) only");
  ++counters_.allreduce;
  counters_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
  auto work = tr.allreduce(t, op == ReduceOp::Mean ? ReduceOp::Sum : op);
  if (op != ReduceOp::Mean) return work;
  return std::make_unique<MeanWork>(std::move(work), t, world_size());
}

void ProcessGroup::allreduce(const Tensor& t, ReduceOp op) { allreduce_async(t, op)->wait(); }

void ProcessGroup::broadcast(const Tensor& t, int root) {
  Transport& tr = transport_for(t, "broadcast");
  MINIDL_CHECK(root >= 0 && root < world_size(), where("broadcast", t), ": root ", root, " is outside the world of ",
               world_size());
  check_across_ranks("broadcast", t);
  ++counters_.broadcast;
  tr.broadcast(t, root);
}

void ProcessGroup::barrier() {
  ++counters_.barrier;
  cpu_->barrier();
}

double ProcessGroup::allreduce(double value, ReduceOp op) {
  Tensor t = scalar_tensor(value, {.dtype = DType::f64});
  allreduce(t, op);
  return t.item();
}

bool ProcessGroup::any(bool flag) { return allreduce(flag ? 1.0 : 0.0, ReduceOp::Max) != 0.0; }

void ProcessGroup::check_same(const std::string& what, int64_t value) {
  Tensor t = from_vector({static_cast<double>(value), -static_cast<double>(value)}, {2}, {.dtype = DType::i64});
  allreduce(t, ReduceOp::Max);
  const auto v = t.to_vector();
  const auto hi = static_cast<int64_t>(v[0]);
  const auto lo = static_cast<int64_t>(-v[1]);
  MINIDL_CHECK(hi == lo, "dist: ", what, " differs across the ", world_size(), " ranks (from ", lo, " to ", hi,
               "; rank ", rank(), " has ", value, "): every rank must build the same model and data");
}

void ProcessGroup::abort(const std::string& message, int code) {
  std::fprintf(stderr, "minidl: rank %d of %d failed: %s\n", rank(), world_size(), message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  cpu_->abort(code);
  std::_Exit(code);  // not reached: Transport::abort does not return
}

ProcessGroup& world() {
  static ProcessGroup group(launch_info_from_env());
  return group;
}

}  // namespace minidl::distributed
