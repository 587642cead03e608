#include "ckpt/format.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>

#include "ckpt/checksum.h"
#include "ckpt/selection.h"
#include "core/error.h"
#include <nlohmann/json.hpp>

namespace amsp::ckpt {

std::string file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

Transfer parse_transfer(const std::string& text, const std::string& option) {
  if (text == "independent") return Transfer::kIndependent;
  if (text == "collective") return Transfer::kCollective;
  fail_usage(option, " ", text, ": expected independent or collective");
}

std::string dataset_name(const std::string& hf) {
  return hf.rfind("model.", 0) == 0 ? hf.substr(6) : hf;
}

std::string hf_name(const std::string& dataset) {
  return dataset.rfind("lm_head.", 0) == 0 ? dataset : "model." + dataset;
}

namespace detail {

using h5::Handle;

const char* state_group(State state) {
  switch (state) {
    case State::kParams: return "model";
    case State::kExpAvg: return "optimizer/exp_avg";
    case State::kExpAvgSq: return "optimizer/exp_avg_sq";
  }
  return "?";
}

std::string dataset_path(State state, const std::string& hf) {
  return std::string(state_group(state)) + "/" + dataset_name(hf);
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int64_t Entry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool write_string_attr(hid_t obj, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0)
    return false;
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space.valid()) return false;
  Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  const char* p = value.c_str();
  return H5Awrite(attr, type, &p) >= 0 && attr.close();
}

namespace {
bool write_scalar(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (!space.valid()) return false;
  Handle attr(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.valid() && H5Awrite(attr, mem_type, v) >= 0 && attr.close();
}
}  // namespace

bool write_i64_attr(hid_t obj, const char* name, int64_t value) {
  return write_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

bool write_u64_attr(hid_t obj, const char* name, uint64_t value) {
  return write_scalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

bool read_u64_attr(hid_t obj, const char* name, uint64_t* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Handle ftype(H5Aget_type(attr), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype) != H5T_INTEGER) return false;
  return H5Aread(attr, H5T_NATIVE_UINT64, out) >= 0;
}

bool write_metadata(hid_t file, const Metadata& m, const std::string& manifest_json) {
  std::string source_tokens;
  for (size_t i = 0; i < m.source_tokens.size(); ++i) source_tokens += cat(i ? ", " : "", m.source_tokens[i]);
  const std::string sampler =
      cat("{\"kind\": \"counter-based\", \"seed\": ", m.seed, ", \"step\": ", m.step,
          ", \"tokens\": ", m.tokens,
          m.source_tokens.empty() ? "" : cat(", \"source_tokens\": [", source_tokens, "]"), "}");
  return write_string_attr(file, "format", kFormat) &&
         write_i64_attr(file, "format_version", m.format_version) &&
         write_i64_attr(file, "step", m.step) && write_i64_attr(file, "tokens", m.tokens) &&
         write_u64_attr(file, "seed", m.seed) && write_string_attr(file, "sampler", sampler) &&
         write_string_attr(file, "model_config", m.model_json) &&
         write_string_attr(file, "options", m.options_json) &&
         write_string_attr(file, "plan", m.plan) && write_string_attr(file, "topology", m.topology) &&
         write_i64_attr(file, "world_size", m.world_size) &&
         write_string_attr(file, "checksum_algorithm", kChecksumAlgorithm) &&
         write_string_attr(file, "manifest", manifest_json) &&
         write_u64_attr(file, "manifest_checksum", text_checksum(manifest_json));
}

Handle open_read(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_usage("checkpoint ", path, ": no such file");
  if (!fs::is_regular_file(path, ec)) fail_usage("checkpoint ", path, ": not a regular file");
  h5::QuietErrors quiet;
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 <= 0)
    fail_usage("checkpoint ", path, ": not an HDF5 file (truncated or damaged?)");
  Handle fapl = h5::file_access();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.valid() ? fapl.get() : H5P_DEFAULT), H5Fclose);
  if (!file.valid()) fail_usage("checkpoint ", path, ": HDF5 cannot open the file (truncated or damaged?)");
  return file;
}

