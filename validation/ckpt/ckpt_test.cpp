// MPI system test of sharded checkpoints (run under mpiexec -n 1, 3 and 4):
// states written through real ShardedEngines under several plans, saved, and
// loaded by an engine with another plan, compared element by element; a
// flipped byte refused by load, verify and find_latest (naming the dataset);
// a truncated file skipped; another model refused naming the field; the
// `latest` marker, --keep-last pruning and leftover temporaries.
// Prints "N passed, M failed"; exit code 1 on any failure.
//
//   mpiexec -n 4 amsp_ckpt_test WORKDIR

#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/test_rank_checks.h"
#include "engine/plan_groups.h"
#include "engine/sharded_engine.h"
#include "model/config.h"
#include "plan/shard_plan.h"
#include "topology/topology.h"

using namespace amsp;
namespace fs = std::filesystem;

namespace {

int g_rank = 0, g_world = 1;
test::RankChecks g_checks;

void check(bool ok, const std::string& what) { g_checks.check(ok, what); }

// The value of element x of unit u for state kind (0 params, 1 m, 2 v) in
// checkpoint `tag`: any rank can compute any element.
float value(uint64_t tag, size_t u, int64_t x, int kind) {
  const double r = random_normal(tag, u * 3 + kind, static_cast<uint64_t>(x));
  return static_cast<float>(kind == 2 ? r * r : r);
}

model::LlamaConfig test_config() {
  model::LlamaConfig c = model::load_config("tiny");
  // Sizes that do not split evenly, so the padded tails are exercised.
  c.hidden_size = 40;
  c.intermediate_size = 104;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 97;
  c.validate();
  return c;
}

struct Run {
  Run(const model::LlamaConfig& c, const topology::Topology& topo, const std::string& plan, uint64_t seed)
      : be(backend::make_cpu_backend(DType::kF32)),
        groups(engine::make_plan_groups(MPI_COMM_WORLD, topo, plan)),
        engine(std::make_unique<engine::ShardedEngine>(c, *be, 1, 8, groups, seed, engine::EngineOptions{})) {}
  std::unique_ptr<backend::Backend> be;
  engine::PlanGroups groups;
  std::unique_ptr<engine::ShardedEngine> engine;
};

std::unique_ptr<Run> make_run(const model::LlamaConfig& c, const topology::Topology& topo,
                              const std::string& plan, uint64_t seed) {
  return std::make_unique<Run>(c, topo, plan, seed);
}

// Writes the states of checkpoint `tag` through the engine's views.
void fill(engine::ShardedEngine& e, uint64_t tag) {
  const auto views = e.state_views();
  for (size_t u = 0; u < e.shards().size(); ++u) {
    const auto& sh = e.shards()[u];
    for (int64_t x = sh.p.begin; x < sh.p.end(); ++x)
      views[u].params[x - sh.p.begin] = x < sh.numel ? value(tag, u, x, 0) : 0.0f;
    for (int64_t x = sh.os.begin; x < sh.os.end(); ++x) {
      views[u].exp_avg[x - sh.os.begin] = x < sh.numel ? value(tag, u, x, 1) : 0.0f;
      views[u].exp_avg_sq[x - sh.os.begin] = x < sh.numel ? value(tag, u, x, 2) : 0.0f;
    }
  }
}

// Does the engine hold exactly the states of `tag` (and zero padding)?
bool holds(engine::ShardedEngine& e, uint64_t tag, std::string* where) {
  const auto views = e.state_views();
  for (size_t u = 0; u < e.shards().size(); ++u) {
    const auto& sh = e.shards()[u];
    for (int64_t x = sh.p.begin; x < sh.p.end(); ++x)
      if (views[u].params[x - sh.p.begin] != (x < sh.numel ? value(tag, u, x, 0) : 0.0f))
        return *where = cat("params of unit ", u, " element ", x), false;
    for (int64_t x = sh.os.begin; x < sh.os.end(); ++x)
      if (views[u].exp_avg[x - sh.os.begin] != (x < sh.numel ? value(tag, u, x, 1) : 0.0f) ||
          views[u].exp_avg_sq[x - sh.os.begin] != (x < sh.numel ? value(tag, u, x, 2) : 0.0f))
        return *where = cat("moments of unit ", u, " element ", x), false;
  }
  const auto full = e.full_parameters();
  for (size_t u = 0; u < full.size(); ++u)
    for (size_t x = 0; x < full[u].size(); ++x)
      if (full[u][x] != value(tag, u, static_cast<int64_t>(x), 0))
        return *where = cat("gathered params of unit ", u, " element ", x), false;
  return true;
}

ckpt::Metadata meta_for(int64_t step, const std::string& plan, const model::LlamaConfig& c,
                        const topology::Topology& topo) {
  ckpt::Metadata m;
  m.step = step;
  m.tokens = step * 1000;
  m.seed = 0xfedcba9876543210ULL;
  m.model_json = model::config_to_json(c);
  m.options_json = "{\"lr\": 0.001}";
  m.plan = plan;
  m.topology = topo.describe();
  m.world_size = g_world;
  return m;
}

std::string save(Run& r, const std::string& dir, const ckpt::Metadata& m, int keep_last,
                 ckpt::Transfer transfer = ckpt::Transfer::kIndependent) {
  auto& e = *r.engine;
  return ckpt::save(dir, m, e.units(), e.shards(), e.state_views(), e.replica_index() == 0, keep_last,
                    MPI_COMM_WORLD, transfer);
}

// Runs f, which must throw on every rank; returns the message ("" if it did not).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Rank 0 flips one byte inside dataset `name`'s data (found with H5Dget_offset).
void flip_byte(const std::string& path, const std::string& name, int64_t element) {
  if (g_rank == 0) {
    haddr_t offset = HADDR_UNDEF;
    {
      hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
      offset = H5Dget_offset(d);
      H5Dclose(d);
      H5Fclose(f);
    }
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset + 4 * element + 1));
    char b = 0;
    io.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    io.seekp(static_cast<std::streamoff>(offset + 4 * element + 1));
    io.write(&b, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const std::string work = argc > 1 ? argv[1] : "ckpt-test-work";
  const std::string root = cat(work, "/n", g_world);
  if (g_rank == 0) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    const topology::Topology topo = topology::discover(MPI_COMM_WORLD);
    const model::LlamaConfig cfg = test_config();
    std::vector<std::string> plans = {"ddp", "zero1", "zero2", "zero3"};
    if (g_world % 2 == 0) plans.insert(plans.end(), {"mics:2", cat("p=1,g=2,os=", g_world)});
    if (g_rank == 0) std::printf("ckpt test: %d ranks, %zu plans\n", g_world, plans.size());

    // Save under each plan; load under the next one (resharding).
    for (size_t i = 0; i < plans.size(); ++i) {
      const std::string& a = plans[i];
      const std::string& b = plans[(i + 1) % plans.size()];
      const uint64_t tag = 100 + i;
      std::string path;
      {
        auto ra = make_run(cfg, topo, a, 1);
        fill(*ra->engine, tag);
        // Both transfer modes must write the same file contents.
        path = save(*ra, root + "/reshard", meta_for(static_cast<int64_t>(i + 1), a, cfg, topo), 0,
                    i % 2 ? ckpt::Transfer::kCollective : ckpt::Transfer::kIndependent);
      }
      check(fs::exists(path), cat("save under ", a, i % 2 ? " (collective)" : " (independent)", " wrote ", path));
      auto rb = make_run(cfg, topo, b, 2);
      ckpt::Metadata m;
      const std::string err = error_of([&] {
        auto& e = *rb->engine;
        m = ckpt::load(path, cfg, e.units(), e.shards(), e.state_views(), MPI_COMM_WORLD);
      });
      check(err.empty(), cat("load of a ", a, " checkpoint under ", b, ": ", err));
      std::string where;
      check(holds(*rb->engine, tag, &where), cat(a, " -> ", b, ": values differ at ", where));
      check(m.step == static_cast<int64_t>(i + 1) && m.tokens == m.step * 1000 &&
                m.seed == 0xfedcba9876543210ULL && m.plan == a && m.world_size == g_world &&
                m.options_json == "{\"lr\": 0.001}" && m.model_json == model::config_to_json(cfg),
            cat("metadata round trip (", a, ")"));
      check(ckpt::verify(path, MPI_COMM_WORLD).empty(), cat("verify of the ", a, " checkpoint"));
    }

    // Damage: a flipped byte, a truncated file.
    const std::string dir = root + "/damage";
    auto run = make_run(cfg, topo, plans.back(), 1);
    fill(*run->engine, 7);
    const std::string good = save(*run, dir, meta_for(1, plans.back(), cfg, topo), 0);
    fill(*run->engine, 8);
    const std::string bad = save(*run, dir, meta_for(2, plans.back(), cfg, topo), 0);
    const std::string victim = "model/layers.1.mlp.down_proj.weight";
    flip_byte(bad, victim, 17);
    {
      auto& e = *run->engine;
      const std::string err = error_of([&] {
        ckpt::load(bad, cfg, e.units(), e.shards(), e.state_views(), MPI_COMM_WORLD);
      });
      check(contains(err, victim) && contains(err, "checksum"), "load refuses a flipped byte: " + err);
      const std::string v = ckpt::verify(bad, MPI_COMM_WORLD);
      check(contains(v, victim), "verify names the damaged dataset: " + v);
    }
    std::vector<std::string> skipped;
    auto latest = ckpt::find_latest(dir, &skipped, MPI_COMM_WORLD);
    check(latest && *latest == good, cat("find_latest skips the damaged newest: ", latest.value_or("none")));
    check(skipped.size() == 1 && contains(skipped[0], bad) && contains(skipped[0], victim),
          cat("find_latest reports the damaged one: ", skipped.empty() ? "" : skipped[0]));
    {  // the good one still loads (values of tag 7)
      auto& e = *run->engine;
      ckpt::load(*latest, cfg, e.units(), e.shards(), e.state_views(), MPI_COMM_WORLD);
      std::string where;
      check(holds(e, 7, &where), "the older checkpoint loads intact: " + where);
    }
    // A truncated newest (a copy cut in half) is skipped too.
    const std::string cut = dir + "/step-00000003.h5";
    if (g_rank == 0) {
      fs::copy_file(good, cut);
      fs::resize_file(cut, fs::file_size(cut) / 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    skipped.clear();
    latest = ckpt::find_latest(dir, &skipped, MPI_COMM_WORLD);
    // Newest first, whatever `latest` says: step 3 (truncated), step 2 (damaged), then good.
    check(latest && *latest == good && skipped.size() == 2 && contains(skipped[0], cut),
          cat("find_latest skips a truncated file: ", skipped.size() == 2 ? skipped[0] : ""));
    if (g_rank == 0 && skipped.size() == 2) std::printf("skipped: %s\n", skipped[0].c_str());

    // Another model: refused naming the field.
    {
      model::LlamaConfig other = cfg;
      other.intermediate_size = 112;
      auto& e = *run->engine;
      const std::string err = error_of([&] {
        ckpt::load(good, other, e.units(), e.shards(), e.state_views(), MPI_COMM_WORLD);
      });
      check(contains(err, "model field intermediate_size is 104 in the checkpoint but 112 here"),
            "another model is refused naming the field: " + err);
    }

    // latest, keep_last, leftover temporaries.
    const std::string kdir = root + "/keep";
    for (int64_t step = 1; step <= 4; ++step) {
      if (step == 3 && g_rank == 0) std::ofstream(kdir + "/.step-00000009.h5.tmp") << "crashed save";
      MPI_Barrier(MPI_COMM_WORLD);
      if (step == 3) {
        skipped.clear();
        latest = ckpt::find_latest(kdir, &skipped, MPI_COMM_WORLD);
        check(latest && *latest == kdir + "/step-00000002.h5" && skipped.empty(),
              "a leftover .tmp is ignored by find_latest");
      }
      fill(*run->engine, 200 + static_cast<uint64_t>(step));
      save(*run, kdir, meta_for(step, plans.back(), cfg, topo), 2);
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(kdir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    std::string listing;
    for (const auto& n : names) listing += n + " ";
    check(listing == "latest step-00000003.h5 step-00000004.h5 ",
          "keep_last 2 keeps the newest two, removes the .tmp: " + listing);
    std::string marker;
    std::getline(std::ifstream(kdir + "/latest"), marker);
    check(marker == "step-00000004.h5", "latest names the newest: " + marker);
    latest = ckpt::find_latest(kdir, &skipped, MPI_COMM_WORLD);
    check(latest && *latest == kdir + "/step-00000004.h5", "find_latest picks step 4");
    check(!ckpt::find_latest(root + "/none", &skipped, MPI_COMM_WORLD), "no directory: nullopt");
    // The serial readers agree with the parallel writer's checksums.
    if (g_rank == 0) {
      const auto ds = ckpt::inspect(*latest, true);
      bool ok = ds.size() == 3 * (1 + 9 * 2 + 2);
      for (const auto& d : ds) ok = ok && d.stored_checksum == d.computed_checksum && d.dtype == "float32";
      check(ok, "inspect: every dataset float32, checksums match");
    } else {
      check(true, "");
    }
  } catch (const std::exception& e) {
    g_checks.fail_here(e.what());
  }
  return g_checks.finish();
}
