// docs/embedding.md's complete program: the trainer library (minidl::train) trains a small CNN on
// an image folder with SGD, warmup + cosine and mixed precision on the CPU; a second run stops
// after one epoch, saves, and resumes to the same end, which must give the same weights. Built
// against the installed package by the ctest test install.embedding, which also checks that it
// links no CUDA or MPI library.
#include <minidl/train/run.h>
#include <minidl/nn/safetensors.h>

#include <cstdio>
#include <string>

namespace train = minidl::train;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IMAGE_FOLDER WORK_DIR\n", argv[0]);
    return 2;
  }
  const std::string work = argv[2];
  try {
    train::TrainConfig c;   // the flags of minidl-train, as fields (docs/experiments.md)
    c.data = argv[1];       // a folder per class, Kaggle's flat train/ or PetImages/
    c.model = "smallcnn";
    c.image_size = 32;
    c.split = "24,8,0";     // images per class: train, validation, test
    c.batch_size = 16;
    c.lr = 0.05;
    c.momentum = 0.9;
    c.warmup_steps = 2;
    c.schedule = "cosine";
    c.amp = true;           // f16 convolutions and GEMMs with a gradient scaler, on the CPU too
    c.epochs = 3;
    c.seed = 1;
    c.quiet = true;

    c.save_weights = work + "/whole.safetensors";
    const train::RunResult whole = train::run_training(c);
    for (const train::EpochMetrics& e : whole.epochs)
      std::printf("epoch %lld: loss %.4f, val acc %.3f\n", static_cast<long long>(e.epoch), e.train_loss, e.val_acc);

    // The same run stopped after its first epoch and resumed from what it saved.
    c.epochs = 1;
    c.save_weights = work + "/first.safetensors";
    train::run_training(c);
    c.epochs = 3;
    c.resume = c.save_weights;
    c.save_weights = work + "/resumed.safetensors";
    const train::RunResult resumed = train::run_training(c);

    if (whole.status != "ok" || resumed.status != "ok") {
      std::fprintf(stderr, "FAILED: runs ended %s / %s: %s\n", whole.status.c_str(), resumed.status.c_str(),
                   (whole.note + resumed.note).c_str());
      return 1;
    }
    const auto a = minidl::nn::load_safetensors(work + "/whole.safetensors").tensors;
    const auto b = minidl::nn::load_safetensors(c.save_weights).tensors;
    for (const auto& [name, t] : a) {
      if (!minidl::allclose(t, b.at(name), 1e-5, 1e-6)) {
        std::fprintf(stderr, "FAILED: %s differs after resuming\n", name.c_str());
        return 1;
      }
    }
    std::printf("best val acc %.3f (epoch %lld), peak allocated %lld bytes, resumed from epoch %lld\n",
                whole.best_val_acc, static_cast<long long>(whole.best_epoch),
                static_cast<long long>(whole.peak_allocated), static_cast<long long>(resumed.first_epoch));
    std::printf("embedding example: OK\n");
    return 0;
  } catch (const minidl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
