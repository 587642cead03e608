// The step's schedule: every collective one optimizer step of the sharding
// engine issues, with the buffers it reads and writes, what it is chained
// after and the local work around it, and the one order in which the engine
// issues them on every rank (doc/engine.md, "One step: the schedule").
//
// One description, three readers: the cost model prices its collectives
// (plan/cost.h: step_collectives), the memory model sizes the engine's
// reduction slots from the buffers its stages name (plan/memory.h), and the
// engine executes its program with a cursor (engine/sharded_engine.cpp). A new
// kind of stage is an edit here and, if it needs a new local operation, in the
// communicators that run it (comm/communicator.h, Local).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/traffic.h"
#include "core/dtype.h"
#include "kernels/common/quant.h"
#include "plan/memory.h"
#include "plan/mesh.h"

namespace amsp::plan {

enum class Phase {
  kForwardGather,    // every micro-batch: P all-gather before a unit's forward
  kBackwardGather,   // every micro-batch: P all-gather again before backward (not the head)
  kBackwardReduce,   // every micro-batch: P reduce-scatter, then G reduce-scatter
  kLastReduce,       // last micro-batch: OS reduce-scatter, replica all-reduce
  kGradNorm,         // once: all-reduce of the squared norm (fp64) over the world
  kOptimizerGather,  // once, after AdamW: gather-group all-gather of the OS-shards
};
const char* phase_name(Phase phase);

// A buffer a stage reads or writes. Slot buffers belong to one of the
// engine's `max_reductions` reduction slots and hold the wire dtype (the
// parameters' dtype); the G-shard is the fp32 accumulator.
enum class Buf {
  kNone,
  kFull,      // slot: the unit's full gradient as backward writes it
  kSlotP,     // slot: its P-shard part
  kSlotG,     // slot: its G-shard part
  kSlotOS,    // slot: its OS-shard part
  kGShard,    // the unit's G-shard (fp32)
  kGShardOS,  // the OS range of the G-shard (fp32)
  kPShard,    // the unit's P-shard parameters
  kPShardOS,  // the OS range of the P-shard
  kGathered,  // a gathered unit (one of prefetch + 1 buffers)
  kNorm,      // the squared norm's partial sum (one fp64)
  kQSend,     // a compressed stage's records to send (int32 words; doc/compression.md)
  kQRecv,     // a compressed stage's records received
};
const char* buf_name(Buf b);

// Elementwise work the communicator does on its own stream around a stage
// (comm/communicator.h, Local), over the stage's count: add sums dst + src in
// fp32 and stores in dst's dtype; copy converts src into dst's dtype. The
// quantizing kinds work on `records` chunks of the stage's `values` with its
// `quant` spec: quantize values into records, dequantize records into values,
// dequantize-sum records into one chunk of values (summed in record order).
struct LocalStep {
  enum Kind { kNone, kAdd, kCopy, kQuantize, kDequantize, kDequantizeSum } kind = kNone;
  Buf src = Buf::kNone, dst = Buf::kNone;
  int64_t records = 1;
};

enum class Runs { kEveryMicroBatch, kLastMicroBatch, kOnce };

struct Stage {
  Phase phase = Phase::kForwardGather;
  int unit = -1;  // -1: the gradient norm
  comm::Op op = comm::Op::kAllGather;
  GroupKind group = GroupKind::kP;  // the norm's group is the world (reported as such)
  int64_t count = 0;  // per rank for all-gather / reduce-scatter, the buffer for all-reduce
  DType dtype = DType::kF32;
  Buf send = Buf::kNone, recv = Buf::kNone;  // all-reduce works in place on recv
  Runs runs = Runs::kEveryMicroBatch;
  // Starts once the unit's previous stage (and its local work) has completed,
  // ordered by the communicators, not by the engine's thread.
  bool chained = false;
  LocalStep before, after;  // local work just before it starts and once it completed
  LocalStep and_then;       // more local work after `after` (a compressed reduction's add)
  // A compressed stage (doc/compression.md) moves records of int32 words:
  // `count` is then the words per rank, `values` the values they hold.
  bool compressed = false;
  kernels::quant::Spec quant;
  int64_t values = 0;
  // A bucket (bucket_reductions in schedule.cpp): issued once backward part
  // `part` of the unit has returned (model/layout.h: backward_parts), over
  // elements [offset, offset + count) of its buffers. Otherwise the whole
  // buffers, after the unit's whole backward.
  bool bucket = false;
  int part = 0;
  int64_t offset = 0;
};

// Elements of each buffer of a reduction slot, sized for the largest unit (0:
// no stage uses it).
struct SlotElems {
  int64_t full = 0, p = 0, g = 0, os = 0;
  int64_t total() const { return full + p + g + os; }
  // Compressed reductions' records sent and received, in int32 words (0: none).
  int64_t qsend = 0, qrecv = 0;
};

struct StepSchedule {
  int units = 0;
  int prefetch = kDefaultPrefetch;
  DType wire = DType::kF32;             // parameters and gradients on the wire
  bool direct_gradients = false;        // backward adds into the G-shard (s_p = s_g = 1)
  std::vector<int64_t> padded;          // Φu per unit
  // Per unit: the backward parts its last micro-batch runs in, each followed
  // by the reduction of what it finalised (1: the whole backward, then the
  // chain).
  std::vector<int> parts;
  std::vector<Stage> gather;            // per unit: the P all-gather (empty when s_p = 1)
  std::vector<std::vector<Stage>> reduction;  // per unit, in chain order
  std::vector<Stage> norm;              // the world's all-reduce (empty on one rank)
  std::vector<Stage> optimizer_gather;  // per unit (empty when s_os = s_p)
  SlotElems slot;
  // Per gather buffer, for compressed P all-gathers: words of the records sent
  // and received, sized for the largest unit (0: uncompressed).
  int64_t gather_qsend = 0, gather_qrecv = 0;
  bool reduces(int unit, bool last_micro) const;  // any stage runs on this micro-batch
};

// The schedule of plan `plan` on `shape` for workload `w`.
StepSchedule step_schedule(const Workload& w, const ShardPlan& plan, const MeshShape& shape);

// The engine's program for one step of `micro_batches`: compute and issue
// points in the order the engine runs them. Every collective of the step is
// issued in this order on every rank, whatever completes first.
struct Action {
  enum Kind {
    kGather,    // issue the P all-gather of gather position `pos` (its unit: `unit`)
    kForward,   // forward of `unit` with the parameters of position `pos`
    kBackward,  // backward of `unit` (its `part`) with the parameters of position `pos`
    kReduce,    // issue `unit`'s reduction chain (its `part`'s stages) for micro-batch `micro`
    kNorm,      // every reduction done; the gradient norm (its all-reduce on > 1 rank)
    kUpdate,    // AdamW on `unit`'s OS-shard, then issue its optimizer gather
  } kind = kForward;
  int unit = -1;
  int64_t micro = 0;
  int64_t pos = 0;
  int part = kWhole;  // kBackward, kReduce: a part of a unit split in parts, or the whole
  static constexpr int kWhole = -1;
};
std::vector<Action> step_program(const StepSchedule& s, int64_t micro_batches);
// Forward only over `batches` micro-batches (evaluation): gathers and forwards.
std::vector<Action> eval_program(const StepSchedule& s, int64_t batches);

// One issued collective, as a communicator sees it.
struct Issue {
  std::string group;  // "P", "G", "OS", "replica", "gather", "world"
  comm::Op op = comm::Op::kAllGather;
  int64_t count = 0;
  bool operator==(const Issue&) const = default;
};
// Every collective the program issues, in its order (steps after the first
// also wait for the previous step's optimizer gathers; they issue the same).
std::vector<Issue> issue_sequence(const StepSchedule& s, int64_t micro_batches);
std::string format_issue(const Issue& i);  // "P all_gather 1024"

// The stages of one unit's chain that run on this micro-batch (and are
// issued after backward part `part`, unless it is Action::kWhole).
std::vector<const Stage*> stages_for(const StepSchedule& s, int unit, bool last_micro,
                                     int part = Action::kWhole);

// The schedule as text for `amsp plan --schedule`: one line per stage, per
// unit in backward order, then the program's issue order for a step of `micro_batches`.
std::string format_schedule(const StepSchedule& s, int64_t micro_batches);

}  // namespace amsp::plan
