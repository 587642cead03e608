// The watchdog: when a collective hangs, name the rank that never arrived.
//
// Every process keeps, for each communicator it is in, the number of
// collectives it has issued there (one atomic per communicator: no per-op
// logging on the hot path), and which collective a thread of it is waiting in.
// A responder thread answers questions about both on a private duplicate of
// MPI_COMM_WORLD that no collective ever uses, so the answer never depends on
// the communicator that is stuck.
//
// A rank whose wait for op #k on a group times out asks every other member:
//   no answer within kAnswerSeconds    stopped, dead, or its process is wedged
//   issued fewer than k ops there      never reached the op; it says what it is
//                                      waiting in instead, or that it computes
//   issued k or more                   waiting like us
// and ends the job with one line (doc/cluster.md, "When a job hangs"):
//   hang: rank 5 (n3, local 1) never reached all_gather #4127 on the P group of
//   ranks 4-7 (...); ranks 4, 6, 7 waited 60.0 s
// Of the ranks that reached the op, the lowest one reports and ends the job;
// the others give it a moment first, so the job prints the line once.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/traffic.h"

namespace amsp::comm::watchdog {

// How long a questioned rank has to answer.
constexpr double kAnswerSeconds = 3.0;

// Collective over MPI_COMM_WORLD: duplicates it, exchanges node names and local
// ranks, starts the responder. MpiSession calls start() after MPI_Init and
// stop() before MPI_Finalize.
void start();
void stop();

// The trainer's optimizer step (0: none), reported in answers.
void set_step(int64_t step);
int64_t step();
// The collective's position in the current step (0, 1, ... since set_step
// across every communicator of the process, in issue order; -1 while no step
// is set). Every rank issues the same collectives in the same order, so a
// rank that skipped one issues its next with another position than its peers:
// the mismatch check (comm/mismatch.h) compares it.
int64_t next_op_index();

// "rank 5 (n3, local 1)": a world rank, its node and its rank on the node.
std::string rank_name(int world_rank);
// "4-7", "0, 4, 8-9": world ranks, ascending ranges.
std::string rank_list(std::vector<int> ranks);
// "rank 3" or "ranks 4-7".
std::string ranks_phrase(const std::vector<int>& ranks);

// What a rank issued as one op, as the mismatch check compares it: sequence
// number, op, count, dtype, root (broadcast; else 0), position in the step.
using Identity = std::array<int64_t, 6>;

// A communicator as the watchdog sees it: registered for its life.
class Entry {
 public:
  static constexpr size_t kHistory = 32;  // ops whose identity is kept
  // `members`: the world rank of every group rank, in group order.
  Entry(const std::string& name, std::vector<int> members);
  ~Entry();
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  void set_issued(uint64_t seq) { issued_.store(seq, std::memory_order_relaxed); }
  uint64_t issued() const { return issued_.load(std::memory_order_relaxed); }
  uint64_t key() const { return key_; }
  uint64_t name_key() const { return name_key_; }  // the same for every group of this name
  // The last kHistory ops' identities, for telling a group of two which of its
  // ranks is odd (reference()).
  void record(const Identity& id);
  std::optional<Identity> identity(uint64_t seq) const;
  const std::vector<int>& members() const { return members_; }
  // "the P group of ranks 4-7"
  const std::string& description() const { return description_; }

 private:
  std::string name_, description_;
  std::vector<int> members_;
  uint64_t key_, name_key_;
  std::atomic<uint64_t> issued_{0};
  mutable std::mutex history_mu_;
  std::array<Identity, kHistory> history_{};
};

// The entry of the blocking world collectives of comm/timed.h.
Entry& world_entry();

// While alive, this thread waits for op `seq` of `e` (answers report it).
class Waiting {
 public:
  Waiting(const Entry& e, Op op, uint64_t seq);
  ~Waiting();
};

// What the other groups of e's name issued as their op `seq` (every group of a
// name runs the same schedule): the identity most ranks outside e answer,
// nullopt when none does within kAnswerSeconds.
std::optional<Identity> reference(const Entry& e, uint64_t seq);

// Asks the other members of e about op seq, which this rank has waited
// `waited_s` for, and ends the job with the verdict. Never returns.
[[noreturn]] void hang(const Entry& e, Op op, uint64_t seq, double waited_s);

}  // namespace amsp::comm::watchdog