namespace {

// A name read from a possibly damaged file, fit for a one-line message:
// bytes outside printable ASCII as \xHH.
std::string printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// The loose root attributes, as version 1 wrote them and version 2 still does.
Metadata read_loose_attributes(hid_t file, const std::string& path) {
  Metadata m;
  const auto need_int = [&](const char* name, int64_t* out) {
    if (!h5::read_int_attr(file, name, out))
      fail_usage("checkpoint ", path, ": missing or non-integer attribute ", name);
  };
  const auto need_str = [&](const char* name, std::string* out) {
    if (!h5::read_string_attr(file, name, out))
      fail_usage("checkpoint ", path, ": missing or non-string attribute ", name);
  };
  need_int("format_version", &m.format_version);
  if (m.format_version != 1 && m.format_version != kFormatVersion)
    fail_usage("checkpoint ", path, ": format version ", m.format_version, "; this amsp reads versions 1 to ",
               kFormatVersion);
  need_int("step", &m.step);
  need_int("tokens", &m.tokens);
  if (!read_u64_attr(file, "seed", &m.seed))
    fail_usage("checkpoint ", path, ": missing or non-integer attribute seed");
  need_str("model_config", &m.model_json);
  need_str("options", &m.options_json);
  need_str("plan", &m.plan);
  need_str("topology", &m.topology);
  need_int("world_size", &m.world_size);
  return m;
}

bool same_json(const std::string& a, const std::string& b) {
  try {
    return nlohmann::json::parse(a) == nlohmann::json::parse(b);
  } catch (const std::exception&) {
    return false;
  }
}

// A loose attribute that disagrees with the manifest: the file was changed after it was written.
void check_agrees(const Metadata& loose, const Metadata& m, const std::string& path) {
  auto differ = [&](const char* name, const std::string& a, const std::string& b) {
    fail_usage("checkpoint ", path, ": attribute ", name, " is ", printable(a), " but the manifest says ", printable(b),
               ": the file was changed or damaged after it was written");
  };
  if (loose.format_version != m.format_version)
    differ("format_version", std::to_string(loose.format_version), std::to_string(m.format_version));
  if (loose.step != m.step) differ("step", std::to_string(loose.step), std::to_string(m.step));
  if (loose.tokens != m.tokens) differ("tokens", std::to_string(loose.tokens), std::to_string(m.tokens));
  if (loose.seed != m.seed) differ("seed", std::to_string(loose.seed), std::to_string(m.seed));
  if (loose.world_size != m.world_size)
    differ("world_size", std::to_string(loose.world_size), std::to_string(m.world_size));
  if (loose.plan != m.plan) differ("plan", loose.plan, m.plan);
  if (loose.topology != m.topology) differ("topology", loose.topology, m.topology);
  if (!same_json(loose.model_json, m.model_json)) differ("model_config", "(text)", "another config");
  if (!same_json(loose.options_json, m.options_json)) differ("options", "(text)", "other options");
}

}  // namespace

Manifest read_manifest(hid_t file, const std::string& path) {
  h5::QuietErrors quiet;
  std::string format;
  if (!h5::read_string_attr(file, "format", &format) || format != kFormat)
    fail_usage("checkpoint ", path, ": no format attribute \"", kFormat,
               "\": is this a checkpoint written by amsp?");
  const Metadata loose = read_loose_attributes(file, path);
  Manifest m;
  if (loose.format_version == 1) {
    m.meta = loose;
    for (const auto& e : list_datasets(file, path)) m.datasets.push_back({e.name, e.shape, e.checksum});
    return m;
  }
  std::string text;
  uint64_t stored = 0;
  if (!h5::read_string_attr(file, "manifest", &text))
    fail_usage("checkpoint ", path, ": no manifest attribute (version ", loose.format_version, " has one)");
  if (!read_u64_attr(file, "manifest_checksum", &stored))
    fail_usage("checkpoint ", path, ": no manifest_checksum attribute");
  if (text_checksum(text) != stored)
    fail_usage("checkpoint ", path, ": the manifest fails its checksum (stored ", hex(stored), ", computed ",
               hex(text_checksum(text)), "): the file is damaged");
  m = manifest_from_json(text, path);
  check_agrees(loose, m.meta, path);
  // JSON-equal (checked): keep the writer's own text.
  m.meta.model_json = loose.model_json;
  m.meta.options_json = loose.options_json;
  return m;
}

Metadata read_metadata(hid_t file, const std::string& path) { return read_manifest(file, path).meta; }

