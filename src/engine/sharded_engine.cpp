#include "engine/sharded_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/traffic.h"
#include "core/error.h"
#include "core/mpi_check.h"
#include "plan/memory.h"
#include "plan/schedule.h"

namespace amsp::engine {

using backend::Buffer;
using backend::View;
using plan::GroupKind;

namespace {

// What the planner is told this engine runs: the same model, batch, precision,
// recomputation, work in flight and compression, so that its schedule and its
// memory are the engine's.
plan::Workload engine_workload(const model::LlamaConfig& config, int64_t batch, int64_t seq_len,
                               const EngineOptions& o) {
  plan::Workload w;
  w.model = config;
  w.seq_len = seq_len;
  w.micro_batch = batch;
  w.precision = o.precision == DType::kBF16 ? plan::Precision::kBf16 : plan::Precision::kFp32;
  w.recompute = o.recompute ? plan::Recompute::kFull : plan::Recompute::kNone;
  w.prefetch = o.prefetch;
  w.max_reductions = o.max_reductions;
  w.compression = o.compression;
  return w;
}

}  // namespace

struct ShardedEngine::Impl {
  // A reduction slot: the unit's full gradient and its P-, G- and OS-shard
  // parts, in the wire dtype (the parameters' dtype).
  struct Slot {
    Buffer full, p, g, os;
    Buffer qsend, qrecv;  // a compressed reduction's records (int32 words)
    comm::Handle reads_full;  // the last stage of the chain using it that touches `full`
    comm::Handle busy;        // the last stage of that chain
  };
  // One unit's model states.
  struct State {
    Buffer p;                     // P-shard parameters (fp32 or bf16)
    Buffer g;                     // G-shard gradient accumulator (fp32)
    Buffer master;                // bf16 only: fp32 parameters of the OS range
    Buffer exp_avg, exp_avg_sq;   // OS-shard Adam moments (fp32)
  };

  backend::Backend& be;
  model::Llama& model;
  const std::vector<UnitShards>& shards;
  EngineOptions opt;
  // What the schedule is made from; set_compression makes it again.
  plan::Workload workload;
  plan::ShardPlan shard_plan;
  plan::MeshShape shape;
  plan::StepSchedule schedule;  // what every step issues, in which order (plan/schedule.h)
  DType wire = DType::kF32;
  int units = 0;
  int64_t p_ranks = 1;  // the P group's size: 1 means every rank holds whole units
  int64_t replicas = 1, replica = 0;
  std::array<std::unique_ptr<comm::Communicator>, 5> comms;
  std::unique_ptr<comm::Communicator> world;  // the gradient norm's all-reduce

  std::vector<State> state;
  std::vector<comm::Handle> param_update;  // gather-group all-gather rebuilding each P-shard

  // Gathered units: `prefetch + 1` buffers, gather position i of a program
  // uses buffer i mod (prefetch + 1).
  std::vector<Buffer> gather_slots;
  // Per gather buffer, for compressed all-gathers: the records sent and received.
  std::vector<Buffer> gather_qsend, gather_qrecv;
  std::vector<comm::Handle> gather_handles;  // per position of the running program

  std::vector<Slot> slots;
  int64_t slots_taken = 0;  // slots are taken in turn
  int backward_slot = -1;   // the slot the last backward wrote its full gradient into

  // Host copies of the states handed out by state_views(), taken back by the
  // next step: the P-shard widened to fp32 in bf16, and everything on a
  // device backend (host code cannot touch device memory).
  struct Staged {
    std::vector<float> params, exp_avg, exp_avg_sq;
  };
  std::vector<Staged> staging;

  Impl(backend::Backend& b, model::Llama& m, const std::vector<UnitShards>& s, PlanGroups& pg,
       int64_t batch, int64_t seq_len, const EngineOptions& o);

  bool bf16() const { return opt.precision == DType::kBF16; }
  bool on_host() const { return be.device() == Device::kCpu; }
  // Backward writes the unit's gradient straight into its G-shard.
  bool direct_gradients() const { return schedule.direct_gradients; }
  comm::Communicator& comm(GroupKind kind) { return *comms[static_cast<size_t>(kind)]; }
  comm::Handle issued(comm::Handle h) {
    if (!opt.overlap) h.wait();
    return h;
  }
  const UnitShards& shards_of(int u) const { return shards[static_cast<size_t>(u)]; }
  State& state_of(int u) { return state[static_cast<size_t>(u)]; }
  // Views of a unit's OS range inside its P-shard and G-shard.
  View p_os(int u) {
    return state_of(u).p.at(shards_of(u).os.begin - shards_of(u).p.begin, shards_of(u).os.size);
  }
  View g_os(int u) {
    return state_of(u).g.at(shards_of(u).os.begin - shards_of(u).g.begin, shards_of(u).os.size);
  }
  View master(int u) { return bf16() ? state_of(u).master.view() : p_os(u); }

  void make_communicators(PlanGroups& pg);
  void allocate();

  // Parameters.
  void start_program(const std::vector<plan::Action>& program);
  void issue_gather(const plan::Action& a);
  View params_at(const plan::Action& a);

  // Gradients: the schedule's buffers and local steps of unit u in slot s.
  View buffer(plan::Buf b, int u, int s);
  comm::Local local(const plan::Stage& stage, const plan::LocalStep& l, int u, int s);
  int take_slot();
  View stage_buffer(const plan::Stage& stage, plan::Buf b, int u, int s);
  void issue_reduction(int u, int s, bool last_micro, int part);
  void drain();

