// Parallel save and load of sharded checkpoints (checkpoint.h).
//
// Writing: per dataset each writer's OS range goes into the file by a pwrite
// of its own at the dataset's offset, rank 0 having laid the file out by serial
// HDF5 (independent transfer, the default: RawData below), or, by parallel HDF5
// over MPI-IO with collective metadata, by one collective H5Dwrite in which
// every rank takes part, the others with an empty selection
// (Transfer::kCollective). Reading is independent: the file
// is immutable once renamed into place, so each rank opens it on its own and
// reads just its hyperslabs; no rank can then hang in a collective another
// rank left because the file was damaged. Ranks agree on every outcome
// (comm/agree.h) before anything else happens.

#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "ckpt/checksum.h"
#include "ckpt/format.h"
#include "ckpt/manifest.h"
#include "ckpt/selection.h"
#include "comm/agree.h"
#include "core/mpi_check.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/h5.h"

namespace amsp::ckpt {
namespace fs = std::filesystem;
using h5::Handle;
using detail::dataset_path;
using detail::State;

namespace {

// ------------------------------------------------------------ agreement

using comm::attempt;
using comm::bcast_string;
using Status = comm::Outcome;

// Every rank ends a phase alike: the lowest failing rank's error, or success.
void agree_or_throw(const Status& mine, MPI_Comm c) { comm::rethrow(comm::agree(mine, c)); }

// Before each collective phase of a save (save's `rendezvous`).
void meet(const Rendezvous& r) {
  if (r) r();
}

// ------------------------------------------------------------ files

std::string meta_to_json(const Metadata& m) {
  nlohmann::json j{{"format_version", m.format_version}, {"step", m.step}, {"tokens", m.tokens},
                   {"seed", m.seed}, {"model_json", m.model_json}, {"options_json", m.options_json},
                   {"plan", m.plan}, {"topology", m.topology}, {"world_size", m.world_size},
                   {"source_tokens", m.source_tokens}};
  return j.dump();
}

Metadata meta_from_json(const std::string& s) {
  const auto j = nlohmann::json::parse(s);
  Metadata m;
  m.format_version = j["format_version"];
  m.step = j["step"];
  m.tokens = j["tokens"];
  m.seed = j["seed"];
  m.model_json = j["model_json"];
  m.options_json = j["options_json"];
  m.plan = j["plan"];
  m.topology = j["topology"];
  m.world_size = j["world_size"];
  m.source_tokens = j["source_tokens"].get<std::vector<int64_t>>();
  return m;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail("checkpoint: cannot open ", path, " to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && !directory) fail("checkpoint: fsync of ", path, " failed (disk full or I/O error?)");
}

// Step of "step-00000042.h5", or -1.
int64_t step_of(const std::string& name) {
  static const std::regex re("step-([0-9]+)\\.h5");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return -1;
  return std::stoll(m[1].str());
}

// Complete checkpoints in dir, newest (highest step) first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = step_of(name);
    if (step >= 0 && e.is_regular_file(ec)) out.emplace_back(step, name);
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

void write_latest(const std::string& dir, const std::string& name, int64_t step) {
  const std::string tmp = dir + "/latest.tmp", final_path = dir + "/latest";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    out.flush();
    if (!out) fail("checkpoint: cannot write ", tmp);
  }
  fsync_path(tmp, false);
  fault::point("save.latest_tmp", step, 0);
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  if (ec) fail("checkpoint: cannot rename ", tmp, " to ", final_path, ": ", ec.message());
}


// Removes all but `keep` checkpoints: the one just written and the newest others.
void prune(const std::string& dir, const std::string& written, int keep) {
  if (keep <= 0) return;
  int kept = 1;
  for (const auto& [step, name] : list_checkpoints(dir)) {
    if (name == written) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(dir + "/" + name, ec);
    if (ec) std::fprintf(stderr, "amsp: warning: checkpoint: cannot remove %s/%s: %s\n", dir.c_str(),
                         name.c_str(), ec.message().c_str());
  }
}

// ------------------------------------------------------------ writing

struct Writer {
  std::string path;
  void check(bool ok, const std::string& what) const {
    if (!ok) comm::abort_job(cat("checkpoint ", path, ": HDF5 could not ", what,
                                 " (disk full or not writable?)"));
  }
};

Handle make_group(const Writer& w, hid_t parent, const char* name) {
  Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  w.check(gcpl.valid() && H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED) >= 0,
          "make a group property list");
  Handle g(H5Gcreate2(parent, name, H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
  w.check(g.valid(), cat("create group /", name));
  return g;
}

// Where a writer's piece of tensor t comes from in its state views.
struct Source {
  std::optional<Piece> piece;
  const float* data = nullptr;
};

Source source_of(State state, const model::TensorSpec& t, const plan::UnitShards& sh,
                 const StateView& v, bool writer) {
  Source s;
  if (!writer) return s;
  s.piece = intersect(t, sh.os.begin, sh.os.end());
  if (!s.piece) return s;
  switch (state) {
    case State::kParams: s.data = v.params + (sh.os.begin - sh.p.begin) + s.piece->buffer_offset; break;
    case State::kExpAvg: s.data = v.exp_avg + s.piece->buffer_offset; break;
    case State::kExpAvgSq: s.data = v.exp_avg_sq + s.piece->buffer_offset; break;
  }
  return s;
}

void check_shapes(const std::vector<model::UnitSpec>& units) {
  for (const auto& u : units)
    for (const auto& t : u.tensors)
      if (t.shape.empty() || t.shape.size() > 2)
        fail("checkpoint: tensor ", t.name, " has ", t.shape.size(), " dimensions; expected 1 or 2");
}

// What one rank contributes to a save.
struct SaveJob {
  const std::vector<model::UnitSpec>& units;
  const std::vector<plan::UnitShards>& shards;
  const std::vector<StateView>& views;
  bool writer;
  Source source(State state, size_t u, const model::TensorSpec& t) const {
    return source_of(state, t, shards[u], views[u], writer);
  }
};

// Rank 0's metadata, on every rank.
Metadata agreed_metadata(const Metadata& meta_in, MPI_Comm comm) {
  std::string meta_json = meta_to_json(meta_in);
  bcast_string(&meta_json, 0, comm);
  return meta_from_json(meta_json);
}

// Rank 0 prepares the directory and clears temporaries of crashed saves.
void prepare_directory(const std::string& dir, int rank, MPI_Comm comm, const Rendezvous& r) {
  const Status mine = rank != 0 ? Status{} : attempt([&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir, ec))
      fail_usage("--checkpoint-dir ", dir, ": cannot create the directory");
    (void)clean_temporaries(dir);
  });
  meet(r);
  agree_or_throw(mine, comm);
}

// Checksums first: every writer sums its pieces, one reduction for all. In
// dataset order: state, unit, tensor.
std::vector<uint64_t> dataset_checksums(const SaveJob& job, MPI_Comm comm, const Rendezvous& r) {
  std::vector<uint64_t> sums;
  for (State state : detail::kAllStates)
    for (size_t u = 0; u < job.units.size(); ++u)
      for (const auto& t : job.units[u].tensors) {
        const Source s = job.source(state, u, t);
        sums.push_back(s.piece ? checksum(s.data, s.piece->size(), s.piece->begin) : 0);
      }
  meet(r);
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()),
                               MPI_UINT64_T, MPI_SUM, comm));
  return sums;
}

