#include "comm/mismatch.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "comm/traffic.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/mpi_check.h"

namespace amsp::comm::mismatch {

bool enabled_from_env() {
  const char* v = std::getenv("AMSP_COMM_CHECK");
  if (!v || !*v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  fail_usage("AMSP_COMM_CHECK=", v, ": expected 1 (check every collective, the default) or 0");
}

Signature signature(const watchdog::Identity& id) {
  const uint64_t s = fnv1a(&id, sizeof id);
  return {s, ~s};
}

bool agreed(const Signature& reduced, const watchdog::Identity& mine) {
  return reduced == signature(mine);
}

std::string describe(const watchdog::Identity& id, int64_t step) {
  const Op op = static_cast<Op>(id[1]);
  return cat(op_name(op), " of ", id[2], " ", dtype_name(static_cast<DType>(id[3])),
             op == Op::kBroadcast ? cat(" from ", id[4]) : "",
             id[5] >= 0 ? cat(" (position ", id[5], " in step ", step, ")") : "");
}

void report(const watchdog::Entry& e, int group_rank, MPI_Comm comm, const watchdog::Identity& mine,
            int64_t step, const std::string& tail) {
  const int n = static_cast<int>(e.members().size());
  std::vector<watchdog::Identity> all(static_cast<size_t>(n));
  AMSP_MPI_CHECK(MPI_Allgather(mine.data(), 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, comm));
  // The identity most ranks of the group issued; in a tie (a group of two),
  // the one the other groups of this name issued as this op.
  int most = 0;
  watchdog::Identity common{};
  for (const watchdog::Identity& id : all) {
    const int votes = static_cast<int>(std::count(all.begin(), all.end(), id));
    if (votes > most) most = votes, common = id;
  }
  const char* whose = "";
  if (2 * most <= n) {
    common = watchdog::reference(e, static_cast<uint64_t>(mine[0])).value_or(watchdog::Identity{});
    whose = "the other groups of this name and ";
  }
  std::vector<int> agree;
  std::string odd;
  for (int r = 0; r < n; ++r) {
    const int world = e.members()[static_cast<size_t>(r)];
    if (all[r] == common) agree.push_back(world);
    else odd += cat(odd.empty() ? "" : "; ", watchdog::rank_name(world), " issued ", describe(all[r], step));
  }
  const std::string where = cat("op #", mine[0], " on ", e.description());
  const std::string line =
      agree.empty() ? cat("mismatch in ", where, " with no majority to tell the odd rank: ", odd, tail)
                    : cat("mismatch in ", where, ": ", odd, " where ", whose, watchdog::ranks_phrase(agree),
                          " issued ", describe(common, step), tail);
  // One line per job: the group's first rank reports, the others a moment later.
  if (group_rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  abort_job(line);
}

}  // namespace amsp::comm::mismatch
