#include "engine/trainer.h"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/factory.h"
#include "backend/profiled_backend.h"
#include "ckpt/checkpoint.h"
#include "ckpt/lock.h"
#include "comm/agree.h"
#include "core/mpi_check.h"
#include "comm/timed.h"
#include "comm/watchdog.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/stop.h"
#include "data/dataset.h"
#include "data/mixture.h"
#include "engine/batch_prefetch.h"
#include "engine/checkpointer.h"
#include "engine/config_table.h"
#include "engine/evaluate.h"
#include "engine/hf_init.h"
#include "engine/kernel_profile.h"
#include "engine/batch_split.h"
#include "engine/compress_guard.h"
#include "engine/metrics.h"
#include "engine/plan_groups.h"
#include "engine/resume_changes.h"
#include "engine/run_info.h"
#include "engine/sharded_engine.h"
#include "engine/trace.h"
#include "model/llama.h"
#include "plan/search.h"
#include "topology/topology.h"

namespace amsp::engine {
namespace {

using Clock = std::chrono::steady_clock;

// How long a checkpoint-directory lock stays valid without renewal: longer than
// any step or checkpoint write, so that only a dead job's lock expires. On the
// same host a dead holder is recognised at once (its pid is gone).
constexpr int64_t kLockLeaseSeconds = 900;

// The share of the peak for MFU that --shard auto assumes a step's
// matmuls reach. A round figure, not a measurement: it only sets how much
// compute there is to hide communication behind, the same for every plan, so
// it moves the ranking only where overlap decides it. Measuring the kernels'
// throughput on the spot is the planner's next step.
constexpr double kAssumedMatmulEfficiency = 0.6;

// "2026-11-23T21:00:00Z"
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Setup phases: the first failure on any rank ends every rank alike (comm/agree.h).
void collectively(const std::function<void()>& fn) { comm::collectively(MPI_COMM_WORLD, fn); }

// The ids of a split are checked against the dataset's vocab_size as they are
// read (data/token_column.h): a dataset whose vocabulary fits the model's holds
// no id beyond it.
void check_dataset(const TrainOptions& o, const data::TokenDataset& data) {
  if (data.vocab_size() > o.model.vocab_size)
    fail_usage("--data ", data.path(), ": its tokenizer has ", data.vocab_size(),
               " ids but the model's vocab_size is ", o.model.vocab_size,
               "; expected a model with vocab_size >= ", data.vocab_size(),
               " (set --model.vocab_size)");
  const int64_t train_tokens = data.size(data::Split::kTrain);
  if (train_tokens < o.seq_len + 1)
    fail_usage("--data ", data.path(), ": train split has ", train_tokens,
               " tokens, fewer than one sequence of --seq-len ", o.seq_len, " + 1");
}

void check_options(const TrainOptions& o, const data::Mixture& data) {
  o.model.validate();
  if (o.seq_len > o.model.max_position_embeddings)
    fail_usage("--seq-len ", o.seq_len, ": expected at most max_position_embeddings = ",
               o.model.max_position_embeddings, " of model ", o.model.name);
  for (size_t i = 0; i < data.size(); ++i) check_dataset(o, data.dataset(i));
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return int64_t{8} << 30;
}

// The plan to train with, whether to recompute, and one line saying why.
struct PlanChoice {
  std::string plan;
  bool recompute = false;
  std::string reason;
  plan::Compression compression;  // --compress, or what the planner chose for auto
};

// The best plan that fits for one choice of recomputation, and why that choice.
struct Weighed {
  plan::Evaluation best;
  plan::Recompute recompute = plan::Recompute::kNone;
  std::string why;
};

// With --recompute auto, the planner weighs recomputation: its extra forward
// against the memory it frees. Recompute only when no plan fits without it,
// or when the plan it makes room for is faster even after paying for it.
Weighed weigh_recompute(plan::PlanInput in) {
  using plan::Recompute;
  auto best_of = [&](Recompute r) {
    in.workload.recompute = r;
    const std::vector<plan::Evaluation> ranked = plan::search(in);
    return !ranked.empty() && ranked.front().fits ? std::optional(ranked.front()) : std::nullopt;
  };
  const auto none = best_of(Recompute::kNone), full = best_of(Recompute::kFull);
  if (!none && !full) return {plan::choose_plan(in), Recompute::kNone, ""};  // throws: nothing fits
  if (!none) return {*full, Recompute::kFull, "recompute full: no plan fits without it"};
  char why[200];
  if (full && full->cost.step_s < none->cost.step_s * (1 - plan::kTieResolution)) {
    std::snprintf(why, sizeof why, "recompute full: the plan it makes room for is faster, step %.1f ms "
                  "against %.1f ms without", full->cost.step_s * 1e3, none->cost.step_s * 1e3);
    return {*full, Recompute::kFull, why};
  }
  if (!full) return {*none, Recompute::kNone, "recompute none"};
  std::snprintf(why, sizeof why, "recompute none: a plan fits without it, step %.1f ms against %.1f ms "
                "with it", none->cost.step_s * 1e3, full->cost.step_s * 1e3);
  return {*none, Recompute::kNone, why};
}

// The bandwidth table --shard auto prices communication with: --bandwidth, else a
// built-in one for the device. On the CPU, the local test cluster's measured MPI
// table; on GPUs, the h100 preset's table, modelled from NVLink's and InfiniBand's
// data sheets, which is nearer any GPU cluster's NCCL than a CPU machine's MPI is
// (hundreds of GB/s against one or two), so that the planner does not weigh every
// collective as if it were a hundred times slower than it is.
struct BandwidthSource {
  std::string path;
  plan::BandwidthTable table;
  plan::Effects effects;  // what the preset adds to the bare collective times (GPU default)
  bool modelled = false;
};

BandwidthSource bandwidth_source(const TrainOptions& o) {
  if (!o.bandwidth_path.empty())
    return {o.bandwidth_path, plan::load_bandwidth_table(o.bandwidth_path, "bandwidth"), {}, false};
  if (o.device == Device::kCuda) {
    plan::Cluster h100 = plan::load_cluster("h100", "bandwidth");
    return {h100.source, std::move(h100.bandwidth), h100.effects, h100.modelled};
  }
  const std::string local = model::inputs_dir() + "/bandwidth/localcluster-2x4.json";
  return {local, plan::load_bandwidth_table(local, "bandwidth"), {}, false};
}

// One line when the table --shard auto plans with is a model or was measured on another
// shape of job than this one, and how to measure one for it.
void warn_if_not_measured_here(const BandwidthSource& b, const topology::Topology& topo) {
  const plan::MeshShape measured = b.table.measured_shape();
  if (!b.modelled && measured.ranks_per_node == topo.local_size && measured.nodes == topo.num_nodes)
    return;
  const std::string launch =
      topo.source == "slurm" ? cat("srun -N ", topo.num_nodes, " --ntasks-per-node=", topo.local_size)
      : topo.num_nodes > 1   ? cat("mpiexec -n ", topo.world_size, " -ppn ", topo.local_size)
                             : cat("mpiexec -n ", topo.world_size);
  const std::string file = cat("bandwidth-", topo.local_size, "x", topo.num_nodes, ".json");
  const std::string what =
      b.modelled ? cat("bandwidth table ", b.path, " is modelled from data sheets, not measured")
                 : cat("bandwidth table ", b.path, " was measured on ", measured.ranks_per_node, "x",
                       measured.nodes, " ranks (per node x nodes), this job has ", topo.local_size,
                       "x", topo.num_nodes);
  std::fputs(cat("amsp: warning: ", what, "; measure one with: ", launch,
                 " amsp comm-bench --output-table ", file, " and pass --bandwidth ", file, "\n")
                 .c_str(),
             stderr);
}

// The memory --shard auto plans each rank with: --memory-per-rank, else the
// least any rank has (every rank must choose the same plan): its GPU's free
// memory, or on the CPU its node's available memory shared by the node's ranks.
// Collective over MPI_COMM_WORLD.
int64_t planning_memory(const TrainOptions& o, const backend::Backend& be,
                        const topology::Topology& topo) {
  if (o.memory_per_rank > 0) return o.memory_per_rank;
  const int64_t device = be.device_memory_free();
  int64_t least = device > 0 ? device : available_memory_bytes() / topo.local_size;
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD));
  return least;
}

