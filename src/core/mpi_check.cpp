#include "core/mpi_check.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace amsp::comm {

// where() and abort_job() are the error path itself: their MPI calls are not
// checked (a failure there could only recurse into abort_job).

std::string where() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return cat("rank ? on host ", host);
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return cat("rank ", rank, " of ", size, " on host ", host);
}

void abort_job(const std::string& message) {
  const std::string line = cat("amsp: error: ", where(), ": ", message, "\n");
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  // Give the launcher a moment to forward the line before MPI_Abort tears the
  // job down (mpiexec can drop output of processes it kills).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, kExitFailure);
  std::_Exit(kExitFailure);
}

void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  call_failed(call, file, line, std::string(msg, len));
}

void call_failed(const char* call, const char* file, int line, const std::string& error) {
  // Name the function, not its arguments.
  std::string name = call;
  if (const auto paren = name.find('('); paren != std::string::npos) name.resize(paren);
  const char* base = std::strstr(file, "src/");
  abort_job(cat(name, " failed at ", base ? base : file, ":", line, ": ", error));
}

void set_errors_return(MPI_Comm comm) {
  AMSP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
}

}  // namespace amsp::comm
