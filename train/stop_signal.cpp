// The stop request behind SIGINT and SIGTERM (run.h): the handler sets a flag that the training
// loop, the sweep and the max-batch finder poll at step boundaries, so a stopped run still saves
// and writes what it has. Kept apart from the loop: it is process state, not training.
#include <atomic>
#include <csignal>
#include <cstdlib>

#include "train/run.h"

namespace minidl::train {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{SIGINT};   // the signal that asked to stop, for the run's note

extern "C" void on_sigint(int sig) {
  g_signal.store(sig);
  if (g_stop.exchange(true)) std::_Exit(128 + sig);  // the second Ctrl-C does not wait
}

}  // namespace

void install_sigint_handler() {
  // SIGTERM (kill, a scheduler's time limit, mpirun passing one on) stops at the next step
  // boundary as Ctrl-C does: the run still saves and writes what it has.
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported like a full disk,
  // instead of killing the process in the middle of it.
  std::signal(SIGXFSZ, SIG_IGN);
}

bool stop_requested() { return g_stop.load(); }
void request_stop() { g_stop.store(true); }
void clear_stop() { g_stop.store(false); }
const char* stop_signal_name() { return g_signal.load() == SIGTERM ? "SIGTERM" : "SIGINT"; }

}  // namespace minidl::train
