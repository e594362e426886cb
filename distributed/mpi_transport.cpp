// The MPI engine for CPU tensors: non-blocking MPI_Iallreduce in place (so data parallelism can
// start a bucket during backward), MPI_Bcast, MPI_Barrier, MPI_Abort. f16 and bf16 have no MPI type:
// they travel as 2-byte elements reduced by user-defined ops that add in f32 and round once.
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

#include "core/error.h"
#include "distributed/process_group.h"

#ifdef MINIDL_WITH_MPI
// The C API only: MPI's deprecated C++ bindings are not wanted (and do not build warning-free).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace minidl::distributed {

#ifndef MINIDL_WITH_MPI

std::unique_ptr<Transport> make_mpi_transport(const LaunchInfo& info) {
  MINIDL_FAIL("dist: a world of ", info.world_size, " (", info.source, ") needs MPI, and this build of minidl has ",
              "none: install libopenmpi-dev (tools/install_deps.sh) and configure again");
}

#else

namespace {

// The reduction ops of one 16-bit float type.
struct Ops16 {
  MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL, min = MPI_OP_NULL;
};

// MPI is initialized once per process (by the first group, or already by the program) and
// finalized at exit, after the world group is destroyed (atexit runs after the destructors of
// statics constructed before the registration finished, which world()'s group is not).
struct MpiRuntime {
  MPI_Datatype half = MPI_DATATYPE_NULL;   // any 2-byte element: f16 and bf16
  Ops16 f16, bf16;
  std::string library;
};

// T is Half or BFloat16: each element widened to f32, combined, rounded once.
template <typename T, typename F>
void half_apply(void* in, void* inout, int* len, F f) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T::from_float(f(T::to_float(a[i]), T::to_float(b[i])));
}
template <typename T>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  half_apply<T>(in, inout, len, [](float x, float y) { return x + y; });
}
template <typename T>
void half_max(void* in, void* inout, int* len, MPI_Datatype*) {
  // NaN wins, as in a sum: a NaN gradient must not vanish in a max.
  half_apply<T>(in, inout, len, [](float x, float y) { return (x != x || x > y) ? x : y; });
}
template <typename T>
void half_min(void* in, void* inout, int* len, MPI_Datatype*) {
  half_apply<T>(in, inout, len, [](float x, float y) { return (x != x || x < y) ? x : y; });
}

template <typename T>
Ops16 make_ops16() {
  Ops16 o;
  MPI_Op_create(half_sum<T>, 1, &o.sum);
  MPI_Op_create(half_max<T>, 1, &o.max);
  MPI_Op_create(half_min<T>, 1, &o.min);
  return o;
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

MpiRuntime& runtime() {
  static MpiRuntime* rt = [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit(finalize_mpi);
    }
    auto* r = new MpiRuntime;  // lives until exit: MPI handles are freed by MPI_Finalize
    MPI_Type_contiguous(2, MPI_BYTE, &r->half);
    MPI_Type_commit(&r->half);
    r->f16 = make_ops16<Half>();
    r->bf16 = make_ops16<BFloat16>();
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    r->library = std::string(version, static_cast<size_t>(len));
    if (const auto nl = r->library.find_first_of("\n,"); nl != std::string::npos) r->library.resize(nl);
    return r;
  }();
  return *rt;
}

std::string mpi_error(int code) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return std::string(msg, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return runtime().half;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::boolean: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (is_float16(t)) {
    const Ops16& o = t == DType::f16 ? runtime().f16 : runtime().bf16;
    return op == ReduceOp::Max ? o.max : op == ReduceOp::Min ? o.min : o.sum;
  }
  return op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request req, Tensor t, std::string where) : req_(req), t_(std::move(t)), where_(std::move(where)) {}
  ~MpiWork() override {
    if (req_ == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    // Dropped unfinished (an exception unwinding past a step): waiting could hang when another rank
    // never joins, so the buffer is kept alive for MPI to finish writing, and the job is expected
    // to end (run_or_abort). A small leak on a path that ends the process anyway.
    if (!done) new Tensor(t_);  // NOLINT: intentional leak
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    const int rc = MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    MINIDL_CHECK(rc == MPI_SUCCESS, where_, ": MPI_Test failed: ", mpi_error(rc));
    return done != 0;
  }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    const int rc = MPI_Wait(&req_, MPI_STATUS_IGNORE);
    MINIDL_CHECK(rc == MPI_SUCCESS, where_, ": MPI_Wait failed: ", mpi_error(rc));
  }

 private:
  MPI_Request req_;
  Tensor t_;  // keeps the buffer alive while MPI may write into it
  std::string where_;
};

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(const LaunchInfo& info) : info_(info) {
    MpiRuntime& rt = runtime();
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MINIDL_CHECK(size == info.world_size && rank == info.rank, "dist: ", info.source, " says rank ", info.rank,
                 " of ", info.world_size, " but MPI started this process as rank ", rank, " of ", size,
                 size == 1 ? " (a singleton: start the ranks with mpirun -np N, or srun --mpi=pmix, so that they "
                             "form one MPI world)"
                           : "");
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    // Errors come back as codes, thrown as minidl::Error naming the op and rank.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    name_ = "MPI (" + rt.library + ")";
  }
  ~MpiTransport() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  std::string name() const override { return name_; }

  std::unique_ptr<Work> allreduce(const Tensor& t, ReduceOp op) override {
    const std::string where = here("allreduce", t);
    MINIDL_CHECK(t.device().type == DeviceType::CPU, where, ": MPI reduces CPU tensors only");
    MINIDL_CHECK(t.numel() <= std::numeric_limits<int>::max(), where, ": more than 2^31 elements in one call");
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t.dtype()),
                                  mpi_op(op, t.dtype()), comm_, &req);
    MINIDL_CHECK(rc == MPI_SUCCESS, where, ": MPI_Iallreduce(", reduce_op_name(op), ") failed: ", mpi_error(rc));
    return std::make_unique<MpiWork>(req, t, where);
  }

  void broadcast(const Tensor& t, int root) override {
    const std::string where = here("broadcast", t);
    MINIDL_CHECK(t.device().type == DeviceType::CPU, where, ": MPI broadcasts CPU tensors only");
    MINIDL_CHECK(t.numel() <= std::numeric_limits<int>::max(), where, ": more than 2^31 elements in one call");
    const int rc = MPI_Bcast(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t.dtype()), root, comm_);
    MINIDL_CHECK(rc == MPI_SUCCESS, where, " from root ", root, ": MPI_Bcast failed: ", mpi_error(rc));
  }

  void barrier() override {
    const int rc = MPI_Barrier(comm_);
    MINIDL_CHECK(rc == MPI_SUCCESS, "dist barrier on rank ", info_.rank, ": MPI_Barrier failed: ", mpi_error(rc));
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps the promise if it ever did
  }

 private:
  std::string here(const char* op, const Tensor& t) const {
    return detail::concat("dist ", op, " on rank ", info_.rank, " of ", info_.world_size, " (tensor ", t.meta(), ")");
  }
  LaunchInfo info_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const LaunchInfo& info) { return std::make_unique<MpiTransport>(info); }

#endif

}  // namespace minidl::distributed

// The symbol minidl::distributed's link options name (--undefined=minidl_mpi_engine), so that a static link
// takes this file's engine although process_group.cpp refers to it only weakly.
extern "C" void minidl_mpi_engine() {}
