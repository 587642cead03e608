// Crashes on purpose at a named point, for tests of what survives a crash.
//
// A test that kills a run "after step 10" by watching its output races the
// run: on a fast machine the run may finish first, on a loaded one the kill
// lands elsewhere. Instead the test names the point in the environment and
// the process kills itself there, so the crash happens at the same place on
// every machine:
//
//   AMSP_FAULT=POINT@STEP        every rank that reaches POINT at STEP
//   AMSP_FAULT=POINT@STEP:RANK   only that rank (MPI_COMM_WORLD rank)
//   AMSP_FAULT=POINT@STEP,USR1   a signal other than KILL (USR1 or TERM)
//   AMSP_FAULT=POINT@STEP,FAIL   no signal: the call throws an I/O error there
//   AMSP_FAULT=POINT@STEP,SLEEP=S no signal: the process waits S seconds there, a
//                                 slow step at a known moment; a stop request that
//                                 arrives meanwhile ends the wait and is taken at
//                                 the next decision point
//   AMSP_FAULT=POINT@STEP,STOP    SIGSTOP: the process stops there, as a wedged node
//   AMSP_FAULT=POINT@STEP,SPIN    the calling thread loops forever there: a rank
//                                 spinning in compute, whose other threads still run
//   AMSP_FAULT=train.step@STEP:RANK,SLOW=F  from STEP on, the trainer makes each step
//                                 of RANK busy F times longer (slow_factor): a straggler
//   AMSP_FAULT=collective@STEP:RANK,SKIP=N   collective number N (0, 1, ...) that RANK
//                                 issues in step STEP is dropped: never issued
//   AMSP_FAULT=collective@STEP:RANK,SHORT=N  it is issued with one element fewer
//
// The process raises the signal on itself. SIGKILL: no handler, destructor or
// atexit runs, exactly as for `kill -9`. USR1 and TERM reach the stop handler
// as Slurm's would, at a known moment. FAIL makes point() throw amsp's Error
// ("injected I/O error at POINT (step STEP, AMSP_FAULT)"), as a failed write of a full
// disk would: what the caller does with a failed write is then what is tested
// (for a background checkpoint, the writer thread catches it and the job ends
// naming the file). Without :RANK every rank fails at the point, as they do
// when the shared file system is full. The points are listed in doc/checkpoints.md
// ("Crash points"); an unknown POINT is refused at the first check so that a
// typo cannot make a crash test pass by crashing nowhere.
#pragma once

#include <cstdint>

namespace amsp::fault {

// Throws UsageError if AMSP_FAULT is set but malformed; call it at start.
void check_environment();

// Dies here (or, with FAIL, throws Error; with SLEEP, SPIN or STOP waits,
// loops or stops as above) if AMSP_FAULT names this point, this step and this rank. `point` must be one of the names in kPoints
// (fault.cpp). rank < 0: not known yet.
void point(const char* name, int64_t step, int rank);

// What to do to collective number `index` of `step` on `rank` (the
// communicators ask for every op they issue).
enum class Collective { kNone, kSkip, kShort };
Collective collective(int64_t step, int64_t index, int rank);

// SLOW=F: F from the named step on for the named rank, else 0.
double slow_factor(int64_t step, int rank);

}  // namespace amsp::fault