namespace {

// Recursively collects the datasets below group `g` (whose path is prefix).
void walk(hid_t g, const std::string& prefix, const std::string& path, std::vector<Entry>* out) {
  Handle gcpl(H5Gget_create_plist(g), H5Pclose);
  unsigned flags = 0;
  const bool by_creation = gcpl.valid() && H5Pget_link_creation_order(gcpl, &flags) >= 0 &&
                           (flags & H5P_CRT_ORDER_INDEXED);
  const H5_index_t index = by_creation ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) fail("checkpoint ", path, ": HDF5 cannot list group /", printable(prefix));
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail("checkpoint ", path, ": HDF5 cannot list group /", printable(prefix));
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    const std::string full = prefix.empty() ? name : prefix + "/" + name;
    H5O_info_t oinfo;
    if (H5Oget_info_by_name(g, name.c_str(), &oinfo, H5P_DEFAULT) < 0)
      fail("checkpoint ", path, ": HDF5 cannot read object /", printable(full));
    if (oinfo.type == H5O_TYPE_GROUP) {
      Handle child(H5Gopen2(g, name.c_str(), H5P_DEFAULT), H5Gclose);
      if (!child.valid()) fail("checkpoint ", path, ": HDF5 cannot open group /", printable(full));
      walk(child, full, path, out);
    } else if (oinfo.type == H5O_TYPE_DATASET) {
      Handle d(H5Dopen2(g, name.c_str(), H5P_DEFAULT), H5Dclose);
      if (!d.valid()) fail("checkpoint ", path, ": HDF5 cannot open dataset /", printable(full));
      Handle space(H5Dget_space(d), H5Sclose);
      Handle type(H5Dget_type(d), H5Tclose);
      if (!space.valid() || !type.valid()) fail("checkpoint ", path, ": HDF5 cannot inspect /", printable(full));
      Entry e;
      e.name = full;
      const int nd = H5Sget_simple_extent_ndims(space);
      std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
      if (nd < 0 || H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
        fail("checkpoint ", path, ": HDF5 cannot size /", printable(full));
      for (hsize_t v : dims) e.shape.push_back(static_cast<int64_t>(v));
      e.float32 = H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
      e.has_checksum = read_u64_attr(d, "checksum", &e.checksum);
      out->push_back(std::move(e));
    }
  }
}

}  // namespace

std::vector<Entry> list_datasets(hid_t file, const std::string& path) {
  h5::QuietErrors quiet;
  std::vector<Entry> out;
  Handle root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
  if (!root.valid()) fail("checkpoint ", path, ": HDF5 cannot open the root group");
  walk(root, "", path, &out);
  return out;
}

namespace {

std::string dims_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The dataset's bytes are one contiguous run inside the file.
void check_storage(hid_t file, const Entry& e, const std::string& path) {
  Handle d(H5Dopen2(file, ("/" + e.name).c_str(), H5P_DEFAULT), H5Dclose);
  Handle dcpl(d.valid() ? H5Dget_create_plist(d) : H5I_INVALID_HID, H5Pclose);
  if (!d.valid() || !dcpl.valid()) fail_usage("checkpoint ", path, ": HDF5 cannot open dataset ", e.name);
  if (H5Pget_layout(dcpl) != H5D_CONTIGUOUS)
    fail_usage("checkpoint ", path, ": dataset ", e.name, " is not stored contiguously");
  hsize_t file_size = 0;
  const haddr_t offset = H5Dget_offset(d);
  const hsize_t bytes = H5Dget_storage_size(d);
  if (H5Fget_filesize(file, &file_size) < 0 || offset == HADDR_UNDEF ||
      bytes != static_cast<hsize_t>(e.numel()) * 4 || offset + bytes > file_size)
    fail_usage("checkpoint ", path, ": dataset ", e.name, " has its data outside the file (truncated or damaged)");
}

}  // namespace

