#include "engine/sharded_engine.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <deque>

#include "comm/check.h"
#include "comm/timed.h"
#include "comm/traffic.h"
#include "core/error.h"

namespace amsp::engine {

using plan::GroupKind;

namespace {

void add_into(float* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

}  // namespace

struct ShardedEngine::Impl {
  // A unit's gradient on its way from the full gradient to the OS-shard.
  enum class Stage { kP, kG, kOS, kReplica, kDone };
  struct Reduction {
    int unit = 0;
    int slot = 0;
    bool last_micro = false;
    Stage stage = Stage::kDone;
    comm::Handle handle;
  };

  model::Llama& model;
  const std::vector<UnitShards>& shards;
  EngineOptions opt;
  int U = 0;
  int64_t sp = 1, sg = 1, sos = 1, replicas = 1, replica = 0;
  std::array<std::unique_ptr<comm::Communicator>, 5> comms;
  comm::Group world;
  comm::Stats world_stats;

  // Model states, per unit: P-shard (fp32 parameters), G-shard (gradient
  // accumulator), OS-shard (Adam moments).
  std::vector<std::vector<float>> p_shard, g_shard, exp_avg, exp_avg_sq;
  std::vector<comm::Handle> param_update;  // gather-group all-gather rebuilding each P-shard

  // Gathered units: `prefetch + 1` slots, position i of the gather order uses
  // slot i mod (prefetch + 1).
  std::vector<std::vector<float>> gather_slots;
  std::vector<int> gather_order;
  std::vector<comm::Handle> gather_handles;
  size_t gather_issued = 0;

  // Gradient reduction slots: the unit's full gradient, its P-shard part, its
  // G-shard part, its OS-shard part.
  std::vector<std::vector<float>> grad_full, grad_p, grad_g, grad_os;
  std::vector<int> free_slots;
  std::deque<Reduction> pending;

