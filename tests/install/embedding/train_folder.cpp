// docs/embedding.md's complete program: a small CNN trained on an image folder with SGD, a warmup +
// cosine schedule and mixed precision on the CPU, a checkpoint saved after the first epoch and
// resumed into a fresh model, and the allocator's memory statistics. Built against the installed
// package by the ctest test install.embedding, which also checks it links no CUDA or MPI library.
#include <minidl/minidl.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace nn = minidl::nn;
namespace optim = minidl::optim;
namespace data = minidl::data;
using minidl::Tensor;

namespace {

std::shared_ptr<nn::Sequential> make_model(minidl::Generator& gen) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(3, 16, 3, 1, 1, 1, /*bias=*/false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(16));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::AdaptiveAvgPool2d>());
  m->push_back(std::make_shared<nn::Flatten>());
  m->push_back(std::make_shared<nn::Linear>(16, 2, true, &gen));
  return m;
}

struct Trainer {
  std::shared_ptr<nn::Sequential> model;
  optim::SGD opt;
  optim::GradScaler scaler;
  std::unique_ptr<optim::LrSchedule> schedule;
  double base_lr = 0.05;

  Trainer(std::shared_ptr<nn::Sequential> m, int64_t total_steps)
      : model(std::move(m)),
        opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4}),
        scaler({.init_scale = 1024.0}),
        schedule(optim::parse_schedule("warmup:2+cosine", total_steps)) {}

  // One epoch; returns the mean loss. Under AutocastGuard the convolution and the linear layer run
  // in f16 on the CPU, batch norm keeps f32 statistics and the loss is f32.
  double epoch(data::Loader& loader, int64_t epoch) {
    model->train();
    loader.start_epoch(epoch);
    double sum = 0;
    int64_t n = 0;
    int64_t step = epoch * loader.batches_per_epoch();   // the schedule's position: a function of the data seen
    while (auto batch = loader.next()) {
      optim::apply_schedule(*schedule, step++, {base_lr}, [&](size_t g, double lr) { opt.set_lr(g, lr); });
      opt.zero_grad();
      Tensor loss;
      {
        minidl::AutocastGuard amp;
        loss = minidl::cross_entropy((*model)(batch->images), batch->labels);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);   // skipped (and the scale halved) when a gradient is inf or NaN
      scaler.update();
      sum += loss.item();
      ++n;
    }
    return sum / static_cast<double>(n);
  }

  void save(const std::string& path, int64_t next_epoch) const {
    std::map<std::string, Tensor> all;
    for (const auto& [k, v] : model->state_dict()) all["model." + k] = v;
    for (const auto& [k, v] : optim::training_state_dict(opt, scaler)) all["train." + k] = v;
    nn::save_safetensors(path, all, {{"next_epoch", std::to_string(next_epoch)}});
  }

  int64_t load(const std::string& path) {
    const nn::SafetensorsFile f = nn::load_safetensors(path);
    std::map<std::string, Tensor> weights, train;
    for (const auto& [k, v] : f.tensors) {
      if (k.rfind("model.", 0) == 0) weights[k.substr(6)] = v;
      if (k.rfind("train.", 0) == 0) train[k.substr(6)] = v;
    }
    model->load_state_dict(weights);
    optim::load_training_state(opt, scaler, train);
    return std::stoll(f.metadata.at("next_epoch"));
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IMAGE_FOLDER WORK_DIR\n", argv[0]);
    return 2;
  }
  const std::string folder = argv[1], ckpt = std::string(argv[2]) + "/checkpoint.safetensors";
  try {
    // The loader on a folder (one sub-folder per class, or Kaggle's flat train/): 24 images per
    // class, 32x32, decoded on two worker threads.
    std::shared_ptr<data::Dataset> all = data::open_image_folder(folder);
    const data::Split split = data::split_by_counts(*all, 24, 0, 0, /*seed=*/1);
    data::LoaderOptions lo;
    lo.batch_size = 16;
    lo.seed = 1;
    lo.transform.size = 32;
    data::Loader loader(data::subset(all, split.train), lo);
    const int64_t epochs = 3, total_steps = epochs * loader.batches_per_epoch();

    minidl::Generator gen(7);
    Trainer a(make_model(gen), total_steps);
    minidl::reset_peak_stats();
    std::printf("epoch 0: loss %.4f\n", a.epoch(loader, 0));
    a.save(ckpt, 1);   // atomic: a crash while saving leaves the previous file whole

    // Resume into a fresh model (other initial weights) and optimizer: after loading, the next
    // epochs must follow the uninterrupted run.
    minidl::Generator other(99);
    Trainer b(make_model(other), total_steps);
    const int64_t next = b.load(ckpt);
    for (int64_t e = next; e < epochs; ++e) {
      const double la = a.epoch(loader, e), lb = b.epoch(loader, e);
      std::printf("epoch %lld: loss %.4f (resumed run %.4f), lr %.4f\n", static_cast<long long>(e), la, lb,
                  a.opt.lr(0));
    }
    const auto pa = a.model->parameters(), pb = b.model->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      if (!minidl::allclose(pa[i], pb[i], 1e-5, 1e-6)) {
        std::fprintf(stderr, "FAILED: parameter %zu differs after resuming from %s\n", i, ckpt.c_str());
        return 1;
      }
    }

    // Memory statistics of the CPU allocator, as PyTorch names them.
    const minidl::MemoryStats m = minidl::memory_stats();
    std::printf("memory: peak allocated %lld bytes, reserved %lld bytes, %lld allocations, scale %.0f\n",
                static_cast<long long>(m.peak_allocated_bytes), static_cast<long long>(m.reserved_bytes),
                static_cast<long long>(m.num_allocs), a.scaler.get_scale());
    if (m.peak_allocated_bytes <= 0) {
      std::fprintf(stderr, "FAILED: no memory statistics\n");
      return 1;
    }
    std::printf("embedding example: OK\n");
    return 0;
  } catch (const minidl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