std::string manifest_json_for(const Metadata& meta, const std::vector<model::UnitSpec>& units,
                              const std::vector<uint64_t>& sums) {
  Manifest manifest;
  manifest.meta = meta;
  for (State state : detail::kAllStates)
    for (const auto& u : units)
      for (const auto& t : u.tensors)
        manifest.datasets.push_back({dataset_path(state, t.name), t.shape, sums[manifest.datasets.size()]});
  return manifest_to_json(manifest);
}

// The raw data of an independent transfer, written by this process itself:
// each dataset is contiguous and allocated when rank 0 creates it
// (H5D_ALLOC_TIME_EARLY), so its elements lie from its offset in the file on,
// and a rank's piece of a tensor is one run of them: one pwrite on a
// descriptor of its own, fsynced by the rank before the ranks agree that the
// file is written. Not MPI-IO: ROMIO runs its opens, writes, syncs and closes
// inside MPICH's critical section, collective ones waiting there for the
// other ranks, so a background writer whose file went through it held MPI's
// lock while the disk worked and the training's communication waited for it
// (doc/checkpoints.md, "Background saves").
class RawData {
 public:
  RawData(const Writer& w, const std::string& path, bool any) : w_(w), path_(path) {
    if (!any) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    w.check(fd_ >= 0, cat("open ", path, " for its raw data: ", std::strerror(errno)));
  }
  ~RawData() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawData(const RawData&) = delete;
  RawData& operator=(const RawData&) = delete;