// `memory`: planning_memory's.
PlanChoice choose_plan(const TrainOptions& o, const topology::Topology& topo, double peak_flops,
                       int64_t memory) {
  const bool full = o.recompute == plan::Recompute::kFull;
  if (o.shard != "auto")
    return {o.shard, full, full ? "given with --shard; recompute full" : "given with --shard",
            o.compression};
  topo.require_equal_tasks_per_node("--shard auto");
  plan::PlanInput in;
  in.workload.model = o.model;
  in.workload.seq_len = o.seq_len;
  in.workload.micro_batch = o.batch_size;
  in.workload.precision = o.precision == DType::kBF16 ? plan::Precision::kBf16 : plan::Precision::kFp32;
  in.workload.recompute = o.recompute.value_or(plan::Recompute::kNone);
  in.workload.compression = o.compression;
  in.workload.prefetch = o.prefetch_units;
  in.workload.max_reductions = o.reduction_slots;
  in.workload.attention = o.device == Device::kCpu ? plan::AttentionSaved::kProbabilities
                                                   : plan::AttentionSaved::kLogSumExp;
  in.mesh = {topo.local_size, topo.num_nodes};
  in.global_batch_tokens = o.batch_size * o.seq_len * o.grad_accum * topo.world_size;
  in.memory_per_rank = memory;
  BandwidthSource bandwidth = bandwidth_source(o);
  if (topo.rank == 0) warn_if_not_measured_here(bandwidth, topo);
  in.bandwidth = std::move(bandwidth.table);
  in.effects = bandwidth.effects;
  in.compute.peak_flops_per_s = peak_flops;
  in.compute.flops_per_s = peak_flops * kAssumedMatmulEfficiency;
  Weighed w;
  if (!o.recompute) {
    w = weigh_recompute(in);
  } else {
    // search ranks the plans that fit first, best first; choose_plan is only
    // called for its error when none fits.
    const std::vector<plan::Evaluation> ranked = plan::search(in);
    w = {!ranked.empty() && ranked.front().fits ? ranked.front() : plan::choose_plan(in),
         *o.recompute, cat("recompute ", plan::recompute_name(*o.recompute))};
  }
  const plan::Evaluation& best = w.best;
  char why[640];
  std::snprintf(
      why, sizeof why,
      "auto: least exposed communication of the plans that fit %.1f MiB per rank: "
      "step %.1f ms, exposed communication %.1f ms, bandwidth from %s; %s%s",
      in.usable_memory() / double(1 << 20), best.cost.step_s * 1e3, best.cost.exposed_s * 1e3,
      bandwidth.path.c_str(), w.why.c_str(),
      o.compression.choose ? cat("; compress ", plan::to_string(best.compression)).c_str() : "");
  return {plan::to_string(best.plan), w.recompute == plan::Recompute::kFull, why, best.compression};
}

