// The subcommands of the amsp executable. Each takes the arguments after its
// own name and returns the process exit code; errors are thrown (core/error.h)
// and reported by main.
#pragma once

namespace amsp::cli {

int run_train(int argc, char** argv);
int run_eval(int argc, char** argv);
int run_data_prepare(int argc, char** argv);
int run_plan(int argc, char** argv);
int run_comm_bench(int argc, char** argv);
int run_backend_check(int argc, char** argv);
int run_gpu_info(int argc, char** argv);
int run_ckpt_inspect(int argc, char** argv);
int run_ckpt_verify(int argc, char** argv);
int run_export(int argc, char** argv);

}  // namespace amsp::cli
