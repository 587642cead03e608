#include "engine/sharded_engine.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "comm/traffic.h"
#include "core/error.h"

namespace amsp::engine {

using backend::Buffer;
using backend::View;
using plan::GroupKind;

struct ShardedEngine::Impl {
  // A unit's gradient on its way from the full gradient to the OS-shard.
  enum class Stage { kP, kG, kOS, kReplica, kDone };
  struct Reduction {
    int unit = 0;
    int slot = 0;
    bool last_micro = false;
    bool in_os_slot = false;  // the OS-part gradient sits in the slot's `os` buffer
    Stage stage = Stage::kDone;
    comm::Handle handle;
  };
  // A reduction slot: the unit's full gradient and its P-, G- and OS-shard
  // parts, in the wire dtype (the parameters' dtype).
  struct Slot {
    Buffer full, p, g, os;
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
  DType wire = DType::kF32;
  int U = 0;
  int64_t sp = 1, sg = 1, sos = 1, replicas = 1, replica = 0;
  std::array<std::unique_ptr<comm::Communicator>, 5> comms;
  std::unique_ptr<comm::Communicator> world;  // the gradient norm's all-reduce

  std::vector<State> state;
  std::vector<comm::Handle> param_update;  // gather-group all-gather rebuilding each P-shard

  // Gathered units: `prefetch + 1` slots, position i of the gather order uses
  // slot i mod (prefetch + 1).
  std::vector<Buffer> gather_slots;
  std::vector<int> gather_order;
  std::vector<comm::Handle> gather_handles;
  size_t gather_issued = 0;

  std::vector<Slot> slots;
  std::vector<int> free_slots;
  std::deque<Reduction> pending;

  // Host copies of the states handed out by state_views(), taken back by the
  // next step: the P-shard widened to fp32 in bf16, and everything on a
  // device backend (host code cannot touch device memory).
  struct Staged {
    std::vector<float> params, exp_avg, exp_avg_sq;
  };
  std::vector<Staged> staging;

  Impl(backend::Backend& b, model::Llama& m, const std::vector<UnitShards>& s, PlanGroups& pg,
       const EngineOptions& o);

  bool bf16() const { return opt.precision == DType::kBF16; }
  bool on_host() const { return be.device() == Device::kCpu; }
  // Backward writes the unit's gradient straight into its G-shard.
  bool direct_gradients() const { return sp == 1 && sg == 1; }
  comm::Communicator& comm(GroupKind kind) { return *comms[static_cast<size_t>(kind)]; }
  comm::Handle issued(comm::Handle h) {
    if (!opt.overlap) h.wait();
    return h;
  }
  const UnitShards& sh(int u) const { return shards[static_cast<size_t>(u)]; }
  State& st(int u) { return state[static_cast<size_t>(u)]; }
  // Views of a unit's OS range inside its P-shard and G-shard.
  View p_os(int u) { return st(u).p.at(sh(u).os.begin - sh(u).p.begin, sh(u).os.size); }
  View g_os(int u) { return st(u).g.at(sh(u).os.begin - sh(u).g.begin, sh(u).os.size); }
  View master(int u) { return bf16() ? st(u).master.view() : p_os(u); }

  void make_communicators(PlanGroups& pg);
  void allocate();
  void allocate_slots(int64_t max_padded);

  // Parameters.
  void start_gathers(std::vector<int> order);
  void issue_gathers_upto(size_t n);
  View params_at(size_t i);

  // Gradients.
  int take_slot();
  void start_reduction(int u, int s, bool last_micro);
  bool advance(Reduction& r);
  bool start_last_stages(Reduction& r);
  bool start_replica(Reduction& r);
  void poll();
  void finish_oldest();
  void drain();
  void wait_reductions_of(int u);

  // One micro-batch.
  template <typename F>
  void traced(const char* what, int u, F&& f);
  void forward(size_t base);
  void backward(size_t base, bool last_micro);
  static std::vector<int> step_order(int U, int64_t micro_batches);

  // The optimizer.
  double grad_norm();
  void update(const std::vector<model::UnitSpec>& units, double lr, int64_t step,
              double clip_scale);