// Every rank's backend description, gathered on rank 0 (empty elsewhere).
std::vector<std::string> gather_descriptions(const std::string& mine) {
  constexpr int kWidth = 160;
  char line[kWidth] = {};
  std::snprintf(line, sizeof line, "%s", mine.c_str());
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(rank == 0 ? static_cast<size_t>(size) * kWidth : 0);
  AMSP_MPI_CHECK(MPI_Gather(line, kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> out;
  for (int r = 0; rank == 0 && r < size; ++r) out.emplace_back(&all[static_cast<size_t>(r) * kWidth]);
  return out;
}

// "device: cuda:0 (NVIDIA H100 80GB HBM3, sm_90) on rank 0", then the other
// ranks' devices where they differ from it.
void print_devices(const std::vector<std::string>& devices) {
  std::string others;
  for (size_t r = 1; r < devices.size(); ++r)
    if (devices[r] != devices[0]) others += cat(", rank ", r, ": ", devices[r]);
  std::printf("device: %s on rank 0%s%s\n", devices[0].c_str(),
              devices.size() > 1 && others.empty() ? ", and the same on every rank" : "", others.c_str());
  std::fflush(stdout);
}

// The options that decide the trajectory, as stored in checkpoints and the run
// record: rows_per_step is the global batch in sequences (batch x grad-accum x
// ranks), data_fingerprint the dataset's identity (resume_changes.h). A mixture
// adds "mixture": every source's path, normalised weight and fingerprint; one
// dataset, with or without a weight, is stored as before mixtures existed.
std::string options_json(const TrainOptions& o, int64_t rows_per_step, const data::Mixture& data,
                         const plan::Compression& active) {
  nlohmann::json j = {{"data", data.single() ? data.path(0) : o.data_path},
                      {"steps", o.steps},
                      {"rows_per_step", rows_per_step},
                      {"data_fingerprint", nlohmann::json::parse(data_fingerprint(data.dataset(0)))},
                      {"seed", o.seed},                {"batch_size", o.batch_size},
                      {"seq_len", o.seq_len},          {"grad_accum", o.grad_accum},
                      {"lr", o.schedule.lr},           {"min_lr", o.schedule.min_lr},
                      {"warmup_steps", o.schedule.warmup_steps},
                      {"weight_decay", o.adamw.weight_decay},
                      {"beta1", o.adamw.beta1},        {"beta2", o.adamw.beta2},
                      {"adam_eps", o.adamw.eps},       {"grad_clip", o.grad_clip},
                      {"shard", o.shard},              {"decay_norms_and_embeddings", o.adamw.decay_norms_and_embeddings},
                      {"precision", dtype_name(o.precision)}};
  if (!o.init_from.empty()) j["init_from"] = o.init_from;
  // What --compress asked for, and what the guard's fallback left of it (compress_guard.h).
  j["compress"] = plan::to_string(o.compression);
  if (!(active == o.compression)) j["compress_active"] = plan::to_string(active);
  // A mixture keeps data_fingerprint of its first dataset: the tokenizer is every
  // dataset's (data/mixture.h), and amsp export reads it there.
  if (!data.single()) {
    nlohmann::json sources = nlohmann::json::array();
    for (size_t i = 0; i < data.size(); ++i)
      sources.push_back({{"path", data.path(i)}, {"weight", data.weight(i)},
                         {"fingerprint", nlohmann::json::parse(data_fingerprint(data.dataset(i)))}});
    j["mixture"] = sources;
  }
  return j.dump();
}

// Every parameter as raw float32 in layout order; `option` names the file in errors.
void write_params(const std::string& path, const std::vector<std::vector<float>>& params, bool append,
                  const char* option) {
  std::ofstream out(path, std::ios::binary | (append ? std::ios::app : std::ios::trunc));
  if (!out) fail(option, " ", path, ": cannot create the file");
  for (const auto& p : params)
    out.write(reinterpret_cast<const char*>(p.data()), static_cast<std::streamsize>(p.size() * sizeof(float)));
  if (!out) fail(option, " ", path, ": write failed");
}

// One JSON line: the step and where each of its rows' windows starts in the
// train split, rows in global order (row = (micro * ranks + pos) * batch + b, pos
// the rank's node-major position);
// with a mixture also each row's source (its index in --data).
void write_data_order(std::ofstream& out, const data::Mixture& data, uint64_t seed, int64_t step,
                      int64_t rows, int64_t T) {
  nlohmann::json starts = nlohmann::json::array(), sources = nlohmann::json::array();
  for (int64_t row = 0; row < rows; ++row) {
    starts.push_back(data.window_start(seed, step, row, T));
    sources.push_back(data.source_of(seed, step, row));
  }
  nlohmann::json line = {{"step", step}, {"window_tokens", T + 1}, {"starts", starts}};
  if (!data.single()) line["sources"] = sources;
  out << line.dump() << "\n";
  out.flush();
  if (!out) fail("--data-order: write failed at step ", step);
}

// --- the checkpoint directory and resuming ---------------------------------

// The checkpoint directory is this job's alone (ckpt/lock.h): rank 0 holds its
// lock until train returns, renewing the lease every step. Null on other ranks
// and without --checkpoint-dir.
std::unique_ptr<ckpt::DirLock> lock_checkpoint_dir(const TrainOptions& o, bool root) {
  std::unique_ptr<ckpt::DirLock> lock;
  if (o.checkpoint_dir.empty()) return lock;
  collectively([&] {
    if (!root) return;
    std::string taken;
    lock = std::make_unique<ckpt::DirLock>(o.checkpoint_dir, ckpt::LockHolder::self(), kLockLeaseSeconds, &taken);
    if (!taken.empty()) std::printf("%s\n", taken.c_str());
  });
  return lock;
}

// Where training starts: step 1, or after a checkpoint's step.
struct ResumePoint {
  int64_t first_step = 1;
  int64_t tokens_before = 0;
  std::vector<int64_t> source_tokens_before;  // per source of --data (resume_changes.h)
  std::string from;  // the checkpoint resumed from, or empty
  std::optional<plan::Compression> compression;  // what the guard left in the checkpoint's run
};

// Rank 0 removes what an interrupted save left, and says so.
void clean_checkpoint_dir(const TrainOptions& o, bool root) {
  if (!root || o.checkpoint_dir.empty()) return;
  std::string removed;
  for (const auto& n : ckpt::clean_temporaries(o.checkpoint_dir)) removed += " " + n;
  if (!removed.empty())
    std::printf("resume: removed what an interrupted save left in %s:%s\n", o.checkpoint_dir.c_str(),
                removed.c_str());
}

// The checkpoint --resume names: the newest that verifies (auto) or the file
// given; empty when auto finds none.
std::string resume_path(const TrainOptions& o, bool root) {
  if (o.resume.kind == ResumeFrom::kFile) return o.resume.file;
  std::vector<std::string> skipped;
  std::optional<std::string> found;
  collectively([&] { found = ckpt::find_latest(o.checkpoint_dir, &skipped, MPI_COMM_WORLD); });
  if (root)
    for (const auto& s : skipped) std::printf("resume: skipping %s\n", s.c_str());
  if (root && !found)
    std::printf("resume: no checkpoint in %s; starting from scratch\n", o.checkpoint_dir.c_str());
  return found.value_or("");
}

// Loads the checkpoint into the engine on any plan and world size (the sampler
// needs nothing but (seed, step)), after checking that the options still make
// sense for it; prints what changed.
ResumePoint resume(const TrainOptions& o, ShardedEngine& engine, const std::string& run_options, bool root) {
  ResumePoint start;
  if (o.resume.kind == ResumeFrom::kNone) return start;
  clean_checkpoint_dir(o, root);
  const std::string path = resume_path(o, root);
  if (path.empty()) return start;
  ckpt::Metadata meta;
  ResumeChanges changes;
  collectively([&] {
    if (o.resume.kind == ResumeFrom::kFile)
      ckpt::require_sound(path, MPI_COMM_WORLD);  // auto: find_latest checked it
    meta = ckpt::load(path, o.model, engine.units(), engine.shards(), engine.state_views(), MPI_COMM_WORLD);
    changes = compare_for_resume(meta.options_json, meta.model_json, run_options, model::config_to_json(o.model));
    if (!changes.refusals.empty() && !o.force_resume)
      fail_usage("--resume ", path, ": ", changes.refusals.front(), "; pass --force-resume to resume anyway");
    if (meta.step >= o.steps)
      fail_usage("--resume ", path, ": the checkpoint is at step ", meta.step, ", not before --steps ", o.steps,
                 "; nothing left to train");
  });
  if (root) {
    std::printf("resume: %s (step %lld, written by %s on %lld ranks)\n", path.c_str(),
                static_cast<long long>(meta.step), meta.plan.c_str(), static_cast<long long>(meta.world_size));
    for (const auto& r : changes.refusals) std::printf("resume: forced (--force-resume): %s\n", r.c_str());
    for (const auto& n : changes.notes) std::printf("resume: changed: %s\n", n.c_str());
  }
  return {meta.step + 1, meta.tokens,
          carried_source_tokens(meta.options_json, meta.source_tokens, meta.tokens, run_options), path,
          resumed_compression(meta.options_json, o.compression)};
}

// A directory whose checkpoints go past where this run starts holds another
// trajectory: writing beside it would let a later --resume auto pick the other
// run's newer file. (With auto, newer files are ones that failed to verify;
// this run's saves replace them.)
void refuse_other_trajectory(const TrainOptions& o, const ResumePoint& start, bool root) {
  if (o.checkpoint_dir.empty() || o.resume.kind == ResumeFrom::kNewest) return;
  collectively([&] {
    const int64_t newest = root ? ckpt::newest_step(o.checkpoint_dir) : -1;
    if (newest >= start.first_step)
      fail_usage("--checkpoint-dir ", o.checkpoint_dir, " holds checkpoints up to step ", newest,
                 " but this run starts at step ", start.first_step,
                 start.first_step == 1 ? " from scratch" : cat(" from ", start.from),
                 "; expected --resume auto to continue them, or another directory");
  });
}

// One training run on this rank: what it is set up with, then its steps.
// train() below reads as the run's schedule; each phase is a method here.
class Run {
 public:
  explicit Run(const TrainOptions& options);
  void start();                          // lock, resume, run record, first evaluation
  void train_steps();                    // until --steps or a stop signal
  TrainResult finish();                  // final parameters, trace, record

 private:
  TrainOptions o;
  int threads = 0;
  topology::Topology topo;
  std::unique_ptr<data::Mixture> data;
  bool root = false;
  std::unique_ptr<backend::Backend> be;
  std::unique_ptr<KernelProfile> profile;  // with --kernel-profile; be is then a ProfiledBackend
  std::vector<std::string> devices;  // every rank's describe(), on rank 0
  double peak_flops = 0;
  std::string plan_text, reason;
  std::string batch_note;  // how --global-batch was split on this allocation
  bool recompute = false;
  std::unique_ptr<PlanGroups> pg;
  std::unique_ptr<Trace> trace;
  int64_t trace_first = 0, trace_last = 0;
  std::unique_ptr<ShardedEngine> engine;
  std::unique_ptr<BatchPrefetch> prefetch;  // the next step's windows, read while a step computes
  int64_t world = 1, pos = 0, tokens_per_step = 0;
  std::string run_options;
  double flops_per_token = 0;
  std::unique_ptr<ckpt::DirLock> dir_lock;
  std::unique_ptr<Checkpointer> checkpointer;  // with --checkpoint-dir; before dir_lock is released
  ResumePoint start_point;
  std::unique_ptr<MetricsSink> sink;
  nlohmann::ordered_json info;
  std::ofstream data_order;
  int64_t windows = 0;
  double val_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> val_losses;     // per source of a mixture, at the last evaluation
  std::vector<int64_t> source_tokens;  // per source of a mixture: tokens drawn so far
  TrainResult result;
  Clock::time_point run_start;
  int64_t reserved_max = 0;  // the caching allocator's reserved bytes, largest at a step's end
  std::unique_ptr<StragglerWatch> straggler;

  void announce_stop_ready();
  void set_up_ranks();
  void set_up_plan();
  void set_up_engine();
  double evaluate();
  void write_run_record_start();
  void fill_batch(int64_t step, int64_t micro, int32_t* tokens, int32_t* targets) const;
  BatchFn batch_of(int64_t step);
  std::optional<GuardReading> guard(int64_t step);
  void set_compression(const plan::Compression& c);
  StepMetrics train_step(int64_t step);
  double busy_seconds(int64_t step, double engine_s, double cpu0);
  void add_memory(StepMetrics& m);
  void write_profile(bool at_end);
  void validate(StepMetrics& m);
  void report(const StepMetrics& m, bool eval_now);
  bool stop_agreed();
  void say_stopping(const std::string& when);
  bool checkpoint_due(int64_t step, bool stopping) const;
  double save_checkpoint(int64_t step);
  void report_written(StepMetrics* m);
  void finish_checkpoints();
  void write_run_record_end(double seconds);
  // Every rank's predicted and measured peaks, gathered on rank 0 (null elsewhere).
  nlohmann::ordered_json memory_per_rank(int64_t backend_peak) const;
};

Run::Run(const TrainOptions& options) : o(options) {
  stop::install();  // amsp train did already, before MPI_Init; tests may call train() directly
  announce_stop_ready();
  o.schedule.total_steps = o.steps;
  if (o.threads > 0) omp_set_num_threads(o.threads);
  threads = omp_get_max_threads();
  set_up_ranks();
  set_up_plan();
  set_up_engine();
}

// Every rank has its stop handlers (they are installed before MPI_Init): a job
// script may pass stop signals on from now on.
void Run::announce_stop_ready() {
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  comm::quiet_barrier(MPI_COMM_WORLD, 50);  // the ranks start at different times: wait without spinning
  stop::announce_ready(rank == 0);
}

// Topology, data and the backend; every check runs on every rank, and the
// first failure ends all of them alike.
void Run::set_up_ranks() {
  collectively([&] {
    fault::check_environment();
    topo = topology::discover(MPI_COMM_WORLD);
    if (o.global_batch_tokens > 0) {
      const BatchSplit s = split_global_batch(o.global_batch_tokens, o.seq_len, topo.world_size, o.batch_size);
      o.batch_size = s.micro_batch;
      o.grad_accum = s.micro_batches;
      batch_note = describe(s, o.global_batch_tokens, o.seq_len, topo.world_size);
    }
  });
  collectively([&] {
    data = std::make_unique<data::Mixture>(o.data_path);
    check_options(o, *data);
  });
  root = topo.rank == 0;
  // Before anything else CUDA: the backend makes this rank's device current.
  collectively([&] {
    const int cuda_device =
        o.device == Device::kCuda ? backend::cuda_device_for(topo.gpu.device, topo.local_rank) : 0;
    be = backend::make_backend(o.device, o.precision, cuda_device);
  });
  if (!o.kernel_profile_path.empty()) {
    auto profiled = std::make_unique<backend::ProfiledBackend>(std::move(be));
    profile = std::make_unique<KernelProfile>(*profiled);
    be = std::move(profiled);
  }
  devices = gather_descriptions(be->describe());
  // The peak is rank 0's (others wait): on a GPU its data sheet's, on the CPU
  // measured on rank 0 alone, as a rank has it on a dedicated device; ranks
  // sharing a CPU make MFU look lower than it is.
  peak_flops = o.peak_tflops * 1e12;
  if (peak_flops <= 0) {
    if (root) peak_flops = be->peak_flops();
    AMSP_MPI_CHECK(MPI_Bcast(&peak_flops, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    if (root && peak_flops <= 0)
      std::printf("note: no peak FLOP/s known for %s; MFU shows 0 (give --peak-tflops)\n",
                  be->describe().c_str());
  }
}

void Run::set_up_plan() {
  const int64_t memory = o.shard == "auto" ? planning_memory(o, *be, topo) : 0;
  collectively([&] {
    const PlanChoice choice = choose_plan(o, topo, peak_flops, memory);
    plan_text = choice.plan;
    recompute = choice.recompute;
    reason = choice.reason;
    o.compression = choice.compression;
    pg = std::make_unique<PlanGroups>(make_plan_groups(MPI_COMM_WORLD, topo, plan_text));
  });
  if (!root) return;
  std::printf("plan: %s on %d rank(s) (%s)\n", plan::to_string(pg->mesh.plan()).c_str(),
              topo.world_size, reason.c_str());
  std::printf("groups: %s\n", pg->placement.c_str());
  if (!batch_note.empty()) std::printf("batch: --global-batch %s\n", batch_note.c_str());
  std::fflush(stdout);
  // After the plan, which tests expect on the first line; the CPU's output as it was.
  if (o.device != Device::kCpu) print_devices(devices);
}

void Run::set_up_engine() {
  if (!o.trace_path.empty()) trace = std::make_unique<Trace>(MPI_COMM_WORLD);
  // Steps 2 .. 1 + trace_steps (the first warms up), or step 1 of a one-step run.
  trace_first = std::min<int64_t>(2, o.steps);
  trace_last = trace_first + o.trace_steps - 1;
  EngineOptions eo;
  eo.precision = o.precision;
  eo.adamw = o.adamw;
  eo.grad_clip = o.grad_clip;
  eo.micro_batches = o.grad_accum;
  eo.overlap = o.overlap;
  eo.prefetch = o.prefetch_units;
  eo.max_reductions = o.reduction_slots;
  eo.recompute = recompute;
  eo.comm_timeout_s = o.comm_timeout_s;
  eo.compression = o.compression;
  eo.trace = trace.get();
  engine = std::make_unique<ShardedEngine>(o.model, *be, o.batch_size, o.seq_len, *pg, o.seed, eo);
  if (!o.init_from.empty()) collectively([&] { load_hf_weights(hf::ModelDir(o.init_from), *engine); });
  // Collectively: a failure on rank 0 alone must not leave the others waiting.
  collectively([&] {
    if (root) print_config(o, *data, peak_flops, threads, topo, *pg, *engine, be->describe());
  });
  world = topo.world_size;
  pos = pg->position;
  tokens_per_step = o.batch_size * o.seq_len * o.grad_accum * world;
  run_options = options_json(o, world * o.batch_size * o.grad_accum, *data, o.compression);
  flops_per_token = model::Llama::flops_per_token(o.model, o.seq_len);
  prefetch = std::make_unique<BatchPrefetch>(
      [this](int64_t step, int64_t micro, int32_t* tokens, int32_t* targets) {
        fill_batch(step, micro, tokens, targets);
      },
      o.grad_accum, o.batch_size * o.seq_len);
}

// The held-out loss. A mixture evaluates every source (val_losses) and returns
// their mean weighted as the mixture draws them, over the sources that have a
// held-out window: the loss of the training distribution.
double Run::evaluate() {
  if (data->single())
    return evaluate_loss(*engine, data->dataset(0), data::Split::kValid, o.eval_windows, o.batch_size, o.seq_len,
                         world, pos, o.comm_timeout_s, &windows);
  val_losses.clear();
  windows = 0;
  double sum = 0, weights = 0;
  for (size_t i = 0; i < data->size(); ++i) {
    int64_t used = 0;
    val_losses.push_back(evaluate_loss(*engine, data->dataset(i), data::Split::kValid, o.eval_windows, o.batch_size,
                                       o.seq_len, world, pos, o.comm_timeout_s, &used));
    windows += used;
    if (used > 0) sum += data->weight(i) * val_losses.back(), weights += data->weight(i);
  }
  return weights > 0 ? sum / weights : std::numeric_limits<double>::quiet_NaN();
}

// Per source of a mixture (empty for one dataset), keyed by the source's path.
template <typename T>
std::vector<std::pair<std::string, T>> by_source(const data::Mixture& data, const std::vector<T>& values) {
  std::vector<std::pair<std::string, T>> out;
  for (size_t i = 0; !data.single() && i < values.size(); ++i) out.emplace_back(data.path(i), values[i]);
  return out;
}

void Run::start() {
  dir_lock = lock_checkpoint_dir(o, root);
  start_point = resume(o, *engine, run_options, root);
  if (start_point.compression) {
    if (root)
      std::printf("resume: --compress %s as the compression guard left it (asked: %s)\n",
                  plan::to_string(*start_point.compression).c_str(), plan::to_string(o.compression).c_str());
    set_compression(*start_point.compression);
  }
  refuse_other_trajectory(o, start_point, root);
  if (!o.checkpoint_dir.empty())
    checkpointer = std::make_unique<Checkpointer>(
        *engine, *be, CheckpointPlace{o.checkpoint_dir, o.keep_last, o.checkpoint_io}, o.checkpoint_background, root);
  if (root) sink = std::make_unique<MetricsSink>(o.metrics_path, /*append=*/start_point.first_step > 1);
  write_run_record_start();
  write_profile(/*at_end=*/false);
  if (root && !o.data_order_path.empty()) {
    data_order.open(o.data_order_path, start_point.first_step > 1 ? std::ios::app : std::ios::trunc);
    if (!data_order) comm::abort_job(cat("--data-order ", o.data_order_path, ": cannot create the file"));
  }
  source_tokens = start_point.source_tokens_before;
  source_tokens.resize(data->size(), 0);
  if (start_point.first_step == 1) {
    val_loss = evaluate();
    if (root) sink->eval(0, val_loss, windows, by_source(*data, val_losses));
  }
  result.last_step = start_point.first_step - 1;
  run_start = Clock::now();
}

// What this run is, for job scripts and scaling studies; the result is added at the end.
void Run::write_run_record_start() {
  if (o.run_info_path.empty()) return;
  int64_t snapshot_bytes = checkpointer ? checkpointer->snapshot_bytes() : 0;
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &snapshot_bytes, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  int pinned = checkpointer && checkpointer->snapshot_pinned() ? 1 : 0;
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &pinned, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  collectively([&] {
    if (!root) return;
    const auto null_or = [](const std::string& s) {
      return s.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(s);
    };
    info = {{"amsp_version", AMSP_VERSION},
            {"run_id", null_or(o.run_id)},
            {"started_at", utc_now()},
            {"slurm", slurm_job_json(topology::process_environment())},
            {"world_size", topo.world_size},
            {"num_nodes", topo.num_nodes},
            {"ranks_per_node",
             topo.equal_tasks_per_node() ? nlohmann::ordered_json(topo.local_size) : nlohmann::ordered_json()},
            {"topology", topology_json(topo)},
            {"plan", plan::to_string(pg->mesh.plan())},
            {"plan_reason", reason},
            {"recompute", recompute ? "full" : "none"},
            {"compress", plan::to_string(o.compression)},
            {"groups", pg->placement},
            {"backend", device_name(o.device)},
            {"devices", devices},
            {"precision", dtype_name(o.precision)},
            {"model_name", o.model.name},
            {"model", nlohmann::ordered_json::parse(model::config_to_json(o.model))},
            {"parameters", o.model.num_parameters()},
            {"options", nlohmann::ordered_json::parse(run_options)},
            {"tokens_per_step", tokens_per_step},
            {"threads_per_rank", threads},
            {"peak_flops_per_rank", peak_flops},
            {"model_state_bytes", engine->model_state_bytes()},
            {"temporary_bytes", engine->temporary_bytes()},
            {"activation_bytes", engine->activation_bytes()},
            {"checkpoint_mode", checkpointer ? (checkpointer->background() ? "background" : "sync")
                                             : nlohmann::ordered_json()},
            {"ckpt_snapshot_bytes", snapshot_bytes},
            {"ckpt_snapshot_pinned", pinned != 0},
            {"resumed_from", null_or(start_point.from)},
            {"first_step", start_point.first_step},
            {"init_from", null_or(o.init_from)},
            {"data_order", null_or(o.data_order_path)},
            {"result", nullptr}};
    write_run_info(o.run_info_path, info);
  });
}

void Run::train_steps() {
  // --steps 0: the initial weights (random or --init-from) as a checkpoint.
  if (o.steps == 0 && start_point.first_step == 1 && !o.checkpoint_dir.empty()) save_checkpoint(0);
  // A request during set-up, resume or the first evaluation: nothing new to save.
  if (start_point.first_step <= o.steps && stop_agreed()) {
    result.preempted = true;
    result.last_step = start_point.first_step - 1;
    say_stopping(cat("before step ", start_point.first_step, ": nothing trained in this attempt",
                     start_point.from.empty() ? ", nothing to save" : "; " + start_point.from + " stays the latest"));
    return;
  }
  straggler = std::make_unique<StragglerWatch>(o.straggler, topo.rank, topo.world_size, o.comm_timeout_s);
  for (int64_t step = start_point.first_step; step <= o.steps; ++step) {
    comm::watchdog::set_step(step);
    fault::point("train.step", step, topo.rank);
    if (dir_lock) {
      try {
        dir_lock->renew();
      } catch (const Error& e) {
        comm::abort_job(e.what());
      }
    }
    const std::optional<GuardReading> reading = guard(step);
    StepMetrics m = train_step(step);
    if (checkpointer) m.ckpt_update_wait_ms = checkpointer->take_update_wait_ms();
    if (reading) {
      m.compress_err_p = reading->p_err;
      m.compress_err_g = reading->g_err;
    }
    const bool eval_now = (o.eval_every > 0 && step % o.eval_every == 0) || step == o.steps;
    result.last_step = step;
    const bool stopping = step < o.steps && stop_agreed();
    // The save comes before the report, so that the step's line carries its stall.
    if (checkpoint_due(step, stopping)) m.ckpt_stall_ms = save_checkpoint(step);
    report_written(&m);
    if (eval_now) validate(m);
    report(m, eval_now);
    if (stopping) {
      result.preempted = true;
      say_stopping(cat("after step ", step, o.checkpoint_dir.empty() ? "; no --checkpoint-dir, so this progress is not saved" : ""));
      break;
    }
  }
}

// Micro-batch `micro` of a step on this rank.
void Run::fill_batch(int64_t step, int64_t micro, int32_t* tokens, int32_t* targets) const {
  data->sample_train_batch(o.seed, step, (micro * world + pos) * o.batch_size, o.batch_size, o.seq_len, tokens,
                           targets);
}

BatchFn Run::batch_of(int64_t step) {
  return [this, step](int64_t micro, int32_t* tokens, int32_t* targets) { fill_batch(step, micro, tokens, targets); };
}

// The compression guard's measurement before the step, when it is due, and what
// it decides (compress_guard.h).
std::optional<GuardReading> Run::guard(int64_t step) {
  if (!guard_due(o.compress_guard, engine->compression(), step)) return std::nullopt;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step);
  const GuardReading r = measure_guard(*engine, grad_scale, batch_of(step), o.comm_timeout_s);
  const GuardVerdict v = judge_guard(o.compress_guard, r, engine->compression(), step);
  if (root)
    for (const std::string& line : v.warnings) std::printf("%s\n", line.c_str());
  if (v.next) set_compression(*v.next);
  return r;
}

// From the next step on; checkpoints carry it.
void Run::set_compression(const plan::Compression& c) {
  engine->set_compression(c);
  run_options = options_json(o, world * o.batch_size * o.grad_accum, *data, c);
}

// One optimizer step on every rank, and its figures.
StepMetrics Run::train_step(int64_t step) {
  engine->reset_comm_stats();
  if (trace) trace->set_recording(step >= trace_first && step <= trace_last);
  const auto t0 = Clock::now();
  const double cpu0 = o.device == Device::kCpu ? compute_cpu_seconds() : 0.0;
  const int64_t syncs0 = be->host_syncs() + engine->comm_host_waits();
  if (profile) profile->begin_step();
  const double lr = learning_rate(o.schedule, step - 1);
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step);
  const BatchFn batch = prefetch->take(step);
  if (step < o.steps) prefetch->start(step + 1);
  // The capture range holds the step's work, through its one synchronisation.
  if (step == o.profiler_step) be->profiler_capture(true);
  const StepResult r = engine->step(step, o.grad_accum, grad_scale, lr, batch);
  if (step == o.profiler_step) be->profiler_capture(false);
  const double busy_s = busy_seconds(step, seconds_since(t0), cpu0);
  double sums[2] = {r.loss_sum, static_cast<double>(r.loss_count)};
  comm::allreduce_sum(sums, 2, MPI_COMM_WORLD, "training loss", o.comm_timeout_s);
  // Recording runs on between traced steps: a collective issued in one step (the next
  // step's first gather, prefetched) may complete between them.
  if (trace && step >= trace_last) trace->set_recording(false);
  if (profile) profile->end_step();

  StepMetrics m;
  if (o.device == Device::kCuda) {
    m.host_syncs = be->host_syncs() + engine->comm_host_waits() - syncs0;
    m.host_issue_ms = r.issue_s * 1e3;
  }
  m.step = step;
  m.total_steps = o.steps;
  m.loss = sums[0] / std::max(1.0, sums[1]);
  m.lr = lr;
  m.grad_norm = r.grad_norm;
  m.step_ms = seconds_since(t0) * 1e3;
  // The first step of a process warms up (allocator, caches), unless it is the only one.
  if (profile) profile->add_step(step, m.step_ms, step > start_point.first_step || step == o.steps);
  m.tokens_per_s = static_cast<double>(tokens_per_step) / (m.step_ms / 1e3);
  m.mfu = peak_flops > 0 ? flops_per_token * m.tokens_per_s / (peak_flops * static_cast<double>(world)) : 0.0;
  m.tokens = start_point.tokens_before + (step - start_point.first_step + 1) * tokens_per_step;
  if (!data->single()) {
    // Every rank counts every row of the step: a row's source is a function of (seed, step, row).
    const std::vector<int64_t> rows = data->rows_per_source(o.seed, step, tokens_per_step / o.seq_len);
    for (size_t i = 0; i < rows.size(); ++i) source_tokens[i] += rows[i] * o.seq_len;
    m.source_tokens = by_source(*data, source_tokens);
  }
  add_memory(m);
  m.comm = engine->comm_stats();
  m.busy_ms = busy_s * 1e3;
  m.busy = straggler->add(step, busy_s);
  if (!std::isfinite(m.loss))
    comm::abort_job(cat("step ", step, ": loss is ", m.loss, "; training diverged (try a lower --lr)"));
  return m;
}

// How long this rank was busy in the engine's step: the time it kept the
// others waiting, if it was the slowest (engine/straggler.h). On a device, the
// step less its waits in collectives. On the CPU, the CPU time its computing
// threads spent: ranks that share cores (a test machine, an oversubscribed
// node) get the cores in turns, so their wall-clock busy times measure the
// scheduler more than the rank; and the communication thread polls for as
// long as the rank waits, so counting it (the process's CPU time) made the
// fastest ranks look busy on a loaded machine (doc/cluster.md, "When a job
// is slow"); cpu0 is compute_cpu_seconds() at the step's start (a device run
// does not read it: each read wakes the OpenMP team, host time the device
// would sit idle for). AMSP_FAULT's SLOW=F makes it F times longer, spinning,
// for the straggler tests.
double Run::busy_seconds(int64_t step, double engine_s, double cpu0) {
  double busy_s = 0;
  if (o.device == Device::kCpu) {
    busy_s = compute_cpu_seconds() - cpu0;
  } else {
    double exposed_s = 0;
    for (const comm::Stats& g : engine->comm_stats())
      for (comm::Op op : comm::kAllOps) exposed_s += g[op].exposed_s;
    busy_s = std::max(0.0, engine_s - exposed_s);
  }
  const double slow = fault::slow_factor(step, topo.rank);
  if (slow > 0) {
    const double until = caller_cpu_seconds() + slow * busy_s;
    while (caller_cpu_seconds() < until) {
    }
  }
  return busy_s * (1 + slow);
}

void Run::add_memory(StepMetrics& m) {
  m.model_state_bytes = engine->model_state_bytes();
  m.temporary_bytes = engine->temporary_bytes();
  m.activation_bytes = engine->activation_bytes();
  const backend::MemoryStats mem = be->memory();
  m.mem_peak_bytes = mem.peak;
  m.mem_predicted_bytes = engine->predicted_peak_bytes();
  if (o.device == Device::kCuda) {  // the CUDA backend's caching allocator
    m.mem_reserved_bytes = mem.reserved;
    reserved_max = std::max(reserved_max, mem.reserved);
  }
  m.rss_peak_bytes = peak_rss_bytes();
}

// The validation pass (collective): the held-out loss into the step's metrics.
void Run::validate(StepMetrics& m) {
  val_loss = evaluate();
  m.val_loss = val_loss;
  m.val_loss_sources = by_source(*data, val_losses);
}

// The step's line, metrics and data order (rank 0), and its parameters with --param-trace.
void Run::report(const StepMetrics& m, bool eval_now) {
  if (root) {
    sink->step(m);
    if (eval_now) sink->eval(m.step, val_loss, windows, m.val_loss_sources);
    if (data_order.is_open())
      write_data_order(data_order, *data, o.seed, m.step, tokens_per_step / o.seq_len, o.seq_len);
  }
  if (!o.param_trace_path.empty()) {
    const auto params = engine->full_parameters();
    if (root) write_params(o.param_trace_path, params, /*append=*/m.step > 1, "--param-trace");
  }
}

// Stop together: a signal may reach the ranks at different moments.
bool Run::stop_agreed() {
  double asked = stop::requested() ? 1.0 : 0.0;
  comm::allreduce_sum(&asked, 1, MPI_COMM_WORLD, "stop flag", o.comm_timeout_s);
  return asked > 0;
}

void Run::say_stopping(const std::string& when) {
  if (!root) return;
  const int sig = stop::requested();
  std::printf("stopping %s (stop requested by %s)\n", when.c_str(),
              sig ? stop::signal_name(sig) : "a signal to another rank");
  std::fflush(stdout);
}

bool Run::checkpoint_due(int64_t step, bool stopping) const {
  return checkpointer && ((o.checkpoint_every > 0 && step % o.checkpoint_every == 0) || step == o.steps || stopping);
}

// Returns the milliseconds training was blocked.
double Run::save_checkpoint(int64_t step) {
  ckpt::Metadata meta;
  meta.step = step;
  meta.tokens = start_point.tokens_before + (step - start_point.first_step + 1) * tokens_per_step;
  meta.seed = o.seed;
  meta.model_json = model::config_to_json(o.model);
  meta.options_json = run_options;
  meta.plan = plan::to_string(pg->mesh.plan());
  meta.topology = topo.describe();
  meta.world_size = world;
  if (!data->single()) meta.source_tokens = source_tokens;
  return checkpointer->save(meta);
}

// A background write that finished: its time goes in this step's line, and
// rank 0 names the file now complete.
void Run::report_written(StepMetrics* m) {
  const auto done = checkpointer ? checkpointer->take_written() : std::nullopt;
  if (!done) return;
  if (m) m->ckpt_write_ms = done->write_ms;
  if (!root) return;
  std::printf("checkpoint: %s (step %lld, written in the background in %.2f s)\n", done->path.c_str(),
              static_cast<long long>(done->step), done->write_ms / 1e3);
  std::fflush(stdout);
}

// The end of training, or a stop request: the write in flight completes first.
void Run::finish_checkpoints() {
  if (!checkpointer) return;
  checkpointer->wait();
  report_written(nullptr);
}

TrainResult Run::finish() {
  finish_checkpoints();
  engine->check_gradient_padding();
  result.val_loss = val_loss;
  if (!o.final_params_path.empty()) {
    const auto params = engine->full_parameters();
    if (root) write_params(o.final_params_path, params, /*append=*/false, "--final-params");
  }
  if (trace) {
    trace->write(o.trace_path);
    if (root) std::printf("trace: %s (steps %lld-%lld; open in chrome://tracing or ui.perfetto.dev)\n",
                          o.trace_path.c_str(), static_cast<long long>(trace_first),
                          static_cast<long long>(std::min(trace_last, o.steps)));
  }
  const double seconds = seconds_since(run_start);
  write_run_record_end(seconds);
  // After the run record: its reference copy allocates, which no memory figure may count.
  write_profile(/*at_end=*/true);
  if (root) sink->finish(seconds, start_point.first_step, result.last_step, o.steps);
  return result;
}

// Rank 0 writes the kernel profile: empty at the start (so that a path that
// cannot be written is refused before training, as --run-info's is), whole at
// the end, with its top kernels printed.
void Run::write_profile(bool at_end) {
  if (!profile) return;
  collectively([&] {
    if (!root) return;
    if (at_end) profile->measure_copy_bandwidth();
    write_json_file(o.kernel_profile_path, profile->json(), "--kernel-profile");
    if (!at_end) return;
    std::printf("%skernel profile: %s\n", profile->table(15).c_str(), o.kernel_profile_path.c_str());
    std::fflush(stdout);
  });
}

nlohmann::ordered_json Run::memory_per_rank(int64_t backend_peak) const {
  const int64_t mine[3] = {engine->predicted_peak_bytes(), backend_peak, peak_rss_bytes()};
  int world = 1;
  AMSP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  std::vector<int64_t> all(root ? 3 * static_cast<size_t>(world) : 0);
  AMSP_MPI_CHECK(MPI_Gather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, 0, MPI_COMM_WORLD));
  if (!root) return nullptr;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < world; ++r) {
    const int64_t* v = all.data() + 3 * r;
    ranks.push_back({{"rank", r}, {"predicted_bytes", v[0]}, {"peak_backend_bytes", v[1]},
                     {"peak_rss_bytes", v[2]}});
  }
  return ranks;
}

