// graphrun: the command line (docs/cli.md). CLI11 parses the
// arguments; tools/graphrun/cli.{h,cc} does the work.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <system_error>

#include "tools/graphrun/bench.h"
#include "tools/graphrun/cli.h"
#include "tools/graphrun/dot.h"
#include "tools/graphrun/info.h"

namespace {

// Output paths: an empty one would silently write nothing (a usage error,
// exit 2, naming the option).
const CLI::Validator kNonEmptyPath(
    [](std::string& path) {
      return path.empty() ? std::string("the path is empty") : std::string();
    },
    "PATH");

// A whole decimal count from 0 to INT64_MAX: CLI11 read "" as 0 and took
// counts past int64 without a word.
const CLI::Validator kCount(
    [](std::string& text) {
      int64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0) {
        return fmt::format("'{}' is not a count from 0 to {}", text,
                           std::numeric_limits<int64_t>::max());
      }
      return std::string();
    },
    "COUNT");

// `code`, unless standard output could not be written (a full disk,
// /dev/full, a closed pipe's reader): then that is an error, exit 1, as
// for -o and --trace files. The output would otherwise be lost silently.
int checked_stdout(int code) {
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return code;
  const int error = errno;
  fmt::print(stderr, "graphrun: cannot write to standard output: {}\n",
             error != 0 ? std::generic_category().message(error) : std::string("write error"));
  return code == 0 ? graphrun::cli::kExitRuntime : code;
}