  // count floats at byte `offset` of the file.
  void write(const float* data, int64_t count, int64_t offset, const std::string& dpath) {
    const char* p = reinterpret_cast<const char*>(data);
    for (int64_t left = count * int64_t{sizeof(float)}; left > 0;) {
      const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(left), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      w_.check(n > 0, cat("write dataset ", dpath, ": ", n < 0 ? std::strerror(errno) : "no progress"));
      p += n;
      offset += n;
      left -= n;
    }
  }
  void sync() {
    if (fd_ >= 0) w_.check(::fsync(fd_) == 0, cat("sync the raw data of ", path_, ": ", std::strerror(errno)));
  }

 private:
  const Writer& w_;
  std::string path_;
  int fd_ = -1;
};

// The file holds float32 little-endian: the raw bytes are the host's.
static_assert(std::endian::native == std::endian::little, "raw checkpoint writes need a little-endian host");

Handle dataset_layout(const Writer& w) {
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  w.check(dcpl.valid() && H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
              H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0 &&
              H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0,
          "make a dataset property list");
  return dcpl;
}

// fn(state, unit, tensor, index) for every dataset in file order: state,
// unit, tensor; index counts them.
template <typename F>
void for_each_tensor(const SaveJob& job, F&& fn) {
  size_t index = 0;
  for (State state : detail::kAllStates)
    for (size_t u = 0; u < job.units.size(); ++u)
      for (const auto& t : job.units[u].tensors) fn(state, u, t, index++);
}

// The groups /model and /optimizer/{exp_avg,exp_avg_sq}, then fn(parent,
// state, unit, tensor, index) for every dataset, as for_each_tensor.
template <typename F>
void for_each_dataset(const Writer& w, hid_t file, const SaveJob& job, F&& fn) {
  Handle gm = make_group(w, file, "model");
  Handle go = make_group(w, file, "optimizer");
  Handle ga = make_group(w, go, "exp_avg");
  Handle gs = make_group(w, go, "exp_avg_sq");
  for_each_tensor(job, [&](State state, size_t u, const model::TensorSpec& t, size_t i) {
    fn(state == State::kParams ? gm.get() : state == State::kExpAvg ? ga.get() : gs.get(), state, u, t, i);
  });
}