  // Checkpoint views.
  std::vector<ckpt::StateView> state_views();
  void take_staged_state();
  void copy_os_states(const std::vector<ckpt::StateView>& dst);
};

ShardedEngine::Impl::Impl(backend::Backend& b, model::Llama& m, const std::vector<UnitShards>& s,
                          PlanGroups& pg, const EngineOptions& o)
    : be(b), model(m), shards(s), opt(o), wire(o.precision), U(m.num_units()) {
  if (opt.precision != DType::kF32 && opt.precision != DType::kBF16)
    fail_usage("engine: precision ", dtype_name(opt.precision), " is not fp32 or bf16");
  const plan::ShardPlan& plan = pg.mesh.plan();
  sp = plan.p.size();
  sg = plan.g.size();
  sos = plan.os.size();
  replicas = pg.mesh.group_size(GroupKind::kReplica);
  replica = pg.mesh.coords(pg.position).r;
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
      comms[k]->set_trace([trace, group](comm::Op op, double start, double end, bool waited) {
        if (waited)
          trace->span("wait", cat("wait ", comm::op_name(op), " ", group), start, end);
        else
          trace->span("comm " + group, comm::op_name(op), start, end);
      });
    }
  }
  // The norm's partial sums are host doubles: on a device backend they travel
  // over MPI, not over the device communicator.
  world = on_host() ? be.make_communicator(std::move(pg.world))
                    : comm::make_mpi_communicator(std::move(pg.world));
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
  param_update.resize(static_cast<size_t>(U));
  if (sp > 1)
    for (int i = 0; i <= opt.prefetch; ++i) gather_slots.push_back(be.alloc(wire, max_padded));
  allocate_slots(max_padded);
}

// Sizes of the reduction slots; the planner's memory model (plan/memory.h)
// predicts exactly these.
void ShardedEngine::Impl::allocate_slots(int64_t max_padded) {
  const bool full = !direct_gradients(), p = sp > 1 && sg > sp,
             g = sp > 1 || sg > 1 || (bf16() && (sos > sg || replicas > 1)),
             os = sos > sg || (bf16() && replicas > 1);
  for (int i = 0; i < opt.max_reductions; ++i) {
    Slot s;
    if (full) s.full = be.alloc(wire, max_padded);
    if (p) s.p = be.alloc(wire, max_padded / sp);
    if (g) s.g = be.alloc(wire, max_padded / sg);
    if (os) s.os = be.alloc(wire, max_padded / sos);
    slots.push_back(std::move(s));
    free_slots.push_back(i);
  }
}

// --- parameters ---------------------------------------------------------------

void ShardedEngine::Impl::start_gathers(std::vector<int> order) {
  take_staged_state();
  gather_order = std::move(order);
  gather_handles.assign(gather_order.size(), comm::Handle());
  gather_issued = 0;
}

void ShardedEngine::Impl::issue_gathers_upto(size_t n) {
  n = std::min(n, gather_order.size());
  for (; gather_issued < n; ++gather_issued) {
    const int u = gather_order[gather_issued];
    param_update[static_cast<size_t>(u)].wait();  // the P-shard is final
    const Buffer& slot = gather_slots[gather_issued % gather_slots.size()];
    gather_handles[gather_issued] =
        issued(comm(GroupKind::kP).all_gather(st(u).p.data(), sh(u).p.size, slot.data(), wire));
  }
}

// Full parameters of the unit at position i of the gather order.
View ShardedEngine::Impl::params_at(size_t i) {
  const int u = gather_order[i];
  if (sp == 1) {
    param_update[static_cast<size_t>(u)].wait();
    return st(u).p.view();
  }
  issue_gathers_upto(i + 1 + static_cast<size_t>(opt.prefetch));
  gather_handles[i].wait();
  return gather_slots[i % gather_slots.size()].at(0, sh(u).padded);
}

// --- gradients ------------------------------------------------------------------

int ShardedEngine::Impl::take_slot() {
  while (free_slots.empty()) finish_oldest();
  const int s = free_slots.back();
  free_slots.pop_back();
  return s;
}

// Starts reducing unit u's gradient, computed into slot s (or, with direct
// gradients, already in its G-shard).
void ShardedEngine::Impl::start_reduction(int u, int s, bool last_micro) {
  Reduction r{u, s, last_micro, false, Stage::kDone, {}};
  Slot& slot = slots[static_cast<size_t>(s)];
  bool done = false;
  if (sp > 1) {
    // With s_g == s_p the P-shard gradient lands in the G buffer (no G step).
    const Buffer& out = sg > sp ? slot.p : slot.g;
    r.stage = Stage::kP;
    r.handle = issued(comm(GroupKind::kP).reduce_scatter(slot.full.data(), sh(u).p.size, out.data(), wire));
  } else if (sg > 1) {
    r.stage = Stage::kG;
    r.handle = issued(comm(GroupKind::kG).reduce_scatter(slot.full.data(), sh(u).g.size, slot.g.data(), wire));
  } else {
    done = start_last_stages(r);
  }
  if (done) {
    free_slots.push_back(s);
    return;
  }
  pending.push_back(std::move(r));
}

