// How LLaMA's parameters are laid out in units. A unit is the granule of
// sharding and communication: the token embedding, each decoder layer, and the
// head (final norm + LM head). Each unit's tensors live back to back in one flat
// fp32 buffer; the sharding engine splits that buffer, the checkpoint writer
// maps it back to Hugging Face tensor names and shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace amsp::model {

struct TensorSpec {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // row-major, as in PyTorch (Linear weights are [out, in])
  int64_t offset = 0;          // first element inside the unit's flat buffer
  int64_t numel = 0;
  bool is_norm = false;        // RMSNorm weights: initialised to 1, no weight decay
  bool is_embedding = false;   // token embedding: no weight decay unless asked
};

enum class UnitKind { kEmbedding, kDecoder, kHead };

struct UnitSpec {
  UnitKind kind;
  int layer = -1;        // decoder layer index, -1 for embedding and head
  std::string name;      // "embed", "layers.3", "head"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;     // sum of the tensors' numel (no padding here)
};

// Units in forward order: embed, layers.0 .. layers.{L-1}, head.
// Decoder tensor order: input_layernorm, q_proj, k_proj, v_proj, o_proj,
// post_attention_layernorm, gate_proj, up_proj, down_proj.
// Head tensor order: model.norm.weight, lm_head.weight.
std::vector<UnitSpec> build_layout(const LlamaConfig& config);

// A unit's backward in parts, in the order they run, each the range of the
// unit's buffer whose gradients are final once it returns. A decoder layer's
// MLP block (post_attention_layernorm .. down_proj, the buffer's tail) runs
// before its attention block (input_layernorm .. o_proj, the head), so a
// reduction of the tail can start while the attention block computes, as
// PyTorch's DDP buckets gradients in the order backward produces them. The
// embedding and the head are one part each.
struct BackwardPart {
  int64_t begin = 0, end = 0;  // elements of the unit's buffer
};
std::vector<BackwardPart> backward_parts(const UnitSpec& unit);

}  // namespace amsp::model
