#include "ckpt/lock.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

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

// The lock file's bytes, or nullopt when there is none.
std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The holder a lock (or claim) file names; nullopt if it is not one amsp wrote.
std::optional<LockHolder> holder_from_text(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    LockHolder h;
    h.host = j.at("host").get<std::string>();
    h.pid = j.at("pid").get<int64_t>();
    h.slurm_job = j.at("slurm_job").get<std::string>();
    h.started = j.at("started").get<int64_t>();
    h.lease_until = j.at("lease_until").get<int64_t>();
    return h;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A complete file naming `h`, at a name of its own, for link() or rename()
// into place.
struct Candidate {
  std::string path, text;
};

Candidate write_candidate(const std::string& dir, const LockHolder& h) {
  static int serial = 0;
  Candidate c{cat(dir, "/.lock.", h.host, ".", h.pid, ".", now(), ".", serial++, ".tmp"), to_json(h) + "\n"};
  ::unlink(c.path.c_str());  // a leftover of a reused pid: never write through its links
  std::ofstream out(c.path, std::ios::trunc);
  out << c.text;
  out.flush();
  if (!out) fail("--checkpoint-dir ", dir, ": cannot write ", c.path);
  return c;
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

// Why `old` may be taken over by `me`, or "" if it may not. On this host the
// process itself answers, and a live one is never taken over; the job id and
// the lease speak only for holders this host cannot see.
std::string takeover_reason(const LockHolder& old, const LockHolder& me) {
  const bool same_job = !me.slurm_job.empty() && old.slurm_job == me.slurm_job;
  if (old.host == me.host) {
    if (holder_alive(old)) return "";
    if (same_job)
      return cat("took back the lock of an earlier attempt of Slurm job ", me.slurm_job, " (", old.describe(), ")");
    return cat("took over the lock of ", old.describe(), ", which is gone");
  }
  if (same_job)
    return cat("took back the lock of an earlier attempt of Slurm job ", me.slurm_job, " (", old.describe(), ")");
  if (old.lease_until < now())
    return cat("took over the lock of ", old.describe(), ", whose lease expired ", now() - old.lease_until, " s ago");
  return "";
}

// What a lock or claim file says about its writer: whether `me` may pass it
// over, why, and the refusal to print if not.
struct Verdict {
  bool stale = false;
  std::string reason;   // when stale: the line to print
  std::string refusal;  // when not: why, to follow "--checkpoint-dir DIR" in the error
  std::string who;      // the writer, as a message names it
};

Verdict judge(const std::string& dir, const std::string& path, const std::string& text, const LockHolder& me,
              int64_t lease_s) {
  Verdict v;
  if (const auto old = holder_from_text(text)) {
    v.who = old->describe();
    v.reason = takeover_reason(*old, me);
    v.stale = !v.reason.empty();
    const int64_t left = old->lease_until - now();
    v.refusal = cat(" is in use by ", v.who,
                    left >= 0 ? cat(", lease until ", left, " s from now")
                              : cat(", which still runs on this host (its lease ran out ", -left, " s ago)"),
                    "; expected a directory no other job writes to (wait for it, or remove ", dir,
                    "/lock if that job is surely gone)");
    return v;
  }
  v.who = cat("an unreadable ", path);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_mtime + lease_s >= now()) {
    v.refusal = cat(": ", path, " is not a lock amsp wrote, and it is recent; expected a directory no other "
                    "job writes to (remove it if no job uses the directory)");
    return v;
  }
  v.stale = true;  // or gone meanwhile: the claimant's second reading decides
  v.reason = "took over a damaged lock file older than the lease";
  return v;
}

std::string claim_path(const std::string& dir, const std::string& key) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  return cat(dir, "/.lock.claim.", hex);
}

// The right to change the lock file while it holds `text` (lock.h). Held
// when `blocked_by` is empty: then paths ends with ours, after the claims of
// claimants that are gone.
struct Claim {
  std::vector<std::string> paths;
  std::string blocked_by;  // a live claimant, as a message names it
  bool held() const { return blocked_by.empty(); }
};