// One tensor's dataset with its checksum attribute; its data not written.
struct Dataset {
  Handle dset, fspace;
};
Dataset create_dataset(const Writer& w, hid_t parent, State state, const model::TensorSpec& t, uint64_t sum,
                       hid_t dcpl) {
  const std::string dpath = dataset_path(state, t.name);
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  Dataset d;
  d.fspace = Handle(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  w.check(d.fspace.valid(), cat("make the dataspace of ", dpath));
  d.dset = Handle(H5Dcreate2(parent, dataset_name(t.name).c_str(), H5T_IEEE_F32LE, d.fspace, H5P_DEFAULT, dcpl,
                             H5P_DEFAULT),
                  H5Dclose);
  w.check(d.dset.valid(), cat("create dataset ", dpath));
  w.check(detail::write_u64_attr(d.dset, "checksum", sum), cat("write the checksum of ", dpath));
  return d;
}

// --- independent transfer: rank 0 lays the file out, every writer writes its data

// Rank 0 alone, by serial HDF5: the whole file but the data (root attributes,
// groups, datasets with their checksums), each dataset's space allocated and
// left unwritten. Returns each dataset's byte offset in the file, in file order.
std::vector<int64_t> lay_out_file(const Writer& w, const std::string& tmp_path, const Metadata& meta,
                                  const std::string& manifest_json, const SaveJob& job,
                                  const std::vector<uint64_t>& sums) {
  h5::QuietErrors quiet;
  Handle fapl = h5::file_access();
  Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
  w.check(file.valid(), cat("create ", tmp_path));
  w.check(detail::write_metadata(file, meta, manifest_json), "write the root attributes");
  const Handle dcpl = dataset_layout(w);
  std::vector<int64_t> offsets;
  for_each_dataset(w, file, job, [&](hid_t parent, State state, size_t, const model::TensorSpec& t, size_t i) {
    Dataset d = create_dataset(w, parent, state, t, sums[i], dcpl);
    const haddr_t at = H5Dget_offset(d.dset);
    w.check(at != HADDR_UNDEF, cat("allocate the data of ", dataset_path(state, t.name)));
    offsets.push_back(static_cast<int64_t>(at));
  });
  w.check(file.close(), cat("close ", tmp_path));
  return offsets;
}

// Every writer: its piece of every dataset at the dataset's offset, then fsync.
void write_raw_data(const Writer& w, const std::string& tmp_path, const SaveJob& job,
                    const std::vector<int64_t>& offsets) {
  RawData raw(w, tmp_path, job.writer);
  for_each_tensor(job, [&](State state, size_t u, const model::TensorSpec& t, size_t i) {
    const Source s = job.source(state, u, t);
    if (s.piece && s.piece->size() > 0)
      raw.write(s.data, s.piece->size(), offsets[i] + s.piece->begin * int64_t{sizeof(float)},
                dataset_path(state, t.name));
  });
  raw.sync();
}

// The file's structure by rank 0, the offsets to all, the data by every
// writer. MPI-IO is not involved: nothing of the save holds MPI's lock for
// longer than a reduction (RawData says why that matters). Every rank has
// written and synced its data on return.
void write_file_independent(const std::string& tmp_path, const std::string& final_path, const Metadata& meta,
                            const std::string& manifest_json, const SaveJob& job,
                            const std::vector<uint64_t>& sums, int rank, MPI_Comm comm, const Rendezvous& r) {
  const Writer w{final_path};
  std::vector<int64_t> offsets;
  const Status laid =
      rank != 0 ? Status{} : attempt([&] { offsets = lay_out_file(w, tmp_path, meta, manifest_json, job, sums); });
  meet(r);
  agree_or_throw(laid, comm);
  offsets.resize(sums.size());
  AMSP_MPI_CHECK(MPI_Bcast(offsets.data(), static_cast<int>(offsets.size()), MPI_INT64_T, 0, comm));
  const Status wrote = attempt([&] {
    write_raw_data(w, tmp_path, job, offsets);
    fault::point("save.data", meta.step, rank);
  });
  meet(r);
  agree_or_throw(wrote, comm);
}

// --- collective transfer: MPI-IO, every rank in every dataset's write

// The file, created over MPI-IO with collective metadata.
Handle create_file(const Writer& w, const std::string& tmp_path, MPI_Comm comm) {
  Handle fapl = h5::file_access();
  w.check(fapl.valid() && H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) >= 0 &&
              H5Pset_all_coll_metadata_ops(fapl, true) >= 0 &&
              H5Pset_coll_metadata_write(fapl, true) >= 0,
          "set up MPI-IO file access");
  Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
  w.check(file.valid(), cat("create ", tmp_path));
  return file;
}