  // Compute.
  template <typename F>
  void traced(const char* what, int u, F&& f);
  void forward(const plan::Action& a);
  void backward(const plan::Action& a);
  void zero_gradients();
  void reduce(const plan::Action& a, int64_t micro_batches);

  // The optimizer.
  void norm_and_clip_scale();
  using OsBuffers = ShardedEngine::OsBuffers;
  void gated_update(const model::UnitSpec& unit, int u, double lr, int64_t step);
  void update(const model::UnitSpec& unit, int u, double lr, int64_t step, const OsBuffers* out);

  // The step's scalars on the backend, read back once at its end: the loss
  // accumulator [0..4) (Backend::cross_entropy_forward_into) and the squared
  // norm [4]; the clipping factor (fp32); and the micro-batches' token ids and
  // targets in page-locked host memory, copied without waiting.
  Buffer scalars, clip;
  Buffer pinned;
  int32_t* pinned_batch(int64_t micro_batches, int64_t tokens);
  View sumsq() { return scalars.at(4, 1); }

  // Checkpoint views.
  std::vector<ckpt::StateView> state_views();
  void take_staged_state();
  void begin_os_snapshot(const std::vector<ckpt::StateView>& dst);
  ShardedEngine::UpdateGate* update_gate = nullptr;  // set_update_gate
};

ShardedEngine::Impl::Impl(backend::Backend& b, model::Llama& m, const std::vector<UnitShards>& s,
                          PlanGroups& pg, int64_t batch, int64_t seq_len, const EngineOptions& o)
    : be(b), model(m), shards(s), opt(o), wire(o.precision), units(m.num_units()) {
  if (opt.precision != DType::kF32 && opt.precision != DType::kBF16)
    fail_usage("engine: precision ", dtype_name(opt.precision), " is not fp32 or bf16");
  const plan::ShardPlan& plan = pg.mesh.plan();
  p_ranks = plan.p.size();
  replicas = pg.mesh.group_size(GroupKind::kReplica);
  replica = pg.mesh.coords(pg.position).r;
  workload = engine_workload(m.config(), batch, seq_len, opt);
  shard_plan = plan;
  shape = pg.mesh.shape();
  schedule = plan::step_schedule(workload, shard_plan, shape);
  for (int u = 0; u < units; ++u)
    if (schedule.padded[static_cast<size_t>(u)] != shards_of(u).padded)
      fail("engine: the schedule pads unit ", u, " to ", schedule.padded[static_cast<size_t>(u)],
           " elements, its shards to ", shards_of(u).padded);
  make_communicators(pg);
  allocate();
}

void ShardedEngine::Impl::make_communicators(PlanGroups& pg) {
  for (GroupKind kind : plan::kAllGroups) {
    const size_t k = static_cast<size_t>(kind);
    if (pg.mesh.group_size(kind) <= 1) continue;
    comms[k] = be.make_communicator(std::move(pg.groups[k]));
    if (opt.comm_timeout_s > 0) comms[k]->set_timeout(opt.comm_timeout_s);
    if (Trace* trace = opt.trace) {
      const std::string group = plan::group_name(kind);
      const int64_t first = pg.mesh.group_members(kind, pg.position).front();
      comms[k]->set_trace(
          [trace, group, first](comm::Op op, uint64_t seq, double start, double end, bool waited) {
            if (waited)
              trace->span("wait", cat("wait ", comm::op_name(op), " ", group), start, end,
                          {first, seq});
            else
              trace->span("comm " + group, comm::op_name(op), start, end, {first, seq});
          });
    }
  }
  // The norm's partial sums stay on the backend: on a device, NCCL sums them.
  world = be.make_communicator(std::move(pg.world));
  if (opt.comm_timeout_s > 0) world->set_timeout(opt.comm_timeout_s);
}

void ShardedEngine::Impl::allocate() {
  int64_t max_padded = 0;
  for (const auto& s : shards) {
    State x;
    x.p = be.alloc(opt.precision, s.p.size);
    x.g = be.alloc(DType::kF32, s.g.size);
    if (bf16()) x.master = be.alloc(DType::kF32, s.os.size);
    x.exp_avg = be.alloc(DType::kF32, s.os.size);
    x.exp_avg_sq = be.alloc(DType::kF32, s.os.size);
    state.push_back(std::move(x));
    max_padded = std::max(max_padded, s.padded);
  }
  param_update.resize(static_cast<size_t>(units));
  scalars = be.alloc(DType::kF64, 5);
  clip = be.alloc(DType::kF32, 1);

  if (p_ranks > 1)
    for (int i = 0; i <= opt.prefetch; ++i) {
      gather_slots.push_back(be.alloc(wire, max_padded));
      if (schedule.gather_qsend > 0) {
        gather_qsend.push_back(be.alloc(DType::kI32, schedule.gather_qsend));
        gather_qrecv.push_back(be.alloc(DType::kI32, schedule.gather_qrecv));
      }
    }
  // The reduction slots, in the sizes the schedule's stages name; the
  // planner's memory model (plan/memory.h) predicts exactly these.
  const plan::SlotElems& e = schedule.slot;
  for (int i = 0; i < opt.max_reductions; ++i) {
    slots.push_back({be.alloc(wire, e.full), be.alloc(wire, e.p), be.alloc(wire, e.g),
                     be.alloc(wire, e.os), be.alloc(DType::kI32, e.qsend), be.alloc(DType::kI32, e.qrecv),
                     {}, {}});
  }
}

// --- parameters ---------------------------------------------------------------

void ShardedEngine::Impl::start_program(const std::vector<plan::Action>& program) {
  take_staged_state();
  int64_t positions = 0;
  for (const plan::Action& a : program)
    if (a.kind == plan::Action::kGather) positions = std::max(positions, a.pos + 1);
  gather_handles.assign(static_cast<size_t>(positions), comm::Handle());
}

void ShardedEngine::Impl::issue_gather(const plan::Action& a) {
  const int u = a.unit;
  const plan::Stage& g = schedule.gather[static_cast<size_t>(u)];
  const size_t b = static_cast<size_t>(a.pos) % gather_slots.size();
  comm::OpArgs args;
  args.op = g.op;
  args.send = state_of(u).p.data();
  args.recv = gather_slots[b].data();
  args.count = g.count;
  args.dtype = g.dtype;
  args.after = param_update[static_cast<size_t>(u)];  // the P-shard is final
  if (g.compressed) {
    // Records travel: the P-shard quantized into one, the P group's gathered ones
    // dequantized into the unit (plan/schedule.cpp, compress_gather).
    const DType pd = state_of(u).p.dtype();
    args.send = gather_qsend[b].data();
    args.recv = gather_qrecv[b].data();
    args.before = {comm::Local::kQuantize,
                   state_of(u).p.data(),
                   pd,
                   gather_qsend[b].data(),
                   DType::kI32,
                   g.values,
                   1,
                   g.quant};
    args.then = {comm::Local::kDequantize, gather_qrecv[b].data(), DType::kI32, gather_slots[b].data(), pd,
                 g.values, g.after.records, g.quant};
  }
  gather_handles[static_cast<size_t>(a.pos)] = issued(comm(g.group).submit(args));
}

// Full parameters of the unit of action a.
View ShardedEngine::Impl::params_at(const plan::Action& a) {
  const int u = a.unit;
  if (p_ranks == 1) {
    param_update[static_cast<size_t>(u)].compute_wait();
    return state_of(u).p.view();
  }
  gather_handles[static_cast<size_t>(a.pos)].compute_wait();
  return gather_slots[static_cast<size_t>(a.pos) % gather_slots.size()].at(0, shards_of(u).padded);
}

// --- gradients ------------------------------------------------------------------

View ShardedEngine::Impl::buffer(plan::Buf b, int u, int s) {
  const Slot& slot = slots[static_cast<size_t>(s)];
  switch (b) {
    case plan::Buf::kFull:
      return slot.full.at(0, shards_of(u).padded);
    case plan::Buf::kSlotP:
      return slot.p.at(0, shards_of(u).p.size);
    case plan::Buf::kSlotG:
      return slot.g.at(0, shards_of(u).g.size);
    case plan::Buf::kSlotOS:
      return slot.os.at(0, shards_of(u).os.size);
    case plan::Buf::kGShard:
      return state_of(u).g.view();
    case plan::Buf::kGShardOS: return g_os(u);
    case plan::Buf::kPShard:
      return state_of(u).p.view();
    case plan::Buf::kPShardOS: return p_os(u);
    case plan::Buf::kQSend: return slot.qsend.view();
    case plan::Buf::kQRecv: return slot.qrecv.view();
    default: break;
  }
  fail("engine: the schedule names buffer ", plan::buf_name(b), " for a reduction");
}

// Buffer b as `stage` works on it: a bucket's range of it, or all of it.
View ShardedEngine::Impl::stage_buffer(const plan::Stage& stage, plan::Buf b, int u, int s) {
  const View v = buffer(b, u, s);
  return stage.bucket ? v.at(stage.offset, stage.count) : v;
}

comm::Local ShardedEngine::Impl::local(const plan::Stage& stage, const plan::LocalStep& l, int u, int s) {
  if (l.kind == plan::LocalStep::kNone) return {};
  const View src = stage_buffer(stage, l.src, u, s), dst = stage_buffer(stage, l.dst, u, s);
  if (l.kind == plan::LocalStep::kQuantize || l.kind == plan::LocalStep::kDequantizeSum)
    return {l.kind == plan::LocalStep::kQuantize ? comm::Local::kQuantize : comm::Local::kDequantizeSum,
            src.data, src.dtype, dst.data, dst.dtype, stage.values, l.records, stage.quant};
  if (src.count != dst.count)
    fail("engine: local step ", plan::buf_name(l.src), " -> ", plan::buf_name(l.dst), " of ",
         src.count, " and ", dst.count, " elements");
  return {l.kind == plan::LocalStep::kAdd ? comm::Local::kAdd : comm::Local::kCopy, src.data,
          src.dtype, dst.data, dst.dtype, dst.count, 1, {}};
}

// The next slot in turn, once compute may overwrite its `full` buffer: the
// stages of the chain that used it last and touch `full` have completed (a wait
// on the compute stream, not the host, on a device). Its later stages may still
// run: the next chain in this slot waits for them on the communicators.
int ShardedEngine::Impl::take_slot() {
  const int s = static_cast<int>(slots_taken++ % static_cast<int64_t>(slots.size()));
  slots[static_cast<size_t>(s)].reads_full.compute_wait();
  slots[static_cast<size_t>(s)].reads_full = {};
  return s;
}

namespace {

bool touches(const plan::Stage& st, plan::Buf b) {
  return st.send == b || st.recv == b || st.before.src == b || st.before.dst == b || st.after.src == b ||
         st.after.dst == b || st.and_then.src == b || st.and_then.dst == b;
}

}  // namespace

// Issues every stage of unit u's chain for this micro-batch at once, in the
// schedule's order: each later stage is chained to the one before on the
// communicators, so it starts when that completes while compute goes on. The
// first stage is chained to the end of the slot's previous chain, whose later
// stages may still be using the slot's other buffers.
void ShardedEngine::Impl::issue_reduction(int u, int s, bool last_micro, int part) {
  Slot& slot = slots[static_cast<size_t>(s)];
  comm::Handle last = slot.busy, full;
  for (const plan::Stage* stage : plan::stages_for(schedule, u, last_micro, part)) {
    comm::OpArgs a;
    a.op = stage->op;
    a.count = stage->count;
    a.dtype = stage->dtype;
    a.recv = stage_buffer(*stage, stage->recv, u, s).data;
    a.send =
        stage->op == comm::Op::kAllReduce ? a.recv : stage_buffer(*stage, stage->send, u, s).data;
    a.after = last;
    a.before = local(*stage, stage->before, u, s);
    a.then = local(*stage, stage->after, u, s);
    a.and_then = local(*stage, stage->and_then, u, s);
    last = issued(comm(stage->group).submit(a));
    if (touches(*stage, plan::Buf::kFull)) full = last;
  }
  slot.busy = last;
  slot.reads_full = full;
}

// Every reduction complete, for compute (the norm reads the G-shards).
void ShardedEngine::Impl::drain() {
  for (Slot& slot : slots) {
    slot.busy.compute_wait();
    slot.busy = {};
    slot.reads_full = {};
  }
}

// --- one micro-batch ----------------------------------------------------------------

// A compute span on the trace.
template <typename F>
void ShardedEngine::Impl::traced(const char* what, int u, F&& f) {
  if (!opt.trace || !opt.trace->recording()) return f();
  const double t0 = comm::now_seconds();
  f();
  opt.trace->span("compute", cat(what, " ", model.units()[static_cast<size_t>(u)].name), t0,
                  comm::now_seconds());
}

void ShardedEngine::Impl::forward(const plan::Action& a) {
  const View params = params_at(a);
  traced("fwd", a.unit, [&] { model.forward(a.unit, params); });
}

// The first micro-batch writes a unit's gradient, the later ones add to it,
// so no pass zeroes the gradients first (a full pass over every parameter's
// fp32 gradient, about 1% of a GPU step). Without direct gradients each
// micro-batch writes a slot's full buffer, whose padding past the unit's
// parameters (the unit's size up to a multiple of the OS group) is zeroed:
// the reduction sums it, and a slot served other units before.
void ShardedEngine::Impl::backward(const plan::Action& a) {
  const int u = a.unit;
  const View params = params_at(a);
  if (direct_gradients()) {
    const auto mode = a.micro == 0 ? model::Llama::Grads::kWrite : model::Llama::Grads::kAdd;
    traced("bwd", u, [&] { model.backward(u, params, state_of(u).g.view(), mode, a.part); });
  } else {
    backward_slot = take_slot();
    const View grad = buffer(plan::Buf::kFull, u, backward_slot);
    const int64_t numel = shards_of(u).numel;
    if (grad.count > numel) be.fill_zero(grad.at(numel, grad.count - numel));
    traced("bwd", u, [&] { model.backward(u, params, grad, model::Llama::Grads::kWrite); });
  }
}

// The G-shards a step's reductions add into start at zero; with direct
// gradients, backward writes them instead (above).
void ShardedEngine::Impl::zero_gradients() {
  if (direct_gradients()) return;
  for (auto& s : state) be.fill_zero(s.g.view());
}

// Right after the unit's backward: its chain, in the slot backward wrote.
void ShardedEngine::Impl::reduce(const plan::Action& a, int64_t micro_batches) {
  const int s = direct_gradients() ? take_slot() : backward_slot;
  backward_slot = -1;
  issue_reduction(a.unit, s, a.micro == micro_batches - 1, a.part);
}

// --- the optimizer -------------------------------------------------------------------

// The squared norm of the OS-shards, summed in unit order and over the world
// on the backend, then the clipping factor from it, on the backend too:
// nothing is read back (each OS-shard is held once per replica, hence the
// division by the replicas).
void ShardedEngine::Impl::norm_and_clip_scale() {
  for (int u = 0; u < units; ++u) be.sum_squares_into(g_os(u), sumsq());
  if (world->size() > 1) {
    const double t0 = comm::now_seconds();
    comm::Handle h = world->all_reduce(sumsq().data, 1, DType::kF64);
    h.compute_wait();
    if (opt.trace)
      opt.trace->span("comm world", "all_reduce (norm)", t0, comm::now_seconds(),
                      {0, h.sequence()});
  }
  be.clip_scale(sumsq(), static_cast<double>(replicas), opt.grad_clip, clip.view());
}

// Room for every micro-batch's tokens and targets; grown (never in a run whose
// micro-batches per step stay the same) only at the start of a step, when the
// previous step's end has synchronised.
int32_t* ShardedEngine::Impl::pinned_batch(int64_t micro_batches, int64_t tokens) {
  const int64_t need = micro_batches * 2 * tokens;
  if (pinned.count() < need) pinned = be.alloc_host(need);
  return static_cast<int32_t*>(pinned.data());
}

// update(u) behind the gate (set_update_gate): in place, or into the gate's
// buffers, which then become the engine's states and the engine's old ones
// the gate's. In fp32 the master is the P-shard's OS range, which stays where
// it is, updated in place (the gate copied its old values), and only the
// moments are exchanged.
void ShardedEngine::Impl::gated_update(const model::UnitSpec& unit, int u, double lr, int64_t step) {
  const std::optional<OsBuffers> out = update_gate ? update_gate->before_update(u) : std::nullopt;
  if (!out) return update(unit, u, lr, step, nullptr);
  if (!on_host()) fail("engine: states exchanged with a gate must be host memory");
  update(unit, u, lr, step, &*out);
  State& x = state_of(u);
  if (bf16()) std::swap(x.master, *out->master);
  std::swap(x.exp_avg, *out->exp_avg);
  std::swap(x.exp_avg_sq, *out->exp_avg_sq);
  update_gate->after_exchange(u);
}

void ShardedEngine::Impl::update(const model::UnitSpec& unit, int u, double lr, int64_t step,
                                 const OsBuffers* out) {
  const plan::Range os = shards_of(u).os;
  OsShard shard{os.begin,
                os.end(),
                master(u),
                g_os(u),
                state_of(u).exp_avg.view(),
                state_of(u).exp_avg_sq.view(),
                bf16() ? p_os(u) : View{},
                {},
                {},
                {}};
  if (out) {
    shard.master_out = bf16() ? out->master->view() : master(u);  // fp32: in place (gated_update)
    shard.exp_avg_out = out->exp_avg->view();
    shard.exp_avg_sq_out = out->exp_avg_sq->view();
  }
  adamw_update_range(be, unit, shard, opt.adamw, lr, step, clip.view());
  // Rebuild the P-shard from the updated OS-shards; the next step waits for
  // it only when it needs this unit.
  if (!schedule.optimizer_gather.empty()) {
    const plan::Stage& g = schedule.optimizer_gather[static_cast<size_t>(u)];
    param_update[static_cast<size_t>(u)] =
        issued(comm(g.group).all_gather(p_os(u).data, g.count, state_of(u).p.data(), g.dtype));
  }
}

// --- checkpoint views --------------------------------------------------------------

std::vector<ckpt::StateView> ShardedEngine::Impl::state_views() {
  take_staged_state();
  for (auto& h : param_update) h.wait();
  std::vector<ckpt::StateView> views;
  if (bf16() || !on_host()) staging.resize(static_cast<size_t>(units));
  for (int u = 0; u < units; ++u) {
    State& x = state_of(u);
    if (staging.empty()) {
      views.push_back({x.p.f32(), x.exp_avg.f32(), x.exp_avg_sq.f32()});
      continue;
    }
    // The P range in fp32; in bf16 its OS part is the fp32 master.
    Staged& s = staging[static_cast<size_t>(u)];
    s.params.resize(static_cast<size_t>(shards_of(u).p.size));
    be.to_host(x.p.view(), s.params.data());
    if (bf16())
      be.to_host(x.master.view(), s.params.data() + (shards_of(u).os.begin - shards_of(u).p.begin));
    if (on_host()) {
      views.push_back({s.params.data(), x.exp_avg.f32(), x.exp_avg_sq.f32()});
      continue;
    }
    s.exp_avg.resize(static_cast<size_t>(x.exp_avg.count()));
    s.exp_avg_sq.resize(static_cast<size_t>(x.exp_avg_sq.count()));
    be.to_host(x.exp_avg.view(), s.exp_avg.data());
    be.to_host(x.exp_avg_sq.view(), s.exp_avg_sq.data());
    views.push_back({s.params.data(), s.exp_avg.data(), s.exp_avg_sq.data()});
  }
  return views;
}

// What the views hold becomes the state: the master from the OS part, the
// bf16 parameters rounded from the P range (so they equal round(master)), and
// on a device the moments too.
void ShardedEngine::Impl::take_staged_state() {
  if (staging.empty()) return;
  for (int u = 0; u < units; ++u) {
    const Staged& s = staging[static_cast<size_t>(u)];
    be.from_host(s.params.data(), state_of(u).p.view());
    if (bf16())
      be.from_host(s.params.data() + (shards_of(u).os.begin - shards_of(u).p.begin),
                   state_of(u).master.view());
    if (!s.exp_avg.empty()) be.from_host(s.exp_avg.data(), state_of(u).exp_avg.view());
    if (!s.exp_avg_sq.empty()) be.from_host(s.exp_avg_sq.data(), state_of(u).exp_avg_sq.view());
  }
  staging.clear();
  staging.shrink_to_fit();
}

void ShardedEngine::Impl::begin_os_snapshot(const std::vector<ckpt::StateView>& dst) {
  take_staged_state();
  for (auto& h : param_update) h.wait();
  std::vector<backend::Backend::HostCopy> copies;
  for (int u = 0; u < units; ++u) {
    const ckpt::StateView& d = dst[static_cast<size_t>(u)];
    copies.push_back({master(u), d.params});
    copies.push_back({state_of(u).exp_avg.view(), d.exp_avg});
    copies.push_back({state_of(u).exp_avg_sq.view(), d.exp_avg_sq});
  }
  be.begin_snapshot(copies);
}

namespace {

// Plain copies of host memory, not backend calls: this may run on another
// thread than the engine's, whose backend is not shared.
void copy_os_state_host(const View& master, const View& exp_avg, const View& exp_avg_sq,
                        const ckpt::StateView& d) {
  std::memcpy(d.params, master.data, static_cast<size_t>(master.bytes()));
  std::memcpy(d.exp_avg, exp_avg.data, static_cast<size_t>(exp_avg.bytes()));
  std::memcpy(d.exp_avg_sq, exp_avg_sq.data, static_cast<size_t>(exp_avg_sq.bytes()));
}

}  // namespace

// --- the public face ------------------------------------------------------------------

namespace {

// The rank's predicted peak, set aside on the backend now, before the model
// and the engine allocate (Backend::reserve): what the backend holds already
// (the CUDA backend's cuBLASLt workspace), the plan's model states and
// temporaries, and the model's own activations on this backend (what its
// attention keeps included), not the planner's GPU estimate.
int64_t reserve_working_set(backend::Backend& be, const model::LlamaConfig& config, const PlanGroups& pg,
                            int64_t batch, int64_t seq_len, const EngineOptions& o) {
  const plan::Workload w = engine_workload(config, batch, seq_len, o);
  plan::MemoryBreakdown m = plan::memory_per_rank(w, pg.mesh.plan(), pg.mesh.shape());
  m.activations = plan::model_activation_bytes(
      config, batch, seq_len, o.recompute, be.compute(),
      be.attention_saved_count(batch, seq_len, config.num_attention_heads));
  const int64_t peak = be.memory().in_use + m.total();
  be.reserve(peak);
  return peak;
}

}  // namespace

ShardedEngine::ShardedEngine(const model::LlamaConfig& config, backend::Backend& backend,
                             int64_t batch, int64_t seq_len, PlanGroups& groups, uint64_t seed,
                             const EngineOptions& options)
    : batch_(batch),
      seq_len_(seq_len),
      tokens_(static_cast<size_t>(batch * seq_len)),
      targets_(static_cast<size_t>(batch * seq_len)),
      predicted_peak_(reserve_working_set(backend, config, groups, batch, seq_len, options)),
      model_(config, backend, batch, seq_len, options.recompute),
      shards_(plan::unit_shards(model_.units(), groups.mesh, groups.position)) {
  if (options.prefetch < 1 || options.max_reductions < 1)
    fail_usage("engine: prefetch and max_reductions must be >= 1");
  if (backend.compute() != options.precision)
    fail_usage("engine: the backend computes in ", dtype_name(backend.compute()),
               " but the engine was asked for ", dtype_name(options.precision));
  impl_ = std::make_unique<Impl>(backend, model_, shards_, groups, batch, seq_len, options);
  // Staging sized now, not in a step: the batch buffer for the expected
  // micro-batches, and the backend's read-back buffer (one read of the scalars).
  impl_->pinned_batch(std::max<int64_t>(1, options.micro_batches), batch * seq_len);
  double warm[5];
  backend.to_host_f64(impl_->scalars.view(), warm);
  init_parameters(seed);
}

// Every rank draws its P-shard (and its OS-shard's fp32 master) of each unit
// from (seed, unit, element index), so parameters are the single-process ones
// whatever the plan and precision, and a rank draws only what it keeps.
void ShardedEngine::init_parameters(uint64_t seed) {
  Impl& im = *impl_;
  std::vector<float> part;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const auto draw = [&](plan::Range r) {
      part.assign(static_cast<size_t>(r.size), 0.0f);  // padding past the unit's end stays 0
      model::init_unit_params(model_.units()[u], static_cast<int>(u), seed, r.begin, r.end(), part.data());
      return part.data();
    };
    im.be.from_host(draw(shards_[u].p), im.state[u].p.view());
    if (im.bf16()) im.be.from_host(draw(shards_[u].os), im.state[u].master.view());
  }
}

