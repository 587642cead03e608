// Internal to src/ckpt: names, attributes and hyperslab I/O shared by the
// parallel writer/reader (checkpoint.cpp) and the one-process tools
// (inspect.cpp).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/manifest.h"
#include "core/h5.h"

namespace amsp::ckpt::detail {

// The three kinds of state stored per tensor, in file order.
enum class State { kParams, kExpAvg, kExpAvgSq };
inline constexpr State kAllStates[] = {State::kParams, State::kExpAvg, State::kExpAvgSq};

// Its group in the file: "model", "optimizer/exp_avg", "optimizer/exp_avg_sq".
const char* state_group(State state);

// "model/layers.0.mlp.up_proj.weight", "optimizer/exp_avg/lm_head.weight"
std::string dataset_path(State state, const std::string& hf);

// Attribute writers; false on failure. In a parallel file every rank calls
// them with the same values (attributes are metadata, written collectively).
bool write_string_attr(hid_t obj, const char* name, const std::string& value);
bool write_i64_attr(hid_t obj, const char* name, int64_t value);
bool write_u64_attr(hid_t obj, const char* name, uint64_t value);
bool read_u64_attr(hid_t obj, const char* name, uint64_t* out);

// All root attributes, the manifest (ckpt/manifest.h) and its checksum among
// them; false on failure.
bool write_metadata(hid_t file, const Metadata& meta, const std::string& manifest_json);

// Opens a checkpoint for reading, one process (no MPI-IO). Throws UsageError
// naming the path if it is missing, not HDF5, damaged, or not a checkpoint.
h5::Handle open_read(const std::string& path);
// Reads and checks the root attributes (UsageError naming what is missing).
// Version 2: the values come from the manifest, whose checksum must match and
// with which every loose attribute must agree. Version 1 (no manifest): the
// loose attributes as they are.
Metadata read_metadata(hid_t file, const std::string& path);

// The manifest of a version-2 file (checked as read_metadata does), or for a
// version-1 file one made from its loose attributes and its datasets' own
// checksum attributes.
Manifest read_manifest(hid_t file, const std::string& path);

// Everything about the file but its data: the datasets in the file are exactly
// the manifest's, which are exactly what its model config implies (names,
// shapes), each float32, contiguous, inside the file, with a checksum
// attribute equal to the manifest's. UsageError naming the first problem.
// Opening every object exercises HDF5's parsing of all metadata, so after this
// passes in a child process, reading the file in the job cannot crash or hang.
void check_structure(hid_t file, const std::string& path, const Manifest& manifest);

struct Entry {
  std::string name;             // path inside the file, no leading '/'
  std::vector<int64_t> shape;
  bool float32 = false;
  bool has_checksum = false;
  uint64_t checksum = 0;
  int64_t numel() const;
};
// Every dataset of the file in creation order (name order where creation
// order was not tracked). Throws Error naming the path on an HDF5 failure.
std::vector<Entry> list_datasets(hid_t file, const std::string& path);

// Selects the row-major elements [begin, end) of a dataset of `shape` (1-D or
// 2-D) in `space`: a union of at most three hyperslabs, or none if empty.
bool select_run(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end);
// A 1-D memory space of n elements (n = 0: one element, nothing selected).
h5::Handle memory_space(int64_t n);

// Reads elements [begin, end) of a float dataset into out (independent I/O).
bool read_run(hid_t dset, const std::vector<int64_t>& shape, int64_t begin, int64_t end, float* out);
// Checksum of elements [begin, end), read in blocks; false on a read failure.
bool checksum_run(hid_t dset, const std::vector<int64_t>& shape, int64_t begin, int64_t end,
                  uint64_t* sum);

std::string hex(uint64_t v);  // "0x0123456789abcdef"

}  // namespace amsp::ckpt::detail
