// Checkpoints of a training run at step boundaries (doc/checkpoints.md,
// "Background saves"): synchronously, or from a host snapshot that a thread of
// this rank writes while the next steps train.
//
// Background: save() waits for the write in flight (at most one), copies what
// the checkpoint holds (the OS range of every state, and the metadata) into
// host memory this object owns, hands it to the writer thread and returns.
// That memory is the backend's host staging (Backend::alloc_host: page-locked
// on CUDA, so the copy from the device is a DMA), allocated once when the
// Checkpointer is made, so that a run without the memory for it fails at the
// start rather than at its first checkpoint.
// The writer runs ckpt::save as it is, on its own duplicate of MPI_COMM_WORLD
// (made once), so its collectives never meet the training's: the same
// temporary name, checksums, manifest, rename, `latest` and pruning after the
// new file is complete. A failed write ends the job (comm::abort_job) naming
// the file, on the next call that looks at it.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
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

// A background write that has finished.
struct WrittenCheckpoint {
  std::string path;
  int64_t step = 0;
  double write_ms = 0;  // on the writer thread: checksums, file, rename, prune
};

class Checkpointer {
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
  // sync; the wait for the previous write plus the snapshot when background.
  double save(const ckpt::Metadata& meta);
  // The background write finished since the last call, if any (rank-local, no
  // waiting). Ends the job if it failed.
  std::optional<WrittenCheckpoint> take_written();
  // Waits for the write in flight, if any; take_written() then returns it.
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
  MPI_Comm comm_ = MPI_COMM_NULL;
  Snapshot snap_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, busy_ = false, quit_ = false;
  std::optional<WrittenCheckpoint> written_;
  std::string error_;

  double save_sync(const ckpt::Metadata& meta);
  void take_snapshot(const ckpt::Metadata& meta);
  void allocate_snapshot();
  void run_writer();
  void write_snapshot();
  void fail_if_write_failed();
};

}  // namespace amsp::engine