ShardedEngine::~ShardedEngine() {
  if (impl_) {
    impl_->drain();
    for (auto& h : impl_->param_update) h.wait();
  }
}

StepResult ShardedEngine::step(int64_t step, int64_t micro_batches, float grad_scale, double lr,
                               const BatchFn& batch) {
  Impl& im = *impl_;
  const double t_start = comm::now_seconds();
  const std::vector<plan::Action> program = plan::step_program(im.schedule, micro_batches);
  im.start_program(program);
  im.zero_gradients();
  im.be.fill_zero(im.scalars.view());
  // Every micro-batch's data first, into page-locked memory the copies read
  // while the step runs.
  const int64_t N = batch_ * seq_len_;
  int32_t* data = im.pinned_batch(micro_batches, N);
  for (int64_t m = 0; m < micro_batches; ++m) batch(m, data + 2 * m * N, data + (2 * m + 1) * N);
  model_.accumulate_loss_into(im.scalars.at(0, 4));
  double t_update = 0;
  for (const plan::Action& a : program) {
    switch (a.kind) {
      case plan::Action::kGather: im.issue_gather(a); break;
      case plan::Action::kForward:
        if (a.unit == 0)
          model_.set_batch_pinned(data + 2 * a.micro * N, data + (2 * a.micro + 1) * N, batch_, seq_len_,
                                  grad_scale);
        im.forward(a);
        break;
      case plan::Action::kBackward: im.backward(a); break;
      case plan::Action::kReduce: im.reduce(a, micro_batches); break;
      case plan::Action::kNorm:
        im.drain();
        im.norm_and_clip_scale();
        t_update = comm::now_seconds();
        break;
      case plan::Action::kUpdate:
        im.be.fence_snapshot();
        im.gated_update(model_.units()[static_cast<size_t>(a.unit)], a.unit, lr, step);
        break;
    }
  }
  model_.accumulate_loss_into(View{});
  // The step's one synchronisation: the loss and the squared norm.
  const double issue_s = comm::now_seconds() - t_start;
  double scalars[5];
  im.be.to_host_f64(im.scalars.view(), scalars);
  backend::check_loss_acc(scalars, model_.config().vocab_size);
  if (im.opt.trace) im.opt.trace->span("compute", "optimizer", t_update, comm::now_seconds());
  StepResult result;
  result.loss_sum = scalars[0];
  result.loss_count = static_cast<int64_t>(scalars[1]);
  result.grad_norm = std::sqrt(scalars[4] / static_cast<double>(im.replicas));
  result.issue_s = issue_s;
  return result;
}