// Every rank creates each dataset and takes part in its collective H5Dwrite,
// a rank without a piece with an empty selection: ROMIO's two-phase I/O
// aligns the writes to a parallel file system's stripes.
void write_file_collective(const std::string& tmp_path, const std::string& final_path, const Metadata& meta,
                           const std::string& manifest_json, const SaveJob& job,
                           const std::vector<uint64_t>& sums, int rank, MPI_Comm comm, const Rendezvous& r) {
  const Writer w{final_path};
  h5::QuietErrors quiet;
  meet(r);
  Handle file = create_file(w, tmp_path, comm);
  w.check(detail::write_metadata(file, meta, manifest_json), "write the root attributes");
  Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  w.check(dxpl.valid() && H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0, "set up the transfer property list");
  const Handle dcpl = dataset_layout(w);
  for_each_dataset(w, file, job, [&](hid_t parent, State state, size_t u, const model::TensorSpec& t, size_t i) {
    meet(r);  // creating the dataset is collective
    Dataset d = create_dataset(w, parent, state, t, sums[i], dcpl);
    const Source s = job.source(state, u, t);
    const int64_t n = s.piece ? s.piece->size() : 0;
    Handle mspace = detail::memory_space(n);
    const std::string dpath = dataset_path(state, t.name);
    w.check(mspace.valid() && detail::select_run(d.fspace, t.shape, s.piece ? s.piece->begin : 0,
                                                 s.piece ? s.piece->end : 0),
            cat("select this rank's part of ", dpath));
    const float dummy = 0;
    w.check(H5Dwrite(d.dset, H5T_NATIVE_FLOAT, mspace, d.fspace, dxpl, n ? s.data : &dummy) >= 0,
            cat("write dataset ", dpath));
    w.check(d.dset.close(), cat("close dataset ", dpath));
  });
  const Status wrote = attempt([&] { fault::point("save.data", meta.step, rank); });
  meet(r);
  agree_or_throw(wrote, comm);
  w.check(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, "flush the file");
  w.check(file.close(), "close the file");
}

// Writes the temporary file; every rank has closed it on return.
void write_file(const std::string& tmp_path, const std::string& final_path, const Metadata& meta,
                const std::string& manifest_json, const SaveJob& job,
                const std::vector<uint64_t>& sums, Transfer transfer, int rank, MPI_Comm comm,
                const Rendezvous& r) {
  if (transfer == Transfer::kIndependent)
    write_file_independent(tmp_path, final_path, meta, manifest_json, job, sums, rank, comm, r);
  else
    write_file_collective(tmp_path, final_path, meta, manifest_json, job, sums, rank, comm, r);
  meet(r);
  AMSP_MPI_CHECK(MPI_Barrier(comm));
  fault::point("save.closed", meta.step, rank);
}

// Every rank has closed the file: rank 0 makes it durable and visible, points
// `latest` at it and prunes older checkpoints.
void publish(const std::string& dir, const std::string& name, const std::string& tmp_path,
             const std::string& final_path, int64_t step, int keep_last, int rank, MPI_Comm comm,
             const Rendezvous& r) {
  const Status mine = rank != 0 ? Status{} : attempt([&] {
    fsync_path(tmp_path, false);
    std::error_code ec;
    fs::rename(tmp_path, final_path, ec);
    if (ec) fail("checkpoint: cannot rename ", tmp_path, " to ", final_path, ": ", ec.message());
    fsync_path(dir, true);
    fault::point("save.renamed", step, 0);
    write_latest(dir, name, step);
    fsync_path(dir, true);
    fault::point("save.latest", step, 0);
    prune(dir, name, keep_last);
  });
  meet(r);
  agree_or_throw(mine, comm);
}

}  // namespace