int run_main(int argc, char** argv) {
  namespace cli = graphrun::cli;
  CLI::App app{"graphrun: run TensorFlow-1-style graph files (GraphDef .pb / .pbtxt)", "graphrun"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", [] { return cli::version_text(); },
      "Print the version and the kernels' instruction-set level (GRAPHRUN_CPU_ISA=baseline|avx2|"
      "avx512 lowers it; an invalid value is named there) and exit 0");

  cli::RunArgs run_args;
  CLI::App* run = app.add_subcommand("run", "Run a graph: feed tensors, print or save fetches");
  run->add_option("graph", run_args.graph, "Graph file (.pb binary, .pbtxt text)")->required();
  run->add_option("--feed", run_args.feeds,
                  "NAME=VALUES (3 | 1,2,3 | [[1,2],[3,4]] | true) or NAME=@FILE.npy; repeatable")
      ->allow_extra_args(false);
  run->add_option("--fetch", run_args.fetches, "Tensor to fetch (node or node:index); repeatable")
      ->allow_extra_args(false);
  run->add_option("--target", run_args.targets, "Node to run without fetching; repeatable")
      ->allow_extra_args(false);
  run->add_option("--partial", run_args.partial,
                  "One partial_run call: 'feed NAME=VALUES; fetch A,B; target N'; repeatable, in "
                  "order (setup declares their union)")
      ->allow_extra_args(false);
  run->add_option("--init", run_args.init,
                  "Node to run first, in a run of its own (e.g. init for variables); repeatable")
      ->allow_extra_args(false);
  run->add_option("--out-dir", run_args.out_dir, "Also write each fetch to DIR/<name>.npy")
      ->check(kNonEmptyPath);
  run->add_option("--trace", run_args.trace,
                  "Write per-node step statistics as a Chrome trace (JSON; opens in Perfetto)")
      ->check(kNonEmptyPath);
  run->add_option("--print-limit", run_args.print_limit,
                  "Elements printed per fetched tensor (0: all)")
      ->check(kCount)
      ->capture_default_str();

  cli::DotArgs dot_args;
  CLI::App* dot = app.add_subcommand(
      "dot",
      "Write the graph as Graphviz DOT: the part a signature needs, the calls of a traced "
      "partial run");
  dot->add_option("graph", dot_args.graph, "Graph file (.pb binary, .pbtxt text)")->required();
  dot->add_option("--feed", dot_args.feeds, "Fed tensor name (replaces its producer); repeatable")
      ->allow_extra_args(false);
  dot->add_option("--fetch", dot_args.fetches, "Fetched tensor; repeatable")
      ->allow_extra_args(false);
  dot->add_option("--target", dot_args.targets, "Target node; repeatable")->allow_extra_args(false);
  dot->add_option("--trace-partial", dot_args.trace_partial,
                  "Run a traced partial run, one call per step ('feed x=1; fetch y', as run "
                  "--partial), and colour nodes by the call that ran them; repeatable")
      ->allow_extra_args(false);
  dot->add_option("--init", dot_args.init,
                  "With --trace-partial: node to run first, untraced; repeatable")
      ->allow_extra_args(false);
  dot->add_option("-o,--out", dot_args.out, "Write DOT to this file (default: stdout)")
      ->check(kNonEmptyPath);
  dot->add_option("--svg", dot_args.svg, "Render SVG to this file with Graphviz's dot")
      ->check(kNonEmptyPath);

  cli::BenchArgs bench_args;
  CLI::App* bench = app.add_subcommand(
      "bench", "Run one signature from many threads on one session: runs/s and latency");
  bench->add_option("graph", bench_args.graph, "Graph file (.pb binary, .pbtxt text)")->required();
  bench->add_option("--feed", bench_args.feeds, "NAME=VALUES or NAME=@FILE.npy; repeatable")
      ->allow_extra_args(false);
  bench->add_option("--fetch", bench_args.fetches, "Tensor to fetch; repeatable")
      ->allow_extra_args(false);
  bench->add_option("--target", bench_args.targets, "Node to run; repeatable")
      ->allow_extra_args(false);
  bench->add_option("--init", bench_args.init, "Node to run once first (untimed); repeatable")
      ->allow_extra_args(false);
  bench
      ->add_option(
          "--threads", bench_args.threads,
          fmt::format("Client threads calling the session (1 to {})", cli::kMaxBenchThreads))
      ->capture_default_str();
  bench->add_option("--runs", bench_args.runs, "Timed runs in total, across all threads (exact)");
  bench->add_option(
      "--seconds", bench_args.seconds,
      fmt::format("Run for this many seconds instead (at most {:g})", cli::kMaxBenchSeconds));
  bench->add_option("--warmup", bench_args.warmup, "Untimed runs per thread before timing")
      ->capture_default_str();
  bench
      ->add_option("--inter-op-threads", bench_args.inter_op_threads,
                   "Session threads executing kernels (0: one per core)")
      ->capture_default_str();
  bench->add_flag("--json", bench_args.json, "Print one JSON object (for scripts)");
  bench->add_flag("--no-progress", bench_args.no_progress,
                  "No progress bar (shown only when stderr is a terminal)");

  CLI::App* info = app.add_subcommand(
      "info",
      "Print the version, the kernels' instruction-set level and the session thread counts "
      "(default and most); exits 1, the reason on stderr, when GRAPHRUN_CPU_ISA is invalid "
      "(no session could be created)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "graphrun: {} (see graphrun --help)\n", e.what());
    return cli::kExitUsage;
  }
  int code = cli::kExitUsage;
  if (run->parsed()) {
    code = cli::run_command(run_args, stdout, stderr);
  } else if (dot->parsed()) {
    code = cli::dot_command(dot_args, stdout, stderr);
  } else if (bench->parsed()) {
    code = cli::bench_command(bench_args, stdout, stderr);
  } else if (info->parsed()) {
    code = cli::info_command(stdout, stderr);
  }
  return checked_stdout(code);
}

}  // namespace

int main(int argc, char** argv) {
  // The commands report errors as statuses; an exception reaching here is a
  // bug, still reported as one line and exit code 1 rather than an abort.
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    // stdio only: nothing here may throw again. what() may hold newlines.
    std::fflush(stdout);
    std::fputs("graphrun: internal error: ", stderr);
    for (const char* c = e.what(); *c != '\0'; ++c) std::fputc(*c == '\n' ? ' ' : *c, stderr);
    std::fputc('\n', stderr);
  } catch (...) {
    std::fflush(stdout);
    std::fputs("graphrun: internal error: an unknown exception\n", stderr);
  }
  return graphrun::cli::kExitRuntime;
}