// One micro-batch's gradient, reduced by the current schedule as a step's
// last micro-batch is, into the G-shards; returns every unit's OS range of it
// in unit order. No norm, no update.
std::vector<float> ShardedEngine::reduced_gradient(float grad_scale, const int32_t* data) {
  Impl& im = *impl_;
  const std::vector<plan::Action> program = plan::step_program(im.schedule, 1);
  im.start_program(program);
  im.zero_gradients();
  const int64_t N = batch_ * seq_len_;
  for (const plan::Action& a : program) {
    switch (a.kind) {
      case plan::Action::kGather: im.issue_gather(a); break;
      case plan::Action::kForward:
        if (a.unit == 0) model_.set_batch_pinned(data, data + N, batch_, seq_len_, grad_scale);
        im.forward(a);
        break;
      case plan::Action::kBackward: im.backward(a); break;
      case plan::Action::kReduce: im.reduce(a, 1); break;
      case plan::Action::kNorm: im.drain(); break;
      case plan::Action::kUpdate: break;
    }
  }
  std::vector<float> out;
  for (int u = 0; u < im.units; ++u) {
    const View g = im.g_os(u);
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(g.count));
    im.be.to_host(g, out.data() + at);
  }
  return out;
}

GuardSums ShardedEngine::guard_sums(float grad_scale, const BatchFn& batch) {
  Impl& im = *impl_;
  const plan::Compression chosen = im.opt.compression;
  int32_t* data = im.pinned_batch(1, batch_ * seq_len_);
  batch(0, data, data + batch_ * seq_len_);
  set_compression({});
  const std::vector<float> exact = reduced_gradient(grad_scale, data);
  GuardSums sums;
  for (float e : exact) sums.exact += static_cast<double>(e) * e;
  auto diff = [&](plan::Compression only) {
    set_compression(only);
    const std::vector<float> c = reduced_gradient(grad_scale, data);
    double d = 0;
    for (size_t i = 0; i < c.size(); ++i) d += (static_cast<double>(c[i]) - exact[i]) * (c[i] - exact[i]);
    return d;
  };
  if (chosen.p_bits) sums.p_diff = diff({chosen.p_bits, 0, chosen.block, chosen.inter_node_only});
  if (chosen.g_bits) sums.g_diff = diff({0, chosen.g_bits, chosen.block, chosen.inter_node_only});
  set_compression(chosen);
  return sums;
}