std::string save(const std::string& dir, const Metadata& meta_in,
                 const std::vector<model::UnitSpec>& units,
                 const std::vector<plan::UnitShards>& shards,
                 const std::vector<StateView>& views, bool writer,
                 int keep_last, MPI_Comm comm, Transfer transfer, const Rendezvous& rendezvous) {
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  check_shapes(units);
  meet(rendezvous);
  const Metadata meta = agreed_metadata(meta_in, comm);
  const std::string name = file_name(meta.step);
  const std::string final_path = dir + "/" + name, tmp_path = dir + "/." + name + ".tmp";
  fault::point("save.begin", meta.step, rank);
  prepare_directory(dir, rank, comm, rendezvous);
  const SaveJob job{units, shards, views, writer};
  const std::vector<uint64_t> sums = dataset_checksums(job, comm, rendezvous);
  const std::string manifest_json = manifest_json_for(meta, units, sums);
  write_file(tmp_path, final_path, meta, manifest_json, job, sums, transfer, rank, comm, rendezvous);
  publish(dir, name, tmp_path, final_path, meta.step, keep_last, rank, comm, rendezvous);
  return final_path;
}

// ------------------------------------------------------------ reading

namespace {

// "checkpoint PATH: model field hidden_size is 128 in the checkpoint but 256 here"
void check_model(const std::string& path, const std::string& stored_json,
                 const model::LlamaConfig& expected) {
  nlohmann::json stored, here = nlohmann::json::parse(model::config_to_json(expected));
  try {
    stored = nlohmann::json::parse(stored_json);
  } catch (const std::exception&) {
    fail_usage("checkpoint ", path, ": the model_config attribute is not JSON");
  }
  // The fields that decide the tensors' shapes and the heads; the others
  // (rope_theta, rms_norm_eps, max_position_embeddings) are the resume's to judge.
  for (const char* f : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "vocab_size"}) {
    if (!here.contains(f)) continue;
    if (!stored.contains(f))
      fail_usage("checkpoint ", path, ": model field ", f, " is missing in the checkpoint (", here[f].dump(),
                 " here)");
    const auto& a = stored[f];
    const auto& b = here[f];
    const bool same = (a.is_number() && b.is_number()) ? a.get<double>() == b.get<double>() : a == b;
    if (!same)
      fail_usage("checkpoint ", path, ": model field ", f, " is ", a.dump(), " in the checkpoint but ",
                 b.dump(), " here");
  }
}

// For each unit, whether this rank sums the checksum of its P range ([0]) and
// of its OS range ([1]): only if no lower rank holds the same range. Ranges of
// one plan are equal or disjoint, so each element counts once.
std::vector<std::array<bool, 2>> ranges_to_count(const std::vector<plan::UnitShards>& shards,
                                                 MPI_Comm comm) {
  int rank = 0, world = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(comm, &world));
  const size_t nu = shards.size();
  std::vector<int64_t> mine(2 * nu), all(2 * nu * static_cast<size_t>(world));
  for (size_t u = 0; u < nu; ++u) mine[2 * u] = shards[u].p.begin, mine[2 * u + 1] = shards[u].os.begin;
  AMSP_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(2 * nu), MPI_INT64_T, all.data(),
                               static_cast<int>(2 * nu), MPI_INT64_T, comm));
  std::vector<std::array<bool, 2>> count(nu, {true, true});
  for (size_t u = 0; u < nu; ++u)
    for (int which = 0; which < 2; ++which)
      for (int r = 0; r < rank; ++r)
        if (all[static_cast<size_t>(r) * 2 * nu + 2 * u + which] == mine[2 * u + which])
          count[u][static_cast<size_t>(which)] = false;
  return count;
}

