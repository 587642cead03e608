#include "comm/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/mpi_check.h"

namespace amsp::comm::watchdog {
namespace {

constexpr int kQueryTag = 1, kAnswerTag = 2;

struct Query {
  uint64_t key = 0;   // the group asked about (its key, or its name_key for kIdentity)
  uint64_t seq = 0;   // kIdentity: the op
  int32_t kind = 0;   // kState or kIdentity
  int32_t pad = 0;
};
constexpr int32_t kState = 0, kIdentity = 1;

// Fixed-size, sent as bytes: every rank runs the same binary.
struct Answer {
  uint64_t issued = 0;    // ops this rank issued on the group
  int64_t step = 0;       // its optimizer step
  int32_t known = 0;      // it is a member of the group
  int32_t waiting = 0;    // a thread of it waits in a collective:
  int32_t wait_op = 0;    //   which op, on which group (wait_group),
  int32_t pad = 0;
  uint64_t wait_seq = 0;  //   its number on its group,
  double wait_s = 0;      //   for how long
  char wait_group[120] = {};
  int64_t has_identity = 0;  // kIdentity: the rank still knows the op:
  Identity identity{};       //   what it issued
};

struct Node {
  std::string name;
  int local = 0;
};

struct Wait {
  const Entry* entry = nullptr;  // registered while set: its destructor takes the same lock
  uint64_t seq = 0;
  Op op = Op::kAllReduce;
  double since = 0;
};

struct State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  std::vector<Node> nodes;  // by world rank
  std::thread responder;
  std::atomic<bool> stopping{false};
  std::mutex mu;  // guards entries and wait
  std::vector<Entry*> entries;
  Wait wait;
};

State& state() {
  static State s;
  return s;
}

std::atomic<int64_t> g_step{0};
std::atomic<int64_t> g_index{0};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

Answer answer(const Query& q) {
  State& s = state();
  Answer a;
  a.step = g_step.load(std::memory_order_relaxed);
  std::lock_guard lock(s.mu);
  if (q.kind == kIdentity) {
    for (const Entry* e : s.entries)
      if (e->name_key() == q.key)
        if (const auto id = e->identity(q.seq)) {
          a.has_identity = 1;
          a.identity = *id;
        }
    return a;
  }
  for (const Entry* e : s.entries)
    if (e->key() == q.key) {
      a.known = 1;
      a.issued = std::max(a.issued, e->issued());
    }
  if (s.wait.entry) {
    a.waiting = 1;
    a.wait_op = static_cast<int32_t>(s.wait.op);
    a.wait_seq = s.wait.seq;
    a.wait_s = now_seconds() - s.wait.since;
    std::snprintf(a.wait_group, sizeof a.wait_group, "%s", s.wait.entry->description().c_str());
  }
  return a;
}

// The responder: answers every question as it comes. Its MPI calls are not
// checked: an error here must not end a job that is otherwise fine.
void respond() {
  State& s = state();
  while (!s.stopping.load(std::memory_order_relaxed)) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, s.comm, &flag, &st) != MPI_SUCCESS) return;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    Query q;
    if (MPI_Recv(&q, sizeof q, MPI_BYTE, st.MPI_SOURCE, kQueryTag, s.comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    const Answer a = answer(q);
    if (MPI_Send(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, kAnswerTag, s.comm) != MPI_SUCCESS) return;
  }
}

// This process's node name (Slurm's, else the host's) and rank on the node.
Node this_node() {
  Node n;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const char* slurm_node = std::getenv("SLURMD_NODENAME");
  n.name = slurm_node && *slurm_node ? slurm_node : host;
  if (const char* local = std::getenv("SLURM_LOCALID"); local && *local && std::getenv("SLURM_JOB_ID")) {
    n.local = std::atoi(local);
  } else {
    MPI_Comm shared = MPI_COMM_NULL;
    AMSP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared));
    AMSP_MPI_CHECK(MPI_Comm_rank(shared, &n.local));
    AMSP_MPI_CHECK(MPI_Comm_free(&shared));
  }
  return n;
}

// What each of `ranks` answered about the group q names: answered[i] is
// false for a rank that did not answer within kAnswerSeconds (and for this
// rank, which is not asked).
struct Poll {
  std::vector<Answer> answers;
  std::vector<bool> answered;
};