void ShardedEngine::set_compression(const plan::Compression& c) {
  Impl& im = *impl_;
  const plan::Compression& built = im.workload.compression;
  if ((c.p_bits && c.p_bits != built.p_bits) || (c.g_bits && c.g_bits != built.g_bits) ||
      (c.any() && (c.block != built.block || c.inter_node_only != built.inter_node_only)))
    fail("engine: compression ", plan::to_string(c), " is not a part of ", plan::to_string(built),
         ", which the engine's buffers were sized for");
  plan::Workload w = im.workload;
  w.compression = c;
  im.schedule = plan::step_schedule(w, im.shard_plan, im.shape);
  im.opt.compression = c;
}

const plan::Compression& ShardedEngine::compression() const { return impl_->opt.compression; }

// Every gather exact, whatever the step compresses: the loss is the trained weights'
// (the checkpoint's, what amsp eval reports), not the quantized copies' the step computes
// with (doc/compression.md, "Evaluation").
std::pair<double, int64_t> ShardedEngine::evaluate(int64_t batches, const BatchFn& batch) {
  Impl& im = *impl_;
  const plan::Compression chosen = im.opt.compression;
  set_compression({});
  const std::vector<plan::Action> program = plan::eval_program(im.schedule, batches);
  im.start_program(program);
  double loss = 0;
  int64_t count = 0;
  for (const plan::Action& a : program) {
    if (a.kind == plan::Action::kGather) {
      im.issue_gather(a);
      continue;
    }
    if (a.unit == 0) {
      batch(a.micro, tokens_.data(), targets_.data());
      model_.set_batch(tokens_.data(), targets_.data(), batch_, seq_len_, 0.0f);
    }
    im.forward(a);
    if (a.unit == im.units - 1) {
      loss += model_.loss_sum();
      count += model_.loss_count();
    }
  }
  set_compression(chosen);
  return {loss, count};
}

