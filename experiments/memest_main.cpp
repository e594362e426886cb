// minidl-memest: estimated vs measured training memory per batch size (see docs/experiments.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "experiments/harness/config.h"
#include "experiments/harness/memest.h"
#include "experiments/harness/results.h"
#include "experiments/harness/train.h"

using namespace minidl::harness;

int main(int argc, char** argv) {
  TrainConfig c;
  std::string batches = "1,4,16,64";
  CLI::App app{"minidl-memest: parameters + gradients + optimizer state + activations + workspace vs measured peak"};
  add_config_flag(app);
  add_train_flags(app, c);
  app.get_option("--out")->description("folder for memest.json and memest.md; empty: print only");
  app.add_option("--batch-sizes", batches, "comma-separated batch sizes to estimate and measure");
  if (const int rc = parse_command_line(app, argc, argv, "minidl-memest"); rc >= 0) return rc;
  try {
    const auto bs = parse_int_list("--batch-sizes", batches);
    MemoryModelInputs in;
    const auto rows = run_memest(c, bs, &in);
    std::printf("%s at %lld px, %s: %.1f MiB of parameters, optimizer state x%.0f, %.1f KiB saved for backward "
                "per sample (model summary), largest layer output %.1f KiB per sample\n\n",
                c.model.c_str(), static_cast<long long>(c.resolved_image_size()), c.optimizer.c_str(),
                static_cast<double>(in.parameter_bytes) / (1 << 20), in.optimizer_state_factor,
                static_cast<double>(in.activation_bytes_per_sample) / 1024.0,
                static_cast<double>(in.largest_output_bytes_per_sample) / 1024.0);
    const std::string table = memest_table(rows);
    std::printf("%s", table.c_str());
    if (!c.out.empty()) {
      nlohmann::json j = provenance(device_description(resolve_device(c.device)));
      j["program"] = "minidl-memest";
      j["config"] = to_json(c);
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& r : rows)
        arr.push_back({{"batch", r.estimate.batch},
                       {"parameters", r.estimate.parameters},
                       {"gradients", r.estimate.gradients},
                       {"optimizer_state", r.estimate.optimizer_state},
                       {"activations", r.estimate.activations},
                       {"workspace", r.estimate.workspace},
                       {"estimate", r.estimate.total()},
                       {"measured_peak", r.measured_peak},
                       {"error_pct", r.error_pct()}});
      j["rows"] = arr;
      const std::filesystem::path out(c.out);
      write_file_atomic(out / "memest.json", j.dump(2) + "\n");
      write_file_atomic(out / "memest.md", table);
      std::printf("wrote %s and %s\n", (out / "memest.json").c_str(), (out / "memest.md").c_str());
    }
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "minidl-memest: error: %s\n", user_message(e, c.verbose).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl-memest: error: %s\n", user_message(e, c.verbose).c_str());
    return 1;
  }
}
