#include "core/fault.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/parse.h"

namespace amsp::fault {
namespace {

// Every point the code names, in the order a step reaches them.
constexpr const char* kPoints[] = {
    "train.step",        // at the start of optimizer step STEP
    "save.begin",        // a checkpoint of STEP is about to be written
    "save.data",         // every dataset written, the .tmp file not yet closed
    "save.closed",       // the .tmp file complete and closed, not yet renamed
    "save.renamed",      // step-STEP.h5 in place, `latest` still names the previous one
    "save.latest_tmp",   // latest.tmp written, not yet renamed over `latest`
    "save.latest",       // `latest` names step-STEP.h5, older checkpoints not yet pruned
    // amsp export (STEP: the checkpoint's step; rank 0)
    "export.written",    // the new export complete in OUTPUT.tmp-XXXXXX, OUTPUT untouched
    "export.swapped",    // --force: the new export at OUTPUT, the old one beside it, not yet deleted
};

struct Spec {
  std::string point;
  int64_t step = -1;
  int rank = -1;  // -1: every rank
  int signal = SIGKILL;  // 0 with fail
  bool fail = false;     // ",FAIL": throw an I/O error instead of a signal
  double sleep_s = 0;    // ",SLEEP=S": wait S seconds instead of a signal
};

bool known(const std::string& name) {
  for (const char* p : kPoints)
    if (name == p) return true;
  return false;
}

// "KILL", "USR1", "TERM" -> the signal; 0 for anything else.
int signal_named(const std::string& name) {
  if (name == "KILL") return SIGKILL;
  if (name == "USR1") return SIGUSR1;
  if (name == "TERM") return SIGTERM;
  return 0;
}

// Splits "HEAD<sep>TAIL" at the first sep: HEAD, and TAIL (empty if no sep).
std::pair<std::string, std::string> split(const std::string& text, char sep) {
  const size_t at = text.find(sep);
  if (at == std::string::npos) return {text, ""};
  return {text.substr(0, at), text.substr(at + 1)};
}

Spec parse(const std::string& full) {
  const auto [where, sig] = split(full, ',');
  const auto [point, when] = split(where, '@');
  const auto [step_text, rank_text] = split(when, ':');
  const std::optional<int64_t> step = parse_int(step_text);
  const std::optional<int64_t> rank = rank_text.empty() ? std::optional<int64_t>(-1) : parse_int(rank_text);
  Spec s;
  s.point = point;
  s.fail = sig == "FAIL";
  s.signal = full.find(',') == std::string::npos ? SIGKILL : signal_named(sig);
  const auto [action, seconds] = split(sig, '=');
  const std::optional<double> sleep_s = action == "SLEEP" ? parse_double(seconds) : std::nullopt;
  if (sleep_s && *sleep_s > 0 && *sleep_s <= 3600) s.sleep_s = *sleep_s;
  if (!known(s.point) || !step || *step < 0 || !rank || *rank < -1 ||
      (s.signal == 0 && !s.fail && s.sleep_s == 0))
    fail_usage("AMSP_FAULT=", full, ": expected POINT@STEP[:RANK][,KILL|USR1|TERM|FAIL|SLEEP=SECONDS] with POINT one of "
               "train.step, save.begin, save.data, save.closed, save.renamed, save.latest_tmp, "
               "save.latest, export.written, export.swapped");
  s.step = *step;
  s.rank = static_cast<int>(*rank);
  return s;
}

// Parsed once; a malformed AMSP_FAULT is a usage error, not a silent no-op.
const std::optional<Spec>& spec() {
  static const std::optional<Spec> parsed = [] () -> std::optional<Spec> {
    const char* env = std::getenv("AMSP_FAULT");
    if (!env || !*env) return std::nullopt;
    return parse(env);
  }();
  return parsed;
}

}  // namespace

void check_environment() { spec(); }

void point(const char* name, int64_t step, int rank) {
  const auto& s = spec();
  if (!s || s->step != step || (s->rank >= 0 && s->rank != rank) || s->point != name) return;
  if (s->fail) fail("injected I/O error at ", name, " (step ", step, ", AMSP_FAULT)");
  if (s->sleep_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s->sleep_s));
    return;
  }
  ::raise(s->signal);
}

}  // namespace amsp::fault