// The gradient's padding (a unit's size up to a multiple of the OS group) in
// this rank's OS ranges: zero, as the norm that sums it assumes, unless a
// slot's padding went into a reduction with what an earlier unit left there,
// or a reduction wrote past a unit. A few elements a unit, once; a rank that
// finds one ends the job (the others may be in a collective).
void ShardedEngine::check_gradient_padding() {
  Impl& im = *impl_;
  for (int u = 0; u < im.units; ++u) {
    const UnitShards& sh = shards_[static_cast<size_t>(u)];
    const int64_t lo = std::max(sh.os.begin, sh.numel), hi = sh.os.end();
    if (lo >= hi) continue;
    std::vector<float> tail(static_cast<size_t>(hi - lo));
    im.be.to_host(im.g_os(u).at(lo - sh.os.begin, hi - lo), tail.data());
    for (size_t i = 0; i < tail.size(); ++i)
      if (tail[i] != 0.0f)
        comm::abort_job(cat("engine: unit ", u, "'s gradient padding holds ", tail[i],
                            " at element ", lo + static_cast<int64_t>(i), " (expected 0 past its ",
                            sh.numel, " parameters)"));
  }
}

// The parameters the model computes with (bf16 values widened, in bf16).
std::vector<std::vector<float>> ShardedEngine::full_parameters() {
  Impl& im = *impl_;
  im.take_staged_state();
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const UnitShards& sh = shards_[u];
    im.param_update[u].wait();
    Buffer full;
    View src = im.state[u].p.view();
    if (im.p_ranks > 1) {
      full = im.be.alloc(im.wire, sh.padded);
      im.comm(GroupKind::kP).all_gather(src.data, sh.p.size, full.data(), im.wire).wait();
      src = full.view();
    }
    out.emplace_back(static_cast<size_t>(src.count));
    im.be.to_host(src, out.back().data());
    out.back().resize(static_cast<size_t>(sh.numel));
  }
  return out;
}