void check_structure(hid_t file, const std::string& path, const Manifest& manifest) {
  h5::QuietErrors quiet;
  const model::LlamaConfig config = model::config_from_json(manifest.meta.model_json, "checkpoint " + path);
  const std::vector<ManifestDataset> expected = expected_datasets(config);
  for (size_t i = 0; i < std::max(expected.size(), manifest.datasets.size()); ++i) {
    if (i >= manifest.datasets.size())
      fail_usage("checkpoint ", path, ": incomplete: no dataset ", expected[i].name, " (the model of its config has ",
                 expected.size(), ", the checkpoint lists ", manifest.datasets.size(), ")");
    const ManifestDataset& d = manifest.datasets[i];
    if (i >= expected.size() || d.name != expected[i].name)
      fail_usage("checkpoint ", path, ": lists dataset ", d.name, " where the model of its config has ",
                 i < expected.size() ? expected[i].name : "nothing more");
    if (d.shape != expected[i].shape)
      fail_usage("checkpoint ", path, ": dataset ", d.name, " has shape ", dims_text(d.shape),
                 "; the model of its config implies ", dims_text(expected[i].shape));
  }
  const std::vector<Entry> entries = list_datasets(file, path);
  std::map<std::string, const ManifestDataset*> listed;
  for (const auto& d : manifest.datasets) listed[d.name] = &d;
  for (const auto& e : entries)
    if (!listed.count(e.name))
      fail_usage("checkpoint ", path, ": dataset ", printable(e.name), " is not in the manifest");
  std::map<std::string, const Entry*> present;
  for (const auto& e : entries) present[e.name] = &e;
  for (const auto& d : manifest.datasets) {
    const auto it = present.find(d.name);
    if (it == present.end()) fail_usage("checkpoint ", path, ": no dataset ", d.name, " (the manifest lists it)");
    const Entry& e = *it->second;
    if (!e.float32) fail_usage("checkpoint ", path, ": dataset ", e.name, " is not float32");
    if (e.shape != d.shape)
      fail_usage("checkpoint ", path, ": dataset ", e.name, " has shape ", dims_text(e.shape), "; the manifest says ",
                 dims_text(d.shape));
    if (!e.has_checksum || e.checksum != d.checksum)
      fail_usage("checkpoint ", path, ": dataset ", e.name, " has checksum attribute ",
                 e.has_checksum ? hex(e.checksum) : "(none)", "; the manifest says ", hex(d.checksum));
    check_storage(file, e, path);
  }
}

bool select_run(hid_t space, const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  if (begin >= end) return H5Sselect_none(space) >= 0;
  if (shape.empty() || shape.size() > 2) return false;
  const int64_t cols = shape.back();
  bool first = true;
  for (const Slab& s : row_major_slabs(begin, end, cols)) {
    hsize_t start[2], count[2];
    int nd = 1;
    if (shape.size() == 1) {
      start[0] = static_cast<hsize_t>(s.col);
      count[0] = static_cast<hsize_t>(s.cols);
    } else {
      nd = 2;
      start[0] = static_cast<hsize_t>(s.row);
      start[1] = static_cast<hsize_t>(s.col);
      count[0] = static_cast<hsize_t>(s.rows);
      count[1] = static_cast<hsize_t>(s.cols);
    }
    (void)nd;
    if (H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count,
                            nullptr) < 0)
      return false;
    first = false;
  }
  return true;
}

Handle memory_space(int64_t n) {
  const hsize_t dims[1] = {static_cast<hsize_t>(std::max<int64_t>(n, 1))};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  if (space.valid() && n == 0 && H5Sselect_none(space) < 0) return Handle();
  return space;
}

bool read_run(hid_t dset, const std::vector<int64_t>& shape, int64_t begin, int64_t end, float* out) {
  if (begin >= end) return true;
  Handle fspace(H5Dget_space(dset), H5Sclose);
  Handle mspace = memory_space(end - begin);
  if (!fspace.valid() || !mspace.valid() || !select_run(fspace, shape, begin, end)) return false;
  return H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out) >= 0;
}

bool checksum_run(hid_t dset, const std::vector<int64_t>& shape, int64_t begin, int64_t end,
                  uint64_t* sum) {
  constexpr int64_t kBlock = int64_t{1} << 22;  // 16 MiB of floats per read
  std::vector<float> buf(static_cast<size_t>(std::min(kBlock, std::max<int64_t>(end - begin, 0))));
  uint64_t s = 0;
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t e = std::min(end, b + kBlock);
    if (!read_run(dset, shape, b, e, buf.data())) return false;
    s += checksum(buf.data(), e - b, b);
  }
  *sum = s;
  return true;
}

}  // namespace detail
}  // namespace amsp::ckpt