// Per dataset, in file order: its name, the checksum the manifest lists, and
// this rank's share of the checksum of what was read.
struct ReadSums {
  std::vector<std::string> names;
  std::vector<uint64_t> stored, computed;
};

// Reads one state of one unit into its view: the P range for parameters, the
// OS range for the moments; padding beyond the unit's numel is zeroed.
void read_unit_state(hid_t file, const std::string& path, State state, const model::UnitSpec& unit,
                     const plan::UnitShards& sh, const StateView& view, bool count,
                     const std::map<std::string, uint64_t>& listed, ReadSums& out) {
  const bool params = state == State::kParams;
  const plan::Range range = params ? sh.p : sh.os;
  float* base = params ? view.params : state == State::kExpAvg ? view.exp_avg : view.exp_avg_sq;
  for (int64_t x = std::max(range.begin, sh.numel); x < range.end(); ++x) base[x - range.begin] = 0;
  for (const auto& t : unit.tensors) {
    const std::string dpath = dataset_path(state, t.name);
    out.names.push_back(dpath);
    Handle d(H5Dopen2(file, ("/" + dpath).c_str(), H5P_DEFAULT), H5Dclose);
    if (!d.valid()) fail_usage("checkpoint ", path, ": cannot open dataset ", dpath);
    out.stored.push_back(listed.at(dpath));  // present: check_structure matched the model
    const auto piece = intersect(t, range.begin, range.end());
    uint64_t s = 0;
    if (piece) {
      float* dest = base + piece->buffer_offset;
      if (!detail::read_run(d, t.shape, piece->begin, piece->end, dest))
        fail("checkpoint ", path, ": HDF5 cannot read dataset ", dpath, " (damaged file?)");
      if (count) s = checksum(dest, piece->size(), piece->begin);
    }
    out.computed.push_back(s);
  }
}

// Opens the file, checks its manifest, model and structure, and reads this
// rank's ranges of every state.
Metadata read_states(const std::string& path, const model::LlamaConfig& expected,
                     const std::vector<model::UnitSpec>& units,
                     const std::vector<plan::UnitShards>& shards,
                     const std::vector<StateView>& views,
                     const std::vector<std::array<bool, 2>>& count, ReadSums& out) {
  check_shapes(units);
  Handle file = detail::open_read(path);
  const Manifest manifest = detail::read_manifest(file, path);
  check_model(path, manifest.meta.model_json, expected);
  detail::check_structure(file, path, manifest);
  std::map<std::string, uint64_t> listed;
  for (const auto& d : manifest.datasets) listed[d.name] = d.checksum;
  h5::QuietErrors quiet;
  for (State state : detail::kAllStates)
    for (size_t u = 0; u < units.size(); ++u)
      read_unit_state(file, path, state, units[u], shards[u], views[u],
                      count[u][state == State::kParams ? 0 : 1], listed, out);
  return manifest.meta;
}

// Sums every rank's share and compares with the manifest's checksums.
void check_sums(const std::string& path, ReadSums& sums, MPI_Comm comm) {
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.computed.data(), static_cast<int>(sums.computed.size()),
                               MPI_UINT64_T, MPI_SUM, comm));
  for (size_t i = 0; i < sums.computed.size(); ++i)
    if (sums.computed[i] != sums.stored[i])
      fail("checkpoint ", path, ": dataset ", sums.names[i], " fails its checksum (stored ",
           detail::hex(sums.stored[i]), ", computed ", detail::hex(sums.computed[i]),
           "): the file is damaged");
}

}  // namespace

Metadata load(const std::string& path, const model::LlamaConfig& expected,
              const std::vector<model::UnitSpec>& units,
              const std::vector<plan::UnitShards>& shards,
              const std::vector<StateView>& views, MPI_Comm comm) {
  const std::vector<std::array<bool, 2>> count = ranges_to_count(shards, comm);
  Metadata meta;
  ReadSums sums;
  const Status st = attempt([&] { meta = read_states(path, expected, units, shards, views, count, sums); });
  agree_or_throw(st, comm);
  check_sums(path, sums, comm);
  return meta;
}