std::vector<ckpt::StateView> ShardedEngine::state_views() { return impl_->state_views(); }
void ShardedEngine::begin_os_snapshot(const std::vector<ckpt::StateView>& dst) { impl_->begin_os_snapshot(dst); }
bool ShardedEngine::states_on_host() const { return impl_->on_host(); }
void ShardedEngine::settle_states() { impl_->take_staged_state(); }
void ShardedEngine::set_update_gate(UpdateGate* gate) { impl_->update_gate = gate; }
bool ShardedEngine::states_exchangeable() const { return impl_->on_host(); }
bool ShardedEngine::master_exchangeable() const { return impl_->bf16(); }

void ShardedEngine::copy_os_master(int u, float* dst) const {
  const View m = impl_->master(u);
  std::memcpy(dst, m.data, static_cast<size_t>(m.bytes()));
}

void ShardedEngine::copy_os_state(int u, const ckpt::StateView& dst) const {
  Impl& im = *impl_;
  if (!im.on_host() || !im.staging.empty())
    fail("engine: copy_os_state needs settled host states (", im.on_host() ? "a resume's views not taken back"
                                                                          : "the states are on a device", ")");
  // In fp32 the master is the P-shard's OS part; bf16 keeps a separate fp32 master.
  auto& x = im.state_of(u);
  copy_os_state_host(im.master(u), x.exp_avg.view(), x.exp_avg_sq.view(), dst);
}

