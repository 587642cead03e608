#include "ckpt/lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/test_temp_dir.h"

namespace amsp::ckpt {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const auto d = test::process_temp_dir().path() / "lock" / name;
  fs::remove_all(d);
  return d.string();
}

LockHolder holder(const std::string& host, int64_t pid, const std::string& job = "") {
  LockHolder h;
  h.host = host;
  h.pid = pid;
  h.slurm_job = job;
  h.started = static_cast<int64_t>(std::time(nullptr));
  return h;
}

// A pid that existed and is gone.
int64_t dead_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

// A child process that runs until release(): a holder that is alive for as
// long as a test needs, with no clock involved.
class LiveProcess {
 public:
  LiveProcess() {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[1]);
      char c;
      while (::read(fds[0], &c, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(fds[0]);
    hold_ = fds[1];
  }
  ~LiveProcess() { release(); }
  int64_t pid() const { return pid_; }
  // Ends it and reaps it: afterwards its pid is gone.
  void release() {
    if (hold_ < 0) return;
    ::close(hold_);
    hold_ = -1;
    ::waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
};

std::string lock_json(int64_t pid, int64_t started, int64_t lease_until, const std::string& host = "n1") {
  return cat(R"({"host":")", host, R"(","pid":)", pid, R"(,"slurm_job":"","started":)", started,
             R"(,"lease_until":)", lease_until, "}");
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int claims_left(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().starts_with(".lock.");
  return n;
}

std::string refusal(const std::string& dir, const LockHolder& me, int64_t lease = 60) {
  std::string msg;
  try {
    DirLock l(dir, me, lease, &msg);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(DirLockTest, SecondJobIsRefusedNamingTheHolder) {
  const std::string dir = fresh_dir("refuse");
  std::string msg;
  DirLock first(dir, holder("n1", ::getpid(), "77"), 60, &msg);
  EXPECT_TRUE(msg.empty());
  const std::string e = refusal(dir, holder("n1", ::getpid() + 100000, "78"));
  EXPECT_NE(e.find("is in use by pid " + std::to_string(::getpid()) + " on host n1 (Slurm job 77)"), std::string::npos)
      << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  first.release();
  EXPECT_FALSE(fs::exists(dir + "/lock"));
  EXPECT_EQ(refusal(dir, holder("n1", 42, "78")), "");  // free again
}

TEST(DirLockTest, RequeuedAttemptTakesItsOwnLockBack) {
  const std::string dir = fresh_dir("requeue");
  std::string msg;
  auto first = std::make_unique<DirLock>(dir, holder("n1", ::getpid(), "77"), 60, &msg);
  DirLock again(dir, holder("n2", 12345, "77"), 60, &msg);
  EXPECT_NE(msg.find("took back the lock of an earlier attempt of Slurm job 77"), std::string::npos) << msg;
  first.reset();  // the old attempt's release must not remove the new holder's lock
  EXPECT_TRUE(fs::exists(dir + "/lock"));
}

TEST(DirLockTest, DeadHolderOnThisHostIsTakenOver) {
  const std::string dir = fresh_dir("dead");
  fs::create_directories(dir);
  std::string msg;
  // A lock left behind as a killed job leaves it.
  const int64_t gone = dead_pid();
  { std::ofstream(dir + "/lock") << R"({"host":"n1","pid":)" << gone
                                 << R"(,"slurm_job":"","started":1,"lease_until":99999999999})"; }
  DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
  EXPECT_NE(msg.find("took over the lock of pid " + std::to_string(gone) + " on host n1, which is gone"),
            std::string::npos)
      << msg;
}

TEST(DirLockTest, AReusedPidIsNotTheHolder) {
  // The lock names this test's pid, but with a start long before this process
  // began: the pid was reused, the holder is gone.
  const std::string dir = fresh_dir("reused");
  fs::create_directories(dir);
  { std::ofstream(dir + "/lock") << R"({"host":"n1","pid":)" << ::getpid()
                                 << R"(,"slurm_job":"","started":1,"lease_until":99999999999})"; }
  std::string msg;
  DirLock l(dir, holder("n1", 4242), 60, &msg);
  EXPECT_NE(msg.find("which is gone"), std::string::npos) << msg;
}

TEST(DirLockTest, OtherHostNeedsAnExpiredLease) {
  const std::string dir = fresh_dir("lease");
  fs::create_directories(dir);
  const int64_t t = static_cast<int64_t>(std::time(nullptr));
  { std::ofstream(dir + "/lock") << R"({"host":"far","pid":1,"slurm_job":"","started":1,"lease_until":)" << t + 600 << "}"; }
  EXPECT_NE(refusal(dir, holder("near", ::getpid())).find("is in use by pid 1 on host far"), std::string::npos);
  { std::ofstream(dir + "/lock") << R"({"host":"far","pid":1,"slurm_job":"","started":1,"lease_until":)" << t - 5 << "}"; }
  std::string msg;
  DirLock l(dir, holder("near", ::getpid()), 60, &msg);
  EXPECT_NE(msg.find("whose lease expired"), std::string::npos) << msg;
}

TEST(DirLockTest, RecentGarbageIsRefusedOldGarbageTakenOver) {
  const std::string dir = fresh_dir("garbled");
  fs::create_directories(dir);
  { std::ofstream(dir + "/lock") << "not json"; }
  EXPECT_NE(refusal(dir, holder("n1", ::getpid())).find("is not a lock amsp wrote"), std::string::npos);
  fs::last_write_time(dir + "/lock", fs::file_time_type::clock::now() - std::chrono::hours(1));
  std::string msg;
  DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
  EXPECT_NE(msg.find("damaged lock"), std::string::npos) << msg;
}

TEST(DirLockTest, RenewDetectsAStolenLock) {
  const std::string dir = fresh_dir("renew");
  std::string msg;
  DirLock l(dir, holder("n1", ::getpid()), 0, &msg);  // lease 0: renew always rewrites
  EXPECT_NO_THROW(l.renew());
  { std::ofstream(dir + "/lock") << R"({"host":"n9","pid":5,"slurm_job":"","started":1,"lease_until":1})"; }
  EXPECT_THROW(l.renew(), Error);
}

TEST(DirLockTest, ALiveHolderOnThisHostIsKeptPastItsLease) {
  // A holder whose step outlasted its lease (a loaded machine, a stopped
  // process) still runs: on its own host that decides, not the clock.
  const std::string dir = fresh_dir("live-expired");
  fs::create_directories(dir);
  LiveProcess holder_process;
  const int64_t t = static_cast<int64_t>(std::time(nullptr));
  write_file(dir + "/lock", lock_json(holder_process.pid(), t, 1));
  const std::string e = refusal(dir, holder("n1", ::getpid()));
  EXPECT_NE(e.find("is in use by pid " + std::to_string(holder_process.pid()) + " on host n1, which still runs "
                   "on this host"),
            std::string::npos)
      << e;
  holder_process.release();
  std::string msg;
  DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
  EXPECT_NE(msg.find("which is gone"), std::string::npos) << msg;
}

TEST(DirLockTest, ALiveClaimantKeepsOthersOff) {
  // A stale lock that another contender has claimed and is replacing: the
  // others give up rather than race it; once that claimant is gone, its claim
  // is passed over and every claim is cleaned up.
  const std::string dir = fresh_dir("claimed");
  fs::create_directories(dir);
  const std::string stale = lock_json(dead_pid(), 1, 1);
  write_file(dir + "/lock", stale);
  LiveProcess claimant;
  write_file(lock_claim_path(dir, stale), lock_json(claimant.pid(), std::time(nullptr), 1));
  const std::string e = refusal(dir, holder("n1", ::getpid()));
  EXPECT_NE(e.find("is being taken over by pid " + std::to_string(claimant.pid())), std::string::npos) << e;
  EXPECT_EQ(read_file(dir + "/lock"), stale);
  claimant.release();
  std::string msg;
  {
    DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
    EXPECT_NE(msg.find("which is gone"), std::string::npos) << msg;
    EXPECT_NE(read_file(dir + "/lock").find(R"("pid":)" + std::to_string(::getpid())), std::string::npos);
    EXPECT_EQ(claims_left(dir), 0);
  }
  EXPECT_FALSE(fs::exists(dir + "/lock"));
}

TEST(DirLockTest, OnlyOneOfRacingContendersWins) {
  // Six processes race for one stale lock. Each reports whether it won; the
  // winner holds the lock until every contender has reported, so that all of
  // them judged it while its holder was alive. No step depends on timing.
  const std::string dir = fresh_dir("race");
  fs::create_directories(dir);
  write_file(dir + "/lock", lock_json(dead_pid(), 1, 1));
  constexpr int kContenders = 6;
  int go[2], results[2], hold[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(results), 0);
  ASSERT_EQ(::pipe(hold), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < kContenders; ++i) {
    const pid_t p = ::fork();
    if (p == 0) {
      ::close(go[1]);
      ::close(results[0]);
      ::close(hold[1]);
      char c;
      if (::read(go[0], &c, 1) != 1) ::_exit(2);  // start together
      std::unique_ptr<DirLock> l;
      try {
        std::string msg;
        l = std::make_unique<DirLock>(dir, holder("n1", ::getpid()), 60, &msg);
      } catch (...) {
      }
      const char outcome = l ? 'W' : 'L';
      if (::write(results[1], &outcome, 1) != 1) ::_exit(2);
      if (l)
        while (::read(hold[0], &c, 1) > 0) {  // until the parent closes it
        }
      ::_exit(0);  // without releasing: the lock stays, naming a process that is gone
    }
    kids.push_back(p);
  }
  ::close(go[0]);
  ::close(results[1]);
  ::close(hold[0]);
  const std::string start(kContenders, 'g');
  ASSERT_EQ(::write(go[1], start.data(), start.size()), static_cast<ssize_t>(start.size()));
  int winners = 0, reported = 0;
  for (char c; reported < kContenders && ::read(results[0], &c, 1) == 1; ++reported) winners += c == 'W';
  EXPECT_EQ(reported, kContenders);
  EXPECT_EQ(winners, 1);
  // The lock names a contender, alive until now.
  const std::string held = read_file(dir + "/lock");
  int named = 0;
  for (pid_t p : kids) named += held.find(R"("pid":)" + std::to_string(p) + ",") != std::string::npos;
  EXPECT_EQ(named, 1) << held;
  EXPECT_EQ(claims_left(dir), 0);
  ::close(hold[1]);
  for (pid_t p : kids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ::close(go[1]);
  ::close(results[0]);
  // Its holder is gone now: a newcomer takes it over.
  std::string msg;
  DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
  EXPECT_NE(msg.find("which is gone"), std::string::npos) << msg;
}

}  // namespace
}  // namespace amsp::ckpt
