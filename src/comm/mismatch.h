// The mismatch check: the ranks of a group compare what each issued as an op
// (comm/watchdog.h, Identity: sequence number, op, count, dtype, root,
// position in the step) with one all-reduce of a 64-bit signature and its
// complement under MAX; both come back unchanged on every rank exactly when
// every rank issued the same. A skipped op, or a different count, is then named
// instead of being silently reduced, left to MPI's undefined behaviour, or left
// to hang NCCL. The MPI backend checks before the op moves any data; the NCCL
// backend beside it, off the device's path (doc/cluster.md, "When a job hangs").
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>

#include "comm/watchdog.h"

namespace amsp::comm::mismatch {

// AMSP_COMM_CHECK: on unless it is 0. Throws UsageError on any other value than 0 or 1.
bool enabled_from_env();

// What a rank contributes to the check's MAX all-reduce (2 x MPI_UINT64_T).
using Signature = std::array<uint64_t, 2>;
Signature signature(const watchdog::Identity& id);
// Did every rank issue `mine`? `reduced`: the all-reduce's result.
bool agreed(const Signature& reduced, const watchdog::Identity& mine);

// "all_gather of 4096 bf16 (position 36 in step 9)": an op issued in `step`.
std::string describe(const watchdog::Identity& id, int64_t step);

// Every rank of the group calls this once its check failed: gathers over
// `comm` (the group's ranks in group order, no other collective pending on it)
// what each issued, and ends the job with one line naming the ranks that
// differ from the majority (in a group of two, from what the other groups of
// this name issued). `step`: the step the op was issued in. `tail` ends the
// line: what became of the op. The group's first rank reports; the others end
// the job a moment later if it did not.
[[noreturn]] void report(const watchdog::Entry& e, int group_rank, MPI_Comm comm,
                         const watchdog::Identity& mine, int64_t step, const std::string& tail);

}  // namespace amsp::comm::mismatch
