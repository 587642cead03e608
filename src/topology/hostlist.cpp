#include "topology/hostlist.h"

#include <cctype>
#include <cstdint>

#include "core/error.h"

namespace amsp::topology {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_digit(c)) return false;
  return true;
}

// A decimal number of at most 18 digits (so it fits an int64 with room to spare).
bool parse_number(std::string_view s, uint64_t& out) {
  if (!all_digits(s) || s.size() > 18) return false;
  out = 0;
  for (char c : s) out = out * 10 + static_cast<uint64_t>(c - '0');
  return true;
}

std::string pad(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

[[noreturn]] void bad_hostlist(std::string_view expr, const std::string& why) {
  fail_usage("bad host list \"", expr, "\": ", why);
}

// The numbers one bracket group stands for ("1-3,7" -> 1 2 3 7), zero padded.
std::vector<std::string> expand_group(std::string_view expr, std::string_view group) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = group.find(',', start);
    const std::string_view piece =
        group.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (piece.empty()) bad_hostlist(expr, cat("empty range in [", group, "]"));
    const size_t dash = piece.find('-');
    const std::string_view lo_s = piece.substr(0, dash);
    const std::string_view hi_s = dash == std::string_view::npos ? lo_s : piece.substr(dash + 1);
    uint64_t lo = 0, hi = 0;
    if (!parse_number(lo_s, lo) || !parse_number(hi_s, hi))
      bad_hostlist(expr, cat("range \"", piece, "\" in [", group, "] is not N or N-M with decimal numbers"));
    if (lo > hi) bad_hostlist(expr, cat("range \"", piece, "\" is reversed (", lo, " > ", hi, ")"));
    if (hi - lo >= kMaxHosts || out.size() + (hi - lo + 1) > kMaxHosts)
      bad_hostlist(expr, cat("more than ", kMaxHosts, " host names"));
    // Slurm pads every number to the width of the range's low bound: n[08-10], n[001-3].
    for (uint64_t v = lo; v <= hi; ++v) out.push_back(pad(v, lo_s.size()));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// Expands one entry of the list (no top-level commas): literal text and bracket groups.
// The order is Slurm's (hostlist.c peels off the last group as the fastest varying,
// then recurses on the prefix from its last group backwards): for groups g1..gm the
// loops nest, outermost first, as g(m-1), ..., g1, gm.  With two groups that is simply
// "first slowest": rack[1-2]-n[1-2] -> rack1-n1 rack1-n2 rack2-n1 rack2-n2.
void expand_entry(std::string_view expr, std::string_view entry, std::vector<std::string>& out) {
  std::vector<std::string> literals;               // m + 1 pieces around the m groups
  std::vector<std::vector<std::string>> groups;    // the numbers of each group
  size_t i = 0;
  while (true) {
    const size_t open = entry.find('[', i);
    literals.emplace_back(entry.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i));
    if (open == std::string_view::npos) break;
    const size_t close = entry.find(']', open);  // balanced and unnested: checked by the caller
    groups.push_back(expand_group(expr, entry.substr(open + 1, close - open - 1)));
    i = close + 1;
  }
  const size_t m = groups.size();
  size_t total = 1;
  for (const auto& g : groups) {
    total *= g.size();
    if (total + out.size() > kMaxHosts) bad_hostlist(expr, cat("more than ", kMaxHosts, " host names"));
  }
  std::vector<size_t> nesting;  // group indices, outermost loop first
  if (m > 0) {
    for (size_t g = m - 1; g-- > 0;) nesting.push_back(g);
    nesting.push_back(m - 1);
  }
  std::vector<size_t> pick(m, 0);
  for (size_t n = 0; n < total; ++n) {
    // n's digits in the nesting order pick one number from each group.
    size_t rest = n;
    for (size_t k = nesting.size(); k-- > 0;) {
      const size_t g = nesting[k];
      pick[g] = rest % groups[g].size();
      rest /= groups[g].size();
    }
    std::string name = literals[0];
    for (size_t g = 0; g < m; ++g) name += groups[g][pick[g]] + literals[g + 1];
    out.push_back(std::move(name));
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expr) {
  std::vector<std::string> out;
  int depth = 0;
  size_t entry_start = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    const char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') {
      if (depth > 0) bad_hostlist(expr, cat("nested '[' at offset ", i));
      depth = 1;
    } else if (c == ']') {
      if (depth == 0) bad_hostlist(expr, cat("']' without '[' at offset ", i));
      depth = 0;
    } else if (depth == 0 && (c == ',' || is_space(c))) {
      if (i > entry_start) expand_entry(expr, expr.substr(entry_start, i - entry_start), out);
      entry_start = i + 1;
    } else if (depth == 1 && is_space(c)) {
      bad_hostlist(expr, cat("white space inside brackets at offset ", i));
    }
  }
  if (depth > 0) bad_hostlist(expr, "'[' is never closed");
  return out;
}

