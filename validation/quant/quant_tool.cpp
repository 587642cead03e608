// amsp_quant_tool: runs a backend's quantize, dequantize and dequantize_sum on
// raw fp32 inputs, for validation/quant/quant_compare.py to check bit for bit
// against NumPy.
//
//   amsp_quant_tool --device cpu|cuda --cases FILE
//
// Each line of FILE is one case:
//
//   BITS BLOCK N RECORDS IN OUT INPUT PREFIX
//
// IN and OUT are fp32 or bf16; INPUT holds RECORDS * N little-endian float32
// values (stored on the backend in IN, bf16 rounded to nearest even). The tool
// quantizes them and writes PREFIX.records (the int32 words), PREFIX.dequant
// (RECORDS * N values dequantized into OUT) and PREFIX.sum (the N values of
// dequantize_sum over the records), the last two as float32 (bf16 widened,
// exactly). --device cuda runs the CUDA backend: on a GPU in a CUDA build, on
// the emulation of CUDA in any other. A test tool: hand-parsed options,
// errors as one line on stderr.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kernels/common/quant.h"

namespace {

using namespace amsp;

const char* kUsage = "usage: amsp_quant_tool --device cpu|cuda --cases FILE";

struct Case {
  kernels::quant::Spec spec;
  int64_t n = 0, records = 0;
  DType in = DType::kF32, out = DType::kF32;
  std::string input, prefix;
};

DType parse_float_dtype(const std::string& s, const std::string& where) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  fail_usage(where, ": dtype '", s, "', expected fp32 or bf16");
}

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail_usage("cannot read the cases file ", path);
  std::vector<Case> cases;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    Case c;
    std::string in_dtype, out_dtype;
    if (!(fields >> c.spec.bits >> c.spec.block >> c.n >> c.records >> in_dtype >> out_dtype >> c.input >>
          c.prefix))
      fail_usage(path, ":", number, ": expected BITS BLOCK N RECORDS IN OUT INPUT PREFIX");
    const std::string where = cat(path, ":", number);
    c.in = parse_float_dtype(in_dtype, where);
    c.out = parse_float_dtype(out_dtype, where);
    cases.push_back(c);
  }
  return cases;
}

std::vector<float> read_floats(const std::string& path, int64_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> v(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * 4));
  if (!in || in.peek() != std::char_traits<char>::eof())
    fail(path, ": expected exactly ", count, " float32 values");
  return v;
}

template <typename T>
void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!out) fail("cannot write ", path);
}

void run_case(backend::Backend& be, const Case& c) {
  const std::vector<float> x = read_floats(c.input, c.records * c.n);
  const int64_t words = c.records * kernels::quant::record_words(c.n, c.spec);
  backend::Buffer values = be.alloc(c.in, c.records * c.n);
  backend::Buffer records = be.alloc(DType::kI32, words);
  backend::Buffer dequant = be.alloc(c.out, c.records * c.n), sum = be.alloc(c.out, c.n);
  be.from_host(x.data(), values.view());
  be.quantize(values.view(), c.n, c.records, records.view(), c.spec);
  be.dequantize(records.view(), c.n, c.records, dequant.view(), c.spec);
  be.dequantize_sum(records.view(), c.n, c.records, sum.view(), c.spec);
  std::vector<int32_t> w(static_cast<size_t>(words));
  std::vector<float> y(static_cast<size_t>(c.records * c.n)), s(static_cast<size_t>(c.n));
  be.to_host(records.view(), w.data());
  be.to_host(dequant.view(), y.data());
  be.to_host(sum.view(), s.data());
  write_raw(c.prefix + ".records", w);
  write_raw(c.prefix + ".dequant", y);
  write_raw(c.prefix + ".sum", s);
}

int run(int argc, char** argv) {
  std::string device, cases_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::puts(kUsage);
      return 0;
    }
    if (i + 1 >= argc) fail_usage("option ", a, " needs a value; ", kUsage);
    const std::string v = argv[++i];
    if (a == "--device")
      device = v;
    else if (a == "--cases")
      cases_path = v;
    else
      fail_usage("unknown option ", a, "; ", kUsage);
  }
  if (device != "cpu" && device != "cuda") fail_usage("--device cpu|cuda is required; ", kUsage);
  if (cases_path.empty()) fail_usage("--cases is required; ", kUsage);
  const std::vector<Case> cases = read_cases(cases_path);
  const std::unique_ptr<backend::Backend> be = device == "cpu" ? backend::make_cpu_backend(DType::kF32)
                                                               : backend::make_cuda_backend(DType::kF32, 0);
  for (const Case& c : cases) run_case(*be, c);
  std::fprintf(stderr, "amsp_quant_tool: %zu cases on %s\n", cases.size(), be->describe().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const amsp::Error& e) {
    std::fprintf(stderr, "amsp_quant_tool: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "amsp_quant_tool: %s\n", e.what());
    return amsp::kExitFailure;
  }
}
