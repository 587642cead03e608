// Checkpoint write and read throughput, beside this
// machine's sequential write and read throughput of a plain file of the same
// size, measured in the same run:
//
//   mpiexec -n 4 build/ckpt_bench [--model base] [--shard zero3] [--dir DIR] [--reps 3]
//                                 [--io independent|collective|both]
//
// Checkpoint write = ckpt::save (independent: rank 0's serial HDF5 layout and
// every rank's pwrite; collective: parallel HDF5 over MPI-IO; then fsync,
// rename, latest); read = ckpt::load (every rank reads its P range and OS range and
// checks the checksums). Plain file: rank 0 alone writes the same number of
// bytes in 64 MiB blocks and fsyncs, then reads them back. Page caches cannot
// be dropped here (no root to /proc/sys/vm/drop_caches), so both reads are
// mostly from memory; both writes include the fsync. Best of --reps.
// Not a Google Benchmark: one MPI job, one table.

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/plan_groups.h"
#include "engine/sharded_engine.h"
#include "model/config.h"
#include "topology/topology.h"

using namespace amsp;
namespace fs = std::filesystem;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rank 0 writes `bytes` to path in 64 MiB blocks and fsyncs; then reads them.
std::pair<double, double> plain_file(const std::string& path, int64_t bytes) {
  constexpr int64_t kBlock = 64 << 20;
  std::vector<char> buf(kBlock);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(mix64(i));
  double t0 = now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("cannot create ", path);
  for (int64_t done = 0; done < bytes;) {
    const int64_t n = std::min(kBlock, bytes - done);
    if (::write(fd, buf.data(), static_cast<size_t>(n)) != n) fail("write to ", path, " failed");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double write_s = now() - t0;
  t0 = now();
  fd = ::open(path.c_str(), O_RDONLY);
  int64_t got = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) got += n;
  ::close(fd);
  const double read_s = now() - t0;
  if (got != bytes) fail("read back ", got, " of ", bytes, " bytes from ", path);
  fs::remove(path);
  return {write_s, read_s};
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string model_name = "base", shard = "zero3", dir = "ckpt-bench";
  std::string io = "both";  // independent, collective or both
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_name = v;
    else if (k == "--shard") shard = v;
    else if (k == "--dir") dir = v;
    else if (k == "--reps") reps = std::max(1, std::stoi(v));
    else if (k == "--io") io = v;
  }
  try {
    const model::LlamaConfig cfg = model::load_config(model_name);
    const auto topo = topology::discover(MPI_COMM_WORLD);
    auto groups = engine::make_plan_groups(MPI_COMM_WORLD, topo, shard);
    const auto be = backend::make_cpu_backend(DType::kF32);
    engine::ShardedEngine eng(cfg, *be, 1, 16, groups, 1, engine::EngineOptions{});
    auto views = eng.state_views();
    for (size_t u = 0; u < views.size(); ++u)
      for (int64_t i = 0; i < eng.shards()[u].os.size; ++i) {
        views[u].exp_avg[i] = static_cast<float>(random_uniform(2, u, i)) - 0.5f;
        views[u].exp_avg_sq[i] = static_cast<float>(random_uniform(3, u, i));
      }
    ckpt::Metadata meta;
    meta.step = 1;
    meta.model_json = model::config_to_json(cfg);
    meta.options_json = "{}";  // the manifest wants an object; this benchmark has no training options
    meta.plan = shard;
    meta.topology = topo.describe();
    meta.world_size = world;
    if (rank == 0) fs::remove_all(dir);

    std::vector<std::pair<const char*, ckpt::Transfer>> modes;
    if (io == "both" || io == "independent") modes.emplace_back("independent, pwrite", ckpt::Transfer::kIndependent);
    if (io == "both" || io == "collective") modes.emplace_back("collective, MPI-IO", ckpt::Transfer::kCollective);
    if (modes.empty()) fail_usage("--io ", io, ": expected independent, collective or both");
    std::vector<double> best_w(modes.size(), 1e30), best_r(modes.size(), 1e30);
    double plain_w = 1e30, plain_r = 1e30;
    int64_t bytes = 0;
    for (int r = 0; r < reps; ++r) {
      for (size_t m = 0; m < modes.size(); ++m) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        const std::string path = ckpt::save(dir, meta, eng.units(), eng.shards(), eng.state_views(),
                                            eng.replica_index() == 0, 1, MPI_COMM_WORLD, modes[m].second);
        MPI_Barrier(MPI_COMM_WORLD);
        best_w[m] = std::min(best_w[m], now() - t0);
        bytes = static_cast<int64_t>(fs::file_size(path));
        t0 = now();
        ckpt::load(path, cfg, eng.units(), eng.shards(), eng.state_views(), MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        best_r[m] = std::min(best_r[m], now() - t0);
      }
      if (rank == 0) {
        const auto [w, rd] = plain_file(dir + "/plain.bin", bytes);
        plain_w = std::min(plain_w, w);
        plain_r = std::min(plain_r, rd);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0) {
      const double mb = static_cast<double>(bytes) / 1e6;
      std::printf("checkpoint benchmark: model %s (%lld parameters), plan %s, %d ranks, file %.1f MB, "
                  "best of %d\n", cfg.name.c_str(), static_cast<long long>(cfg.num_parameters()),
                  shard.c_str(), world, mb, reps);
      std::printf("%-40s %10s %10s %10s %10s\n", "", "write s", "write MB/s", "read s", "read MB/s");
      for (size_t m = 0; m < modes.size(); ++m)
        std::printf("%-40s %10.3f %10.1f %10.3f %10.1f\n",
                    cat("checkpoint (", modes[m].first, ")").c_str(), best_w[m],
                    mb / best_w[m], best_r[m], mb / best_r[m]);
      std::printf("%-40s %10.3f %10.1f %10.3f %10.1f\n", "plain file (rank 0, sequential)", plain_w,
                  mb / plain_w, plain_r, mb / plain_r);
      std::printf("(writes include fsync; reads are from the page cache, which cannot be dropped here;\n"
                  " checkpoint read includes checksum verification of every element)\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_bench: rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