std::vector<int> parse_tasks_per_node(std::string_view spec) {
  auto bad = [&](const std::string& why) -> void {
    fail_usage("bad tasks-per-node list \"", spec, "\": ", why,
               " (expected counts like \"2(x3),1\")");
  };
  std::vector<int> out;
  if (spec.empty()) bad("it is empty");
  size_t start = 0;
  while (true) {
    const size_t comma = spec.find(',', start);
    const std::string_view item =
        spec.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::string_view count_s = item, repeat_s = "1";
    const size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      count_s = item.substr(0, paren);
      const std::string_view rest = item.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') {
        bad(cat("\"", item, "\" is not N or N(xM)"));
      }
      repeat_s = rest.substr(2, rest.size() - 3);
    }
    uint64_t count = 0, repeat = 0;
    if (!parse_number(count_s, count) || count > 1000000)
      bad(cat("\"", item, "\" does not start with a task count"));
    if (!parse_number(repeat_s, repeat) || repeat == 0 || repeat > kMaxHosts)
      bad(cat("\"", item, "\" has a bad repetition (want x1 or more)"));
    if (out.size() + repeat > kMaxHosts) bad(cat("more than ", kMaxHosts, " nodes"));
    out.insert(out.end(), repeat, static_cast<int>(count));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

SwitchAddress parse_topology_addr(std::string_view addr, std::string_view pattern) {
  auto split = [](std::string_view s) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
      const size_t dot = s.find('.', start);
      parts.emplace_back(s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
    return parts;
  };
  auto bad = [&](const std::string& why) -> void {
    fail_usage("bad SLURM_TOPOLOGY_ADDR \"", addr, "\" with SLURM_TOPOLOGY_ADDR_PATTERN \"", pattern,
               "\": ", why);
  };
  const auto kinds = split(pattern);
  const auto parts = split(addr);
  if (kinds.back() != "node") bad("the pattern must end in \"node\"");
  for (size_t i = 0; i + 1 < kinds.size(); ++i)
    if (kinds[i] != "switch") bad(cat("pattern component \"", kinds[i], "\" is not \"switch\""));
  if (parts.size() < kinds.size())
    bad(cat("the address has ", parts.size(), " components, the pattern ", kinds.size()));
  SwitchAddress out;
  const size_t nswitch = kinds.size() - 1;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) bad("empty component");
    if (i < nswitch) {
      out.switches.push_back(parts[i]);
    } else {
      if (!out.node.empty()) out.node += '.';
      out.node += parts[i];
    }
  }
  return out;
}

std::string join_path(const std::vector<std::string>& switches) { return join(switches, "."); }

bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && is_digit(a[ie])) ++ie;
      while (je < b.size() && is_digit(b[je])) ++je;
      // Compare the digit runs as numbers: strip leading zeros, then length, then digits.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      const int c = a.substr(is, ie - is).compare(b.substr(js, je - js));
      if (c != 0) return c < 0;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
      ++i;
      ++j;
    }
  }
  if ((i < a.size()) != (j < b.size())) return j < b.size();  // the shorter rest first
  return a < b;                                                 // equal by value: tie-break
}

}  // namespace amsp::topology
