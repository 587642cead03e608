// Which collectives travel block-quantized (doc/compression.md): the parameters'
// P all-gathers and the gradients' reduce-scatters, each with its own code width,
// on every group or only on the groups that cross nodes. The master weights, the
// optimizer and the checkpoint never see a quantized value: only what crosses
// the wire is quantized, and the receiver works in fp32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/quant.h"

namespace amsp::plan {

struct Compression {
  int p_bits = 0;        // parameters' all-gathers over P: 8, 4, or 0 (off)
  int g_bits = 0;        // gradients' reduce-scatters: 8, 4, or 0 (off)
  int64_t block = 256;   // values per scale; kChunk: one scale per rank's chunk
  bool inter_node_only = false;  // only groups whose ranks span several nodes
  // "auto": --shard auto chooses among compression_candidates (and off); never
  // what an engine or a schedule is given.
  bool choose = false;

  static constexpr int64_t kChunk = INT64_C(1) << 62;
  bool any() const { return p_bits != 0 || g_bits != 0; }
  bool operator==(const Compression&) const = default;
};

// --compress: "off" (the default), "auto", or a comma list of
//   p=int8|int4|off   g=int8|int4|off   block=N|chunk   inter-node   on
// where "on" means p=int8,g=int8 and "inter-node" alone means p=int8,g=int8
// on the groups that cross nodes. Throws UsageError naming --compress and what
// was expected.
Compression parse_compression(const std::string& text);
// The canonical text: "off", or e.g. "p=int8,g=int4,block=256,inter-node".
std::string to_string(const Compression& c);

// What --compress auto lets the planner choose from, besides off: int8 in
// blocks of 256 for the parameters, the gradients or both, on every group or
// only on those that cross nodes. int4 is never chosen for the user: it moves
// the gradient by tens of percent (doc/compression.md, the guard).
std::vector<Compression> compression_candidates();

// The spec a collective of this kind uses on a group spanning `group_nodes`
// nodes; nullopt: uncompressed.
enum class Compressed { kParams, kGrads };
std::optional<kernels::quant::Spec> compression_spec(const Compression& c, Compressed what,
                                                     int64_t group_nodes);

}  // namespace amsp::plan
