#include "engine/trainer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "engine/metrics.h"
#include "engine/peak.h"
#include "model/llama.h"

namespace amsp::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Parameters, gradients and Adam moments, one flat buffer per unit.
struct ModelState {
  std::vector<std::vector<float>> params, grads, exp_avg, exp_avg_sq;

  explicit ModelState(const std::vector<model::UnitSpec>& units, uint64_t seed) {
    for (size_t u = 0; u < units.size(); ++u) {
      const size_t n = static_cast<size_t>(units[u].numel);
      params.emplace_back(n);
      model::init_unit_params(units[u], static_cast<int>(u), seed, params.back().data());
      grads.emplace_back(n, 0.0f);
      exp_avg.emplace_back(n, 0.0f);
      exp_avg_sq.emplace_back(n, 0.0f);
    }
  }
};

void check_options(const TrainOptions& o, const data::TokenDataset& data) {
  o.model.validate();
  if (o.seq_len > o.model.max_position_embeddings)
    fail_usage("--seq-len ", o.seq_len, ": expected at most max_position_embeddings = ",
               o.model.max_position_embeddings, " of model ", o.model.name);
  for (auto split : {data::Split::kTrain, data::Split::kValid}) {
    const int32_t max_id = data.max_token(split);
    if (max_id >= o.model.vocab_size)
      fail_usage("--data ", data.path(), ": token id ", max_id, " in the ",
                 split == data::Split::kTrain ? "train" : "validation",
                 " split is beyond the model's vocab_size ", o.model.vocab_size);
  }
  if (data.vocab_size() > o.model.vocab_size)
    fail_usage("--data ", data.path(), ": its tokenizer has ", data.vocab_size(),
               " ids but the model's vocab_size is ", o.model.vocab_size,
               "; expected a model with vocab_size >= ", data.vocab_size(),
               " (set --model.vocab_size)");
  const int64_t train_tokens = static_cast<int64_t>(data.tokens(data::Split::kTrain).size());
  if (train_tokens < o.seq_len + 1)
    fail_usage("--data ", data.path(), ": train split has ", train_tokens,
               " tokens, fewer than one sequence of --seq-len ", o.seq_len, " + 1");
}

void print_config(const TrainOptions& o, const data::TokenDataset& data, double peak_flops,
                  int threads) {
  const auto& m = o.model;
  auto row = [](const char* key, const std::string& value) {
    std::printf("| %-26s | %-40s |\n", key, value.c_str());
  };
  const std::string rule = "+" + std::string(28, '-') + "+" + std::string(42, '-') + "+";
  std::printf("%s\n", rule.c_str());
  row("model", m.name);
  row("parameters", cat(m.num_parameters(), " (", m.num_parameters() / 1e6, " M)"));
  row("hidden_size", std::to_string(m.hidden_size));
  row("intermediate_size", std::to_string(m.intermediate_size));
  row("num_hidden_layers", std::to_string(m.num_hidden_layers));
  row("num_attention_heads", std::to_string(m.num_attention_heads));
  row("num_key_value_heads", std::to_string(m.num_key_value_heads));
  row("vocab_size", std::to_string(m.vocab_size));
  row("rms_norm_eps / rope_theta", cat(m.rms_norm_eps, " / ", m.rope_theta));
  row("data", data.path());
  row("train / validation tokens", cat(data.tokens(data::Split::kTrain).size(), " / ",
                                       data.tokens(data::Split::kValid).size()));
  row("steps", std::to_string(o.steps));
  row("batch x seq x grad_accum", cat(o.batch_size, " x ", o.seq_len, " x ", o.grad_accum, " = ",
                                      o.batch_size * o.seq_len * o.grad_accum, " tokens/step"));
  row("lr (warmup, min)", cat(o.schedule.lr, " (", o.schedule.warmup_steps, " steps, ",
                              o.schedule.min_lr, ")"));
  row("adamw betas, eps, wd", cat(o.adamw.beta1, ", ", o.adamw.beta2, ", ", o.adamw.eps, ", ",
                                  o.adamw.weight_decay));
  row("grad clip", o.grad_clip > 0 ? cat(o.grad_clip) : "off");
  row("seed", std::to_string(o.seed));
  row("threads", std::to_string(threads));
  row("peak for MFU", cat(peak_flops / 1e9, " GFLOP/s", o.peak_tflops > 0 ? " (given)" : " (sgemm, measured)"));
  std::printf("%s\n", rule.c_str());
  std::fflush(stdout);
}