// Moves r to its next stage; returns false when it issued a collective that
// has to complete first.
bool ShardedEngine::Impl::advance(Reduction& r) {
  Slot& slot = slots[static_cast<size_t>(r.slot)];
  const int u = r.unit;
  switch (r.stage) {
    case Stage::kP:
      if (sg > sp) {
        r.stage = Stage::kG;
        r.handle = issued(comm(GroupKind::kG).reduce_scatter(slot.p.data(), sh(u).g.size, slot.g.data(), wire));
        return false;
      }
      // P-shard and G-shard coincide: the P reduce-scatter wrote the G part.
      be.add(st(u).g.view(), slot.g.at(0, sh(u).g.size));
      return start_last_stages(r);
    case Stage::kG:
      be.add(st(u).g.view(), slot.g.at(0, sh(u).g.size));
      return start_last_stages(r);
    case Stage::kOS:
      r.in_os_slot = true;
      return start_replica(r);
    case Stage::kReplica:
      if (r.in_os_slot) be.copy(slot.os.at(0, sh(u).os.size), g_os(u));
      r.stage = Stage::kDone;
      return true;
    case Stage::kDone:
      return true;
  }
  return true;
}

// After the last micro-batch: the G-shard's OS part over the OS group, then
// over the replica group. In bf16 the G-shard is fp32 and travels as a bf16
// copy in the slot.
bool ShardedEngine::Impl::start_last_stages(Reduction& r) {
  if (!r.last_micro) {
    r.stage = Stage::kDone;
    return true;
  }
  const int u = r.unit;
  Slot& slot = slots[static_cast<size_t>(r.slot)];
  if (sos > sg) {
    const void* send = st(u).g.data();
    if (bf16()) {
      be.copy(st(u).g.view(), slot.g.at(0, sh(u).g.size));
      send = slot.g.data();
    }
    r.stage = Stage::kOS;
    r.handle = issued(comm(GroupKind::kOS).reduce_scatter(send, sh(u).os.size, slot.os.data(), wire));
    return false;
  }
  return start_replica(r);
}

bool ShardedEngine::Impl::start_replica(Reduction& r) {
  const int u = r.unit;
  Slot& slot = slots[static_cast<size_t>(r.slot)];
  if (replicas > 1) {
    if (bf16() && !r.in_os_slot) {
      be.copy(g_os(u), slot.os.at(0, sh(u).os.size));
      r.in_os_slot = true;
    }
    void* buf = r.in_os_slot ? slot.os.data() : g_os(u).data;
    r.stage = Stage::kReplica;
    r.handle = issued(comm(GroupKind::kReplica).all_reduce(buf, sh(u).os.size, wire));
    return false;
  }
  if (r.in_os_slot) be.copy(slot.os.at(0, sh(u).os.size), g_os(u));
  r.stage = Stage::kDone;
  return true;
}

