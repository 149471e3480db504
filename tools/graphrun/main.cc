// graphrun: the command line (docs/issue-6-cli.md). CLI11 parses the
// arguments; tools/graphrun/cli.{h,cc} does the work.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tools/graphrun/cli.h"

int main(int argc, char** argv) {
  namespace cli = graphrun::cli;
  CLI::App app{"graphrun: run TensorFlow-1-style graph files (GraphDef .pb / .pbtxt)", "graphrun"};
  app.require_subcommand(1);

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
  run->add_option("--out-dir", run_args.out_dir, "Also write each fetch to DIR/<name>.npy");
  run->add_option("--trace", run_args.trace,
                  "Write per-node step statistics as a Chrome trace (JSON; opens in Perfetto)");
  run->add_option("--print-limit", run_args.print_limit,
                  "Elements printed per fetched tensor (0: all)")
      ->capture_default_str();

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
  if (run->parsed()) return cli::run_command(run_args, stdout, stderr);
  return cli::kExitUsage;
}
