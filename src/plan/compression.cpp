#include "plan/compression.h"

#include <sstream>
#include <vector>

#include "core/error.h"

namespace amsp::plan {

namespace {

const char* kExpected =
    "expected off, auto, or a comma list of p=int8|int4|off, g=int8|int4|off, block=N|chunk, "
    "inter-node, on";

int parse_bits(const std::string& item, const std::string& value) {
  if (value == "int8") return 8;
  if (value == "int4") return 4;
  if (value == "off") return 0;
  fail_usage("--compress ", item, ": the code width is int8, int4 or off");
}

int64_t parse_block(const std::string& item, const std::string& value) {
  if (value == "chunk") return Compression::kChunk;
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || used == 0 || n < 1 || n > (INT64_C(1) << 30))
    fail_usage("--compress ", item, ": the block is a count of values from 1 to 2^30, or chunk");
  return n;
}

}  // namespace

Compression parse_compression(const std::string& text) {
  Compression c;
  if (text == "off") return c;
  if (text == "auto") {
    c.choose = true;
    return c;
  }
  if (text.empty()) fail_usage("--compress is empty: ", kExpected);
  bool widths = false, on = false;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (item == "on") {
      on = true;
    } else if (item == "inter-node") {
      c.inter_node_only = true;
    } else if (key == "p" && eq != std::string::npos) {
      c.p_bits = parse_bits(item, value);
      widths = true;
    } else if (key == "g" && eq != std::string::npos) {
      c.g_bits = parse_bits(item, value);
      widths = true;
    } else if (key == "block" && eq != std::string::npos) {
      c.block = parse_block(item, value);
    } else {
      fail_usage("--compress ", text, ": '", item, "' is not understood; ", kExpected);
    }
  }
  if (on && widths) fail_usage("--compress ", text, ": 'on' names the widths itself (p=int8,g=int8)");
  if (on || (!widths && c.inter_node_only)) c.p_bits = c.g_bits = 8;
  if (!c.any())
    fail_usage("--compress ", text, ": compresses nothing; expected p= or g= with int8 or int4, or off");
  return c;
}

std::vector<Compression> compression_candidates() {
  std::vector<Compression> out;
  for (bool inter_node : {false, true})
    for (auto [p, g] : {std::pair{8, 0}, {0, 8}, {8, 8}}) {
      Compression c;
      c.p_bits = p;
      c.g_bits = g;
      c.inter_node_only = inter_node;
      out.push_back(c);
    }
  return out;
}

std::string to_string(const Compression& c) {
  if (c.choose) return "auto";
  if (!c.any()) return "off";
  auto width = [](int bits) { return bits == 8 ? "int8" : bits == 4 ? "int4" : "off"; };
  std::string s = cat("p=", width(c.p_bits), ",g=", width(c.g_bits), ",block=",
                      c.block == Compression::kChunk ? std::string("chunk") : std::to_string(c.block));
  if (c.inter_node_only) s += ",inter-node";
  return s;
}

std::optional<kernels::quant::Spec> compression_spec(const Compression& c, Compressed what,
                                                     int64_t group_nodes) {
  const int bits = what == Compressed::kParams ? c.p_bits : c.g_bits;
  if (bits == 0 || (c.inter_node_only && group_nodes <= 1)) return std::nullopt;
  return kernels::quant::Spec{bits, c.block};
}

}  // namespace amsp::plan
