// The data-parallel measurements on the CPU: MPI allreduce bandwidth over a range of sizes, and the
// data-parallel training step with bucket allreduces started during backward (overlap) or after
// it. Run under mpirun with 1 and 2 ranks (lab/results/bench/dist_cpu_<date>.md); a plain program,
// not Google Benchmark, so that every rank runs exactly the same number of collectives.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "distributed/run.h"
#include "nn/layers.h"
#include "optim/sgd.h"

namespace {
using namespace minidl;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The slowest rank's median: a collective step is as fast as its slowest participant.
double median_over_ranks(distributed::ProcessGroup& g, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return g.allreduce(v[v.size() / 2], distributed::ReduceOp::Max);
}

void bench_allreduce(distributed::ProcessGroup& g, int reps) {
  if (g.rank() == 0) {
    std::printf("\n| bytes | median time | algorithm bandwidth | bus bandwidth |\n| ---: | ---: | ---: | ---: |\n");
  }
  for (int64_t bytes = int64_t{4} << 10; bytes <= int64_t{64} << 20; bytes *= 4) {
    Tensor t = ones({bytes / 4});
    for (int i = 0; i < 2; ++i) g.allreduce(t);  // warm-up
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
      g.barrier();
      const auto t0 = Clock::now();
      g.allreduce(t);
      times.push_back(seconds_since(t0));
    }
    const double s = median_over_ranks(g, times);
    const int w = g.world_size();
    // Bus bandwidth as nccl-tests defines it: algbw * 2 (W - 1) / W, comparable across world sizes.
    if (g.rank() == 0) {
      const double algbw = static_cast<double>(bytes) / s / 1e9;
      char bus[32] = "-";
      if (w > 1) std::snprintf(bus, sizeof(bus), "%.2f GB/s", algbw * 2.0 * (w - 1) / w);
      std::printf("| %lld | %.1f us | %.2f GB/s | %s |\n", static_cast<long long>(bytes), s * 1e6, algbw, bus);
    }
  }
}

std::shared_ptr<nn::Sequential> mlp(int64_t width, int layers) {
  Generator gen(1);
  auto m = std::make_shared<nn::Sequential>();
  for (int i = 0; i < layers; ++i) {
    m->push_back(std::make_shared<nn::Linear>(width, width, true, &gen));
    m->push_back(std::make_shared<nn::ReLU>());
  }
  return m;
}

void bench_step(distributed::ProcessGroup& g, int reps, int64_t width, int layers, int64_t batch, double cap_mib) {
  if (g.rank() == 0) {
    std::printf("\n| overlap | buckets | median step | of which waiting in finish_gradient_sync |\n"
                "| --- | ---: | ---: | ---: |\n");
  }
  for (bool overlap : {false, true}) {
    auto model = mlp(width, layers);
    distributed::DataParallel dp(*model, g, {.bucket_cap_mib = cap_mib, .overlap = overlap});
    optim::SGD opt(model->parameters(), {.lr = 1e-4, .momentum = 0.9});
    Generator data(2 + static_cast<uint64_t>(g.rank()));
    const Tensor x = randn({batch, width}, {}, &data);
    std::vector<double> steps, waits;
    for (int i = 0; i < reps + 2; ++i) {
      g.barrier();
      const auto t0 = Clock::now();
      mean(square(dp(x))).backward();
      const auto t1 = Clock::now();
      dp.finish_gradient_sync();
      const double wait = seconds_since(t1);
      opt.step();
      opt.zero_grad();
      if (i >= 2) {  // two warm-up steps (momentum buffers, allocator cache)
        steps.push_back(seconds_since(t0));
        waits.push_back(wait);
      }
    }
    const double s = median_over_ranks(g, steps);
    const double w = median_over_ranks(g, waits);
    if (g.rank() == 0) {
      std::printf("| %s | %zu | %.2f ms | %.2f ms |\n", overlap ? "on" : "off", dp.buckets().size(), s * 1e3, w * 1e3);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  return distributed::run_or_abort([&] {
    distributed::ProcessGroup& g = distributed::world();
    if (g.rank() == 0) std::printf("%s\n", g.describe().c_str());
    bench_allreduce(g, reps);
    // 8 layers of 1024 x 1024 (32 MiB of f32 parameters), batch 64 per rank, 4 MiB buckets.
    bench_step(g, reps, 1024, 8, 64, 4.0);
    return 0;
  });
}
