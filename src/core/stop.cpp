#include "core/stop.h"

#include <signal.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace amsp::stop {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }

}  // namespace

void install() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int requested() { return g_signal; }

const char* signal_name(int sig) {
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGTERM) return "SIGTERM";
  return "no signal";
}

void announce_ready(bool root) {
  const char* path = std::getenv("AMSP_READY_FILE");
  if (!root || !path || !*path) return;
  std::ofstream out(path);
  out << "ready\n";
  if (!out) std::fprintf(stderr, "amsp: warning: AMSP_READY_FILE=%s: cannot create the file\n", path);
}

}  // namespace amsp::stop
