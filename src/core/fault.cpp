#include "core/fault.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/parse.h"
#include "core/stop.h"

namespace amsp::fault {
namespace {

// Every point the code names, in the order a step reaches them.
constexpr const char* kPoints[] = {
    "train.step",        // at the start of optimizer step STEP
    "collective",        // a collective issued in step STEP (SKIP=N, SHORT=N)
    "save.writer",       // a background save's writer thread, woken for STEP, nothing claimed yet
    "save.snapshot",     // a background save's writer thread, about to copy the snapshot of STEP
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

enum class Action { kSignal, kFail, kSleep, kSpin, kSlow, kSkip, kShort };

struct Spec {
  std::string point;
  int64_t step = -1;
  int rank = -1;  // -1: every rank
  Action action = Action::kSignal;
  int signal = SIGKILL;  // kSignal
  double value = 0;      // kSleep: seconds; kSlow: the factor; kSkip, kShort: the op's index
};

bool known(const std::string& name) {
  for (const char* p : kPoints)
    if (name == p) return true;
  return false;
}

// Splits "HEAD<sep>TAIL" at the first sep: HEAD, and TAIL (empty if no sep).
std::pair<std::string, std::string> split(const std::string& text, char sep) {
  const size_t at = text.find(sep);
  if (at == std::string::npos) return {text, ""};
  return {text.substr(0, at), text.substr(at + 1)};
}

// The action after the comma into s; false if it is not one.
bool parse_action(const std::string& text, Spec& s) {
  const auto [name, arg] = split(text, '=');
  const std::optional<double> v = arg.empty() ? std::nullopt : parse_double(arg);
  const bool collective = s.point == "collective";
  const struct {
    const char* name;
    int signal;
  } signals[] = {{"KILL", SIGKILL}, {"USR1", SIGUSR1}, {"TERM", SIGTERM}, {"STOP", SIGSTOP}};
  for (const auto& sig : signals)
    if (text == sig.name && !collective) {
      s.action = Action::kSignal;
      s.signal = sig.signal;
      return true;
    }
  if (text == "FAIL" || text == "SPIN") {
    s.action = text == "FAIL" ? Action::kFail : Action::kSpin;
    return !collective;
  }
  s.value = v.value_or(-1);
  if (name == "SLEEP") s.action = Action::kSleep;
  if (name == "SLOW") s.action = Action::kSlow;
  if (name == "SKIP") s.action = Action::kSkip;
  if (name == "SHORT") s.action = Action::kShort;
  if (name == "SLEEP") return !collective && s.value > 0 && s.value <= 3600;
  if (name == "SLOW") return s.point == "train.step" && s.value > 0 && s.value <= 100;
  if (name == "SKIP" || name == "SHORT") return collective && s.value >= 0 && s.value == static_cast<int64_t>(s.value);
  return false;
}

Spec parse(const std::string& full) {
  const auto [where, action] = split(full, ',');
  const auto [point, when] = split(where, '@');
  const auto [step_text, rank_text] = split(when, ':');
  const std::optional<int64_t> step = parse_int(step_text);
  const std::optional<int64_t> rank = rank_text.empty() ? std::optional<int64_t>(-1) : parse_int(rank_text);
  Spec s;
  s.point = point;
  const bool action_ok = full.find(',') == std::string::npos ? s.point != "collective" : parse_action(action, s);
  if (!known(s.point) || !step || *step < 0 || !rank || *rank < -1 || !action_ok)
    fail_usage("AMSP_FAULT=", full, ": expected POINT@STEP[:RANK][,KILL|USR1|TERM|STOP|FAIL|SPIN|SLEEP=SECONDS], "
               "train.step@STEP:RANK,SLOW=FACTOR or collective@STEP:RANK,SKIP=N|SHORT=N, with POINT one of "
               "train.step, save.writer, save.snapshot, save.begin, save.data, save.closed, save.renamed, save.latest_tmp, "
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

bool mine(const Spec& s, int rank) { return s.rank < 0 || s.rank == rank; }

// SLEEP: a slow step, which a stop request ends as it would end a long step's
// wait for its next decision point; the test that waits for a signal then waits
// only until the signal, not the whole S seconds.
void sleep_unless_stopped(double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (Clock::now() < end && stop::requested() == 0)
    std::this_thread::sleep_for(std::min<Clock::duration>(end - Clock::now(), std::chrono::milliseconds(50)));
}

}  // namespace

void check_environment() { spec(); }

void point(const char* name, int64_t step, int rank) {
  const auto& s = spec();
  if (!s || s->step != step || !mine(*s, rank) || s->point != name) return;
  switch (s->action) {
    case Action::kFail: fail("injected I/O error at ", name, " (step ", step, ", AMSP_FAULT)");
    case Action::kSleep: sleep_unless_stopped(s->value); return;
    case Action::kSpin:
      for (std::atomic<uint64_t> i{0};; i.fetch_add(1, std::memory_order_relaxed)) {
      }
    case Action::kSignal: ::raise(s->signal); return;
    case Action::kSlow:
    case Action::kSkip:
    case Action::kShort: return;  // asked for by slow_factor and collective
  }
}

Collective collective(int64_t step, int64_t index, int rank) {
  const auto& s = spec();
  if (!s || s->point != "collective" || s->step != step || !mine(*s, rank) || s->value != index)
    return Collective::kNone;
  return s->action == Action::kSkip ? Collective::kSkip : Collective::kShort;
}

double slow_factor(int64_t step, int rank) {
  const auto& s = spec();
  if (!s || s->action != Action::kSlow || step < s->step || !mine(*s, rank)) return 0;
  return s->value;
}

}  // namespace amsp::fault
