// File: tools/graphrun/info.h
// `graphrun info` and `graphrun --version`: the version, the level the
// built-in kernels run at (GRAPHRUN_CPU_ISA may lower it) and, for `info`,
// the session thread counts.
//
// Thread safety: stateless functions; thread-safe for distinct arguments.
#pragma once

#include <cstdio>
#include <string>

namespace graphrun::cli {

// `graphrun --version`'s text (no final newline):
//   graphrun 0.1.0
//   kernels: avx512 (this CPU supports up to avx512)
// An invalid GRAPHRUN_CPU_ISA is named on the kernels line
// ("kernels: error: GRAPHRUN_CPU_ISA='sse9' ..."); --version still exits 0.
std::string version_text();

// Prints the version text, then
//   default threads: N   (ThreadPool::default_threads(): inter_op_threads = 0)
//   max threads: M       (ThreadPool::max_threads())
// to `out`. Returns kExitOk, or kExitRuntime with one line naming the error
// on `err` when GRAPHRUN_CPU_ISA is invalid (every session would fail to be
// created); `out` is printed in full either way.
int info_command(std::FILE* out, std::FILE* err);

}  // namespace graphrun::cli
