// Data-layer benchmarks: images/s of decode + RandomResizedCrop 224 + flip + normalize on the real
// cats-vs-dogs photos, through the whole Loader (from files and from the RAM cache) at 1-16
// workers, plus the decode and transform stages alone. bench/pytorch_loader.py is the PyTorch
// DataLoader baseline with the same transforms and worker counts.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>

#include "data/dataset.h"
#include "data/decode.h"
#include "data/loader.h"
#include "data/transform.h"

namespace minidl::data {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// MINIDL_BENCH_PHOTOS, else ../shared/data/catsdogs beside the source tree.
fs::path photos_dir() {
  if (const char* env = std::getenv("MINIDL_BENCH_PHOTOS")) return env;
  return fs::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
}

// MINIDL_BENCH_IMAGES photos (default 400: 200 per class, a few seconds per epoch on one core).
std::shared_ptr<const Dataset> photos() {
  static std::shared_ptr<const Dataset> ds = [] {
    const fs::path dir = photos_dir();
    if (!fs::is_directory(dir)) return std::shared_ptr<const Dataset>();
    const auto all = open_image_folder(dir);
    const int64_t want = std::getenv("MINIDL_BENCH_IMAGES") ? std::atoll(std::getenv("MINIDL_BENCH_IMAGES")) : 400;
    if (want <= 0 || want >= all->size()) return std::shared_ptr<const Dataset>(all);
    const Split s = split_by_counts(*all, want / static_cast<int64_t>(all->class_names().size()), 0, 0, 0);
    return std::shared_ptr<const Dataset>(subset(all, s.train));
  }();
  return ds;
}

LoaderOptions rrc_options(int workers, bool cache) {
  LoaderOptions o;
  o.batch_size = 32;
  o.workers = workers;
  o.cache = cache;
  o.transform.size = 224;
  o.transform.augment = Augment::RandomResizedCrop;
  o.transform.hflip = true;
  o.transform.normalize = true;
  return o;
}

// One epoch of the photos per iteration, images/s over wall time; with the cache, one epoch first
// fills it outside the timing.
void time_epochs(benchmark::State& state, const LoaderOptions& o) {
  const auto ds = photos();
  if (!ds) {
    state.SkipWithError(("no photos at " + photos_dir().string() + " (set MINIDL_BENCH_PHOTOS)").c_str());
    return;
  }
  Loader l(ds, o);
  int64_t epoch = 0;
  if (o.cache) {
    l.start_epoch(epoch++);
    while (l.next()) {
    }
  }
  int64_t images = 0;
  for (auto _ : state) {
    l.start_epoch(epoch++);
    while (auto b = l.next()) {
      images += b->labels.size(0);
      benchmark::DoNotOptimize(b->images.data_ptr());
    }
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(images), benchmark::Counter::kIsRate);
  state.counters["workers"] = static_cast<double>(o.workers);
  state.counters["skipped"] = static_cast<double>(l.stats().skipped);
}

void BM_loader(benchmark::State& state, bool cache) {
  time_epochs(state, rrc_options(static_cast<int>(state.range(0)), cache));
}
void BM_loader_files(benchmark::State& state) { BM_loader(state, false); }
void BM_loader_cache(benchmark::State& state) { BM_loader(state, true); }
BENCHMARK(BM_loader_files)->ArgName("workers")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_loader_cache)->ArgName("workers")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

// The keras-batch study's training loader (--data-cache): photos squashed to 200 px once and kept,
// then each epoch only converted (1/255, f32, NCHW) into batches of 16 and of 256, the study's
// smallest and largest. What is left per image once decoding is cached: the loader's ceiling for a
// model faster than it (a small CNN on a GPU), and whether a batch's own cost lowers it when
// batches are small.
void BM_loader_cached_keras(benchmark::State& state) {
  LoaderOptions o;
  o.batch_size = state.range(1);
  o.workers = static_cast<int>(state.range(0));
  o.cache = true;
  o.transform.size = 200;
  o.transform.fit = Fit::Squash;
  o.transform.interpolation = Interpolation::Nearest;
  o.transform.normalize = false;
  time_epochs(state, o);
}
BENCHMARK(BM_loader_cached_keras)
    ->ArgNames({"workers", "batch"})
    ->ArgsProduct({{1, 2, 4, 14}, {16, 256}})
    ->Iterations(5)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// What the one assembler thread does per image of that loader: it converted each sample (u8 HWC
// to f32 NCHW, 1/255) into the batch until the workers did it; now it copies the converted sample.
// Its images/s bound the whole loader, whatever the worker count.
void BM_assemble_sample(benchmark::State& state, bool convert) {
  TransformOptions t;
  t.size = 200;
  t.normalize = false;
  const BatchWriter writer(t, DType::f32, false);
  const auto n = static_cast<size_t>(writer.sample_bytes());
  std::vector<uint8_t> hwc(static_cast<size_t>(200 * 200 * 3), 7), sample(n, 1);
  std::vector<uint8_t> batch(n * 64);   // a batch of 64, written slot after slot as the assembler does
  int64_t k = 0;
  for (auto _ : state) {
    if (convert) {
      writer.write(hwc.data(), batch.data(), k % 64);
    } else {
      std::memcpy(batch.data() + static_cast<size_t>(k % 64) * n, sample.data(), n);
    }
    benchmark::DoNotOptimize(batch.data());
    ++k;
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
void BM_assemble_convert(benchmark::State& state) { BM_assemble_sample(state, true); }
void BM_assemble_copy(benchmark::State& state) { BM_assemble_sample(state, false); }
BENCHMARK(BM_assemble_convert)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_assemble_copy)->Unit(benchmark::kMicrosecond);

// The stages on one thread: read + decode a photo; RandomResizedCrop 224 + flip of a decoded one.
void BM_decode(benchmark::State& state) {
  const auto ds = photos();
  if (!ds) {
    state.SkipWithError("no photos");
    return;
  }
  std::vector<std::vector<uint8_t>> files;
  for (int64_t i = 0; i < std::min<int64_t>(ds->size(), 64); ++i) files.push_back(read_bytes(ds->describe(i)));
  size_t k = 0;
  for (auto _ : state) {
    const auto& f = files[k++ % files.size()];
    DecodeResult r = decode_image(f.data(), f.size());
    benchmark::DoNotOptimize(r.image->pixels.data());
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_decode)->Unit(benchmark::kMicrosecond);

void BM_rrc_flip(benchmark::State& state) {
  const auto ds = photos();
  if (!ds) {
    state.SkipWithError("no photos");
    return;
  }
  std::vector<Image> imgs;
  for (int64_t i = 0; i < std::min<int64_t>(ds->size(), 64); ++i) imgs.push_back(*ds->load(i));
  const TransformOptions t = rrc_options(1, false).transform;
  std::vector<uint8_t> out(static_cast<size_t>(224 * 224 * 3));
  const BatchWriter writer(t, DType::f32, false);
  std::vector<float> batch(static_cast<size_t>(3 * 224 * 224));
  int64_t k = 0;
  for (auto _ : state) {
    apply_transform(imgs[static_cast<size_t>(k % static_cast<int64_t>(imgs.size()))], t, 1, k, out.data());
    writer.write(out.data(), batch.data(), 0);
    benchmark::DoNotOptimize(batch.data());
    ++k;
  }
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_rrc_flip)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace minidl::data
BENCHMARK_MAIN();
