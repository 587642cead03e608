// Small RAII helpers over the HDF5 C API, private to src/data/.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>

namespace amsp::data::h5 {

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

}  // namespace amsp::data::h5
