// A process group: the ranks of one data-parallel job and the collectives they run together
// (allreduce, broadcast, barrier). CPU tensors travel over MPI, CUDA tensors over NCCL; a world of
// one needs neither. Every rank must call the same collectives in the same order, as in MPI.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "distributed/launch.h"

namespace minidl::distributed {

enum class ReduceOp { Sum, Mean, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "mean", "max", "min"

// Whether this build has the MPI backend (CPU tensors, worlds above 1) and the NCCL one (CUDA).
bool mpi_built();
bool nccl_built();

// A collective in flight. test() drives it (MPI makes progress only inside MPI calls) and says
// whether it finished; wait() blocks until it has (idempotent). Throws naming the op and rank.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// One device kind's engine (MPI, NCCL, or the world of one); ProcessGroup picks it per tensor.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // In place on the contiguous tensor's elements; Sum, Max or Min (Mean is done by the caller).
  virtual std::unique_ptr<Work> allreduce(const Tensor& t, ReduceOp op) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  [[noreturn]] virtual void abort(int code) = 0;
};

// Collective calls made through a group (what tests count: the no_sync rule, one allreduce per
// bucket per effective batch).
struct Counters {
  int64_t allreduce = 0;
  int64_t broadcast = 0;
  int64_t barrier = 0;
  int64_t allreduce_bytes = 0;
};

class ProcessGroup {
 public:
  // World 1: no MPI (unless the build has it and the process was started by mpirun -np 1).
  // World > 1: starts MPI (MPI_Init_thread, funneled) and checks that MPI sees the same world;
  // throws naming the launcher when it does not (e.g. MINIDL_WORLD_SIZE=2 without mpirun).
  explicit ProcessGroup(const LaunchInfo& info);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return info_.rank; }
  int world_size() const { return info_.world_size; }
  int local_rank() const { return info_.local_rank; }
  const LaunchInfo& launch_info() const { return info_; }
  // "rank 1 of 2 (mpirun (OMPI_COMM_WORLD_*)); CPU: MPI (...); CUDA: NCCL"
  std::string describe() const;

  // In place on a contiguous tensor (CPU: f32, f64, f16, i32, i64, u8; CUDA: the same over NCCL).
  // Mean divides the sum by the world size (floating dtypes only). The async form returns at once;
  // the tensor must stay untouched until wait().
  std::unique_ptr<Work> allreduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  void allreduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Copies root's tensor into every rank's (same shape and dtype on every rank).
  void broadcast(const Tensor& t, int root = 0);
  void barrier();
  // Scalars over the CPU transport, whatever device the data are on.
  double allreduce(double value, ReduceOp op);
  bool any(bool flag);  // true on every rank when true on at least one
  // Throws on every rank, naming `what` and the smallest and largest values, when the ranks
  // disagree on `value` (a parameter count, a batch count): a mismatch caught before it hangs.
  void check_same(const std::string& what, int64_t value);

  // Ends the whole job: prints "minidl: rank R of W failed: <message>" to stderr and aborts every
  // rank (MPI_Abort) with `code`; in a world of one it exits the process with `code`.
  [[noreturn]] void abort(const std::string& message, int code = 1);

  Counters counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  // Debug mode (on when MINIDL_DIST_CHECK=1 is set, or by this call): before every tensor
  // collective the ranks compare the tensor's element count and dtype (one extra small
  // allreduce), and a mismatch throws on every rank naming the op, this rank's tensor and the
  // range seen, instead of MPI truncating, corrupting or hanging. Off by default (it costs a
  // round trip per collective). Every rank must set the same mode.
  void set_check_shapes(bool on) { check_shapes_ = on; }
  bool check_shapes() const { return check_shapes_; }

 private:
  Transport& transport_for(const Tensor& t, const char* op);
  void check_across_ranks(const char* op, const Tensor& t);
  std::string where(const char* op, const Tensor& t) const;

  LaunchInfo info_;
  std::unique_ptr<Transport> cpu_;
  std::unique_ptr<Transport> cuda_;
  Counters counters_;
  bool check_shapes_ = false;
};

// This process's group, created on first use from launch_info_from_env() and kept until exit
// (MPI is finalized after it is destroyed).
ProcessGroup& world();

// Internal: the engines ProcessGroup builds (distributed/mpi_transport.cpp, distributed/nccl_transport.cpp).
// make_mpi_transport throws in a build without MPI; make_nccl_transport without NCCL. The two
// engines are in a program only when it links minidl::distributed, whose link options ask for
// them (minidl_mpi_engine, minidl_nccl_engine): a program that links the trainer alone
// (minidl::train) links neither MPI nor NCCL, and its group is a world of one.
std::unique_ptr<Transport> make_local_transport();
std::unique_ptr<Transport> make_mpi_transport(const LaunchInfo& info);
std::unique_ptr<Transport> make_nccl_transport(ProcessGroup& group, int device_index);

}  // namespace minidl::distributed
