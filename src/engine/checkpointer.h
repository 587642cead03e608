// Checkpoints of a training run at step boundaries (doc/checkpoints.md,
// "Background saves"): synchronously, or from a host snapshot that a thread of
// this rank writes while the next steps train.
//
// Background: save() waits for the write in flight (at most one), takes the
// metadata, hands the rest to the writer thread and returns: the snapshot of
// the states overlaps the next step, as in CheckFreq, because the states only
// change at its optimizer updates.
//   - States in host memory (the CPU backend): the writer thread copies them
//     unit by unit into the snapshot while the next step computes. The
//     engine's update gate holds the update of unit u until u is copied; if
//     the writer has not reached u yet, the update takes u itself, writing into
//     the snapshot's buffers and exchanging them (fp32 copies the master), so an
//     update waits at most for one unit's copy under way.
//   - States on a device: one DMA per state into the page-locked snapshot,
//     issued at the step boundary on the backend's copy stream
//     (Backend::begin_snapshot), so that it runs beside the next step's
//     forward and backward; the compute stream waits for it on the device
//     before the first optimizer update, and the writer thread waits for it
//     before it writes.
// The snapshot is the backend's host staging (Backend::alloc_host), allocated
// once when the Checkpointer is made, so that a run without the memory for it
// fails at the start rather than at its first checkpoint.
// The writer runs ckpt::save as it is, on its own duplicate of MPI_COMM_WORLD
// (made once), so its collectives never meet the training's: the same
// temporary name, checksums, manifest, rename, `latest` and pruning after the
// new file is complete. It is one thread per rank, niced (kWriterNice) so that
// the training keeps its cores. A failed write ends the job
// (comm::abort_job) naming the file, on the next call that looks at it.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "engine/sharded_engine.h"

namespace amsp::engine {

struct CheckpointPlace {
  std::string dir;
  int keep_last = 0;
  ckpt::Transfer transfer = ckpt::Transfer::kIndependent;
};

// How much nicer than the training the writer thread runs (setpriority on the
// thread): at 10 the Linux scheduler gives it about a tenth of a core that
// the training also wants, and every idle moment.
inline constexpr int kWriterNice = 10;

// A background write that has finished.
struct WrittenCheckpoint {
  std::string path;
  int64_t step = 0;
  double write_ms = 0;  // on the writer thread: checksums, file, rename, prune
};

class Checkpointer : private ShardedEngine::UpdateGate {
 public:
  // Collective over MPI_COMM_WORLD. background falls back to sync (rank 0
  // prints a note) when MPI does not provide MPI_THREAD_MULTIPLE.
  Checkpointer(ShardedEngine& engine, backend::Backend& backend, CheckpointPlace place, bool background,
               bool root);
  ~Checkpointer();  // waits for the write in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  bool background() const { return background_; }
  // Collective. Saves the engine's state as `meta` (meta.step names the file)
  // and returns the milliseconds training was blocked: the whole save when
  // sync; when background, the wait for the previous write (and issuing the
  // snapshot's copies).
  double save(const ckpt::Metadata& meta);
  // Training thread, after each step: the milliseconds that step's updates
  // waited for the snapshot of a background save before it (0 if none
  // waited), or nullopt if no snapshot was under way at the step's start.
  std::optional<double> take_update_wait_ms();
  // The background write finished since the last call, if any (rank-local, no
  // waiting). Ends the job if it failed.
  std::optional<WrittenCheckpoint> take_written();
  // Waits for the write in flight, if any (copying what is left of its
  // snapshot on this thread); take_written() then returns it.
  void wait();
  // Host memory of this rank's snapshot (0 when sync, or for a rank that
  // writes nothing): the bytes of its alloc_host buffers.
  int64_t snapshot_bytes() const;
  // The snapshot is page-locked memory (a CUDA backend).
  bool snapshot_pinned() const { return snapshot_bytes() > 0 && backend_.device() == Device::kCuda; }

 private:
  struct Snapshot {
    ckpt::Metadata meta;
    std::vector<plan::UnitShards> shards;  // the engine's, with p = os
    std::vector<backend::Buffer> params, exp_avg, exp_avg_sq;  // Backend::alloc_host
    std::vector<ckpt::StateView> views;
  };
  ShardedEngine& engine_;
  backend::Backend& backend_;
  CheckpointPlace place_;
  bool background_ = false, root_ = false, writer_ = false;
  int rank_ = 0;  // in MPI_COMM_WORLD
  MPI_Comm comm_ = MPI_COMM_NULL;
  Snapshot snap_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, busy_ = false, quit_ = false;
  std::optional<WrittenCheckpoint> written_;
  std::string error_;
  // The snapshot that overlaps the next step (host states): per unit
  // kFree -> kCopying (claimed by one thread) -> kCopied; copied_ counts the
  // copied units under mu_; copying_ is true from save() until all are.
  enum UnitCopy : int { kFree, kCopying, kCopied };
  std::unique_ptr<std::atomic<int>[]> unit_copy_;
  int copied_ = 0;
  std::atomic<bool> copying_{false};
  bool first_claim_ = false;  // the writer thread's, for the fault point
  std::optional<double> update_wait_ms_;  // training thread only

  double save_sync(const ckpt::Metadata& meta);
  void allocate_snapshot();
  bool overlapped() const { return writer_ && engine_.states_on_host(); }
  void begin_overlapped_snapshot();
  bool copy_unit(int u, bool writer);
  void publish_copy(int u);
  void mark_copied(int u);
  void copy_all_units(bool writer);
  // The engine's update gate (training thread): unit u may change once its
  // snapshot is taken, by a copy, or where the engine can (host states), by the
  // update itself writing into the snapshot's buffers and exchanging them.
  std::optional<ShardedEngine::OsBuffers> before_update(int u) override;
  void after_exchange(int u) override;
  void set_views(int u);
  void run_writer();
  void write_snapshot();
  void fail_if_write_failed();
};

}  // namespace amsp::engine
