// amsp_hf_dump: runs one forward and backward of amsp's LLaMA on a random batch
// and writes everything needed to redo it in Hugging Face transformers to one
// HDF5 file, which validation/hf_compare.py checks against LlamaForCausalLM.
//
//   amsp_hf_dump --model NAME_OR_JSON [--set field=value ...] --seed S
//                --batch B --seq T --out dump.h5
//
// The file holds:
//   attribute config      the model as a Hugging Face config.json (string)
//   attribute loss        mean cross-entropy over valid targets (double)
//   attributes loss_sum, loss_count, seed, batch, seq_len
//   /tokens, /targets     int32 [B, T]; a target of -1 is ignored by the loss
//   /logits               float32 [B, T, vocab]
//   /params/<hf name>     float32, the tensor's own shape (Linear: [out, in])
//   /grads/<hf name>      gradient of the mean loss, same shapes
//
// Parameters come from init_unit_params, except that RMSNorm weights are drawn
// as 1 + 0.1 * normal so that the norms' scaling and its gradient are tested
// with something other than ones. A dev tool: hand-parsed options, errors as
// one line on stderr.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/h5.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/llama.h"

namespace {

using namespace amsp;

// Random streams of this tool (arbitrary constants, distinct from each other).
constexpr uint64_t kStreamTokens = 0x746f6b656e73ULL;   // "tokens"
constexpr uint64_t kStreamTargets = 0x74617267ULL;      // "targ"
constexpr uint64_t kStreamNorms = 0x6e6f726d7300ULL;    // "norms", + unit index

struct Options {
  std::string model;
  std::vector<std::pair<std::string, std::string>> sets;
  uint64_t seed = 1;
  int64_t batch = 2;
  int64_t seq = 16;
  std::string out;
};

const char* kUsage =
    "usage: amsp_hf_dump --model NAME_OR_JSON [--set field=value ...] --seed S "
    "--batch B --seq T --out dump.h5";

int64_t parse_int(const std::string& opt, const std::string& v, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < min)
    fail_usage(opt, " = '", v, "': expected an integer >= ", min);
  return x;
}

Options parse_options(int argc, char** argv) {
  Options o;
  bool have_seed = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::puts(kUsage);
      std::exit(0);
    }
    if (i + 1 >= argc) fail_usage("option ", a, " needs a value; ", kUsage);
    const std::string v = argv[++i];
    if (a == "--model") {
      o.model = v;
    } else if (a == "--set") {
      const auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0) fail_usage("--set '", v, "': expected field=value");
      o.sets.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(a, v, 0));
      have_seed = true;
    } else if (a == "--batch") {
      o.batch = parse_int(a, v, 1);
    } else if (a == "--seq") {
      o.seq = parse_int(a, v, 1);
    } else if (a == "--out") {
      o.out = v;
    } else {
      fail_usage("unknown option ", a, "; ", kUsage);
    }
  }
  if (o.model.empty()) fail_usage("--model is required; ", kUsage);
  if (o.out.empty()) fail_usage("--out is required; ", kUsage);
  if (!have_seed) fail_usage("--seed is required; ", kUsage);
  return o;
}

// --- HDF5 ---------------------------------------------------------------------

// An HDF5 identifier, owned and closed by h5::Handle; one that could not be
// made is an error naming what failed.
h5::Handle checked(hid_t id, h5::Handle::Closer close, const std::string& what) {
  h5::Handle handle(id, close);
  if (!handle.valid()) fail("HDF5: cannot ", what);
  return handle;
}

void check(herr_t status, const std::string& what) {
  if (status < 0) fail("HDF5: cannot ", what);
}

void write_dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t mem_type,
                   const std::vector<int64_t>& shape, const void* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const h5::Handle space =
      checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
              "create dataspace for " + name);
  const h5::Handle set = checked(
      H5Dcreate2(parent, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      H5Dclose, "create dataset " + name);
  check(H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write dataset " + name);
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  const h5::Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "copy string type");
  check(H5Tset_size(type, H5T_VARIABLE), "set string size");
  check(H5Tset_cset(type, H5T_CSET_UTF8), "set string charset");
  const h5::Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, "create scalar dataspace");
  const h5::Handle attr = checked(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT),
                                  H5Aclose, cat("create attribute ", name));
  const char* p = value.c_str();
  check(H5Awrite(attr, type, &p), cat("write attribute ", name));
}

template <typename T>
void write_scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, T value) {
  const h5::Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, "create scalar dataspace");
  const h5::Handle attr = checked(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                                  H5Aclose, cat("create attribute ", name));
  check(H5Awrite(attr, mem_type, &value), cat("write attribute ", name));
}

// --- the run ------------------------------------------------------------------

