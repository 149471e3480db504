// The CLI's error paths through the real binary: one line on stderr
// naming the culprit, nothing on stdout, exit code 2 (usage) or 1 (runtime).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/tools/cli_runner.h"
#include "tools/graphrun/npy.h"

namespace graphrun {
namespace {

class CliErrorTest : public testing_cli::CliTest {};
using testing_cli::kTf;

TEST_F(CliErrorTest, MissingGraphFileExits1) {
  expect_error(run({"run", (dir_ / "nope.pbtxt").string(), "--fetch", "a"}), 1, "nope.pbtxt");
}

TEST_F(CliErrorTest, BadFeedSyntaxExits2) {
  expect_error(
      run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=1,,3", "--fetch", "add"}),
      2, "feed 'x': bad value '1,,3'");
  expect_error(
      run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x", "--fetch", "add"}), 2,
      "expected NAME=VALUES");
  expect_error(run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--partial", "fetch",
                    "--fetch", "add"}),
               2, "--partial");
}

TEST_F(CliErrorTest, UnknownTensorExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"run", g, "--feed", "nope=1", "--fetch", "add"}), 1, "feed 'nope'");
  expect_error(run({"run", g, "--feed", "x=1,2,3", "--fetch", "add:7"}), 1, "fetch 'add:7'");
  expect_error(run({"run", g, "--target", "nope"}), 1, "target 'nope'");
}

TEST_F(CliErrorTest, DtypeMismatchExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"run", g, "--feed", "x=1,true,3", "--fetch", "add"}), 1,
               "feed 'x': 'true' is not a valid float32 value");
  const auto f8 = dir_ / "x.npy";
  ASSERT_TRUE(npy::write_file(Tensor{1.0, 2.0, 3.0}, f8).is_ok());
  expect_error(run({"run", g, "--feed", "x=@" + f8.string(), "--fetch", "add"}), 1,
               "holds float64 but 'x' is float32 (convert with a.astype('float32'))");
}

TEST_F(CliErrorTest, ShapeMismatchExits1) {
  expect_error(run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=[[1,2,3]]",
                    "--fetch", "add"}),
               1, "feed 'x': the value has shape [1,3] but 'x' is declared float32 [3]");
}

TEST_F(CliErrorTest, UnreadableNpyExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"run", g, "--feed", "x=@" + (dir_ / "missing.npy").string(), "--fetch", "add"}),
               1, "missing.npy");
  std::ofstream(dir_ / "junk.npy") << "not numpy";
  expect_error(run({"run", g, "--feed", "x=@" + (dir_ / "junk.npy").string(), "--fetch", "add"}), 1,
               "junk.npy: not a NumPy .npy file");
}

TEST_F(CliErrorTest, UnfedPlaceholderExits1) {
  expect_error(run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--fetch", "add"}), 1,
               "run failed: InvalidArgument: You must feed a value for placeholder tensor 'x'");
}

TEST_F(CliErrorTest, UsageErrorsExit2) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"run", g}), 2, "nothing to run");
  expect_error(run({"run", g, "--partial", "fetch add", "--feed", "x=1,2,3"}), 2,
               "--partial cannot be combined");
  expect_error(run({"run", g, "--bogus"}), 2, "--bogus");
  expect_error(run({}), 2, "subcommand");
}

}  // namespace
}  // namespace graphrun