  Impl(model::Llama& m, const std::vector<UnitShards>& s, PlanGroups& pg,
       const EngineOptions& o)
      : model(m), shards(s), opt(o), U(m.num_units()) {
    const plan::ShardPlan& plan = pg.mesh.plan();
    sp = plan.p.size();
    sg = plan.g.size();
    sos = plan.os.size();
    replicas = pg.mesh.group_size(GroupKind::kReplica);
    replica = pg.mesh.coords(pg.position).r;
    for (GroupKind kind : plan::kAllGroups) {
      const size_t k = static_cast<size_t>(kind);
      if (pg.mesh.group_size(kind) <= 1) continue;
      comms[k] = comm::make_mpi_communicator(std::move(pg.groups[k]));
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
    world = comm::dup_group(MPI_COMM_WORLD, "world");
    world_stats.group = "world";

    int64_t max_padded = 0, max_p = 0, max_g = 0, max_os = 0;
    for (const auto& sh : shards) {
      p_shard.emplace_back(static_cast<size_t>(sh.p.size), 0.0f);
      g_shard.emplace_back(static_cast<size_t>(sh.g.size), 0.0f);
      exp_avg.emplace_back(static_cast<size_t>(sh.os.size), 0.0f);
      exp_avg_sq.emplace_back(static_cast<size_t>(sh.os.size), 0.0f);
      max_padded = std::max(max_padded, sh.padded);
      max_p = std::max(max_p, sh.p.size);
      max_g = std::max(max_g, sh.g.size);
      max_os = std::max(max_os, sh.os.size);
    }
    param_update.resize(static_cast<size_t>(U));
    if (sp > 1)
      gather_slots.assign(static_cast<size_t>(opt.prefetch + 1),
                          std::vector<float>(static_cast<size_t>(max_padded)));
    // Gradients go straight into the G-shard when nothing is sharded below the
    // optimizer; otherwise through reduction slots.
    const int slots = opt.max_reductions;
    for (int i = 0; i < slots; ++i) {
      grad_full.emplace_back(direct_gradients() ? 0 : static_cast<size_t>(max_padded));
      grad_p.emplace_back(sp > 1 && sg > sp ? static_cast<size_t>(max_p) : 0);
      grad_g.emplace_back(sp > 1 || sg > 1 ? static_cast<size_t>(max_g) : 0);
      grad_os.emplace_back(sos > sg ? static_cast<size_t>(max_os) : 0);
      free_slots.push_back(i);
    }
  }

  // Backward writes the unit's gradient straight into its G-shard.
  bool direct_gradients() const { return sp == 1 && sg == 1; }

  comm::Communicator& comm(GroupKind kind) { return *comms[static_cast<size_t>(kind)]; }

  comm::Handle issued(comm::Handle h) {
    if (!opt.overlap) h.wait();
    return h;
  }

  // --- parameters -----------------------------------------------------------
  void start_gathers(std::vector<int> order) {
    gather_order = std::move(order);
    gather_handles.assign(gather_order.size(), comm::Handle());
    gather_issued = 0;
  }

  void issue_gathers_upto(size_t n) {
    n = std::min(n, gather_order.size());
    for (; gather_issued < n; ++gather_issued) {
      const int u = gather_order[gather_issued];
      param_update[static_cast<size_t>(u)].wait();  // the P-shard is final
      float* slot = gather_slots[gather_issued % gather_slots.size()].data();
      gather_handles[gather_issued] = issued(comm(GroupKind::kP).all_gather(
          p_shard[static_cast<size_t>(u)].data(), shards[static_cast<size_t>(u)].p.size, slot));
    }
  }

  // Full parameters of the unit at position i of the gather order.
  const float* params_at(size_t i) {
    const int u = gather_order[i];
    if (sp == 1) {
      param_update[static_cast<size_t>(u)].wait();
      return p_shard[static_cast<size_t>(u)].data();
    }
    issue_gathers_upto(i + 1 + static_cast<size_t>(opt.prefetch));
    gather_handles[i].wait();
    return gather_slots[i % gather_slots.size()].data();
  }

  // --- gradients ------------------------------------------------------------
  int take_slot() {
    while (free_slots.empty()) finish_oldest();
    const int s = free_slots.back();
    free_slots.pop_back();
    return s;
  }

  // Moves r to its next stage; returns false when it issued a collective that
  // has to complete first.
  bool advance(Reduction& r) {
    const auto u = static_cast<size_t>(r.unit);
    const auto s = static_cast<size_t>(r.slot);
    const UnitShards& sh = shards[u];
    switch (r.stage) {
      case Stage::kP:
        if (sg > sp) {
          r.stage = Stage::kG;
          r.handle = issued(comm(GroupKind::kG).reduce_scatter(grad_p[s].data(), sh.g.size, grad_g[s].data()));
          return false;
        }
        // P-shard and G-shard coincide: the P reduce-scatter wrote into grad_g.
        add_into(g_shard[u].data(), grad_g[s].data(), sh.g.size);
        return start_last_stages(r);
      case Stage::kG:
        add_into(g_shard[u].data(), grad_g[s].data(), sh.g.size);
        return start_last_stages(r);
      case Stage::kOS:
        std::copy_n(grad_os[s].data(), sh.os.size, g_shard[u].data() + (sh.os.begin - sh.g.begin));
        return start_replica(r);
      case Stage::kReplica:
        r.stage = Stage::kDone;
        return true;
      case Stage::kDone:
        return true;
    }
    return true;
  }

  bool start_last_stages(Reduction& r) {
    if (!r.last_micro) {
      r.stage = Stage::kDone;
      return true;
    }
    const auto u = static_cast<size_t>(r.unit);
    const UnitShards& sh = shards[u];
    if (sos > sg) {
      r.stage = Stage::kOS;
      r.handle = issued(comm(GroupKind::kOS).reduce_scatter(g_shard[u].data(), sh.os.size,
                                                            grad_os[static_cast<size_t>(r.slot)].data()));
      return false;
    }
    return start_replica(r);
  }

  bool start_replica(Reduction& r) {
    if (replicas > 1) {
      const UnitShards& sh = shards[static_cast<size_t>(r.unit)];
      r.stage = Stage::kReplica;
      r.handle = issued(comm(GroupKind::kReplica).all_reduce(
          g_shard[static_cast<size_t>(r.unit)].data() + (sh.os.begin - sh.g.begin), sh.os.size));
      return false;
    }
    r.stage = Stage::kDone;
    return true;
  }

  // Starts reducing unit u's gradient, computed into slot s (or, with direct
  // gradients, already in its G-shard).
  void start_reduction(int u, int s, bool last_micro) {
    Reduction r{u, s, last_micro, Stage::kDone, {}};
    const UnitShards& sh = shards[static_cast<size_t>(u)];
    const auto k = static_cast<size_t>(s);
    bool done = false;
    if (sp > 1) {
      // With s_g == s_p the P-shard gradient lands in grad_g (no G step).
      float* out = sg > sp ? grad_p[k].data() : grad_g[k].data();
      r.stage = Stage::kP;
      r.handle = issued(comm(GroupKind::kP).reduce_scatter(grad_full[k].data(), sh.p.size, out));
    } else if (sg > 1) {
      r.stage = Stage::kG;
      r.handle = issued(comm(GroupKind::kG).reduce_scatter(grad_full[k].data(), sh.g.size, grad_g[k].data()));
    } else {
      done = start_last_stages(r);
    }
    if (done) {
      free_slots.push_back(s);
      return;
    }
    pending.push_back(std::move(r));
  }

  // Advances every reduction whose collective has completed, without blocking.
  void poll() {
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

  void finish_oldest() {
    Reduction& r = pending.front();
    do r.handle.wait();
    while (!advance(r));
    free_slots.push_back(r.slot);
    pending.pop_front();
  }

  void drain() {
    while (!pending.empty()) finish_oldest();
  }

  // A compute span on the trace.
  template <typename F>
  void traced(const char* what, int u, F&& f) {
    if (!opt.trace || !opt.trace->recording()) return f();
    const double t0 = comm::now_seconds();
    f();
    opt.trace->span("compute", cat(what, " ", model.units()[static_cast<size_t>(u)].name), t0,
                    comm::now_seconds());
  }

  // --- one micro-batch --------------------------------------------------------
  void forward(size_t base) {
    for (int u = 0; u < U; ++u) {
      const float* params = params_at(base + static_cast<size_t>(u));
      traced("fwd", u, [&] { model.forward(u, params); });
    }
  }

  void backward(size_t base, bool last_micro) {
    for (int u = U - 1; u >= 0; --u) {
      // The head reuses its forward copy; the others were gathered again.
      const size_t pos = u == U - 1 ? base + static_cast<size_t>(U - 1)
                                    : base + static_cast<size_t>(U) + static_cast<size_t>(U - 2 - u);
      const float* params = params_at(pos);
      // A unit's previous reduction adds into the same G-shard: let it finish first.
      while (std::any_of(pending.begin(), pending.end(), [u](const Reduction& r) { return r.unit == u; }))
        finish_oldest();
      if (direct_gradients()) {
        traced("bwd", u, [&] { model.backward(u, params, g_shard[static_cast<size_t>(u)].data()); });
        if (last_micro) start_reduction(u, take_slot(), true);
      } else {
        const int s = take_slot();
        zero(grad_full[static_cast<size_t>(s)]);
        traced("bwd", u, [&] { model.backward(u, params, grad_full[static_cast<size_t>(s)].data()); });
        start_reduction(u, s, last_micro);
      }
      poll();
    }
  }

  static std::vector<int> step_order(int U, int64_t micro_batches) {
    std::vector<int> order;
    for (int64_t m = 0; m < micro_batches; ++m) {
      for (int u = 0; u < U; ++u) order.push_back(u);
      for (int u = U - 2; u >= 0; --u) order.push_back(u);
    }
    return order;
  }

  // --- the optimizer -----------------------------------------------------------
  double grad_norm() {
    double local = 0.0;
    for (size_t u = 0; u < shards.size(); ++u) {
      const UnitShards& sh = shards[u];
      local += sum_squares(g_shard[u].data() + (sh.os.begin - sh.g.begin), sh.os.size);
    }
    double total = local;
    if (world.size() > 1) {
      const double t0 = comm::now_seconds();
      comm::allreduce_sum(&total, 1, world.comm(), "gradient norm", opt.comm_timeout_s);
      if (opt.trace) opt.trace->span("comm world", "all_reduce (norm)", t0, comm::now_seconds());
      auto& s = world_stats[comm::Op::kAllReduce];
      const comm::Traffic t = comm::traffic_bytes(comm::Op::kAllReduce, 1, world.size(), world.rank(), 0, 8);
      ++s.calls;
      s.bytes_sent += t.sent;
      s.bytes_received += t.received;
    }
    // Each OS-shard is held once per replica.
    return std::sqrt(total / static_cast<double>(replicas));
  }

  void update(const std::vector<model::UnitSpec>& units, double lr, int64_t step, double clip_scale) {
    for (size_t u = 0; u < shards.size(); ++u) {
      const UnitShards& sh = shards[u];
      float* g = g_shard[u].data() + (sh.os.begin - sh.g.begin);
      float* p = p_shard[u].data() + (sh.os.begin - sh.p.begin);
      if (clip_scale != 1.0) scale_inplace(g, sh.os.size, static_cast<float>(clip_scale));
      adamw_update_range(units[u], sh.os.begin, sh.os.end(), p, g, exp_avg[u].data(),
                         exp_avg_sq[u].data(), opt.adamw, lr, step);
      // Rebuild the P-shard from the updated OS-shards; the next step waits
      // for it only when it needs this unit.
      if (sos > sp)
        param_update[u] = issued(comm(GroupKind::kGather).all_gather(p, sh.os.size, p_shard[u].data()));
    }
  }
};

ShardedEngine::ShardedEngine(const model::LlamaConfig& config, int64_t batch, int64_t seq_len,
                             PlanGroups& groups, uint64_t seed, const EngineOptions& options)
    : batch_(batch),
      seq_len_(seq_len),
      tokens_(static_cast<size_t>(batch * seq_len)),
      targets_(static_cast<size_t>(batch * seq_len)),
      model_(config, batch, seq_len),
      shards_(unit_shards(model_.units(), groups.mesh, groups.position)) {
  if (options.prefetch < 1 || options.max_reductions < 1)
    fail_usage("engine: prefetch and max_reductions must be >= 1");
  impl_ = std::make_unique<Impl>(model_, shards_, groups, options);
  // Every rank draws the whole unit from (seed, unit) and keeps its P-shard, so
  // parameters are the single-process ones whatever the plan.
  std::vector<float> full;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const UnitShards& sh = shards_[u];
    full.assign(static_cast<size_t>(sh.padded), 0.0f);
    model::init_unit_params(model_.units()[u], static_cast<int>(u), seed, full.data());
    std::copy_n(full.data() + sh.p.begin, sh.p.size, impl_->p_shard[u].data());
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
  for (auto& g : im.g_shard) zero(g);
  std::vector<int32_t>& tokens = tokens_;
  std::vector<int32_t>& targets = targets_;
  im.start_gathers(Impl::step_order(im.U, micro_batches));
  StepResult result;
  const size_t per_micro = static_cast<size_t>(2 * im.U - 1);
  for (int64_t m = 0; m < micro_batches; ++m) {
    batch(m, tokens.data(), targets.data());
    model_.set_batch(tokens.data(), targets.data(), batch_, seq_len_, grad_scale);
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

std::vector<std::vector<float>> ShardedEngine::full_parameters() {
  Impl& im = *impl_;
  std::vector<std::vector<float>> out;
  std::vector<float> full;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const UnitShards& sh = shards_[u];
    im.param_update[u].wait();
    const float* src = im.p_shard[u].data();
    if (im.sp > 1) {
      full.resize(static_cast<size_t>(sh.padded));
      im.comm(GroupKind::kP).all_gather(im.p_shard[u].data(), sh.p.size, full.data()).wait();
      src = full.data();
    }
    out.emplace_back(src, src + sh.numel);
  }
  return out;
}

std::vector<ckpt::StateView> ShardedEngine::state_views() {
  Impl& im = *impl_;
  std::vector<ckpt::StateView> views;
  for (size_t u = 0; u < shards_.size(); ++u) {
    im.param_update[u].wait();
    views.push_back({im.p_shard[u].data(), im.exp_avg[u].data(), im.exp_avg_sq[u].data()});
  }
  return views;
}

int64_t ShardedEngine::replica_index() const { return impl_->replica; }

std::vector<comm::Stats> ShardedEngine::comm_stats() const {
  std::vector<comm::Stats> out;
  for (const auto& c : impl_->comms)
    if (c) out.push_back(c->stats());
  if (impl_->world.size() > 1) out.push_back(impl_->world_stats);
  return out;
}

void ShardedEngine::reset_comm_stats() {
  for (auto& c : impl_->comms)
    if (c) c->reset_stats();
  impl_->world_stats = comm::Stats{};
  impl_->world_stats.group = "world";
}

}  // namespace amsp::engine