void Run::write_run_record_end(double seconds) {
  if (o.run_info_path.empty()) return;
  int64_t rss = peak_rss_bytes();
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &rss, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  // The emulation's happens-before checks over all ranks (-1: none, a real GPU or the CPU).
  int64_t hb = o.device == Device::kCuda ? backend::hb_checked() : -1;
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hb, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  const backend::MemoryStats mem = be->memory();
  int64_t device_peak[2] = {mem.peak, reserved_max};
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, device_peak, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  const nlohmann::ordered_json per_rank = memory_per_rank(mem.peak);
  collectively([&] {
    if (!root) return;
    info["result"] = {{"status", result.preempted ? "stopped" : "completed"},
                      {"exit_code", result.preempted ? kExitPreempted : kExitOk},
                      {"last_step", result.last_step},
                      {"seconds", seconds},
                      {"val_loss", std::isfinite(val_loss) ? nlohmann::ordered_json(val_loss) : nlohmann::ordered_json()},
                      {"peak_rss_bytes", rss},
                      {"peak_backend_bytes", device_peak[0]},
                      {"peak_backend_reserved_bytes", o.device == Device::kCuda ? nlohmann::ordered_json(device_peak[1])
                                                                                : nlohmann::ordered_json()},
                      {"hb_checked", hb < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(hb)},
                      {"memory_per_rank", per_rank},
                      {"finished_at", utc_now()}};
    write_run_info(o.run_info_path, info);
  });
}

}  // namespace

TrainResult train(const TrainOptions& options) {
  Run run(options);  // topology, data, backend, plan, groups, engine
  run.start();       // lock, resume, run record, first evaluation
  run.train_steps();
  return run.finish();
}

}  // namespace amsp::engine