int run(const Options& o) {
  model::LlamaConfig config = model::load_config(o.model);
  for (const auto& [field, value] : o.sets) model::set_config_field(config, field, value);
  config.validate();

  const int64_t B = o.batch, T = o.seq, V = config.vocab_size;
  if (T > config.max_position_embeddings)
    fail_usage("--seq ", T, " exceeds max_position_embeddings = ", config.max_position_embeddings);

  const auto be = backend::make_cpu_backend(DType::kF32);
  model::Llama llama(config, *be, B, T);
  const std::vector<model::UnitSpec>& units = llama.units();
  const int num_units = llama.num_units();

  // Parameters: the trainer's initialisation, with the norms perturbed.
  std::vector<std::vector<float>> params(num_units), grads(num_units);
  for (int u = 0; u < num_units; ++u) {
    const model::UnitSpec& unit = units[u];
    params[u].assign(unit.numel, 0.0f);
    grads[u].assign(unit.numel, 0.0f);
    model::init_unit_params(unit, u, o.seed, params[u].data());
    for (const model::TensorSpec& t : unit.tensors) {
      if (!t.is_norm) continue;
      for (int64_t i = 0; i < t.numel; ++i)
        params[u][t.offset + i] = static_cast<float>(
            1.0 + 0.1 * random_normal(o.seed, kStreamNorms + u, static_cast<uint64_t>(t.offset + i)));
    }
  }

  // A random batch; a few targets are -1 to test that they are ignored.
  const int64_t N = B * T;
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(random_below(o.seed, kStreamTokens, i, V));
    targets[i] = static_cast<int32_t>(random_below(o.seed, kStreamTargets, i, V));
  }
  for (int64_t i : {int64_t{1}, T + T / 2, N - 1})
    if (i < N && N > 1) targets[i] = -1;
  int64_t valid = 0;
  for (int32_t t : targets) valid += t >= 0;
  if (valid == 0) fail_usage("batch too small: no valid target left");

  llama.set_batch(tokens.data(), targets.data(), B, T, 1.0f / static_cast<float>(valid));
  const auto host = [&](std::vector<float>& v) { return backend::host_view(v.data(), static_cast<int64_t>(v.size())); };
  for (int u = 0; u < num_units; ++u) llama.forward(u, host(params[u]));
  const std::vector<float> logits(llama.logits().f32(), llama.logits().f32() + N * V);
  const double loss_sum = llama.loss_sum();
  const int64_t loss_count = llama.loss_count();
  if (loss_count != valid) fail("model counted ", loss_count, " valid targets, expected ", valid);
  for (int u = num_units - 1; u >= 0; --u)
    llama.backward(u, host(params[u]), host(grads[u]), model::Llama::Grads::kAdd);

  // Write the dump.
  const h5::Handle file = checked(H5Fcreate(o.out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                  H5Fclose, "create " + o.out);
  write_string_attr(file, "config", model::config_to_json(config));
  write_scalar_attr(file, "loss", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, loss_sum / loss_count);
  write_scalar_attr(file, "loss_sum", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, loss_sum);
  write_scalar_attr(file, "loss_count", H5T_STD_I64LE, H5T_NATIVE_INT64, int64_t{loss_count});
  write_scalar_attr(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, uint64_t{o.seed});
  write_scalar_attr(file, "batch", H5T_STD_I64LE, H5T_NATIVE_INT64, int64_t{B});
  write_scalar_attr(file, "seq_len", H5T_STD_I64LE, H5T_NATIVE_INT64, int64_t{T});
  write_dataset(file, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {B, T}, tokens.data());
  write_dataset(file, "targets", H5T_STD_I32LE, H5T_NATIVE_INT32, {B, T}, targets.data());
  write_dataset(file, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {B, T, V}, logits.data());

  const h5::Handle pgroup =
      checked(H5Gcreate2(file, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
              "create group /params");
  const h5::Handle ggroup =
      checked(H5Gcreate2(file, "grads", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
              "create group /grads");
  for (int u = 0; u < num_units; ++u) {
    for (const model::TensorSpec& t : units[u].tensors) {
      write_dataset(pgroup, t.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, t.shape, params[u].data() + t.offset);
      write_dataset(ggroup, t.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, t.shape, grads[u].data() + t.offset);
    }
  }
  check(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush " + o.out);
  std::fprintf(stderr, "amsp_hf_dump: %s: B=%lld T=%lld vocab=%lld loss=%.6f (%lld targets)\n",
               o.out.c_str(), static_cast<long long>(B), static_cast<long long>(T),
               static_cast<long long>(V), loss_sum / loss_count, static_cast<long long>(loss_count));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const amsp::h5::QuietErrors quiet;  // errors are reported as one line below
  try {
    return run(parse_options(argc, argv));
  } catch (const amsp::Error& e) {
    std::fprintf(stderr, "amsp_hf_dump: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amsp_hf_dump: %s\n", e.what());
    return amsp::kExitFailure;
  }
}