// Mean loss over the first `windows` held-out windows (NaN if there are none).
double evaluate(model::Llama& model, const ModelState& state, const data::TokenDataset& data,
                const TrainOptions& o, std::vector<int32_t>& tokens, std::vector<int32_t>& targets,
                int64_t* windows_used) {
  int64_t windows = data::num_eval_windows(data, o.seq_len);
  if (o.eval_windows > 0) windows = std::min(windows, o.eval_windows);
  *windows_used = windows;
  if (windows == 0) return std::numeric_limits<double>::quiet_NaN();
  double loss = 0.0;
  int64_t count = 0;
  for (int64_t first = 0; first < windows; first += o.batch_size) {
    const int64_t b = std::min(o.batch_size, windows - first);
    data::eval_batch(data, first, b, o.seq_len, tokens.data(), targets.data());
    model.set_batch(tokens.data(), targets.data(), b, o.seq_len, 0.0f);
    for (int u = 0; u < model.num_units(); ++u) model.forward(u, state.params[u].data());
    loss += model.loss_sum();
    count += model.loss_count();
  }
  return loss / static_cast<double>(std::max<int64_t>(1, count));
}

}  // namespace

double train(const TrainOptions& options) {
  TrainOptions o = options;
  o.schedule.total_steps = o.steps;
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const int threads = omp_get_max_threads();

  const data::TokenDataset data(o.data_path);
  check_options(o, data);

  model::Llama model(o.model, o.batch_size, o.seq_len);
  ModelState state(model.units(), o.seed);
  const double peak_flops = o.peak_tflops > 0 ? o.peak_tflops * 1e12 : measure_sgemm_peak_flops();
  const double flops_per_token = model::Llama::flops_per_token(o.model, o.seq_len);
  print_config(o, data, peak_flops, threads);

  MetricsSink sink(o.metrics_path);
  std::vector<int32_t> tokens(static_cast<size_t>(o.batch_size * o.seq_len));
  std::vector<int32_t> targets(tokens.size());
  int64_t windows = 0;
  double val_loss = evaluate(model, state, data, o, tokens, targets, &windows);
  sink.eval(0, val_loss, windows);

  const int64_t tokens_per_step = o.batch_size * o.seq_len * o.grad_accum;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step);
  const int U = model.num_units();
  const auto run_start = Clock::now();
  for (int64_t step = 1; step <= o.steps; ++step) {
    const auto t0 = Clock::now();
    for (auto& g : state.grads) std::fill(g.begin(), g.end(), 0.0f);

    double loss_sum = 0.0;
    int64_t loss_count = 0;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      data::sample_train_batch(data, o.seed, step, micro * o.batch_size, o.batch_size, o.seq_len,
                               tokens.data(), targets.data());
      model.set_batch(tokens.data(), targets.data(), o.batch_size, o.seq_len, grad_scale);
      for (int u = 0; u < U; ++u) model.forward(u, state.params[u].data());
      loss_sum += model.loss_sum();
      loss_count += model.loss_count();
      for (int u = U - 1; u >= 0; --u)
        model.backward(u, state.params[u].data(), state.grads[u].data());
    }

    double sq = 0.0;
    for (const auto& g : state.grads) sq += sum_squares(g.data(), static_cast<int64_t>(g.size()));
    const double grad_norm = std::sqrt(sq);
    if (o.grad_clip > 0 && grad_norm > o.grad_clip) {
      // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6).
      const float scale = static_cast<float>(o.grad_clip / (grad_norm + 1e-6));
      for (auto& g : state.grads) scale_inplace(g.data(), static_cast<int64_t>(g.size()), scale);
    }
    const double lr = learning_rate(o.schedule, step - 1);
    for (int u = 0; u < U; ++u)
      adamw_update_range(model.units()[u], 0, model.units()[u].numel, state.params[u].data(),
                         state.grads[u].data(), state.exp_avg[u].data(),
                         state.exp_avg_sq[u].data(), o.adamw, lr, step);

    StepMetrics m;
    m.step = step;
    m.total_steps = o.steps;
    m.loss = loss_sum / static_cast<double>(std::max<int64_t>(1, loss_count));
    m.lr = lr;
    m.grad_norm = grad_norm;
    m.step_ms = seconds_since(t0) * 1e3;
    m.tokens_per_s = tokens_per_step / (m.step_ms / 1e3);
    m.mfu = flops_per_token * m.tokens_per_s / peak_flops;
    m.tokens = step * tokens_per_step;
    if (!std::isfinite(m.loss))
      fail("step ", step, ": loss is ", m.loss, "; training diverged (try a lower --lr)");
    const bool eval_now = (o.eval_every > 0 && step % o.eval_every == 0) || step == o.steps;
    if (eval_now) {
      val_loss = evaluate(model, state, data, o, tokens, targets, &windows);
      m.val_loss = val_loss;
    }
    sink.step(m);
    if (eval_now) sink.eval(step, val_loss, windows);
  }
  sink.finish(seconds_since(run_start), o.steps);
  return val_loss;
}

}  // namespace amsp::engine