Poll ask(const std::vector<int>& ranks, const Query& q) {
  const State& s = state();
  const size_t n = ranks.size();
  Poll p{std::vector<Answer>(n), std::vector<bool>(n, false)};
  std::vector<MPI_Request> recv(n, MPI_REQUEST_NULL);
  for (size_t i = 0; i < n; ++i) {
    if (ranks[i] == s.rank) continue;
    MPI_Request send;
    MPI_Isend(&q, sizeof q, MPI_BYTE, ranks[i], kQueryTag, s.comm, &send);
    MPI_Request_free(&send);
    MPI_Irecv(&p.answers[i], sizeof(Answer), MPI_BYTE, ranks[i], kAnswerTag, s.comm, &recv[i]);
  }
  for (const double deadline = now_seconds() + kAnswerSeconds; now_seconds() < deadline;) {
    size_t left = 0;
    for (size_t i = 0; i < n; ++i) {
      if (recv[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&recv[i], &flag, MPI_STATUS_IGNORE);
      p.answered[i] = flag != 0;
      left += !flag;
    }
    if (!left) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return p;
}

std::string silent(int r) {
  return cat(rank_name(r), " did not answer within ", seconds(kAnswerSeconds), " s (stopped, dead or wedged)");
}

// What the members answered about op `seq` of e, as the parts of the verdict.
struct Verdict {
  std::vector<std::string> culprits;  // one phrase per rank that holds the op up
  std::vector<int> waiters;           // ranks that reached the op
  int reporter = 0;                   // the lowest of them
  bool chained = false;               // every culprit waits in another collective itself
  double chain_left_s = 0;            // the longest a culprit still waits before its own timeout
};

std::string elsewhere(const Answer& a) {
  if (a.waiting)
    return cat("it waits in ", op_name(static_cast<Op>(a.wait_op)), " #", a.wait_seq, " on ", a.wait_group,
               ", for ", seconds(a.wait_s), " s");
  return cat("it waits in no collective: it computes", a.step > 0 ? cat(" in step ", a.step) : "",
             ", its last op on the group #", a.issued);
}

Verdict judge(const Entry& e, Op op, uint64_t seq, const Poll& p, double waited_s) {
  const State& s = state();
  const std::string what = cat(op_name(op), " #", seq, " on ", e.description());
  Verdict v;
  v.waiters.push_back(s.rank);
  v.reporter = s.rank;
  int direct = 0;  // culprits that do not answer or compute
  for (size_t i = 0; i < e.members().size(); ++i) {
    const int r = e.members()[i];
    if (r == s.rank) continue;
    const Answer& a = p.answers[i];
    if (!p.answered[i]) {
      v.culprits.push_back(cat(silent(r), " and holds up ", what));
      ++direct;
    } else if (!a.known || a.issued < seq) {
      v.culprits.push_back(cat(rank_name(r), " never reached ", what, " (", elsewhere(a), ")"));
      direct += !a.waiting;
      // Every rank has the same timeout: one that began waiting later reports later.
      if (a.waiting) v.chain_left_s = std::max(v.chain_left_s, waited_s - a.wait_s);
    } else {
      v.waiters.push_back(r);
      // Only a rank that waits in this very op will report it: one that issued
      // it and waits in a later op reports that one, if any.
      if (a.waiting && a.wait_seq == seq && e.description().substr(0, sizeof a.wait_group - 1) == a.wait_group)
        v.reporter = std::min(v.reporter, r);
    }
  }
  v.chained = !v.culprits.empty() && direct == 0;
  return v;
}

// The ranks of the world that do not answer or wait in no collective.
std::vector<std::string> idle_ranks(const Entry& world, const Poll& p) {
  const State& s = state();
  std::vector<std::string> idle;
  for (size_t i = 0; i < world.members().size(); ++i) {
    const int r = world.members()[i];
    const Answer& a = p.answers[i];
    if (r == s.rank) continue;
    if (!p.answered[i]) idle.push_back(silent(r));
    else if (!a.waiting)
      idle.push_back(cat(rank_name(r), " is in no collective (it computes",
                         a.step > 0 ? cat(" in step ", a.step) : "", ")"));
  }
  return idle;
}

}  // namespace

void start() {
  State& s = state();
  if (s.comm != MPI_COMM_NULL) return;
  AMSP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm));
  AMSP_MPI_CHECK(MPI_Comm_set_name(s.comm, "watchdog"));
  set_errors_return(s.comm);
  int size = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(s.comm, &s.rank));
  AMSP_MPI_CHECK(MPI_Comm_size(s.comm, &size));
  const Node me = this_node();
  struct Packed {
    char name[112];
    int32_t local;
  } mine{}, *all = nullptr;
  std::vector<Packed> packed(static_cast<size_t>(size));
  all = packed.data();
  std::snprintf(mine.name, sizeof mine.name, "%s", me.name.c_str());
  mine.local = me.local;
  AMSP_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, s.comm));
  s.nodes.clear();
  for (const Packed& p : packed) s.nodes.push_back({p.name, p.local});
  s.stopping = false;
  s.responder = std::thread(respond);
}

void stop() {
  State& s = state();
  if (s.comm == MPI_COMM_NULL) return;
  s.stopping = true;
  if (s.responder.joinable()) s.responder.join();
  MPI_Comm_free(&s.comm);
}

void set_step(int64_t step) {
  g_step.store(step, std::memory_order_relaxed);
  g_index.store(0, std::memory_order_relaxed);
}

int64_t step() { return g_step.load(std::memory_order_relaxed); }

int64_t next_op_index() {
  if (g_step.load(std::memory_order_relaxed) <= 0) return -1;
  return g_index.fetch_add(1, std::memory_order_relaxed);
}

std::string rank_name(int r) {
  const State& s = state();
  if (r < 0 || r >= static_cast<int>(s.nodes.size())) return cat("rank ", r);
  return cat("rank ", r, " (", s.nodes[r].name, ", local ", s.nodes[r].local, ")");
}

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? cat(ranks[i]) : cat(ranks[i], j == i + 1 ? ", " : "-", ranks[j]));
    i = j + 1;
  }
  return join(parts, ", ");
}

