#include "engine/trace.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/mpi_check.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace amsp::engine {

Trace::Trace(MPI_Comm comm) : comm_(comm) {
  AMSP_MPI_CHECK(MPI_Barrier(comm_));
  origin_s_ = comm::now_seconds();
}

void Trace::span(const std::string& track, const std::string& name, double start_s, double end_s,
                 Collective c) {
  if (!recording_) return;
  std::lock_guard lock(mu_);
  events_.push_back({track, name, start_s, end_s, c});
}

void Trace::write(const std::string& path) const {
  int rank = 0, size = 1;
  AMSP_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  AMSP_MPI_CHECK(MPI_Comm_size(comm_, &size));
  // Tracks in a fixed order: compute first, then waits, then the groups.
  nlohmann::json events = nlohmann::json::array();
  {
    std::lock_guard lock(mu_);
    std::map<std::string, int> tids;
    auto tid = [&](const std::string& track) {
      auto [it, added] = tids.emplace(track, 0);
      if (added) {
        it->second = track == "compute" ? 0 : track == "wait" ? 1 : static_cast<int>(tids.size()) + 1;
        events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", it->second},
                          {"args", {{"name", track}}}});
        events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank},
                          {"tid", it->second}, {"args", {{"sort_index", it->second}}}});
      }
      return it->second;
    };
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
                      {"args", {{"name", cat("rank ", rank)}}}});
    for (const Event& e : events_) {
      nlohmann::json j = {{"name", e.name},
                          {"cat", e.track},
                          {"ph", "X"},
                          {"pid", rank},
                          {"tid", tid(e.track)},
                          {"ts", (e.start_s - origin_s_) * 1e6},
                          {"dur", (e.end_s - e.start_s) * 1e6}};
      if (e.c.seq) j["args"] = {{"group", e.c.group}, {"seq", e.c.seq}};
      events.push_back(std::move(j));
    }
  }
  const std::string mine = events.dump();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  AMSP_MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_));
  int total = 0;
  for (int i = 0; i < size; ++i) {
    offsets[static_cast<size_t>(i)] = total;
    total += lens[static_cast<size_t>(i)];
  }
  std::string all(static_cast<size_t>(rank == 0 ? total : 0), '\0');
  AMSP_MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(),
                             MPI_CHAR, 0, comm_));
  if (rank != 0) return;
  nlohmann::json merged = nlohmann::json::array();
  for (int i = 0; i < size; ++i)
    for (auto& e : nlohmann::json::parse(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(i)]),
                                                    static_cast<size_t>(lens[static_cast<size_t>(i)]))))
      merged.push_back(std::move(e));
  std::ofstream out(path, std::ios::trunc);
  if (!out) fail("--trace ", path, ": cannot create the file");
  out << nlohmann::json({{"traceEvents", merged}, {"displayTimeUnit", "ms"}}).dump() << "\n";
  if (!out) fail("--trace ", path, ": write failed");
}

}  // namespace amsp::engine
