// Sweep execution (see sweep.h): runs what results.csv does not hold yet, one row per run.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "distributed/process_group.h"
#include "train/eta.h"
#include "train/graphed_step.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"

extern char** environ;

namespace minidl::harness {
namespace {

std::string mib(int64_t b) { return fmt(static_cast<double>(b) / (1024.0 * 1024.0), 1); }

// Images/s of each phase of a batch schedule (consecutive epochs with the same effective batch),
// "16: 5120.3; 64: 6011.0"; one phase without a schedule.
std::string phase_rates(const RunResult& r) {
  std::string out;
  for (size_t i = 0; i < r.epochs.size();) {
    const int64_t eff = r.epochs[i].batch_size * r.epochs[i].accumulation_steps;
    double imgs = 0, secs = 0;
    for (; i < r.epochs.size() && r.epochs[i].batch_size * r.epochs[i].accumulation_steps == eff; ++i) {
      imgs += static_cast<double>(r.epochs[i].images);
      secs += r.epochs[i].train_seconds;
    }
    out += (out.empty() ? "" : "; ") + std::to_string(eff) + ": " + fmt(secs > 0 ? imgs / secs : 0.0, 1);
  }
  return out;
}

// One results.csv row; `res` may be empty (skipped or failed runs).
Row make_row(const Study& st, const SweepRun& run, const TrainConfig& c, const RunResult* res,
             const std::string& status, const std::string& note, int64_t max_batch, int64_t predicted,
             int64_t dry_max_batch = 0) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double epoch_s = nan, ips = nan, cpu = nan, gpu = nan;
  if (res && !res->epochs.empty()) {
    epoch_s = res->train_seconds / static_cast<double>(res->epochs.size());
    ips = res->mean_images_per_second();
    cpu = 0;
    for (const auto& e : res->epochs) cpu += e.cpu_utilization;
    cpu = 100 * cpu / static_cast<double>(res->epochs.size());
    double busy = 0;
    int n = 0;
    for (const auto& e : res->epochs)
      if (std::isfinite(e.gpu_busy)) busy += e.gpu_busy, ++n;
    if (n > 0) gpu = 100 * busy / n;
  }
  const bool ok = res && (status == "ok" || status == "diverged");
  return {run.id,
          st.name,
          run.group,
          run.technique,
          c.model,
          std::to_string(c.resolved_image_size()),
          std::to_string(c.batch_size),
          std::to_string(c.accumulation_steps),
          std::to_string(c.effective_batch()),
          c.optimizer,
          fmt(res ? res->lr : c.scaled_lr(), 6),
          c.lr_scaling,
          std::to_string(res ? res->warmup_steps : c.warmup_steps),
          c.augment,
          c.checkpoint,
          c.amp ? (c.amp_dtype == "bf16" ? "bf16" : "on") : "off",
          c.cudnn_benchmark,
          c.memory_budget,
          status,
          note,
          std::to_string(res ? res->epochs.size() : 0),
          std::to_string(res ? res->steps : 0),
          fmt(res && !res->epochs.empty() ? res->epochs.back().train_loss : nan),
          fmt(ok && !run.throughput_only ? res->best_val_acc : nan),
          ok && !run.throughput_only && res->best_epoch > 0 ? std::to_string(res->best_epoch) : "",
          fmt(ok && !run.throughput_only ? res->test_acc : nan),
          res && res->time_to_target >= 0 ? fmt(res->time_to_target, 2) : "",
          fmt(epoch_s, 3),
          fmt(ips, 1),
          fmt(cpu, 1),
          fmt(gpu, 1),  // NVML, else CUDA events; CUDA devices only
          res && !res->epochs.empty() ? res->epochs.front().gpu_busy_source : "",
          res ? mib(res->peak_allocated) : "",
          res ? mib(res->peak_reserved) : "",
          max_batch > 0 ? std::to_string(max_batch) : "",
          predicted > 0 ? std::to_string(predicted) : "",
          res ? fmt(res->total_seconds, 1) : "",
          fmt(res ? res->steady_images_per_second() : nan, 1),
          c.schedule,
          c.batch_schedule,
          res ? fmt(res->train_seconds, 2) : "",
          res ? phase_rates(*res) : "",
          std::to_string(c.world_size),
          std::to_string(c.batch_size),
          dry_max_batch > 0 ? std::to_string(dry_max_batch) : ""};
}

struct Executed {
  Row row;
  nlohmann::json json;
  bool interrupted = false;
};

// Under mpirun, after each run: whether any rank's run failed, and how ("oom\t<message>" or
// "error\t<message>", "" when none did), the lowest failing rank's on every rank, so all of them
// write (rank 0) or skip the same row and go on to the next run together. A rank that failed waits
// at most kAgreeSeconds for the others: when they do not come (it failed alone, the others are
// still inside the run's collectives) it ends the job, as before this agreement, never a hang.
constexpr double kAgreeSeconds = 60.0;

std::string agree_on_failure(distributed::ProcessGroup& g, const std::string& local) {
  Tensor who = scalar_tensor(local.empty() ? g.world_size() : g.rank(), {.dtype = DType::f64});
  const auto work = g.allreduce_async(who, distributed::ReduceOp::Min);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kAgreeSeconds);
  while (!local.empty() && !work->test()) {
    if (std::chrono::steady_clock::now() > deadline)
      g.abort("minidl-sweep: error: " + local.substr(local.find('\t') + 1) + " (this rank alone: the others did "
              "not reach the end of the run within " + std::to_string(static_cast<int>(kAgreeSeconds)) + " s)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  work->wait();
  const auto root = static_cast<int>(who.item());
  if (root >= g.world_size()) return "";
  Tensor n = scalar_tensor(g.rank() == root ? static_cast<double>(local.size()) : 0.0, {.dtype = DType::f64});
  g.allreduce(n, distributed::ReduceOp::Max);
  Tensor text = zeros({static_cast<int64_t>(n.item())}, {.dtype = DType::u8});
  if (g.rank() == root) std::copy(local.begin(), local.end(), text.data<uint8_t>());
  if (text.numel() > 0) g.broadcast(text, root);
  std::string msg(text.data<uint8_t>(), text.data<uint8_t>() + text.numel());
  if (root != 0) msg.insert(msg.find('\t') + 1, "rank " + std::to_string(root) + ": ");
  return msg;
}

Executed execute(const Study& st, const SweepRun& run, bool verbose, bool distributed) {
  Executed ex;
  TrainConfig c = run.config;
  c.quiet = !verbose;
  ex.json = {{"id", run.id}, {"group", run.group}, {"technique", run.technique}, {"config", to_json(c)}};
  if (!run.unavailable.empty()) {
    ex.row = make_row(st, run, c, nullptr, "unavailable", run.unavailable, 0, 0);
    ex.json["status"] = "unavailable";
    ex.json["note"] = run.unavailable;
    return ex;
  }
  int64_t max_batch = 0, predicted = 0, dry = 0;   // effective batches: the answer, the linear model's, the dry run's
  std::string failure;   // "<status>\t<note>" of a run that threw
  try {
    if (run.find_max_batch) {
      const MaxBatchReport rep = run_maxbatch(c, st.maxbatch, verbose);
      if (stop_requested()) {  // SIGINT during the search: no training run just to throw it away
        ex.interrupted = true;
        return ex;
      }
      ex.json["maxbatch"] = rep.json;
      if (rep.finder.max_batch == 0) {
        ex.row = make_row(st, run, c, nullptr, "oom", "not even batch 1 fits the budget", 0, rep.finder.predicted);
        ex.json["status"] = "oom";
        return ex;
      }
      // Train at the recommended batch: the maximum is already the run's (the finder's trials hold
      // what the run holds), and the margin below it leaves room for what no trial sees.
      c.batch_size = std::max<int64_t>(1, rep.recommended);
      c.batch_up_to_data = true;   // a memory bound: over the training set, the run trains on all of it
      // The effective batch: per device x accumulation x ranks.
      max_batch = rep.finder.max_batch * c.accumulation_steps * c.world_size;
      predicted = rep.finder.predicted * c.accumulation_steps * c.world_size;
      dry = rep.finder.dry_max_batch * c.accumulation_steps * c.world_size;
    }
    const RunResult res = run_training(c);
    ex.interrupted = res.status == "interrupted";
    ex.row = make_row(st, run, c, &res, res.status, res.note, max_batch, predicted, dry);
    ex.json["result"] = to_json(res);
    ex.json["status"] = res.status;
  } catch (const RunInputError& e) {
    failure = "error\t" + user_message(e, c.verbose);   // this run's weights file: the others go on
  } catch (const UsageError&) {
    throw;
  } catch (const Interrupted&) {
    ex.interrupted = true;  // not a result: the rerun starts this run again
  } catch (const std::exception& e) {
    // In one process an out-of-memory run is caught inside run_training (status oom); with several
    // ranks it leaves it, so that no rank steps on alone, and is agreed below like any failure.
    const std::string status = dynamic_cast<const OutOfMemoryError*>(&e) ? "oom" : "error";
    failure = status + "\t" + user_message(e, c.verbose);
  }
  if (distributed) failure = agree_on_failure(distributed::world(), failure);
  if (!failure.empty()) {
    const std::string status = failure.substr(0, failure.find('\t')), note = failure.substr(failure.find('\t') + 1);
    ex.row = make_row(st, run, c, nullptr, status, note, max_batch, predicted, dry);
    ex.json.erase("result");
    ex.json["status"] = status;
    ex.json["note"] = note;
    ex.interrupted = false;
  }
  return ex;
}

std::set<std::string> done_ids(const std::filesystem::path& csv) {
  std::set<std::string> ids;
  const CsvTable t = read_csv(csv);
  for (size_t i = 0; i < t.rows.size(); ++i) ids.insert(t.get(i, "run_id"));
  return ids;
}

// Ids whose row says the run failed to produce a result (--retry-failed reruns them): `error` (an
// exception), `crashed` (a --process-per-run child died), or `oom` at the recommended batch of a
// maximum-batch search. Diverged rows and other oom rows are results.
std::set<std::string> failed_ids(const std::filesystem::path& csv) {
  std::set<std::string> ids;
  const CsvTable t = read_csv(csv);
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const std::string status = t.get(i, "status");
    // An OOM where the run trained at minidl-maxbatch's recommended batch is the answer's failure,
    // not the configuration's result: a run that trains at a batch it chose itself must fit.
    const bool answer_failed = status == "oom" && !t.get(i, "max_batch").empty();
    if (status == "error" || status == "crashed" || answer_failed) ids.insert(t.get(i, "run_id"));
  }
  return ids;
}

// The row of `id` as it is in the file ("" when none): tells whether a child replaced it.
std::string row_text(const std::filesystem::path& csv, const std::string& id) {
  const CsvTable t = read_csv(csv);
  for (size_t i = 0; i < t.rows.size(); ++i)
    if (t.get(i, "run_id") == id) return csv_line(t.rows[i]);
  return "";
}

// Runs one id in a child process (this program with --only ID) and waits for it.
int spawn_child(const std::vector<std::string>& argv, const std::string& id) {
  std::vector<std::string> args = argv;
  args.push_back("--only");
  args.push_back(id);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargs.data(), environ) != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

ChildVerdict child_verdict(int rc, bool stopped, bool wrote) {
  ChildVerdict v;
  if (rc == 130 || stopped) {   // the child's row, if it wrote one before the interrupt, is a result
    v.ran = wrote;
    v.stop = true;
    return v;
  }
  v.ran = true;
  v.record_crash = rc != 0 && !wrote;   // it died without writing its row: record it, move on
  return v;
}

const Row& results_header() {
  static const Row h{"run_id",        "study",          "group",         "technique",          "model",
                     "image_size",    "batch_size",     "accumulation",  "effective_batch",    "optimizer",
                     "lr",            "lr_scaling",     "warmup_steps",  "augment",            "checkpoint",
                     "amp",           "cudnn_benchmark", "memory_budget", "status",            "note",
                     "epochs",        "steps",          "train_loss",    "best_val_acc",       "best_epoch",
                     "test_acc",      "time_to_target_s", "epoch_seconds", "images_per_s",     "cpu_util_pct",
                     "gpu_busy_pct",  "gpu_busy_source", "peak_allocated_mib", "peak_reserved_mib", "max_batch",  "predicted_max_batch",
                     "seconds",       "images_per_s_steady", "schedule", "batch_schedule", "train_seconds",
                     "images_per_s_phases", "world_size", "per_device_batch",
                     "dry_run_max_batch"};   // new columns go last: older files are upgraded
  return h;
}

SweepOutcome run_sweep(const Study& st, const SweepOptions& o) {
  SweepOutcome out;
  const auto csv = o.out / "results.csv";
  const auto jsonl = o.out / "runs.jsonl";
  // Several ranks (mpirun): every rank trains every run together; rank 0 alone prints and writes.
  const int64_t world = st.runs.empty() ? 1 : st.runs.front().config.world_size;
  distributed::ProcessGroup* group = world > 1 ? &distributed::world() : nullptr;
  const bool lead = group == nullptr || group->rank() == 0;
  if (group && o.process_per_run)
    throw UsageError("--process-per-run under mpirun: the ranks are the processes; drop --process-per-run");
  if (lead) check_writable("--out", csv);   // creates the folder; a read-only one stops here, not after a run
  std::set<std::string> done = done_ids(csv);
  const std::set<std::string> retry = o.retry_failed ? failed_ids(csv) : std::set<std::string>{};
  for (const auto& id : retry) done.erase(id);
  // A retried run replaces its failed row in place (the others stay as they are); a new one is appended.
  const auto record = [&](const std::string& id, const Row& row) {
    if (retry.count(id)) replace_csv_row(csv, results_header(), "run_id", row);
    else append_csv_row(csv, results_header(), row);
  };
  // --cuda-graphs refuses a non-CUDA device: before the first run, not after hours of the runs before it.
  for (const SweepRun& run : st.runs) {
    if (!run.config.cuda_graphs.value_or(false)) continue;
    try {
      check_cuda_graphs(run.config);
    } catch (const UsageError& e) {
      throw UsageError("run " + run.id + " of " + st.name + ": " + e.what());
    }
  }
  bool found_only = o.only.empty();
  // The plan first; then "run k/N" and an ETA from the runs finished so far in this session.
  int to_do = 0;
  for (const SweepRun& run : st.runs)
    if ((o.only.empty() || run.id == o.only) && !done.count(run.id)) ++to_do;
  if (group) group->check_same("the number of runs to do (read from " + csv.string() + ")", to_do);
  if (o.verbose && o.only.empty()) std::printf("%s\n", study_plan(st, done).c_str()), std::fflush(stdout);
  int k = 0;
  SweepEtaOf<SweepRun> eta;
  std::vector<const SweepRun*> left;
  for (const SweepRun& run : st.runs)
    if ((o.only.empty() || run.id == o.only) && !done.count(run.id)) left.push_back(&run);
  for (const SweepRun& run : st.runs) {
    if (!o.only.empty() && run.id != o.only) continue;
    found_only = true;
    if (done.count(run.id)) {
      ++out.done_before;
      continue;
    }
    if (group ? group->any(stop_requested()) : stop_requested()) {
      out.interrupted = true;
      break;
    }
    ++k;
    if (o.verbose) {
      const double secs = eta.seconds_for({left.begin() + (k - 1), left.end()});
      const std::string eta_text = secs > 0 ? ", ETA " + format_duration(secs) : "";
      if (o.only.empty())
        std::printf("== %s / %s (run %d/%d%s)\n", st.name.c_str(), run.id.c_str(), k, to_do, eta_text.c_str());
      else
        std::printf("== %s / %s\n", st.name.c_str(), run.id.c_str());
      std::fflush(stdout);
    }
    const auto t_run = std::chrono::steady_clock::now();
    const auto run_done = [&] {
      eta.finished(run, std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count());
    };
    // A run with --expandable-segments starts its device's allocator in that mode: a process of its own.
    const bool own_process = run.config.expandable_segments && run.unavailable.empty() && !group;
    if ((o.process_per_run || own_process) && o.only.empty()) {
      const std::string before = row_text(csv, run.id);   // a failed row being retried, else ""
      const int rc = spawn_child(o.argv, run.id);
      const ChildVerdict v = child_verdict(rc, stop_requested(), row_text(csv, run.id) != before);
      if (v.record_crash)
        record(run.id, make_row(st, run, run.config, nullptr, "crashed", "child exit status " + std::to_string(rc), 0, 0));
      if (v.ran) {
        ++out.ran;
        out.retried += retry.count(run.id) ? 1 : 0;
        run_done();
      }
      if (v.stop) {
        out.interrupted = true;
        break;
      }
      continue;
    }
    Executed ex = execute(st, run, o.verbose, group != nullptr);
    if (ex.interrupted) {
      // A partial run is not a result: the rerun starts it again.
      out.interrupted = true;
      break;
    }
    // runs.jsonl first: results.csv is the commit point that marks the run done.
    if (lead) {
      append_line(jsonl, ex.json.dump());
      record(run.id, ex.row);
    }
    run_done();
    ++out.ran;
    out.retried += retry.count(run.id) ? 1 : 0;
  }
  if (!found_only) throw UsageError("--only " + o.only + ": no such run in " + st.name);
  if (o.only.empty() && lead) out.plot_note = write_study_outputs(st, o.out);
  if (group) group->barrier();   // the files are complete before any rank exits
  return out;
}

}  // namespace minidl::harness