// Claims with `mine` (a complete file naming `me`), linked into place.
Claim claim(const std::string& dir, const std::string& text, const std::string& mine, const LockHolder& me,
            int64_t lease_s) {
  Claim c;
  std::string key = text;
  for (int tries = 0; tries < 64; ++tries) {
    const std::string path = claim_path(dir, key);
    if (::link(mine.c_str(), path.c_str()) == 0) {
      c.paths.push_back(path);
      return c;
    }
    if (errno != EEXIST) fail("--checkpoint-dir ", dir, ": cannot create ", path, ": ", std::strerror(errno));
    const std::optional<std::string> held = read_text(path);
    if (!held) continue;  // dropped meanwhile: try the same name again
    const Verdict v = judge(dir, path, *held, me, lease_s);
    if (!v.stale) {
      c.blocked_by = v.who;
      return c;
    }
    c.paths.push_back(path);
    key += *held;  // its claimant is gone: the next claim of the chain
  }
  c.blocked_by = cat("other processes (", dir, "/.lock.claim.* keep changing)");
  return c;
}

// Only once the lock no longer holds the claimed text: until then a dead
// claimant's claim must stay, or a newcomer could claim the text beside the
// one who passed over it.
void drop(const Claim& c) {
  for (const std::string& p : c.paths) ::unlink(p.c_str());
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
    const Candidate mine = write_candidate(dir_, me_);
    const int rc = ::link(mine.path.c_str(), path_.c_str());
    const int err = errno;
    if (rc == 0) {
      ::unlink(mine.path.c_str());
      text_ = mine.text;
      held_ = true;
      return;
    }
    if (err != EEXIST) {
      ::unlink(mine.path.c_str());
      fail("--checkpoint-dir ", dir_, ": cannot create ", path_, ": ", std::strerror(err));
    }
    const std::optional<std::string> judged = read_text(path_);
    if (!judged) {  // released meanwhile: try again
      ::unlink(mine.path.c_str());
      continue;
    }
    const Verdict v = judge(dir_, path_, *judged, me_, lease_s_);
    if (!v.stale) {
      ::unlink(mine.path.c_str());
      fail_usage("--checkpoint-dir ", dir_, v.refusal);
    }
    const Claim c = claim(dir_, *judged, mine.path, me_, lease_s_);
    if (!c.held()) {
      ::unlink(mine.path.c_str());
      fail_usage("--checkpoint-dir ", dir_, ": the lock of ", v.who, " is being taken over by ", c.blocked_by,
                 "; expected a directory no other job writes to");
    }
    // Under the claim: replace the lock only if it is still what was judged.
    const bool unchanged = read_text(path_) == judged;
    if (unchanged && ::rename(mine.path.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      drop(c);
      ::unlink(mine.path.c_str());
      fail("--checkpoint-dir ", dir_, ": cannot replace ", path_, ": ", std::strerror(e));
    }
    drop(c);
    if (!unchanged) {
      ::unlink(mine.path.c_str());
      continue;
    }
    text_ = mine.text;
    held_ = true;
    *message = cat("--checkpoint-dir ", dir_, ": ", v.reason);
    return;
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
  LockHolder next = me_;
  next.lease_until = now() + lease_s_;
  const Candidate mine = write_candidate(dir_, next);
  const Claim c = claim(dir_, text_, mine.path, next, lease_s_);
  if (!c.held()) {
    ::unlink(mine.path.c_str());
    held_ = false;
    fail("--checkpoint-dir ", dir_, ": this job's lock is being taken over by ", c.blocked_by,
         " (was this job stopped past its lease?)");
  }
  const std::optional<std::string> cur = read_text(path_);
  if (cur != text_) {
    drop(c);
    ::unlink(mine.path.c_str());
    held_ = false;
    const auto other = cur ? holder_from_text(*cur) : std::nullopt;
    fail("--checkpoint-dir ", dir_, ": this job's lock was taken over by ",
         other ? other->describe() : std::string("another job"), " (was this job stopped past its lease?)");
  }
  const bool renewed = ::rename(mine.path.c_str(), path_.c_str()) == 0;
  drop(c);
  if (!renewed) {
    ::unlink(mine.path.c_str());
    fail("--checkpoint-dir ", dir_, ": cannot renew ", path_);
  }
  me_ = next;
  text_ = mine.text;
}

void DirLock::release() {
  if (!held_) return;
  held_ = false;
  const Candidate mine = write_candidate(dir_, me_);
  const Claim c = claim(dir_, text_, mine.path, me_, lease_s_);
  if (c.held()) {
    if (read_text(path_) == text_) ::unlink(path_.c_str());
    drop(c);
  }
  ::unlink(mine.path.c_str());
}

std::string lock_claim_path(const std::string& dir, const std::string& lock_text) {
  return claim_path(dir, lock_text);
}

}  // namespace amsp::ckpt
