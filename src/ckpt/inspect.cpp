// One-process readers of a checkpoint, for `amsp ckpt inspect` and `verify`.

#include "ckpt/checkpoint.h"
#include "ckpt/format.h"
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

}  // namespace amsp::ckpt
