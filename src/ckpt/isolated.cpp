// check_in_child: a checkpoint's first reading happens in a child process.
//
// HDF5 parses a file's metadata (superblock, object headers, B-trees, heaps)
// with little defence against damage: a flipped byte there has made it
// segfault, and made it loop forever ignoring SIGTERM. Neither may reach a
// training job, so the file is first opened and fully checked by a child with
// a deadline; only a file that passed is opened by the ranks. doc/checkpoints.md
// ("Untrusted files") says why this and not the alternatives.

#include <sys/stat.h>

#include <cstdlib>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/subprocess.h"

namespace amsp::ckpt {
namespace {

double check_timeout(const std::string& path, bool data) {
  if (const char* env = std::getenv("AMSP_CKPT_CHECK_TIMEOUT"); env && *env) {
    const auto v = parse_double(env);
    if (!v || *v <= 0) fail_usage("AMSP_CKPT_CHECK_TIMEOUT=", env, ": expected seconds > 0");
    return *v;
  }
  struct stat st {};
  const double gb = ::stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) / 1e9 : 0.0;
  return 60.0 + (data ? 20.0 * gb : 0.0);
}

// The child's own one-line error ("amsp: error: ..." without its prefix), if any.
std::string child_error(const std::string& output) {
  const std::string tag = "amsp: error: ";
  const size_t at = output.rfind(tag);
  if (at == std::string::npos) return "";
  std::string line = output.substr(at + tag.size());
  line = line.substr(0, line.find('\n'));
  const std::string prefix = "checkpoint ";
  if (line.rfind(prefix, 0) == 0 && line.find(": ") != std::string::npos) line = line.substr(line.find(": ") + 2);
  return line;
}

}  // namespace

std::string check_in_child(const std::string& path, bool data) {
  const char* exe = std::getenv("AMSP_EXECUTABLE");
  std::vector<std::string> argv = {exe && *exe ? exe : self_executable(), "ckpt", "verify", "--in-process"};
  if (!data) argv.push_back("--structure-only");
  argv.push_back(path);
  const double timeout = check_timeout(path, data);
  const ChildResult r = run_child(argv, timeout);
  if (r.ok()) return "";
  if (!r.timed_out && r.signal == 0) {
    const std::string e = child_error(r.output);
    if (!e.empty()) return e;
  }
  return cat("reading it ", r.timed_out ? "did not finish" : "failed", " (", r.describe(timeout),
             " in the checking process): the file is damaged");
}

}  // namespace amsp::ckpt
