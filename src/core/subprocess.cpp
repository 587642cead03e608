#include "core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace amsp {
namespace {

bool launcher_variable(const char* entry) {
  static const char* const kPrefixes[] = {"PMI_",      "PMIX_",        "HYDRA_",        "MPIR_",
                                          "OMPI_",     "I_MPI_",       "MPICH_",        "SLURM_STEP",
                                          "SLURM_PROCID=", "SLURM_LOCALID=", "SLURM_NODEID=", "SLURM_TASK_PID="};
  for (const char* p : kPrefixes)
    if (std::strncmp(entry, p, std::strlen(p)) == 0) return true;
  return false;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    default: return nullptr;
  }
}

}  // namespace

std::string ChildResult::describe(double timeout_s) const {
  if (timed_out) return cat("no answer within ", timeout_s, " s");
  if (signal) {
    const char* name = signal_name(signal);
    return name ? cat("killed by ", name) : cat("killed by signal ", signal);
  }
  return cat("exit ", exit_code);
}

std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("cannot find this executable's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

ChildResult run_child(const std::vector<std::string>& argv, double timeout_s) {
  if (argv.empty()) fail("run_child: no command");
  char out_path[] = "/tmp/amsp-child-XXXXXX";
  const int out_fd = ::mkstemp(out_path);
  if (out_fd < 0) fail("run_child: cannot create a temporary file in /tmp: ", std::strerror(errno));
  ::unlink(out_path);

  std::vector<char*> args, env;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (char** e = environ; *e; ++e)
    if (!launcher_variable(*e)) env.push_back(*e);
  env.push_back(nullptr);

  // fork + exec rather than posix_spawn, for what must happen in between: the
  // child dies with this process (PR_SET_PDEATHSIG), so that killing a job or
  // a test never leaves a checker spinning on a damaged file; it gets its own
  // process group (killed whole at the deadline) and default signal handling
  // (it does not inherit the trainer's stop handlers). Only async-signal-safe
  // calls run between fork and exec.
  const pid_t parent = ::getpid();
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out_fd);
    fail("cannot run ", argv[0], ": fork failed: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(out_fd, 2);
    ::execve(args[0], args.data(), env.data());
    ::_exit(127);
  }
  if (null_fd >= 0) ::close(null_fd);

  ChildResult r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) fail("run_child: waitpid failed: ", std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);

  const off_t size = ::lseek(out_fd, 0, SEEK_END);
  const off_t keep = std::min<off_t>(size, 64 * 1024);
  r.output.resize(static_cast<size_t>(std::max<off_t>(keep, 0)));
  if (keep > 0 && ::pread(out_fd, r.output.data(), static_cast<size_t>(keep), size - keep) != keep)
    r.output.clear();
  ::close(out_fd);
  return r;
}

}  // namespace amsp
