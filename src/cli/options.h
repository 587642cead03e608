// Shared plumbing for the subcommands: Boost.Program_options parsing with an
// INI config file underneath the command line, and one-line errors.
#pragma once

#include <boost/program_options.hpp>
#include <functional>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace amsp::cli {

namespace po = boost::program_options;

// Parses argv (after the subcommand words) against desc. Adds --help and
// --config FILE; values from the config file (INI: `key = value`, sections map
// to dotted names, e.g. [model] hidden_size = 64 is --model.hidden_size) fill
// what the command line did not set. Throws UsageError with one line naming
// the option and what was expected. Returns false if --help was printed.
bool parse_command(const std::string& command, const std::string& summary,
                   const po::options_description& desc, int argc, char** argv,
                   po::variables_map& vm,
                   const po::positional_options_description* positional = nullptr);

// Range checks that name the option and the value given:
// require(v >= 1, "steps", v, "an integer >= 1").
template <typename T>
void require(bool ok, const std::string& option, const T& value, const std::string& expected) {
  if (!ok) fail_usage("--", option, " ", value, ": expected ", expected);
}

// A number option defaulting to `fallback` (an options struct's own default),
// which --help prints as written: 0.1, not 0.10000000000000001.
po::typed_value<double>* number(double* target, double fallback);

// The --model.FIELD options (one per Hugging Face LlamaConfig field), and
// applying the ones given to a loaded config.
po::options_description model_field_options();
void apply_model_fields(const po::variables_map& vm, model::LlamaConfig& config);

// The engine's bounds on work in flight, which size its temporaries (amsp
// train runs with them, amsp plan predicts with them): --prefetch-units and
// --reduction-slots, into `prefetch` and `slots`; check_in_flight refuses
// values below 1.
struct InFlight {
  int prefetch = 0;
  int slots = 0;
};
po::options_description in_flight_options(InFlight& f);
void check_in_flight(const InFlight& f);

// Runs a command's work under MPI (comm::MpiSession) and returns its exit
// code. Errors that every rank raised alike (setup checks run collectively)
// are printed by rank 0 only.
int run_under_mpi(int* argc, char*** argv, const std::function<int()>& body);

}  // namespace amsp::cli
