// --run-info FILE: one JSON document that says what a run was and how it ended, for
// job scripts and scaling studies (slurm/train.sbatch, slurm/scaling_report.py).
// Rank 0 writes it when training starts (result: null) and again when it ends, each
// time through FILE.tmp and a rename, so a reader never sees half a file.
// doc/cluster.md lists the fields.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "topology/topology.h"

namespace amsp::engine {

// The Slurm job this process belongs to (job id, name, restart count, node list,
// partition, submit directory, step id), or null when SLURM_JOB_ID is unset.
nlohmann::ordered_json slurm_job_json(const topology::Env& env);

// Nodes in switch order, each with its switch path and world ranks.
nlohmann::ordered_json topology_json(const topology::Topology& topo);

// This process's peak resident set size in bytes (getrusage).
int64_t peak_rss_bytes();

// CPU seconds the threads that compute have used so far: the calling thread
// and the OpenMP team it runs kernels on (each one's CLOCK_THREAD_CPUTIME_ID).
// Not the communication thread, whose polling grows with the time this rank
// waits for the others, nor the checkpoint writer or the watchdog.
double compute_cpu_seconds();
// CPU seconds the calling thread has used so far.
double caller_cpu_seconds();

// Writes j to path through path.tmp and a rename, so that a reader never sees
// half a file. UsageError naming `option` (the option that gave the path) if
// the file cannot be written.
void write_json_file(const std::string& path, const nlohmann::ordered_json& j, const char* option);

// write_json_file for --run-info.
void write_run_info(const std::string& path, const nlohmann::ordered_json& j);

}  // namespace amsp::engine
