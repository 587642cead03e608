// Sharded checkpoints: one HDF5 file per checkpoint, written collectively (see
// Transfer), every element by the one rank that owns it in its OS-shard;
// read back by any plan on any world size. doc/checkpoints.md describes the
// file (Hugging Face tensor names and shapes, attributes, checksums), the
// atomic save and the resume.
//
// File layout (format version 2):
//   /                                  attributes: Metadata, format, checksum_algorithm,
//                                      manifest + manifest_checksum (ckpt/manifest.h)
//   /model/<name>                      parameters; <name> is the Hugging Face
//                                      state-dict key without a leading "model."
//   /optimizer/exp_avg/<name>          Adam first moment
//   /optimizer/exp_avg_sq/<name>       Adam second moment
// Every dataset is float32 with the tensor's true shape and carries the
// attribute "checksum" (uint64, ckpt/checksum.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "plan/shards.h"
#include "model/config.h"
#include "model/layout.h"

namespace amsp::ckpt {

// Version 2 added the manifest; version 1 files still load (their metadata is
// not covered by a checksum).
inline constexpr int64_t kFormatVersion = 2;
inline constexpr const char* kFormat = "amsp-checkpoint";

// Attributes of the root group.
struct Metadata {
  int64_t format_version = kFormatVersion;
  int64_t step = 0;           // optimizer steps completed
  int64_t tokens = 0;         // tokens consumed
  uint64_t seed = 0;          // the run's seed: the sampler is counter-based, so
                              // (seed, step) is its whole position and RNG state
  std::string model_json;     // model::config_to_json
  std::string options_json;   // the training options
  std::string plan;           // plan::to_string of the plan written from
  std::string topology;       // topology::Topology::describe()
  int64_t world_size = 0;
  // With a data mixture: tokens drawn from each source so far, in the order of
  // the options' "mixture" list (empty for one dataset). In the sampler's JSON.
  std::vector<int64_t> source_tokens;
};

// Where one unit's model states live in a rank's memory, as fp32 in the padded
// unit's coordinates: params holds the P range (a save reads only its OS
// part), exp_avg and exp_avg_sq the OS range. The engine hands these out.
struct StateView {
  float* params;
  float* exp_avg;
  float* exp_avg_sq;
};

// "step-00000042.h5"
std::string file_name(int64_t step);

// How each writer's piece of a dataset reaches the file. A writer's piece of a
// tensor is one contiguous run, so there is nothing for MPI-IO's two-phase
// collective buffering to merge, and a collective H5Dwrite costs every rank a
// synchronisation per dataset: with more ranks than cores (or a slow rank) that
// dominates (doc/checkpoints.md, "Throughput"). Independent, the default: rank
// 0 lays the file out with serial HDF5 and each writer pwrites its pieces at
// the datasets' offsets, no MPI-IO at all. Collective: parallel HDF5 over
// MPI-IO, which lets ROMIO align writes to a parallel file system's stripes.
enum class Transfer { kIndependent, kCollective };
// "independent" / "collective"; UsageError naming `option` otherwise.
Transfer parse_transfer(const std::string& text, const std::string& option);

// Collective over comm. Writes DIR/step-<8 digits>.h5 through a temporary
// DIR/.step-<8 digits>.h5.tmp: every writer (replica 0: writer = true) writes
// its OS range of every tensor's parameters and moments (the others take part
// with empty selections in a collective transfer); once all ranks are done
// with the file (each writer's data fsynced), rank 0 fsyncs it,
// renames it into place, fsyncs DIR, points DIR/latest at it (latest.tmp +
// rename) and prunes to the newest keep_last checkpoints (0 keeps all).
// Leftover temporaries of a crashed save are removed first. `meta` is taken
// from rank 0. A failure inside the collective write ends the job
// (comm::abort_job); a directory that cannot be created throws UsageError on
// every rank. Returns the final path.
//
// `rendezvous`, when set, is called on every rank before each collective
// phase (the metadata, the checksums' reduction, the file's creation, each
// dataset's, the flush and close, the agreements): a background writer makes
// it a barrier that sleeps while it waits (comm::quiet_barrier), so that the
// collectives after it find every rank there and MPI spins for no time on
// cores the training needs.
using Rendezvous = std::function<void()>;
std::string save(const std::string& dir, const Metadata& meta,
                 const std::vector<model::UnitSpec>& units,
                 const std::vector<plan::UnitShards>& shards,
                 const std::vector<StateView>& views, bool writer,
                 int keep_last, MPI_Comm comm, Transfer transfer = Transfer::kIndependent,
                 const Rendezvous& rendezvous = {});

// Collective over comm. Reads the metadata, refuses a checkpoint of another
// model (UsageError naming the first field that differs) or another layout
// (a missing dataset or a different shape, named), then fills each rank's P
// range of the parameters and OS range of the moments from the file (any plan
// and world size may have written it; the padded tail past a unit's numel is
// zeroed) and checks every dataset's checksum from the pieces the ranks read
// (Error naming the dataset on a mismatch; the views then hold garbage).
// Every rank returns or throws the same.
Metadata load(const std::string& path, const model::LlamaConfig& expected,
              const std::vector<model::UnitSpec>& units,
              const std::vector<plan::UnitShards>& shards,
              const std::vector<StateView>& views, MPI_Comm comm);

// Collective over comm. Rank 0 checks the file's structure in a child process
// (check_in_child), so that a damaged file cannot crash or hang the job; then
// every rank reads and checksums a slice of every dataset. "" if the file is a
// complete, intact checkpoint, else one line saying what is wrong (the same on
// every rank).
std::string verify(const std::string& path, MPI_Comm comm);

// Collective over comm: rank 0 runs check_in_child(path, structure only); on a
// problem every rank throws Error("checkpoint PATH: ...", exit 1). Call it
// before load() or read_metadata() of a file nobody has checked.
void require_sound(const std::string& path, MPI_Comm comm);

// Collective over comm. The newest checkpoint in dir (by step, among the
// step-*.h5 files, whatever `latest` says; temporaries are ignored) that
// verifies. Each newer one that does not is appended to `skipped` as
// "PATH: reason". nullopt if there is none (or dir does not exist). Same
// answer on every rank.
std::optional<std::string> find_latest(const std::string& dir, std::vector<std::string>* skipped,
                                       MPI_Comm comm);

// One process: the highest step of the step-*.h5 files in dir (-1 if none).
int64_t newest_step(const std::string& dir);

// One process (rank 0, holding the directory): removes what an interrupted save
// left in dir (.step-*.h5.tmp, latest.tmp) and returns their names. Safe only
// while no other job writes there (the directory lock).
std::vector<std::string> clean_temporaries(const std::string& dir);

// ----------------------------------------------------------- one process
// These parse the file in this process: give them only a file that passed
// check_in_child, or accept that a damaged file may crash or hang it.

// Reads the root attributes. Throws UsageError if the file is not an amsp
// checkpoint of a version this build reads, or its manifest is damaged or
// disagrees with them.
Metadata read_metadata(const std::string& path);

// read_metadata plus everything about the file but its data (format.h,
// check_structure): complete against its own model config, every dataset
// where the manifest says. UsageError naming the first problem.
Metadata check_structure(const std::string& path);

// The full parameters of the model, one tensor at a time, for `amsp export`:
// checks the file as load() does (manifest, model of its own config,
// structure), then for each tensor of `units` (model::build_layout of the
// checkpoint's config) in layout order reads the whole dataset (the element
// runs of ckpt/selection.h, as a resume on one rank reads them), checks it
// against the manifest's checksum and calls fn(tensor, elements). UsageError
// naming the dataset on a mismatch (a damaged file). Moments are not read.
void read_parameters(const std::string& path, const std::vector<model::UnitSpec>& units,
                     const std::function<void(const model::TensorSpec&, std::vector<float>&)>& fn);

// ----------------------------------------------------------- in a child process

// Runs `amsp ckpt verify --in-process [--structure-only] PATH` in a child
// process with a deadline (60 s, plus 20 s per GB when `data`; the
// environment variable AMSP_CKPT_CHECK_TIMEOUT overrides it) and returns ""
// if it passed, else one line: the child's own error, or that it crashed or
// did not answer, which only a damaged file (or a stuck file system) makes it
// do. The executable is this one, or AMSP_EXECUTABLE when set (test programs).
std::string check_in_child(const std::string& path, bool data);

struct DatasetInfo {
  std::string name;               // "model/layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  std::string dtype;              // "float32"
  int64_t bytes = 0;
  uint64_t stored_checksum = 0;
  uint64_t computed_checksum = 0; // 0 unless computed
};

// Every dataset under /model and /optimizer, in file order; with
// compute_checksums, each dataset is read and its checksum recomputed.
std::vector<DatasetInfo> inspect(const std::string& path, bool compute_checksums);

// Hugging Face state-dict key <-> dataset name inside /model.
std::string dataset_name(const std::string& hf_name);  // "model.norm.weight" -> "norm.weight"
std::string hf_name(const std::string& dataset_name);  // "lm_head.weight" stays

}  // namespace amsp::ckpt
