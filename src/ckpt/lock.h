// A lock on a checkpoint directory, so that two jobs pointed at one directory
// by mistake cannot both write there (and delete each other's temporaries).
//
// DIR/lock is a small JSON file naming the holder: host, pid, Slurm job id and
// a lease end. Rank 0 of a job takes it at start, renews the lease as training
// goes, and removes it at the end. A lock found in place is taken over when
//   - its holder ran on this host and that process is gone (the pid exited,
//     is a zombie, or now belongs to a process started after the lock); a
//     holder on this host that still runs is never taken over, whatever its
//     lease says, and whatever its Slurm job,
//   - its holder ran on another host (whose processes cannot be seen from
//     here) and it is this Slurm job's own (a requeued attempt: same job id)
//     or its lease has expired (a holder renews it every step);
// otherwise the job is refused, naming the holder.
//
// Creation is link() of a complete file, which only one contender can do.
// Every other change of an existing lock file (a takeover, a renewal, the
// release) is made under a claim on the exact text it holds:
// DIR/.lock.claim.<FNV-1a 64 of the text, 16 hex digits>, created with link()
// of a file naming the claimant, so that one process at a time holds it. The
// claimant reads the lock again under the claim and changes it only if it
// still holds that text, with rename() of a complete file over it (the lock is
// never missing meanwhile) or, to release it, unlink(), then removes the claim. Two contenders for one
// stale lock therefore never both win, and no contender removes or replaces a
// lock that changed after it judged it: a live holder's lock is never touched.
// A claim whose claimant is gone (judged as a lock is) is passed over by
// claiming the next one in a chain (named from the text and the dead claim);
// a live claimant makes the others give up, the job being refused.
#pragma once
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
  std::string text_;  // the lock file's bytes as this job last wrote them
  int64_t lease_s_ = 0;
  bool held_ = false;
};

// DIR/.lock.claim.<hex>: the first claim on a lock file holding `lock_text`
// (tests plant claims with it).
std::string lock_claim_path(const std::string& dir, const std::string& lock_text);

}  // namespace amsp::ckpt
