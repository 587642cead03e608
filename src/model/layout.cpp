#include "model/layout.h"

namespace amsp::model {
namespace {

void add_tensor(UnitSpec& unit, std::string name, std::vector<int64_t> shape, bool is_norm = false,
                bool is_embedding = false) {
  TensorSpec t;
  t.name = std::move(name);
  t.numel = 1;
  for (int64_t d : shape) t.numel *= d;
  t.shape = std::move(shape);
  t.offset = unit.numel;
  t.is_norm = is_norm;
  t.is_embedding = is_embedding;
  unit.numel += t.numel;
  unit.tensors.push_back(std::move(t));
}

}  // namespace

std::vector<UnitSpec> build_layout(const LlamaConfig& config) {
  config.validate();
  const int64_t h = config.hidden_size, kv = config.kv_dim(), inter = config.intermediate_size,
                vocab = config.vocab_size;
  std::vector<UnitSpec> units;

  UnitSpec embed{UnitKind::kEmbedding, -1, "embed", {}, 0};
  add_tensor(embed, "model.embed_tokens.weight", {vocab, h}, false, true);
  units.push_back(std::move(embed));

  for (int l = 0; l < static_cast<int>(config.num_hidden_layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    UnitSpec u{UnitKind::kDecoder, l, "layers." + std::to_string(l), {}, 0};
    add_tensor(u, p + "input_layernorm.weight", {h}, true);
    add_tensor(u, p + "self_attn.q_proj.weight", {h, h});
    add_tensor(u, p + "self_attn.k_proj.weight", {kv, h});
    add_tensor(u, p + "self_attn.v_proj.weight", {kv, h});
    add_tensor(u, p + "self_attn.o_proj.weight", {h, h});
    add_tensor(u, p + "post_attention_layernorm.weight", {h}, true);
    add_tensor(u, p + "mlp.gate_proj.weight", {inter, h});
    add_tensor(u, p + "mlp.up_proj.weight", {inter, h});
    add_tensor(u, p + "mlp.down_proj.weight", {h, inter});
    units.push_back(std::move(u));
  }

  UnitSpec head{UnitKind::kHead, -1, "head", {}, 0};
  add_tensor(head, "model.norm.weight", {h}, true);
  add_tensor(head, "lm_head.weight", {vocab, h});
  units.push_back(std::move(head));
  return units;
}

std::vector<BackwardPart> backward_parts(const UnitSpec& unit) {
  if (unit.kind != UnitKind::kDecoder) return {{0, unit.numel}};
  const int64_t mlp = unit.tensors.at(5).offset;  // post_attention_layernorm
  return {{mlp, unit.numel}, {0, mlp}};
}

}  // namespace amsp::model