std::string ranks_phrase(const std::vector<int>& ranks) {
  const std::string list = rank_list(ranks);
  return cat(list.find_first_of(",-") == std::string::npos ? "rank " : "ranks ", list);
}

Entry::Entry(const std::string& name, std::vector<int> members)
    : name_(name), members_(std::move(members)) {
  description_ = cat("the ", name_, " group of ranks ", rank_list(members_));
  name_key_ = fnv1a(name_);
  key_ = fnv1a(members_.data(), members_.size() * sizeof(int), name_key_);
  State& s = state();
  std::lock_guard lock(s.mu);
  s.entries.push_back(this);
}

Entry::~Entry() {
  State& s = state();
  std::lock_guard lock(s.mu);
  std::erase(s.entries, this);
}

void Entry::record(const Identity& id) {
  std::lock_guard lock(history_mu_);
  history_[static_cast<uint64_t>(id[0]) % kHistory] = id;
}

std::optional<Identity> Entry::identity(uint64_t seq) const {
  std::lock_guard lock(history_mu_);
  const Identity& id = history_[seq % kHistory];
  if (seq == 0 || id[0] != static_cast<int64_t>(seq)) return std::nullopt;
  return id;
}

std::optional<Identity> reference(const Entry& e, uint64_t seq) {
  const State& s = state();
  if (s.comm == MPI_COMM_NULL) return std::nullopt;
  std::vector<int> outside;
  for (int r = 0; r < static_cast<int>(s.nodes.size()); ++r)
    if (std::find(e.members().begin(), e.members().end(), r) == e.members().end()) outside.push_back(r);
  static Query q;  // sent without waiting: it must outlive the call
  q = {e.name_key(), seq, kIdentity, 0};
  const Poll p = ask(outside, q);
  std::vector<Identity> seen;
  for (size_t i = 0; i < outside.size(); ++i)
    if (p.answered[i] && p.answers[i].has_identity) seen.push_back(p.answers[i].identity);
  std::optional<Identity> best;
  size_t most = 0;
  for (const Identity& id : seen) {
    const size_t votes = static_cast<size_t>(std::count(seen.begin(), seen.end(), id));
    if (votes > most) most = votes, best = id;
  }
  return best;
}

Entry& world_entry() {
  static Entry* world = [] {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<int> all(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) all[r] = r;
    return new Entry("world", all);  // lives as long as the process
  }();
  return *world;
}

Waiting::Waiting(const Entry& e, Op op, uint64_t seq) {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.wait = {&e, seq, op, now_seconds()};
}

Waiting::~Waiting() {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.wait.entry = nullptr;
}

void hang(const Entry& e, Op op, uint64_t seq, double waited_s) {
  const State& s = state();
  if (s.comm == MPI_COMM_NULL)
    abort_job(cat("hang: ", op_name(op), " #", seq, " on ", e.description(), " did not complete within ", seconds(waited_s),
                  " s (with AMSP_COMM_PROGRESS=none no watchdog thread runs to name the rank that holds it up)"));
  static Query group_query, world_query;  // sent without waiting: they must outlive the call
  group_query.key = e.key();
  const Verdict v = judge(e, op, seq, ask(e.members(), group_query), waited_s);
  const std::string waited = cat("; ", ranks_phrase(v.waiters), " waited ", seconds(waited_s), " s");
  std::string line = cat("hang: ", join(v.culprits, "; "), waited);
  double defer_s = v.reporter == s.rank ? 0 : kAnswerSeconds + 2;
  // A culprit that waits in another collective is itself held up there; the
  // ranks of that group name the rank at the end of the chain once their own
  // timeout runs out and their question goes unanswered, given a moment.
  if (v.chained) defer_s += v.chain_left_s + 2 * kAnswerSeconds + 3.5;
  if (v.culprits.empty()) {
    // Every member reached the op: it waits on another group's op that it is
    // chained after, or on the network. The ranks of the world that are in no
    // collective, or do not answer, are what the waits lead to.
    const Entry& world = world_entry();
    world_query.key = world.key();
    const std::vector<std::string> idle = idle_ranks(world, ask(world.members(), world_query));
    line = idle.empty()
               ? cat("hang: every rank of ", e.description(), " reached ", op_name(op), " #", seq,
                     " and it did not complete (the network or MPI failed)", waited)
               : cat("hang: every rank of ", e.description(), " reached ", op_name(op), " #", seq,
                     ", which waits on another group; of all ranks, ", join(idle, "; "), waited);
    // The culprit's own group, if it waits too, names it more precisely.
    defer_s += 1.5;
  }
  // One line per job: the lowest rank that reached the op reports; the others
  // report too if the job is still alive a moment later (that rank may have
  // gone on to wait elsewhere, with a later timeout).
  std::this_thread::sleep_for(std::chrono::duration<double>(defer_s));
  abort_job(line);
}

}  // namespace amsp::comm::watchdog
