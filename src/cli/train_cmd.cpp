// amsp train: options -> engine::TrainOptions -> engine::train.

#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "backend/factory.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/stop.h"
#include "data/mixture.h"
#include "engine/trainer.h"
#include "hf/model_dir.h"
#include "model/config.h"
#include "plan/memory.h"
#include "plan/search.h"

namespace amsp::cli {

namespace {

// What the command line says, before it is checked: TrainOptions' fields where they
// can be taken as given, and raw values for those that need defaults computed from
// other options or parsing.
struct TrainArgs {
  engine::TrainOptions o;
  std::string model_name, precision, device, compress, compress_guard, global_batch;
  double lr = 0, min_lr = -1;
  int64_t warmup = -1, seed = 0;
  std::string memory;
  bool no_overlap = false;
  InFlight in_flight;
  std::string checkpoint_io;
  std::string checkpoint_mode;
  std::string recompute;
  std::string resume;
};

// The option table; parse_command stores the values given into `a`.
void declare_options(po::options_description& desc, TrainArgs& a) {
  engine::TrainOptions& o = a.o;
  const engine::TrainOptions d;  // the defaults, written once there
  desc.add_options()
      ("model", po::value<std::string>(&a.model_name)->default_value("tiny")->value_name("NAME|FILE"),
           "model preset (inputs/models/NAME.json) or a Hugging Face config.json")
      ("data", po::value<std::string>(&o.data_path)->required()->value_name("FILE.h5[:W],..."),
           "token dataset from `amsp data prepare`, or a mixture a.h5:0.7,b.h5:0.3 that draws each "
           "sequence from one dataset by weight (doc/data.md, \"Mixtures\")")
      ("steps", po::value<int64_t>(&o.steps)->default_value(d.steps)->value_name("INT"),
           "optimizer steps; 0 trains none: evaluates the initial weights and, with "
           "--checkpoint-dir, saves them as the checkpoint of step 0 (e.g. --init-from weights "
           "as an amsp checkpoint)")
      ("seed", po::value<int64_t>(&a.seed)->default_value(static_cast<int64_t>(d.seed))->value_name("INT"),
           "seed for initialisation and data sampling")
      ("batch-size", po::value<int64_t>(&o.batch_size)->default_value(d.batch_size)->value_name("INT"),
           "sequences per micro-batch (per rank)")
      ("seq-len", po::value<int64_t>(&o.seq_len)->default_value(d.seq_len)->value_name("INT"),
           "tokens per sequence")
      ("global-batch", po::value<std::string>(&a.global_batch)->value_name("TOKENS"),
           "tokens per optimizer step over all ranks (e.g. 196608, 64K, 1M = 2^20): each attempt "
           "splits them for the ranks it has into micro-batches of at most --batch-size sequences "
           "and micro-batches per step, so a run requeued on other nodes trains the same batch; "
           "instead of --grad-accum")
      ("grad-accum", po::value<int64_t>(&o.grad_accum)->default_value(d.grad_accum)->value_name("INT"),
           "micro-batches per optimizer step")
      ("lr", number(&a.lr, d.schedule.lr)->value_name("NUM"),
           "peak learning rate")
      ("min-lr", po::value<double>(&a.min_lr)->value_name("NUM"),
           "learning rate at the last step (default: lr / 10)")
      ("warmup-steps", po::value<int64_t>(&a.warmup)->value_name("INT"),
           "linear warmup steps (default: 5% of steps)")
      ("weight-decay", number(&o.adamw.weight_decay, d.adamw.weight_decay)->value_name("NUM"),
           "AdamW decoupled weight decay")
      ("decay-norms-and-embeddings", po::bool_switch(&o.adamw.decay_norms_and_embeddings),
           "also decay RMSNorm weights and the token embedding")
      ("beta1", number(&o.adamw.beta1, d.adamw.beta1)->value_name("NUM"), "AdamW beta1")
      ("beta2", number(&o.adamw.beta2, d.adamw.beta2)->value_name("NUM"), "AdamW beta2")
      ("adam-eps", number(&o.adamw.eps, d.adamw.eps)->value_name("NUM"), "AdamW epsilon")
      ("grad-clip", number(&o.grad_clip, d.grad_clip)->value_name("NUM"),
           "clip the global gradient norm to this; 0 disables")
      ("eval-every", po::value<int64_t>(&o.eval_every)->default_value(d.eval_every)->value_name("INT"),
           "validation loss every N steps (and at the start and end); 0: start and end only")
      ("eval-windows", po::value<int64_t>(&o.eval_windows)->default_value(d.eval_windows)->value_name("INT"),
           "held-out windows per evaluation; 0: the whole split")
      ("metrics", po::value<std::string>(&o.metrics_path)->value_name("FILE"),
           "write one JSON line per step to FILE")
      ("peak-tflops", number(&o.peak_tflops, d.peak_tflops)->value_name("NUM"),
           "peak TFLOP/s for MFU; 0: on cpu this machine's measured GEMM peak, on cuda the GPU's "
           "data-sheet dense bf16 peak")
      ("precision", po::value<std::string>(&a.precision)->default_value("fp32")->value_name("fp32|bf16"),
           "fp32, or bf16 mixed precision: bf16 parameters and gradients on the wire, fp32 "
           "gradient accumulation, master weights and Adam moments (fp32 unless given, on "
           "either device; bf16 is the natural choice on cuda)")
      ("device", po::value<std::string>(&a.device)->value_name("cpu|cuda"),
           "compute backend: cpu, or cuda (rank i of a node on its GpuInfo device); default cuda "
           "when this build has CUDA and a GPU is visible, else cpu")
      ("threads", po::value<int>(&o.threads)->default_value(d.threads)->value_name("INT"),
           "OpenMP threads per rank; 0 keeps OMP_NUM_THREADS or the core count")
      ("shard", po::value<std::string>(&o.shard)->default_value(d.shard)->value_name("PLAN"),
           "shard plan: ddp, zero1, zero2, zero3, fsdp, mics:K, factors such as "
           "p=2x1,g=2x1,os=8x1, or auto (the planner's choice for this topology)")
      ("compress", po::value<std::string>(&a.compress)->default_value("off")->value_name("SPEC"),
           "block-quantized collectives: off, or a list of p=int8|int4|off (parameters' "
           "all-gathers), g=int8|int4|off (gradients' reductions), block=N|chunk (values per "
           "scale, default 256), inter-node (only groups that cross nodes), on (p=int8,g=int8), or "
           "auto (with --shard auto, the planner may choose int8 for either or both); doc/compression.md")
      ("compress-guard", po::value<std::string>(&a.compress_guard)->default_value("warn")->value_name("MODE"),
           "with --compress: measure how far compression moves one micro-batch's gradient at step "
           "1 and every --compress-guard-every steps; warn (above the threshold, one line), "
           "fallback (also stop compressing that kind of collective for the rest of the run) or off")
      ("compress-guard-every", po::value<int64_t>(&o.compress_guard.every)->default_value(d.compress_guard.every)->value_name("INT"),
           "steps between the guard's measurements")
      ("compress-guard-threshold", number(&o.compress_guard.threshold, d.compress_guard.threshold)->value_name("NUM"),
           "relative error of the gradient (|compressed - exact| / |exact|) above which the guard acts")
      ("bandwidth", po::value<std::string>(&o.bandwidth_path)->value_name("FILE"),
           "bandwidth table for --shard auto (amsp comm-bench --output-table); "
           "default: on cpu inputs/bandwidth/localcluster-2x4.json (measured), on cuda the h100 "
           "preset's table modelled from data sheets (inputs/clusters/h100.json)")
      ("memory-per-rank", po::value<std::string>(&a.memory)->value_name("SIZE"),
           "memory a rank may use, for --shard auto (e.g. 4GiB); default: the least any rank has (its GPU's free memory, or available / ranks per node)")
      ("no-overlap", po::bool_switch(&a.no_overlap),
           "wait for every collective as soon as it is issued (for measuring what overlap hides)")
      ("trace", po::value<std::string>(&o.trace_path)->value_name("FILE"),
           "write a Chrome trace (chrome://tracing, Perfetto) of --trace-steps steps from step 2 (the "
           "first warms up): compute, waits, collectives")
      ("trace-steps", po::value<int64_t>(&o.trace_steps)->default_value(d.trace_steps)->value_name("INT"),
           "how many steps --trace records")
      ("kernel-profile", po::value<std::string>(&o.kernel_profile_path)->value_name("FILE.json"),
           "time every backend call (kernel) by name, every step but the first, and write the totals "
           "beside the step time to FILE.json (rank 0); waits for the device at the end of each step")
      ("cuda-profiler-step", po::value<int64_t>(&o.profiler_step)->default_value(d.profiler_step)->value_name("INT"),
           "on --device cuda, open the profiler's capture range (cudaProfilerStart/Stop) around "
           "this step alone, for `ncu --profile-from-start off` or `nsys --capture-range=cudaProfilerApi`; "
           "0: none")
      ("comm-timeout", number(&o.comm_timeout_s, d.comm_timeout_s)->value_name("NUM"),
           "seconds a collective may take before the job is aborted, naming the rank and the "
           "operation; 0: AMSP_COMM_TIMEOUT or 600")
      ("straggler-every", po::value<int64_t>(&o.straggler.every)->default_value(d.straggler.every)->value_name("INT"),
           "steps per window in which the ranks compare their busy time (the step less the waits in "
           "collectives); 0: off")
      ("straggler-threshold", number(&o.straggler.threshold, d.straggler.threshold)->value_name("NUM"),
           "a rank busier than the median by more than this fraction ...")
      ("straggler-windows", po::value<int64_t>(&o.straggler.windows)->default_value(d.straggler.windows)->value_name("INT"),
           "... in this many windows in a row is named as a straggler")
      ("checkpoint-dir", po::value<std::string>(&o.checkpoint_dir)->value_name("DIR"),
           "write sharded HDF5 checkpoints here (doc/checkpoints.md)")
      ("checkpoint-every", po::value<int64_t>(&o.checkpoint_every)->default_value(d.checkpoint_every)->value_name("INT"),
           "steps between checkpoints; 0: only at the end and when stopped by SIGUSR1/SIGTERM")
      ("resume", po::value<std::string>(&a.resume)->default_value("none")->value_name("auto|FILE|none"),
           "continue from the newest verified checkpoint in --checkpoint-dir (auto), a file, or not")
      ("force-resume", po::bool_switch(&o.force_resume),
           "resume even when the dataset's tokens or a model field other than the shapes "
           "(rope_theta, rms_norm_eps, max_position_embeddings) differ from the checkpoint's run")
      ("checkpoint-io", po::value<std::string>(&a.checkpoint_io)->default_value("independent")->value_name("MODE"),
           "how ranks write their shards: independent (default: each rank pwrites its pieces "
           "into the file rank 0 laid out) or collective (parallel HDF5 over MPI-IO, two-phase "
           "buffering, for parallel file systems; doc/checkpoints.md)")
      ("checkpoint-mode", po::value<std::string>(&a.checkpoint_mode)->default_value("background")->value_name("MODE"),
           "background (default): a writer thread copies the shards to host memory while the "
           "next step computes (each update waits for its unit's copy) and writes the file while "
           "the next steps train; sync: training waits for the write")
      ("keep-last", po::value<int>(&o.keep_last)->default_value(d.keep_last)->value_name("INT"),
           "keep only the newest K checkpoints (pruned after a new one is complete); 0: all")
      ("run-info", po::value<std::string>(&o.run_info_path)->value_name("FILE"),
           "write a JSON record of the run (plan, topology, Slurm job, options) at the start and "
           "its outcome (steps, time, peak memory) at the end")
      ("run-id", po::value<std::string>(&o.run_id)->value_name("ID"),
           "the run's identity, kept in the --run-info record (slurm/train.sbatch gives every "
           "run a random one and keeps it in the run directory's run.json)")
      ("final-params", po::value<std::string>(&o.final_params_path)->value_name("FILE"),
           "after the last step, write every parameter as raw float32 in layout order (tests)")
      ("param-trace", po::value<std::string>(&o.param_trace_path)->value_name("FILE"),
           "after every step, append every parameter as raw float32 in layout order (tests)")
      ("recompute", po::value<std::string>(&a.recompute)->default_value("auto")->value_name("none|full|auto"),
           "activation recomputation: keep only each layer's input and rebuild the layer in "
           "backward (the same gradients, less memory, a third more compute); auto: with --shard "
           "auto the planner weighs it, otherwise none")
      ("init-from", po::value<std::string>(&o.init_from)->value_name("DIR"),
           "start from a Hugging Face model directory (config.json and safetensors) instead of "
           "random weights; the model comes from its config.json")
      ("data-order", po::value<std::string>(&o.data_order_path)->value_name("FILE"),
           "write one JSON line per step: where each of its training windows starts in the "
           "train split, in global row order");
  desc.add(in_flight_options(a.in_flight));
  desc.add(model_field_options());
}

// Ranges of single options, checked before anything is loaded: a typo is reported
// before a model config or an --init-from directory is read.
void check_ranges(const TrainArgs& a) {
  const engine::TrainOptions& o = a.o;
  require(a.recompute == "none" || a.recompute == "full" || a.recompute == "auto", "recompute",
          a.recompute, "none, full or auto");
  require(o.steps >= 0, "steps", o.steps, "an integer >= 0");
  require(o.batch_size >= 1, "batch-size", o.batch_size, "an integer >= 1");
  require(o.seq_len >= 2, "seq-len", o.seq_len, "an integer >= 2");
  require(o.grad_accum >= 1, "grad-accum", o.grad_accum, "an integer >= 1");
  require(a.seed >= 0, "seed", a.seed, "an integer >= 0");
  require(a.lr > 0 && std::isfinite(a.lr), "lr", a.lr, "a number > 0");
  require(o.grad_clip >= 0, "grad-clip", o.grad_clip, "a number >= 0");
  require(o.eval_every >= 0, "eval-every", o.eval_every, "an integer >= 0");
  require(o.eval_windows >= 0, "eval-windows", o.eval_windows, "an integer >= 0");
  require(o.adamw.beta1 >= 0 && o.adamw.beta1 < 1, "beta1", o.adamw.beta1, "a number in [0, 1)");
  require(o.adamw.beta2 >= 0 && o.adamw.beta2 < 1, "beta2", o.adamw.beta2, "a number in [0, 1)");
  require(o.adamw.eps > 0, "adam-eps", o.adamw.eps, "a number > 0");
  require(o.adamw.weight_decay >= 0, "weight-decay", o.adamw.weight_decay, "a number >= 0");
  require(o.threads >= 0, "threads", o.threads, "an integer >= 0");
  require(o.peak_tflops >= 0, "peak-tflops", o.peak_tflops, "a number >= 0");
}

// parse_dtype knows int32 and fp64 too, which are no precisions to train in.
void set_precision(TrainArgs& a) {
  const auto dtype = parse_dtype(a.precision);
  require(dtype == DType::kF32 || dtype == DType::kBF16, "precision", a.precision, "fp32 or bf16");
  a.o.precision = *dtype;
}

// The backend's device: given, or the build's and machine's default.
void set_device(TrainArgs& a) {
  if (a.device.empty()) {
    a.o.device = backend::default_device();
    return;
  }
  const auto device = backend::parse_device(a.device);
  require(device.has_value(), "device", a.device, "cpu or cuda");
  backend::check_device_usable(*device);
  a.o.device = *device;
}

// The model: a preset or config file, or the config.json of --init-from (never
// both, since either would silently override the other), then the --model.FIELD
// overrides.
void load_model(TrainArgs& a, const po::variables_map& vm) {
  engine::TrainOptions& o = a.o;
  if (!o.init_from.empty()) {
    if (!vm["model"].defaulted())
      fail_usage("--model ", a.model_name, " with --init-from ", o.init_from,
                 ": expected one of them (--init-from takes the model from its config.json)");
    o.model = hf::ModelDir(o.init_from).config();
  } else {
    o.model = model::load_config(a.model_name);
  }
  apply_model_fields(vm, o.model);
  o.model.validate();
}

// The learning-rate schedule; its defaults depend on --lr and --steps.
void set_schedule(TrainArgs& a) {
  engine::TrainOptions& o = a.o;
  o.schedule.lr = a.lr;
  o.schedule.min_lr = a.min_lr >= 0 ? a.min_lr : a.lr / 10;
  o.schedule.warmup_steps = a.warmup >= 0 ? a.warmup : o.steps / 20;
  require(o.schedule.min_lr <= a.lr, "min-lr", o.schedule.min_lr, "a number <= --lr");
  require(o.schedule.warmup_steps <= o.steps, "warmup-steps", o.schedule.warmup_steps,
          "at most --steps");
}

// Overlap, checkpoints, resume, output files and limits.  Paths are checked here so
// that a typo fails before any work starts rather than when the engine reaches them.
void set_run_options(TrainArgs& a) {
  engine::TrainOptions& o = a.o;
  o.overlap = !a.no_overlap;
  check_in_flight(a.in_flight);
  o.prefetch_units = a.in_flight.prefetch;
  o.reduction_slots = a.in_flight.slots;
  require(o.checkpoint_every >= 0, "checkpoint-every", o.checkpoint_every, "an integer >= 0");
  o.checkpoint_io = ckpt::parse_transfer(a.checkpoint_io, "--checkpoint-io");
  if (a.checkpoint_mode != "sync" && a.checkpoint_mode != "background")
    fail_usage("--checkpoint-mode ", a.checkpoint_mode, ": expected sync or background");
  o.checkpoint_background = a.checkpoint_mode == "background";
  if (a.recompute != "auto")
    o.recompute = a.recompute == "full" ? plan::Recompute::kFull : plan::Recompute::kNone;
  require(o.keep_last >= 0, "keep-last", o.keep_last, "an integer >= 0");
  if (a.resume == "auto" && o.checkpoint_dir.empty())
    fail_usage("--resume auto: expected --checkpoint-dir to say where the checkpoints are");
  if (a.resume != "auto" && a.resume != "none" && !std::filesystem::is_regular_file(a.resume))
    fail_usage("--resume ", a.resume, ": no such file; expected auto, none or a checkpoint file");
  o.resume = a.resume == "none"   ? engine::ResumeFrom{}
             : a.resume == "auto" ? engine::ResumeFrom{engine::ResumeFrom::kNewest, ""}
                                  : engine::ResumeFrom{engine::ResumeFrom::kFile, a.resume};
  // Files written during the run or at its end: a directory that does not
  // exist is refused now, not after the training it would have recorded.
  for (const auto& [option, path] :
       {std::pair<const char*, const std::string&>{"--run-info", o.run_info_path},
        {"--metrics", o.metrics_path}, {"--trace", o.trace_path},
        {"--kernel-profile", o.kernel_profile_path}, {"--param-trace", o.param_trace_path},
        {"--final-params", o.final_params_path}, {"--data-order", o.data_order_path}}) {
    const auto dir = std::filesystem::path(path).parent_path();
    if (!path.empty() && !dir.empty() && !std::filesystem::is_directory(dir))
      fail_usage(option, " ", path, ": no directory ", dir.string(), "; expected a file in an existing directory");
  }
  require(o.trace_steps >= 1, "trace-steps", o.trace_steps, "an integer >= 1");
  require(o.profiler_step >= 0, "cuda-profiler-step", o.profiler_step, "an integer >= 0");
  require(o.comm_timeout_s >= 0, "comm-timeout", o.comm_timeout_s, "a number >= 0");
  require(o.straggler.every >= 0, "straggler-every", o.straggler.every, "an integer >= 0");
  require(o.straggler.threshold > 0, "straggler-threshold", o.straggler.threshold, "a fraction > 0");
  require(o.straggler.windows >= 1, "straggler-windows", o.straggler.windows, "an integer >= 1");
  require(o.compress_guard.every >= 1, "compress-guard-every", o.compress_guard.every, "an integer >= 1");
  require(o.compress_guard.threshold > 0, "compress-guard-threshold", o.compress_guard.threshold,
          "a fraction > 0");
  require(a.compress_guard == "warn" || a.compress_guard == "fallback" || a.compress_guard == "off",
          "compress-guard", a.compress_guard, "warn, fallback or off");
  o.compress_guard.mode = a.compress_guard == "off"        ? engine::CompressionGuard::kOff
                          : a.compress_guard == "fallback" ? engine::CompressionGuard::kFallback
                                                           : engine::CompressionGuard::kWarn;
  if (!a.memory.empty()) o.memory_per_rank = plan::parse_memory_size(a.memory, "memory-per-rank");
}

// Checks the parsed options and completes TrainOptions.  Runs before MPI starts, so
// a bad option costs no MPI start-up.
engine::TrainOptions to_train_options(TrainArgs& a, const po::variables_map& vm) {
  check_ranges(a);
  set_precision(a);
  set_device(a);
  if (a.o.profiler_step > 0 && a.o.device != Device::kCuda)
    fail_usage("--cuda-profiler-step ", a.o.profiler_step, ": the CPU backend has no device profiler; "
               "expected --device cuda");
  a.o.compression = plan::parse_compression(a.compress);
  if (a.o.compression.choose && a.o.shard != "auto")
    fail_usage("--compress auto: the planner chooses the compression only with --shard auto; with --shard ",
               a.o.shard, " give one (e.g. p=int8,g=int8) or off");
  a.o.seed = static_cast<uint64_t>(a.seed);
  if (vm.count("global-batch")) {
    if (!vm["grad-accum"].defaulted())
      fail_usage("--global-batch and --grad-accum: give one; with --global-batch the micro-batches per step "
                 "follow from the rank count");
    a.o.global_batch_tokens = plan::parse_token_count(a.global_batch, "global-batch");
    require(a.o.global_batch_tokens >= 1, "global-batch", a.global_batch, "a token count >= 1");
  }
  data::parse_mixture(a.o.data_path);  // a malformed --data fails before MPI starts; the files are read later
  load_model(a, vm);
  set_schedule(a);
  set_run_options(a);
  return a.o;
}

// A run stopped by SIGUSR1/SIGTERM after its checkpoint exits kExitPreempted, which
// tells slurm/train.sbatch to requeue it.
int train_under_mpi(int argc, char** argv, const engine::TrainOptions& o) {
  return run_under_mpi(&argc, &argv, [&] { return engine::train(o).preempted ? kExitPreempted : kExitOk; });
}

}  // namespace

int run_train(int argc, char** argv) {
  // First of all: a stop request from now on is remembered, never fatal (core/stop.h).
  stop::install();
  TrainArgs args;
  po::options_description desc("Options");
  declare_options(desc, args);
  po::variables_map vm;
  if (!parse_command("train", "Trains a LLaMA model on a token dataset.", desc, argc, argv, vm))
    return 0;
  const engine::TrainOptions o = to_train_options(args, vm);
  return train_under_mpi(argc, argv, o);
}

}  // namespace amsp::cli
