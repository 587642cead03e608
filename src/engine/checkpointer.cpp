#include "engine/checkpointer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/agree.h"
#include "core/error.h"
#include "core/fault.h"
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

// Lowers the calling thread's priority by kWriterNice (Linux: nice is a
// thread's own). Best effort: an error leaves it as it was.
void nice_this_thread() {
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(19, now + kWriterNice));
}

}  // namespace

Checkpointer::Checkpointer(ShardedEngine& engine, backend::Backend& backend, CheckpointPlace place,
                           bool background, bool root)
    : engine_(engine),
      backend_(backend),
      place_(std::move(place)),
      root_(root),
      writer_(engine.replica_index() == 0) {
  AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  background_ = background && threads_allowed(root);
  if (!background_) return;
  allocate_snapshot();
  AMSP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  if (overlapped()) engine_.set_update_gate(this);
  thread_ = std::thread([this] { run_writer(); });
}

Checkpointer::~Checkpointer() {
  if (!background_) return;
  if (overlapped()) {
    copy_all_units(/*writer=*/false);
    engine_.set_update_gate(nullptr);
  }
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
  snap_.meta = meta;
  if (overlapped())
    begin_overlapped_snapshot();
  else if (writer_)
    engine_.begin_os_snapshot(snap_.views);
  {
    std::lock_guard lock(mu_);
    pending_ = busy_ = true;
  }
  cv_.notify_all();
  const double stall_ms = ms_since(t0);
  if (root_) {
    std::printf("checkpoint: step %lld %s (training blocked %.1f ms), writing %s/%s in the background\n",
                static_cast<long long>(meta.step),
                "snapshot overlapping the next step", stall_ms,
                place_.dir.c_str(), ckpt::file_name(meta.step).c_str());
    std::fflush(stdout);
  }
  return stall_ms;
}

// --- the snapshot that overlaps the next step (host states) ------------------------

void Checkpointer::begin_overlapped_snapshot() {
  engine_.settle_states();
  const int units = static_cast<int>(snap_.views.size());
  for (int u = 0; u < units; ++u) unit_copy_[static_cast<size_t>(u)].store(kFree, std::memory_order_relaxed);
  copied_ = 0;
  first_claim_ = true;
  copying_.store(units > 0, std::memory_order_release);
  update_wait_ms_ = 0.0;
}

// Copies unit u if no thread has claimed it yet; false if another has. On the
// writer thread (`writer`) the fault point save.snapshot is reached once the
// first unit is claimed, before it is copied: a slow writer holding a unit.
bool Checkpointer::copy_unit(int u, bool writer) {
  int expected = kFree;
  if (!unit_copy_[static_cast<size_t>(u)].compare_exchange_strong(expected, kCopying, std::memory_order_acq_rel))
    return false;
  if (writer && first_claim_) {
    first_claim_ = false;
    try {
      fault::point("save.snapshot", snap_.meta.step, rank_);
    } catch (...) {
      publish_copy(u);  // a claimed unit is always copied: the gate waits for it
      throw;
    }
  }
  publish_copy(u);
  return true;
}

void Checkpointer::publish_copy(int u) {
  engine_.copy_os_state(u, snap_.views[static_cast<size_t>(u)]);
  mark_copied(u);
}

void Checkpointer::mark_copied(int u) {
  unit_copy_[static_cast<size_t>(u)].store(kCopied, std::memory_order_release);
  {
    std::lock_guard lock(mu_);
    if (++copied_ == static_cast<int>(snap_.views.size())) copying_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

// Claims every unit not yet claimed, then waits for the others' copies.
void Checkpointer::copy_all_units(bool writer) {
  if (!copying_.load(std::memory_order_acquire)) return;
  for (int u = 0; u < static_cast<int>(snap_.views.size()); ++u) copy_unit(u, writer);
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !copying_.load(std::memory_order_acquire); });
}

// The engine's update gate, on the training thread: unit u may change once
// its snapshot is taken. A unit no thread has claimed is taken by the update
// itself where the engine can exchange states: it writes into the snapshot's
// buffers and hands its own over, as they were (after_exchange); else it is
// copied here, or the writer's copy of it awaited.
std::optional<ShardedEngine::OsBuffers> Checkpointer::before_update(int u) {
  if (!copying_.load(std::memory_order_acquire)) return std::nullopt;
  const auto t0 = Clock::now();
  const size_t i = static_cast<size_t>(u);
  std::optional<ShardedEngine::OsBuffers> out;
  int expected = kFree;
  if (engine_.states_exchangeable() &&
      unit_copy_[i].compare_exchange_strong(expected, kCopying, std::memory_order_acq_rel)) {
    if (!engine_.master_exchangeable()) engine_.copy_os_master(u, snap_.views[i].params);
    out = ShardedEngine::OsBuffers{&snap_.params[i], &snap_.exp_avg[i], &snap_.exp_avg_sq[i]};
  } else if (!copy_unit(u, /*writer=*/false)) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return unit_copy_[i].load(std::memory_order_acquire) == kCopied; });
  }
  if (update_wait_ms_) *update_wait_ms_ += ms_since(t0);
  return out;
}

void Checkpointer::after_exchange(int u) {
  set_views(u);
  mark_copied(u);
}

// The snapshot's views of unit u: its buffers, whichever memory they hold now.
void Checkpointer::set_views(int u) {
  const size_t i = static_cast<size_t>(u);
  auto data = [](const backend::Buffer& b) { return b.view().data ? b.f32() : nullptr; };
  snap_.views[i] = {data(snap_.params[i]), data(snap_.exp_avg[i]), data(snap_.exp_avg_sq[i])};
}

std::optional<double> Checkpointer::take_update_wait_ms() {
  std::optional<double> out;
  out.swap(update_wait_ms_);
  return out;
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
  unit_copy_ = std::make_unique<std::atomic<int>[]>(shards.size());
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
    set_views(static_cast<int>(u));
    // Touched now, so that the pages are the process's before the first save
    // (whose copy would otherwise pay for faulting them in) and a node short
    // of memory fails here.
    for (const backend::Buffer* b : {&snap_.params[u], &snap_.exp_avg[u], &snap_.exp_avg_sq[u]})
      if (b->view().data) std::memset(b->view().data, 0, static_cast<size_t>(b->bytes()));
  }
}

void Checkpointer::run_writer() {
  nice_this_thread();
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
    // A slow writer here leaves every unit to the next step's updates.
    if (overlapped()) fault::point("save.writer", snap_.meta.step, rank_);
    copy_all_units(/*writer=*/true);
    if (!overlapped() && writer_) {
      // A slow writer here lets the next step's updates run before it waits.
      fault::point("save.snapshot", snap_.meta.step, rank_);
      backend_.wait_snapshot();
    }
    path = ckpt::save(place_.dir, snap_.meta, engine_.units(), snap_.shards, snap_.views, writer_,
                      place_.keep_last, comm_, place_.transfer, [this] { comm::quiet_barrier(comm_); });
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
  copy_all_units(/*writer=*/false);
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
