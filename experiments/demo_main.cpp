// minidl-demo: trains the small CNN of nn/functional_cnn.h on the built-in synthetic two-class set
// and reports loss, accuracy, speed and peak memory per epoch: the quickest proof that tensors,
// kernels, autograd and the allocator work together. Exits 1 when the test accuracy misses its bar.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/thread_policy.h"
#include "data/synthetic.h"
#include "nn/functional_cnn.h"

namespace {

struct DemoOptions {
  int64_t epochs = 5;
  int64_t batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  uint64_t seed = 0;
  int64_t train_size = 2048;
  int64_t test_size = 512;
  int64_t image_size = 32;
  double difficulty = 0.6;
  double min_accuracy = 0.90;
};

void print_usage(const char* argv0) {
  const DemoOptions d;
  std::printf(
      "usage: %s [options]\n"
      "Trains a small CNN (conv-bn-relu-pool-conv-bn-relu-gap-linear) with SGD + momentum on the\n"
      "built-in synthetic two-class images and prints per-epoch loss, accuracy, images/s and peak\n"
      "memory. Exits 1 when the final test accuracy is below --min-accuracy.\n"
      "Threads: set OMP_NUM_THREADS.\n\n"
      "  --epochs N         training epochs (default %lld)\n"
      "  --batch-size N     images per step (default %lld)\n"
      "  --lr X             learning rate (default %g)\n"
      "  --momentum X       SGD momentum (default %g)\n"
      "  --weight-decay X   L2 weight decay (default %g)\n"
      "  --seed N           seed of the data, the initialisation and the shuffling (default %llu)\n"
      "  --train-size N     training images (default %lld)\n"
      "  --test-size N      test images (default %lld)\n"
      "  --image-size N     image height and width (default %lld)\n"
      "  --difficulty X     synthetic task difficulty in [0, 1] (default %g)\n"
      "  --min-accuracy X   test accuracy required for exit status 0 (default %g)\n"
      "  --help             this text\n",
      argv0, static_cast<long long>(d.epochs), static_cast<long long>(d.batch_size), d.lr, d.momentum,
      d.weight_decay, static_cast<unsigned long long>(d.seed), static_cast<long long>(d.train_size),
      static_cast<long long>(d.test_size), static_cast<long long>(d.image_size), d.difficulty, d.min_accuracy);
}

// Strict number parsing: a typo like "--lr 0.o5" must fail loudly, not train with 0.
double parse_number(std::string_view flag, const char* text) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "minidl-demo: %.*s expects a number, got '%s'\n", static_cast<int>(flag.size()),
                 flag.data(), text);
    std::exit(2);
  }
  return v;
}

int64_t parse_positive_int(std::string_view flag, const char* text) {
  const double v = parse_number(flag, text);
  if (v < 1 || v != static_cast<double>(static_cast<int64_t>(v))) {
    std::fprintf(stderr, "minidl-demo: %.*s expects a positive integer, got '%s'\n", static_cast<int>(flag.size()),
                 flag.data(), text);
    std::exit(2);
  }
  return static_cast<int64_t>(v);
}

DemoOptions parse_args(int argc, char** argv) {
  DemoOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      print_usage(argv[0]);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "minidl-demo: unknown flag or missing value: %s (see --help)\n", argv[i]);
      std::exit(2);
    }
    const char* value = argv[++i];
    if (flag == "--epochs") o.epochs = parse_positive_int(flag, value);
    else if (flag == "--batch-size") o.batch_size = parse_positive_int(flag, value);
    else if (flag == "--lr") o.lr = parse_number(flag, value);
    else if (flag == "--momentum") o.momentum = parse_number(flag, value);
    else if (flag == "--weight-decay") o.weight_decay = parse_number(flag, value);
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_number(flag, value));
    else if (flag == "--train-size") o.train_size = parse_positive_int(flag, value);
    else if (flag == "--test-size") o.test_size = parse_positive_int(flag, value);
    else if (flag == "--image-size") o.image_size = parse_positive_int(flag, value);
    else if (flag == "--difficulty") o.difficulty = parse_number(flag, value);
    else if (flag == "--min-accuracy") o.min_accuracy = parse_number(flag, value);
    else {
      std::fprintf(stderr, "minidl-demo: unknown flag %s (see --help)\n", argv[i - 1]);
      std::exit(2);
    }
  }
  return o;
}


int run(const DemoOptions& o) {
  using minidl::data::make_synthetic_images;
  const auto start = std::chrono::steady_clock::now();
  // Distinct seeds per stream, so the test set never shares images with the training set.
  const auto train = make_synthetic_images(o.train_size, o.image_size, o.seed * 4 + 1, o.difficulty);
  const auto test = make_synthetic_images(o.test_size, o.image_size, o.seed * 4 + 2, o.difficulty);
  minidl::Generator init_gen(o.seed * 4 + 3);
  minidl::Generator shuffle_gen(o.seed * 4 + 4);
  minidl::nn::SmallCnn model(minidl::nn::SmallCnnOptions{}, init_gen);
  std::printf("minidl-demo: small CNN (%lld parameters), synthetic %lldx%lld images, %lld train / %lld test, "
              "difficulty %g, batch %lld, lr %g, momentum %g, weight decay %g, seed %llu\n",
              static_cast<long long>(model.num_parameters()), static_cast<long long>(o.image_size),
              static_cast<long long>(o.image_size), static_cast<long long>(o.train_size),
              static_cast<long long>(o.test_size), o.difficulty, static_cast<long long>(o.batch_size), o.lr,
              o.momentum, o.weight_decay, static_cast<unsigned long long>(o.seed));
  // The peak figures below include these in-memory sets; print their size so the step's share is clear.
  const size_t data_bytes = train.images.nbytes() + train.labels.nbytes() + test.images.nbytes() + test.labels.nbytes();
  std::printf("minidl-demo: the synthetic sets hold %s (generated in %.2f s)\n", minidl::format_bytes(data_bytes).c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());

  const minidl::nn::TrainOptions topts{o.batch_size, o.lr, o.momentum, o.weight_decay};
  std::vector<minidl::Tensor> velocities;
  double test_acc = 0.0;
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    minidl::reset_peak_stats();
    const auto r = minidl::nn::train_epoch(model, train.images, train.labels, topts, velocities, shuffle_gen);
    const int64_t peak = minidl::memory_stats().peak_allocated_bytes;
    test_acc = minidl::nn::evaluate_accuracy(model, test.images, test.labels, o.batch_size);
    std::printf("epoch %lld/%lld  loss %.4f  train acc %.2f%%  test acc %.2f%%  %.0f images/s  peak allocated %s\n",
                static_cast<long long>(epoch), static_cast<long long>(o.epochs), r.mean_loss, 100.0 * r.accuracy,
                100.0 * test_acc, static_cast<double>(r.images) / r.seconds,
                minidl::format_bytes(static_cast<size_t>(peak)).c_str());
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const bool ok = test_acc >= o.min_accuracy;
  std::printf("final test accuracy %.2f%% (required >= %.2f%%): %s, total %.1f s\n", 100.0 * test_acc,
              100.0 * o.min_accuracy, ok ? "PASS" : "FAIL", total);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  minidl::apply_thread_policy(argv);   // OpenMP threads wait passively unless the user chose (core/thread_policy.h)
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl-demo: error: %s\n", e.what());
    return 2;
  }
}
