#include "ckpt/lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"

namespace amsp::ckpt {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("amsp-lock-" + std::to_string(::getpid())) / name;
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

TEST(DirLockTest, OnlyOneOfRacingContendersWins) {
  const std::string dir = fresh_dir("race");
  fs::create_directories(dir);
  const int64_t gone = dead_pid();
  { std::ofstream(dir + "/lock") << R"({"host":"n1","pid":)" << gone
                                 << R"(,"slurm_job":"","started":1,"lease_until":1})"; }
  constexpr int kContenders = 6;
  int pipes[2];
  ASSERT_EQ(::pipe(pipes), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < kContenders; ++i) {
    const pid_t p = ::fork();
    if (p == 0) {
      char go;
      (void)::read(pipes[0], &go, 1);  // start together
      std::string msg;
      try {
        DirLock l(dir, holder("n1", ::getpid()), 60, &msg);
        ::sleep(1);  // hold it while the others try
        ::_exit(0);
      } catch (...) {
        ::_exit(1);
      }
    }
    kids.push_back(p);
  }
  const std::string go(kContenders, 'g');
  ASSERT_EQ(::write(pipes[1], go.data(), go.size()), static_cast<ssize_t>(go.size()));
  int winners = 0;
  for (pid_t p : kids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    winners += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  EXPECT_EQ(winners, 1);
}

}  // namespace
}  // namespace amsp::ckpt