int64_t ShardedEngine::replica_index() const { return impl_->replica; }

int64_t ShardedEngine::model_state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : impl_->state)
    bytes += s.p.bytes() + s.g.bytes() + s.master.bytes() + s.exp_avg.bytes() + s.exp_avg_sq.bytes();
  return bytes;
}

int64_t ShardedEngine::temporary_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : impl_->gather_slots) bytes += b.bytes();
  for (const auto& b : impl_->gather_qsend) bytes += b.bytes();
  for (const auto& b : impl_->gather_qrecv) bytes += b.bytes();
  for (const auto& s : impl_->slots)
    bytes += s.full.bytes() + s.p.bytes() + s.g.bytes() + s.os.bytes() + s.qsend.bytes() + s.qrecv.bytes();
  return bytes;
}

std::vector<comm::Stats> ShardedEngine::comm_stats() const {
  std::vector<comm::Stats> out;
  for (const auto& c : impl_->comms)
    if (c) out.push_back(c->stats());
  if (impl_->world->size() > 1) out.push_back(impl_->world->stats());
  return out;
}

int64_t ShardedEngine::comm_host_waits() const {
  int64_t n = impl_->world->host_waits();
  for (const auto& c : impl_->comms)
    if (c) n += c->host_waits();
  return n;
}

void ShardedEngine::reset_comm_stats() {
  for (auto& c : impl_->comms)
    if (c) c->reset_stats();
  impl_->world->reset_stats();
}

}  // namespace amsp::engine
