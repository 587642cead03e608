#include "ckpt/lock.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace amsp::ckpt {
namespace fs = std::filesystem;
namespace {

int64_t now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string to_json(const LockHolder& h) {
  return nlohmann::json{{"host", h.host},       {"pid", h.pid}, {"slurm_job", h.slurm_job},
                        {"started", h.started}, {"lease_until", h.lease_until}}
      .dump();
}

// The holder named in a lock file; nullopt if it is missing (ENOENT) or garbled
// (*garbled set).
// The lock file's bytes, or nullopt when there is none.
std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<LockHolder> holder_from_text(const std::optional<std::string>& text, bool* garbled) {
  *garbled = false;
  if (!text) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(*text);
    LockHolder h;
    h.host = j.at("host").get<std::string>();
    h.pid = j.at("pid").get<int64_t>();
    h.slurm_job = j.at("slurm_job").get<std::string>();
    h.started = j.at("started").get<int64_t>();
    h.lease_until = j.at("lease_until").get<int64_t>();
    return h;
  } catch (const std::exception&) {
    *garbled = true;
    return std::nullopt;
  }
}

std::optional<LockHolder> read_holder(const std::string& path, bool* garbled) {
  return holder_from_text(read_text(path), garbled);
}

// A complete file at a unique name, for link() or rename() into place.
std::string write_candidate(const std::string& dir, const LockHolder& h) {
  const std::string tmp = cat(dir, "/.lock.", h.host, ".", h.pid, ".", now(), ".tmp");
  std::ofstream out(tmp, std::ios::trunc);
  out << to_json(h) << "\n";
  out.flush();
  if (!out) fail("--checkpoint-dir ", dir, ": cannot write ", tmp);
  return tmp;
}

// When process pid started, in unix seconds (from /proc: its start in clock
// ticks after boot, and the boot time); -1 if unknown.
int64_t process_start(int64_t pid) {
  std::ifstream stat(cat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return -1;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i)
    if (i == 22) {
      std::ifstream boot("/proc/stat");
      std::string key;
      int64_t btime = -1;
      while (boot >> key)
        if (key == "btime" && boot >> btime) break;
      const long hz = ::sysconf(_SC_CLK_TCK);
      return btime < 0 || hz <= 0 ? -1 : btime + std::stoll(f) / hz;
    }
  return -1;
}

// The holder's process still runs: pid exists, is not a zombie (a killed
// process whose parent has not reaped it yet still answers kill(pid, 0)), and
// did not start after the lock was taken (then the pid was reused).
bool holder_alive(const LockHolder& h) {
  if (h.pid <= 0 || (::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH)) return false;
  std::ifstream stat(cat("/proc/", h.pid, "/stat"));
  std::string line;
  if (std::getline(stat, line)) {
    const size_t close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') return false;
  }
  const int64_t started = process_start(h.pid);
  return started < 0 || started <= h.started + 1;
}

bool same_holder(const LockHolder& a, const LockHolder& b) {
  return a.host == b.host && a.pid == b.pid && a.started == b.started;
}

// Why `old` may be taken over by `me`, or "" if it may not.
std::string takeover_reason(const LockHolder& old, const LockHolder& me) {
  if (!me.slurm_job.empty() && old.slurm_job == me.slurm_job)
    return cat("took back the lock of an earlier attempt of Slurm job ", me.slurm_job, " (", old.describe(), ")");
  if (old.host == me.host && !holder_alive(old))
    return cat("took over the lock of ", old.describe(), ", which is gone");
  if (old.lease_until < now())
    return cat("took over the lock of ", old.describe(), ", whose lease expired ", now() - old.lease_until, " s ago");
  return "";
}

}  // namespace

