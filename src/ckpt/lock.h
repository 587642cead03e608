// A lock on a checkpoint directory, so that two jobs pointed at one directory
// by mistake cannot both write there (and delete each other's temporaries).
//
// DIR/lock is a small JSON file naming the holder: host, pid, Slurm job id and
// a lease end. Rank 0 of a job takes it at start, renews the lease as training
// goes, and removes it at the end. A lock found in place is taken over when
//   - it is this Slurm job's own (a requeued attempt: same job id),
//   - its holder ran on this host and that process is gone (the pid exited,
//     is a zombie, or now belongs to a process started after the lock),
//   - its lease has expired (a holder renews it every step);
// otherwise the job is refused, naming the holder. Creation and takeover are
// atomic (link() of a complete file; rename() of the old lock aside, which only
// one contender can do), so two jobs racing for one directory never both win.
#pragma once

#include <cstdint>
#include <string>

namespace amsp::ckpt {

struct LockHolder {
  std::string host;
  int64_t pid = 0;
  std::string slurm_job;     // SLURM_JOB_ID (array: JOB_TASK), empty outside Slurm
  int64_t started = 0;       // unix seconds
  int64_t lease_until = 0;   // unix seconds
  // This process, from the environment.
  static LockHolder self();
  std::string describe() const;  // "pid 1234 on host n1 (Slurm job 77)"
};

class DirLock {
 public:
  // Takes DIR/lock for `me` (creating DIR if needed) with a lease of
  // lease_s seconds. Throws UsageError naming the directory and the holder if
  // it is held. *message is set to a line to print when a lock was taken over
  // (empty otherwise).
  DirLock(const std::string& dir, LockHolder me, int64_t lease_s, std::string* message);
  ~DirLock();  // release()
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Pushes the lease forward when more than half of it has passed (cheap
  // otherwise). Throws Error if the lock is no longer ours: someone took it
  // over while this job was stopped past its lease.
  void renew();
  // Removes the lock if it is still ours.
  void release();

 private:
  std::string dir_, path_;
  LockHolder me_;
  int64_t lease_s_ = 0;
  bool held_ = false;
};

}  // namespace amsp::ckpt