std::string verify(const std::string& path, MPI_Comm comm) {
  int rank = 0, world = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(comm, &world));
  // First the structure, in a child: only then may this process open the file.
  std::string problem;
  if (rank == 0) problem = check_in_child(path, /*data=*/false);
  bcast_string(&problem, 0, comm);
  if (!problem.empty()) return problem;
  std::vector<ManifestDataset> datasets;
  std::vector<uint64_t> sums;
  Status st = attempt([&] {
    Handle file = detail::open_read(path);
    datasets = detail::read_manifest(file, path).datasets;
    h5::QuietErrors quiet;
    for (const auto& e : datasets) {
      int64_t numel = 1;
      for (int64_t x : e.shape) numel *= x;
      const Piece p = even_split(numel, world, rank);
      Handle d(H5Dopen2(file, ("/" + e.name).c_str(), H5P_DEFAULT), H5Dclose);
      uint64_t s = 0;
      if (!d.valid() || !detail::checksum_run(d, e.shape, p.begin, p.end, &s))
        fail("HDF5 cannot read dataset ", e.name);
      sums.push_back(s);
    }
  });
  st = comm::agree(st, comm);
  if (st.code) {
    const std::string prefix = "checkpoint " + path + ": ";
    return st.message.rfind(prefix, 0) == 0 ? st.message.substr(prefix.size()) : st.message;
  }
  AMSP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T,
                               MPI_SUM, comm));
  std::string bad;
  int more = 0;
  for (size_t i = 0; i < datasets.size(); ++i)
    if (sums[i] != datasets[i].checksum) {
      if (bad.empty())
        bad = cat("dataset ", datasets[i].name, " fails its checksum (stored ", detail::hex(datasets[i].checksum),
                  ", computed ", detail::hex(sums[i]), ")");
      else
        ++more;
    }
  if (more) bad += cat(" and ", more, " more");
  return bad;
}

int64_t newest_step(const std::string& dir) {
  const auto found = list_checkpoints(dir);
  return found.empty() ? -1 : found.front().first;
}

std::vector<std::string> clean_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool step_tmp = n.size() > 8 && n[0] == '.' && n.rfind("step-", 1) == 1 && n.ends_with(".h5.tmp");
    if ((step_tmp || n == "latest.tmp") && fs::remove(e.path(), ec)) removed.push_back(n);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

void require_sound(const std::string& path, MPI_Comm comm) {
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::string problem;
  if (rank == 0) problem = check_in_child(path, /*data=*/false);
  bcast_string(&problem, 0, comm);
  if (!problem.empty()) fail("checkpoint ", path, ": ", problem);
}

std::optional<std::string> find_latest(const std::string& dir, std::vector<std::string>* skipped,
                                       MPI_Comm comm) {
  int rank = 0;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  // Rank 0 lists the candidates, newest first. `latest` is not consulted: a
  // crash between the rename of step-N.h5 and the update of `latest` leaves it
  // naming an older file, and step-N.h5 is complete (it was renamed into
  // place only once written and synced).
  std::string list;
  if (rank == 0) {
    std::error_code ec;
    if (fs::is_directory(dir, ec))
      for (const auto& [step, name] : list_checkpoints(dir)) list += name + "\n";
  }
  bcast_string(&list, 0, comm);
  std::istringstream in(list);
  std::string name;
  while (std::getline(in, name)) {
    const std::string path = dir + "/" + name;
    const std::string problem = verify(path, comm);
    if (problem.empty()) return path;
    if (skipped) skipped->push_back(path + ": " + problem);
  }
  return std::nullopt;
}

}  // namespace amsp::ckpt
