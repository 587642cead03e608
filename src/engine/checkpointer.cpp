#include "engine/checkpointer.h"

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "core/mpi_check.h"

namespace amsp::engine {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Background writes need MPI_THREAD_MULTIPLE: the writer thread's collectives
// run beside the training's.
bool threads_allowed(bool root) {
  int provided = 0;
  AMSP_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided >= MPI_THREAD_MULTIPLE) return true;
  if (root)
    std::printf("note: MPI provides thread level %d, not MPI_THREAD_MULTIPLE; checkpoints are "
                "written synchronously (--checkpoint-mode sync)\n", provided);
  return false;
}

}  // namespace

Checkpointer::Checkpointer(ShardedEngine& engine, backend::Backend& backend, CheckpointPlace place,
                           bool background, bool root)
    : engine_(engine),
      backend_(backend),
      place_(std::move(place)),
      root_(root),
      writer_(engine.replica_index() == 0) {
  background_ = background && threads_allowed(root);
  if (!background_) return;
  allocate_snapshot();
  AMSP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  thread_ = std::thread([this] { run_writer(); });
}

Checkpointer::~Checkpointer() {
  if (!background_) return;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
  MPI_Comm_free(&comm_);
}

double Checkpointer::save(const ckpt::Metadata& meta) {
  if (!background_) return save_sync(meta);
  const auto t0 = Clock::now();
  wait();
  take_snapshot(meta);
  {
    std::lock_guard lock(mu_);
    pending_ = busy_ = true;
  }
  cv_.notify_all();
  const double stall_ms = ms_since(t0);
  if (root_) {
    std::printf("checkpoint: step %lld snapshot taken (training blocked %.1f ms), writing %s/%s in the "
                "background\n", static_cast<long long>(meta.step), stall_ms, place_.dir.c_str(),
                ckpt::file_name(meta.step).c_str());
    std::fflush(stdout);
  }
  return stall_ms;
}

double Checkpointer::save_sync(const ckpt::Metadata& meta) {
  const auto t0 = Clock::now();
  const std::string path = ckpt::save(place_.dir, meta, engine_.units(), engine_.shards(), engine_.state_views(),
                                      writer_, place_.keep_last, MPI_COMM_WORLD, place_.transfer);
  const double ms = ms_since(t0);
  if (root_) {
    std::printf("checkpoint: %s (step %lld, %.2f s)\n", path.c_str(), static_cast<long long>(meta.step),
                ms / 1e3);
    std::fflush(stdout);
  }
  return ms;
}

// The writer's own memory, allocated once and reused by every save: the OS
// range of each state of each unit in the backend's host staging memory, and
// shards whose P range is the OS range (so that ckpt::save finds the
// parameters at the start of the copy).
void Checkpointer::allocate_snapshot() {
  const auto& shards = engine_.shards();
  snap_.shards = shards;
  snap_.views.assign(shards.size(), ckpt::StateView{nullptr, nullptr, nullptr});
  if (!writer_) return;
  snap_.params.resize(shards.size());
  snap_.exp_avg.resize(shards.size());
  snap_.exp_avg_sq.resize(shards.size());
  for (size_t u = 0; u < shards.size(); ++u) {
    snap_.shards[u].p = shards[u].os;
    const int64_t n = shards[u].os.size;
    snap_.params[u] = backend_.alloc_host(n);
    snap_.exp_avg[u] = backend_.alloc_host(n);
    snap_.exp_avg_sq[u] = backend_.alloc_host(n);
    snap_.views[u] = {snap_.params[u].view().data ? snap_.params[u].f32() : nullptr,
                      snap_.exp_avg[u].view().data ? snap_.exp_avg[u].f32() : nullptr,
                      snap_.exp_avg_sq[u].view().data ? snap_.exp_avg_sq[u].f32() : nullptr};
  }
}

void Checkpointer::take_snapshot(const ckpt::Metadata& meta) {
  snap_.meta = meta;
  if (writer_) engine_.copy_os_states(snap_.views);
}

void Checkpointer::run_writer() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || quit_; });
    if (!pending_) return;
    pending_ = false;
    lock.unlock();
    write_snapshot();
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

// On the writer thread: the checkpoint writer as it is, fed from the snapshot.
void Checkpointer::write_snapshot() {
  const auto t0 = Clock::now();
  std::string path, error;
  try {
    path = ckpt::save(place_.dir, snap_.meta, engine_.units(), snap_.shards, snap_.views, writer_,
                      place_.keep_last, comm_, place_.transfer);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const double ms = ms_since(t0);
  std::lock_guard lock(mu_);
  if (!error.empty())
    error_ = cat("checkpoint ", place_.dir, "/", ckpt::file_name(snap_.meta.step),
                 ": the background write failed: ", error);
  else
    written_ = WrittenCheckpoint{path, snap_.meta.step, ms};
}

void Checkpointer::fail_if_write_failed() {
  std::string error;
  {
    std::lock_guard lock(mu_);
    error = error_;
  }
  if (!error.empty()) comm::abort_job(error);
}

void Checkpointer::wait() {
  if (!background_) return;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
  }
  fail_if_write_failed();
}

std::optional<WrittenCheckpoint> Checkpointer::take_written() {
  if (!background_) return std::nullopt;
  fail_if_write_failed();
  std::lock_guard lock(mu_);
  std::optional<WrittenCheckpoint> out;
  out.swap(written_);
  return out;
}

int64_t Checkpointer::snapshot_bytes() const {
  int64_t bytes = 0;
  for (const auto* states : {&snap_.params, &snap_.exp_avg, &snap_.exp_avg_sq})
    for (const auto& b : *states) bytes += b.bytes();
  return bytes;
}

}  // namespace amsp::engine
