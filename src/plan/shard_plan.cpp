#include "plan/shard_plan.h"

#include <cctype>
#include <vector>

#include "core/error.h"
#include "core/parse.h"

namespace amsp::plan {
namespace {

int64_t parse_positive(const std::string& text, const std::string& context) {
  const auto v = parse_int(text);
  if (!v || *v < 1) fail_usage("--shard ", context, ": '", text, "' is not a positive integer");
  return *v;
}

void check_factor(const Factor& f, const char* state, const MeshShape& mesh) {
  const int64_t R = mesh.ranks_per_node, N = mesh.nodes;
  if (f.s0 < 1 || R % f.s0 != 0)
    fail_usage("--shard ", state, "=", to_string(f), ": ", f.s0,
               " ranks per node must divide the ", R, " ranks per node");
  if (f.s1 < 1 || N % f.s1 != 0)
    fail_usage("--shard ", state, "=", to_string(f), ": ", f.s1, " nodes must divide the ", N,
               " nodes");
  if (f.s1 > 1 && f.s0 != R)
    fail_usage("--shard ", state, "=", to_string(f), ": a group spanning ", f.s1,
               " nodes must fill them (", R, "x", f.s1, ")");
}

void check_nested(const Factor& inner, const char* a, const Factor& outer, const char* b) {
  if (outer.s0 % inner.s0 != 0 || outer.s1 % inner.s1 != 0)
    fail_usage("--shard ", a, "=", to_string(inner), ", ", b, "=", to_string(outer), ": ", b,
               " must be sharded over a multiple of ", a, "'s group in both dimensions (",
               a, " | ", b, ")");
}

}  // namespace

std::string to_string(const Factor& f) { return cat(f.s0, "x", f.s1); }

std::string to_string(const ShardPlan& plan) {
  return cat("p=", to_string(plan.p), ",g=", to_string(plan.g), ",os=", to_string(plan.os));
}

Factor factor_for_size(int64_t k, const MeshShape& mesh, const std::string& what) {
  const int64_t R = mesh.ranks_per_node, N = mesh.nodes;
  if (k >= 1 && k <= R && R % k == 0) return {k, 1};
  if (k > R && k % R == 0 && N % (k / R) == 0) return {R, k / R};
  fail_usage("--shard ", what, ": a group of ", k, " ranks does not fit ", N, " nodes x ", R,
             " ranks (expected a divisor of ", R, " or a multiple of ", R,
             " that divides the world size ", mesh.world(), ")");
}

void validate(const ShardPlan& plan, const MeshShape& mesh) {
  check_factor(plan.p, "p", mesh);
  check_factor(plan.g, "g", mesh);
  check_factor(plan.os, "os", mesh);
  check_nested(plan.p, "p", plan.g, "g");
  check_nested(plan.g, "g", plan.os, "os");
}

ShardPlan parse_shard_plan(const std::string& text, const MeshShape& mesh) {
  const int64_t d = mesh.world();
  ShardPlan plan;
  plan.name = text;
  const Factor one{1, 1}, all = factor_for_size(d, mesh, text);
  if (text == "ddp") {
    plan.p = plan.g = plan.os = one;
  } else if (text == "zero1") {
    plan.p = plan.g = one;
    plan.os = all;
  } else if (text == "zero2") {
    plan.p = one;
    plan.g = plan.os = all;
  } else if (text == "zero3" || text == "fsdp") {
    plan.p = plan.g = plan.os = all;
  } else if (text.rfind("mics:", 0) == 0) {
    const int64_t k = parse_positive(text.substr(5), "mics:K");
    plan.p = plan.g = plan.os = factor_for_size(k, mesh, text);
  } else if (text.find('=') != std::string::npos) {
    plan.name = "custom";
    bool seen[3] = {false, false, false};
    Factor* slots[3] = {&plan.p, &plan.g, &plan.os};
    const char* names[3] = {"p", "g", "os"};
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = text.find(',', start);
      const std::string item =
          text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? text.size() + 1 : comma + 1;
      const size_t eq = item.find('=');
      if (eq == std::string::npos)
        fail_usage("--shard ", text, ": '", item, "' is not STATE=FACTOR (e.g. os=8x1)");
      const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
      int slot = -1;
      for (int i = 0; i < 3; ++i)
        if (key == names[i]) slot = i;
      if (slot < 0) fail_usage("--shard ", text, ": unknown state '", key, "'; expected p, g or os");
      if (seen[slot]) fail_usage("--shard ", text, ": ", key, " given twice");
      seen[slot] = true;
      const size_t x = value.find('x');
      if (x == std::string::npos) {
        *slots[slot] = factor_for_size(parse_positive(value, key), mesh, item);
      } else {
        *slots[slot] = {parse_positive(value.substr(0, x), key), parse_positive(value.substr(x + 1), key)};
      }
    }
    // Omitted states inherit: G from P, OS from G.
    if (!seen[1]) plan.g = plan.p;
    if (!seen[2]) plan.os = plan.g;
  } else {
    fail_usage("--shard ", text, ": unknown plan; expected ddp, zero1, zero2, zero3, fsdp, "
               "mics:K, auto or factors like p=1,g=2x1,os=8x1");
  }
  validate(plan, mesh);
  return plan;
}

}  // namespace amsp::plan
