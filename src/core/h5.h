// Small RAII helpers over the HDF5 C API, shared by the token datasets
// (src/data) and the checkpoints (src/ckpt).
#pragma once

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace amsp::h5 {

// Owns an hid_t and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports whether closing succeeded (for files: the flush).
  bool close() {
    herr_t status = 0;
    if (id_ >= 0 && closer_) status = closer_(id_);
    id_ = -1;
    return status >= 0;
  }
  void reset() { (void)close(); }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Silences HDF5's automatic error-stack printing while alive: we check every
// return value and report one line instead.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// A file-access property list with file locking off where the library
// supports it: datasets are written under a temporary name and renamed, and
// read-only afterwards, so locks add nothing, while parallel file systems
// without flock() would refuse to open the file at all.
inline Handle file_access() {
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  if (fapl.valid()) (void)H5Pset_file_locking(fapl, false, true);
#endif
  return fapl;
}

// Reads a scalar string attribute, variable- or fixed-length. False if it is
// missing or not a string.
inline bool read_string_attr(hid_t obj, const char* name, std::string* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Handle ftype(H5Aget_type(attr), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype) != H5T_STRING) return false;
  Handle space(H5Aget_space(attr), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space) != 1) return false;
  const htri_t variable = H5Tis_variable_str(ftype);
  if (variable < 0) return false;
  if (variable > 0) {
    Handle mtype(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mtype.valid() || H5Tset_size(mtype, H5T_VARIABLE) < 0 ||
        H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0)
      return false;
    char* p = nullptr;
    if (H5Aread(attr, mtype, &p) < 0) return false;
    *out = p ? p : "";
    if (p) H5free_memory(p);
  } else {
    const size_t size = H5Tget_size(ftype);
    if (size == 0) return false;
    Handle mtype(H5Tcopy(ftype), H5Tclose);
    if (!mtype.valid()) return false;
    std::string buf(size, '\0');
    if (H5Aread(attr, mtype, buf.data()) < 0) return false;
    buf.resize(std::min(buf.size(), buf.find('\0')));
    if (H5Tget_strpad(ftype) == H5T_STR_SPACEPAD)
      while (!buf.empty() && buf.back() == ' ') buf.pop_back();
    *out = std::move(buf);
  }
  return true;
}

// Reads a scalar integer attribute. False if missing or not an integer.
inline bool read_int_attr(hid_t obj, const char* name, int64_t* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return false;
  Handle ftype(H5Aget_type(attr), H5Tclose);
  if (!ftype.valid() || H5Tget_class(ftype) != H5T_INTEGER) return false;
  Handle space(H5Aget_space(attr), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space) != 1) return false;
  return H5Aread(attr, H5T_NATIVE_INT64, out) >= 0;
}

inline bool link_exists(hid_t file, const std::string& path) {
  // H5Lexists needs every intermediate group to exist: walk the path.
  size_t pos = 0;
  while ((pos = path.find('/', pos + 1)) != std::string::npos)
    if (H5Lexists(file, path.substr(0, pos).c_str(), H5P_DEFAULT) <= 0) return false;
  return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
}

}  // namespace amsp::h5
