#include "cli/options.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/mpi_check.h"
#include "plan/memory.h"

namespace amsp::cli {

namespace {

// What an option's value should look like, from its value_name ("INT", ...).
std::string expected_for(const po::options_description& desc, const std::string& name) {
  std::string key = name;
  while (!key.empty() && key.front() == '-') key.erase(0, 1);
  const po::option_description* opt = desc.find_nothrow(key, false);
  if (!opt) return "a valid value";
  std::string arg = opt->semantic()->name();  // "INT (=300)": drop the default
  if (const size_t paren = arg.find(" (="); paren != std::string::npos) arg.resize(paren);
  if (arg == "INT") return "an integer";
  if (arg == "NUM") return "a number";
  if (arg == "FILE" || arg == "PATH") return "a path";
  if (arg.empty()) return "no value";
  return arg;
}

std::string dashed(const std::string& name) {
  return name.rfind("--", 0) == 0 ? name : "--" + name;
}

}  // namespace

// A later occurrence of an option replaces an earlier one, so that scripts
// can append overrides to a default command line. Composing options (--input)
// collect every occurrence instead.
void keep_last_occurrence(po::parsed_options& parsed, const po::options_description& desc) {
  std::vector<po::option> kept;
  for (auto it = parsed.options.rbegin(); it != parsed.options.rend(); ++it) {
    const po::option_description* d = desc.find_nothrow(it->string_key, false);
    const bool composing = d && d->semantic()->is_composing();
    const bool dup = !it->string_key.empty() && !composing &&
                     std::any_of(kept.begin(), kept.end(),
                                 [&](const po::option& o) { return o.string_key == it->string_key; });
    if (!dup) kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  parsed.options = std::move(kept);
}

bool parse_command(const std::string& command, const std::string& summary,
                   const po::options_description& desc, int argc, char** argv,
                   po::variables_map& vm, const po::positional_options_description* positional) {
  po::options_description general("General");
  general.add_options()("help,h", "print this help and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "read options from an INI file (key = value; the command line wins)");
  po::options_description all;
  all.add(desc).add(general);

  try {
    po::command_line_parser parser(argc, argv);
    parser.options(all);
    if (positional) parser.positional(*positional);
    po::parsed_options parsed = parser.run();
    keep_last_occurrence(parsed, all);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << "usage: amsp " << command << " [options]\n\n" << summary << "\n\n" << all;
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      if (!std::filesystem::is_regular_file(path))
        fail_usage("--config ", path, ": no such file");
      std::ifstream in(path);
      if (!in) fail_usage("--config ", path, ": cannot read the file");
      try {
        po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
      } catch (const po::unknown_option& e) {
        fail_usage("--config ", path, ": unknown option '", e.get_option_name(),
                   "'; see amsp ", command, " --help");
      } catch (const po::invalid_option_value& e) {
        fail_usage("--config ", path, ": option '", e.get_option_name(), "' has a bad value; expected ",
                   expected_for(desc, e.get_option_name()));
      } catch (const po::error& e) {
        fail_usage("--config ", path, ": ", e.what());
      }
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    fail_usage("unknown option ", e.get_option_name(), "; see amsp ", command, " --help");
  } catch (const po::invalid_option_value& e) {
    fail_usage(dashed(e.get_option_name()), ": bad value; expected ",
               expected_for(all, e.get_option_name()));
  } catch (const po::required_option& e) {
    fail_usage("missing required option ", dashed(e.get_option_name()), "; see amsp ", command,
               " --help");
  } catch (const po::multiple_occurrences& e) {
    fail_usage("option ", dashed(e.get_option_name()), " given more than once");
  } catch (const po::invalid_command_line_syntax& e) {
    fail_usage(e.what(), "; see amsp ", command, " --help");
  } catch (const po::too_many_positional_options_error& e) {
    fail_usage("unexpected argument; see amsp ", command, " --help");
  } catch (const po::error& e) {
    fail_usage(e.what(), "; see amsp ", command, " --help");
  }
  return true;
}

po::typed_value<double>* number(double* target, double fallback) {
  return po::value<double>(target)->default_value(fallback, cat(fallback));
}

po::options_description in_flight_options(InFlight& f) {
  po::options_description desc(
      "Work in flight (the engine's temporaries; doc/engine.md, \"Reduction slots\")");
  desc.add_options()(
      "prefetch-units",
      po::value<int>(&f.prefetch)->default_value(plan::kDefaultPrefetch)->value_name("INT"),
      "with sharded parameters: units all-gathered ahead of the one computing, each in a "
      "gathered-unit buffer of its own")(
      "reduction-slots",
      po::value<int>(&f.slots)->default_value(plan::kDefaultReductionSlots)->value_name("INT"),
      "gradient reductions in flight, each in a slot of a unit's gradient and its shards; "
      "backward waits for a slot when all are busy (fewer: less memory, more waiting)");
  return desc;
}

void check_in_flight(const InFlight& f) {
  require(f.prefetch >= 1, "prefetch-units", f.prefetch, "an integer >= 1");
  require(f.slots >= 1, "reduction-slots", f.slots, "an integer >= 1");
}

po::options_description model_field_options() {
  po::options_description fields("Model field overrides (Hugging Face LlamaConfig names)");
  for (const auto& f : model::config_field_names())
    fields.add_options()(("model." + f).c_str(), po::value<std::string>()->value_name("VALUE"),
                         ("override " + f).c_str());
  return fields;
}

void apply_model_fields(const po::variables_map& vm, model::LlamaConfig& config) {
  for (const auto& f : model::config_field_names())
    if (vm.count("model." + f)) model::set_config_field(config, f, vm["model." + f].as<std::string>());
}

int run_under_mpi(int* argc, char*** argv, const std::function<int()>& body) {
  comm::MpiSession mpi(argc, argv);
  try {
    return body();
  } catch (const Error& e) {
    int rank = 0;
    AMSP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (rank != 0) throw Error("", e.exit_code());  // main prints nothing for an empty message
    throw;
  }
}

}  // namespace amsp::cli
