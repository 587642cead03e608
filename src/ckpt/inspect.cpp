// One-process readers of a checkpoint, for `amsp ckpt inspect`, `verify` and
// `amsp export`.

#include <map>

#include "ckpt/checkpoint.h"
#include "ckpt/checksum.h"
#include "ckpt/format.h"
#include "ckpt/selection.h"
#include "core/error.h"

namespace amsp::ckpt {

Metadata read_metadata(const std::string& path) {
  h5::Handle file = detail::open_read(path);
  return detail::read_metadata(file, path);
}

Metadata check_structure(const std::string& path) {
  h5::Handle file = detail::open_read(path);
  const Manifest m = detail::read_manifest(file, path);
  detail::check_structure(file, path, m);
  return m.meta;
}

std::vector<DatasetInfo> inspect(const std::string& path, bool compute_checksums) {
  h5::Handle file = detail::open_read(path);
  const Manifest manifest = detail::read_manifest(file, path);
  detail::check_structure(file, path, manifest);
  std::vector<DatasetInfo> out;
  h5::QuietErrors quiet;
  for (const auto& e : detail::list_datasets(file, path)) {
    DatasetInfo d;
    d.name = e.name;
    d.shape = e.shape;
    d.dtype = e.float32 ? "float32" : "other";
    d.bytes = e.numel() * 4;
    d.stored_checksum = e.checksum;  // equal to the manifest's: check_structure
    if (compute_checksums) {
      if (!e.float32) fail("checkpoint ", path, ": dataset ", e.name, " is not float32");
      if (e.shape.empty() || e.shape.size() > 2)
        fail("checkpoint ", path, ": dataset ", e.name, " has ", e.shape.size(), " dimensions");
      h5::Handle dset(H5Dopen2(file, ("/" + e.name).c_str(), H5P_DEFAULT), H5Dclose);
      if (!dset.valid() || !detail::checksum_run(dset, e.shape, 0, e.numel(), &d.computed_checksum))
        fail("checkpoint ", path, ": HDF5 cannot read dataset ", e.name, " (damaged file?)");
    }
    out.push_back(std::move(d));
  }
  return out;
}

void read_parameters(const std::string& path, const std::vector<model::UnitSpec>& units,
                     const std::function<void(const model::TensorSpec&, std::vector<float>&)>& fn) {
  h5::Handle file = detail::open_read(path);
  const Manifest manifest = detail::read_manifest(file, path);
  detail::check_structure(file, path, manifest);
  std::map<std::string, uint64_t> listed;
  for (const auto& d : manifest.datasets) listed[d.name] = d.checksum;
  h5::QuietErrors quiet;
  std::vector<float> data;
  for (const auto& unit : units) {
    // The whole unit as one shard: each tensor is one run of its elements.
    for (const auto& t : unit.tensors) {
      const std::string dpath = detail::dataset_path(detail::State::kParams, t.name);
      const auto it = listed.find(dpath);
      if (it == listed.end()) fail_usage("checkpoint ", path, ": no dataset ", dpath, " for tensor ", t.name);
      const auto piece = intersect(t, 0, unit.numel);
      data.assign(static_cast<size_t>(t.numel), 0.0f);
      h5::Handle d(H5Dopen2(file, ("/" + dpath).c_str(), H5P_DEFAULT), H5Dclose);
      if (!d.valid() || (piece && !detail::read_run(d, t.shape, piece->begin, piece->end, data.data())))
        fail_usage("checkpoint ", path, ": HDF5 cannot read dataset ", dpath, " (damaged file?)");
      const uint64_t sum = checksum(data.data(), t.numel, 0);
      if (sum != it->second)
        fail_usage("checkpoint ", path, ": dataset ", dpath, " fails its checksum (stored ", detail::hex(it->second),
                   ", computed ", detail::hex(sum), "): the file is damaged");
      fn(t, data);
    }
  }
}

}  // namespace amsp::ckpt