LockHolder LockHolder::self() {
  LockHolder h;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  h.host = host;
  h.pid = ::getpid();
  h.slurm_job = env("SLURM_ARRAY_JOB_ID").empty() ? env("SLURM_JOB_ID")
                                                  : env("SLURM_ARRAY_JOB_ID") + "_" + env("SLURM_ARRAY_TASK_ID");
  h.started = now();
  return h;
}

std::string LockHolder::describe() const {
  return cat("pid ", pid, " on host ", host, slurm_job.empty() ? std::string() : cat(" (Slurm job ", slurm_job, ")"));
}

DirLock::DirLock(const std::string& dir, LockHolder me, int64_t lease_s, std::string* message)
    : dir_(dir), path_(dir + "/lock"), me_(std::move(me)), lease_s_(lease_s) {
  message->clear();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) fail_usage("--checkpoint-dir ", dir, ": cannot create the directory");
  me_.lease_until = now() + lease_s_;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string tmp = write_candidate(dir_, me_);
    const int rc = ::link(tmp.c_str(), path_.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) {
      held_ = true;
      return;
    }
    if (err != EEXIST) fail("--checkpoint-dir ", dir_, ": cannot create ", path_, ": ", std::strerror(err));
    bool garbled = false;
    const std::optional<std::string> judged = read_text(path_);
    const auto old = holder_from_text(judged, &garbled);
    std::string reason;
    if (old) {
      reason = takeover_reason(*old, me_);
      if (reason.empty())
        fail_usage("--checkpoint-dir ", dir_, " is in use by ", old->describe(), ", lease until ",
                   old->lease_until - now(), " s from now; expected a directory no other job writes to "
                   "(wait for it, or remove ", path_, " if that job is surely gone)");
    } else if (garbled) {
      struct stat st {};
      if (::stat(path_.c_str(), &st) == 0 && st.st_mtime + lease_s_ >= now())
        fail_usage("--checkpoint-dir ", dir_, ": ", path_, " is not a lock amsp wrote, and it is recent; "
                   "expected a directory no other job writes to (remove it if no job uses the directory)");
      reason = cat("took over a damaged lock file older than the lease");
    } else {
      continue;  // released meanwhile: try again
    }
    // Move the old lock aside: of several contenders only one can rename it.
    // Another contender may have replaced the stale lock with its own live one
    // between our reading and our renaming: then what we moved is not what we
    // judged, and it goes back (link() fails only if a third lock appeared, whose
    // holder then wins the next round).
    const std::string aside = cat(dir_, "/.lock.stale.", me_.host, ".", me_.pid);
    if (::rename(path_.c_str(), aside.c_str()) == 0) {
      if (read_text(aside) != judged) {
        (void)::link(aside.c_str(), path_.c_str());
        ::unlink(aside.c_str());
        continue;
      }
      ::unlink(aside.c_str());
      *message = cat("--checkpoint-dir ", dir_, ": ", reason);
    }
  }
  fail("--checkpoint-dir ", dir_, ": could not take ", path_, " (other jobs keep taking it)");
}

DirLock::~DirLock() {
  try {
    release();
  } catch (...) {
  }
}

void DirLock::renew() {
  if (!held_ || now() < me_.lease_until - lease_s_ / 2) return;
  bool garbled = false;
  const auto cur = read_holder(path_, &garbled);
  if (!cur || !same_holder(*cur, me_)) {
    held_ = false;
    fail("--checkpoint-dir ", dir_, ": this job's lock was taken over by ",
         cur ? cur->describe() : std::string("another job"), " (was this job stopped past its lease?)");
  }
  me_.lease_until = now() + lease_s_;
  const std::string tmp = write_candidate(dir_, me_);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) fail("--checkpoint-dir ", dir_, ": cannot renew ", path_);
}

void DirLock::release() {
  if (!held_) return;
  held_ = false;
  bool garbled = false;
  const auto cur = read_holder(path_, &garbled);
  if (cur && same_holder(*cur, me_)) ::unlink(path_.c_str());
}

}  // namespace amsp::ckpt
