// A test's scratch directory (header-only; for tests, not part of amsp_core).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>

namespace amsp::test {

// A fresh directory under the system temp directory, named after `prefix`, the
// process and a counter, and removed with its contents on destruction: a test
// binary leaves nothing behind in /tmp, however many times the suite runs.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "amsp-test") {
    static std::atomic<int> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(now));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // path()/name as a string.
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// One scratch directory per test binary, removed when the binary exits.
inline const TempDir& process_temp_dir() {
  static const TempDir dir;
  return dir;
}

}  // namespace amsp::test