// Advances every reduction whose collective has completed, without blocking.
void ShardedEngine::Impl::poll() {
  for (auto it = pending.begin(); it != pending.end();) {
    bool done = false;
    while (it->handle.test())
      if ((done = advance(*it))) break;
    if (done) {
      free_slots.push_back(it->slot);
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
}

void ShardedEngine::Impl::finish_oldest() {
  Reduction& r = pending.front();
  do r.handle.wait();
  while (!advance(r));
  free_slots.push_back(r.slot);
  pending.pop_front();
}

void ShardedEngine::Impl::drain() {
  while (!pending.empty()) finish_oldest();
}

// A unit's previous reduction adds into the same G-shard: let it finish first.
void ShardedEngine::Impl::wait_reductions_of(int u) {
  while (std::any_of(pending.begin(), pending.end(), [u](const Reduction& r) { return r.unit == u; }))
    finish_oldest();
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

void ShardedEngine::Impl::forward(size_t base) {
  for (int u = 0; u < U; ++u) {
    const View params = params_at(base + static_cast<size_t>(u));
    traced("fwd", u, [&] { model.forward(u, params); });
  }
}

void ShardedEngine::Impl::backward(size_t base, bool last_micro) {
  for (int u = U - 1; u >= 0; --u) {
    // The head reuses its forward copy; the others were gathered again.
    const size_t pos = u == U - 1 ? base + static_cast<size_t>(U - 1)
                                  : base + static_cast<size_t>(U) + static_cast<size_t>(U - 2 - u);
    const View params = params_at(pos);
    wait_reductions_of(u);
    if (direct_gradients()) {
      traced("bwd", u, [&] { model.backward(u, params, st(u).g.view()); });
      if (last_micro) start_reduction(u, take_slot(), true);
    } else {
      const int s = take_slot();
      const View grad = slots[static_cast<size_t>(s)].full.at(0, sh(u).padded);
      be.fill_zero(grad);
      traced("bwd", u, [&] { model.backward(u, params, grad); });
      start_reduction(u, s, last_micro);
    }
    poll();
  }
}

std::vector<int> ShardedEngine::Impl::step_order(int U, int64_t micro_batches) {
  std::vector<int> order;
  for (int64_t m = 0; m < micro_batches; ++m) {
    for (int u = 0; u < U; ++u) order.push_back(u);
    for (int u = U - 2; u >= 0; --u) order.push_back(u);
  }
  return order;
}

// --- the optimizer -------------------------------------------------------------------

double ShardedEngine::Impl::grad_norm() {
  double total = 0.0;
  for (int u = 0; u < U; ++u) total += be.sum_squares(g_os(u));
  if (world->size() > 1) {
    const double t0 = comm::now_seconds();
    world->all_reduce(&total, 1, DType::kF64).wait();
    if (opt.trace) opt.trace->span("comm world", "all_reduce (norm)", t0, comm::now_seconds());
  }
  // Each OS-shard is held once per replica.
  return std::sqrt(total / static_cast<double>(replicas));
}

void ShardedEngine::Impl::update(const std::vector<model::UnitSpec>& units, double lr, int64_t step,
                                 double clip_scale) {
  for (int u = 0; u < U; ++u) {
    const plan::Range os = sh(u).os;
    const OsShard shard{os.begin, os.end(), master(u), g_os(u), st(u).exp_avg.view(),
                        st(u).exp_avg_sq.view(), bf16() ? p_os(u) : View{}};
    adamw_update_range(be, units[static_cast<size_t>(u)], shard, opt.adamw, lr, step,
                       static_cast<float>(clip_scale));
    // Rebuild the P-shard from the updated OS-shards; the next step waits
    // for it only when it needs this unit.
    if (sos > sp)
      param_update[static_cast<size_t>(u)] = issued(comm(GroupKind::kGather).all_gather(
          p_os(u).data, os.size, st(u).p.data(), wire));
  }
}

// --- checkpoint views --------------------------------------------------------------

std::vector<ckpt::StateView> ShardedEngine::Impl::state_views() {
  take_staged_state();
  for (auto& h : param_update) h.wait();
  std::vector<ckpt::StateView> views;
  if (bf16() || !on_host()) staging.resize(static_cast<size_t>(U));
  for (int u = 0; u < U; ++u) {
    State& x = st(u);
    if (staging.empty()) {
      views.push_back({x.p.f32(), x.exp_avg.f32(), x.exp_avg_sq.f32()});
      continue;
    }
    // The P range in fp32; in bf16 its OS part is the fp32 master.
    Staged& s = staging[static_cast<size_t>(u)];
    s.params.resize(static_cast<size_t>(sh(u).p.size));
    be.to_host(x.p.view(), s.params.data());
    if (bf16()) be.to_host(x.master.view(), s.params.data() + (sh(u).os.begin - sh(u).p.begin));
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
  for (int u = 0; u < U; ++u) {
    const Staged& s = staging[static_cast<size_t>(u)];
    be.from_host(s.params.data(), st(u).p.view());
    if (bf16()) be.from_host(s.params.data() + (sh(u).os.begin - sh(u).p.begin), st(u).master.view());
    if (!s.exp_avg.empty()) be.from_host(s.exp_avg.data(), st(u).exp_avg.view());
    if (!s.exp_avg_sq.empty()) be.from_host(s.exp_avg_sq.data(), st(u).exp_avg_sq.view());
  }
  staging.clear();
  staging.shrink_to_fit();
}

void ShardedEngine::Impl::copy_os_states(const std::vector<ckpt::StateView>& dst) {
  take_staged_state();
  for (auto& h : param_update) h.wait();
  for (int u = 0; u < U; ++u) {
    const ckpt::StateView& d = dst[static_cast<size_t>(u)];
    be.to_host(master(u), d.params);
    be.to_host(st(u).exp_avg.view(), d.exp_avg);
    be.to_host(st(u).exp_avg_sq.view(), d.exp_avg_sq);
  }
}

// --- the public face ------------------------------------------------------------------

ShardedEngine::ShardedEngine(const model::LlamaConfig& config, backend::Backend& backend,
                             int64_t batch, int64_t seq_len, PlanGroups& groups, uint64_t seed,
                             const EngineOptions& options)
    : batch_(batch),
      seq_len_(seq_len),
      tokens_(static_cast<size_t>(batch * seq_len)),
      targets_(static_cast<size_t>(batch * seq_len)),
      model_(config, backend, batch, seq_len, options.recompute),
      shards_(plan::unit_shards(model_.units(), groups.mesh, groups.position)) {
  if (options.prefetch < 1 || options.max_reductions < 1)
    fail_usage("engine: prefetch and max_reductions must be >= 1");
  if (backend.compute() != options.precision)
    fail_usage("engine: the backend computes in ", dtype_name(backend.compute()),
               " but the engine was asked for ", dtype_name(options.precision));
  impl_ = std::make_unique<Impl>(backend, model_, shards_, groups, options);
  init_parameters(seed);
}

// Every rank draws the whole unit from (seed, unit) and keeps its P-shard, so
// parameters are the single-process ones whatever the plan and precision.
void ShardedEngine::init_parameters(uint64_t seed) {
  Impl& im = *impl_;
  std::vector<float> full;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const UnitShards& sh = shards_[u];
    full.assign(static_cast<size_t>(sh.padded), 0.0f);
    model::init_unit_params(model_.units()[u], static_cast<int>(u), seed, full.data());
    im.be.from_host(full.data() + sh.p.begin, im.state[u].p.view());
    if (im.bf16()) im.be.from_host(full.data() + sh.os.begin, im.state[u].master.view());
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
  im.start_gathers(Impl::step_order(im.U, micro_batches));
  for (auto& s : im.state) im.be.fill_zero(s.g.view());
  StepResult result;
  const size_t per_micro = static_cast<size_t>(2 * im.U - 1);
  for (int64_t m = 0; m < micro_batches; ++m) {
    batch(m, tokens_.data(), targets_.data());
    model_.set_batch(tokens_.data(), targets_.data(), batch_, seq_len_, grad_scale);
    const size_t base = static_cast<size_t>(m) * per_micro;
    im.forward(base);
    result.loss_sum += model_.loss_sum();
    result.loss_count += model_.loss_count();
    im.backward(base, m == micro_batches - 1);
  }
  im.drain();
  result.grad_norm = im.grad_norm();
  const double clip_scale = im.opt.grad_clip > 0 && result.grad_norm > im.opt.grad_clip
                                ? im.opt.grad_clip / (result.grad_norm + 1e-6)
                                : 1.0;
  const double t0 = comm::now_seconds();
  im.update(model_.units(), lr, step, clip_scale);
  if (im.opt.trace) im.opt.trace->span("compute", "optimizer", t0, comm::now_seconds());
  return result;
}

std::pair<double, int64_t> ShardedEngine::evaluate(int64_t batches, const BatchFn& batch) {
  Impl& im = *impl_;
  std::vector<int> order;
  for (int64_t b = 0; b < batches; ++b)
    for (int u = 0; u < im.U; ++u) order.push_back(u);
  im.start_gathers(std::move(order));
  double loss = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    batch(b, tokens_.data(), targets_.data());
    model_.set_batch(tokens_.data(), targets_.data(), batch_, seq_len_, 0.0f);
    im.forward(static_cast<size_t>(b * im.U));
    loss += model_.loss_sum();
    count += model_.loss_count();
  }
  return {loss, count};
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
    if (im.sp > 1) {
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
void ShardedEngine::copy_os_states(const std::vector<ckpt::StateView>& dst) { impl_->copy_os_states(dst); }

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
  for (const auto& s : impl_->slots) bytes += s.full.bytes() + s.p.bytes() + s.g.bytes() + s.os.bytes();
  return bytes;
}

std::vector<comm::Stats> ShardedEngine::comm_stats() const {
  std::vector<comm::Stats> out;
  for (const auto& c : impl_->comms)
    if (c) out.push_back(c->stats());
  if (impl_->world->size() > 1) out.push_back(impl_->world->stats());
  return out;
}

void ShardedEngine::reset_comm_stats() {
  for (auto& c : impl_->comms)
    if (c) c->reset_stats();
  impl_->world->reset_stats();
}

}  // namespace amsp::engine
