// amsp eval: the loss of a checkpoint on a dataset, on any number of ranks.

#include "backend/factory.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "data/mixture.h"
#include "engine/evaluate.h"

#include <filesystem>

namespace amsp::cli {

int run_eval(int argc, char** argv) {
  engine::EvalOptions o;
  std::string split, device;
  po::options_description desc("Options");
  desc.add_options()
      ("checkpoint", po::value<std::string>(&o.checkpoint)->required()->value_name("FILE"),
           "a checkpoint written by amsp train --checkpoint-dir")
      ("data", po::value<std::string>(&o.data_path)->required()->value_name("FILE.h5[:W],..."),
           "token dataset from `amsp data prepare`, or a mixture a.h5:0.7,b.h5:0.3: the loss of each "
           "and their mean weighted by the mixture")
      ("split", po::value<std::string>(&split)->default_value("valid")->value_name("valid|train"),
           "which split to evaluate")
      ("seq-len", po::value<int64_t>(&o.seq_len)->default_value(128)->value_name("INT"), "tokens per window")
      ("batch-size", po::value<int64_t>(&o.batch_size)->default_value(8)->value_name("INT"),
           "windows per forward pass per rank")
      ("windows", po::value<int64_t>(&o.windows)->default_value(0)->value_name("INT"),
           "evaluate the first N windows; 0: the whole split")
      ("shard", po::value<std::string>(&o.shard)->default_value("zero3")->value_name("PLAN"),
           "how ranks share the parameters (any plan of amsp train)")
      ("threads", po::value<int>(&o.threads)->default_value(0)->value_name("INT"), "OpenMP threads per rank")
      ("device", po::value<std::string>(&device)->value_name("cpu|cuda"),
           "compute backend, as for amsp train (default: cuda when built with CUDA and a GPU is visible)");
  po::variables_map vm;
  if (!parse_command("eval", "Prints the loss of a checkpoint on a token dataset.", desc, argc, argv, vm))
    return 0;
  require(split == "valid" || split == "train", "split", split, "valid or train");
  o.split = split == "train" ? data::Split::kTrain : data::Split::kValid;
  require(o.seq_len >= 2, "seq-len", o.seq_len, "an integer >= 2");
  require(o.batch_size >= 1, "batch-size", o.batch_size, "an integer >= 1");
  require(o.windows >= 0, "windows", o.windows, "an integer >= 0");
  if (device.empty()) {
    o.device = backend::default_device();
  } else {
    const auto d = backend::parse_device(device);
    require(d.has_value(), "device", device, "cpu or cuda");
    backend::check_device_usable(*d);
    o.device = *d;
  }
  data::parse_mixture(o.data_path);
  if (!std::filesystem::is_regular_file(o.checkpoint))
    fail_usage("--checkpoint ", o.checkpoint, ": no such file");

  return run_under_mpi(&argc, &argv, [&] {
    engine::run_eval(o);
    return kExitOk;
  });
}

}  // namespace amsp::cli
