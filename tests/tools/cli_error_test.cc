// The CLI's error paths through the real binary: one line on stderr
// naming the culprit, nothing on stdout, exit code 2 (usage) or 1 (runtime).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "tests/graphdef/nested_graph_def.h"
#include "tests/tools/cli_runner.h"
#include "tools/graphrun/cli.h"
#include "tools/graphrun/npy.h"

namespace graphrun {
namespace {

class CliErrorTest : public testing_cli::CliTest {};
using ::testing::HasSubstr;
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
  // One sign: "+-1" was read as -1.
  expect_error(run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=+-1,2,3",
                    "--fetch", "add"}),
               2, "'+-1' is not a number");
}

TEST_F(CliErrorTest, UnknownTensorExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(run({"run", g, "--feed", "nope=1", "--fetch", "add"}), 1, "feed 'nope'");
  expect_error(run({"run", g, "--feed", "x=1,2,3", "--fetch", "add:7"}), 1, "fetch 'add:7'");
  expect_error(run({"run", g, "--target", "nope"}), 1, "target 'nope'");
  // A target's output index must be one of the node's, as a fetch's.
  expect_error(run({"run", g, "--feed", "x=1,2,3", "--target", "add:5"}), 1,
               "target 'add:5': node 'add' (Add) has 1 output(s)");
  expect_error(run({"dot", g, "--target", "add:7"}), 1, "target 'add:7'");
}

// Standard output that cannot be written (a full disk) is an error, as an
// -o or --trace file is: the result is not lost with exit code 0.
TEST_F(CliErrorTest, StandardOutputThatCannotBeWrittenExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const std::vector<std::vector<std::string>> commands = {
      {"run", g, "--feed", "x=1,2,3", "--fetch", "add"},
      {"dot", g, "--fetch", "add"},
      {"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--runs", "3"},
      {"info"}};
  for (const auto& args : commands) {
    const Outcome o = run_with_env("", args, "/dev/full");
    EXPECT_EQ(o.code, 1) << args[0];
    EXPECT_EQ(o.signal, 0) << args[0];
    EXPECT_THAT(o.err, HasSubstr("graphrun: cannot write to standard output")) << args[0];
  }
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
  // --print-limit takes a count: not empty, not past int64.
  for (const char* limit : {"", "99999999999999999999", "-1", "1.5", "x"}) {
    expect_error(run({"run", g, "--feed", "x=1,2,3", "--fetch", "add", "--print-limit", limit}), 2,
                 "--print-limit");
  }
}

// Files the CLI cannot take (issue 12, item 4). Each once ended in a signal:
// a stack overflow in protobuf's text parser, an uncaught std::ios_failure
// (a directory), a read until std::bad_alloc (/dev/zero). Now: exit code 1
// and one line naming the file.

TEST_F(CliErrorTest, DeepTextGraphDefExits1) {
  // 9000 nested messages, 141 kB on one line.
  const std::string g = (dir_ / "deep.pbtxt").string();
  std::ofstream(g) << graphrun::testing::nested_graph_def_text(9000);
  const Outcome o = run({"run", g, "--fetch", "a"});
  expect_error(o, 1, "graph file '" + g + "'");
  EXPECT_THAT(o.err, HasSubstr("InvalidArgument: not a text-format GraphDef: line 1, column"));
  EXPECT_THAT(o.err, HasSubstr("Message is too deep"));
}

TEST_F(CliErrorTest, DeepBinaryGraphDefExits1) {
  const std::string g = (dir_ / "deep.pb").string();
  std::ofstream(g, std::ios::binary) << graphrun::testing::nested_graph_def_binary(9000);
  const Outcome o = run({"run", g, "--fetch", "a"});
  expect_error(o, 1, "graph file '" + g + "'");
  EXPECT_THAT(o.err, HasSubstr("messages nest more than 100 levels deep"));
}

TEST_F(CliErrorTest, DirectoryAsGraphFileExits1) {
  const std::string g = (dir_ / "graph.pbtxt").string();
  std::filesystem::create_directories(g);
  const std::string want = "graph file '" + g + "': InvalidArgument: is a directory";
  expect_error(run({"run", g, "--fetch", "a"}), 1, want);
  expect_error(run({"dot", g}), 1, want);
  expect_error(run({"bench", g, "--fetch", "a", "--runs", "1"}), 1, want);
}

TEST_F(CliErrorTest, DirectoryAsNpyFeedExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const std::string x = (dir_ / "x.npy").string();
  std::filesystem::create_directories(x);
  const std::string want = "feed 'x': " + x + ": is a directory, not a regular .npy file";
  expect_error(run({"run", g, "--feed", "x=@" + x, "--fetch", "add"}), 1, want);
  expect_error(run({"run", g, "--partial", "feed x=@" + x + "; fetch add"}), 1, want);
  expect_error(run({"bench", g, "--feed", "x=@" + x, "--fetch", "add", "--runs", "1"}), 1, want);
  expect_error(run({"dot", g, "--trace-partial", "feed x=@" + x + "; fetch add"}), 1, want);
}

TEST_F(CliErrorTest, DevZeroAsGraphFileExits1) {
  expect_error(run({"run", "/dev/zero", "--fetch", "a"}), 1,
               "graph file '/dev/zero': InvalidArgument: is a character device");
}

TEST_F(CliErrorTest, DevZeroAsNpyFeedExits1) {
  expect_error(run({"run", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=@/dev/zero",
                    "--fetch", "add"}),
               1, "feed 'x': /dev/zero: is a character device, not a regular .npy file");
}

// A version 1.0 .npy file by hand: magic, version, header length, dict, data.
std::string npy_file(std::string_view dict, std::string_view data) {
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xFF);
  out += static_cast<char>((dict.size() >> 8) & 0xFF);
  out += dict;
  out += data;
  return out;
}

TEST_F(CliErrorTest, TruncatedNpyExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const std::string x = (dir_ / "short.npy").string();
  std::ofstream(x, std::ios::binary) << npy_file(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", std::string(8, '\0'));
  expect_error(run({"run", g, "--feed", "x=@" + x, "--fetch", "add"}), 1,
               x + ": truncated .npy data: float32[3] needs 12 bytes, 8 present");
  // A header longer than the file.
  const std::string h = (dir_ / "header.npy").string();
  std::ofstream(h, std::ios::binary) << std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{", 13);
  expect_error(run({"run", g, "--feed", "x=@" + h, "--fetch", "add"}), 1,
               h + ": truncated .npy header: 4294967295 bytes declared, 1 present");
}

TEST_F(CliErrorTest, NpyDeclaringAHugeShapeExits1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  // 4 PB of float32 declared, 12 bytes present: refused before allocating.
  const std::string x = (dir_ / "huge.npy").string();
  std::ofstream(x, std::ios::binary)
      << npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000, 1000), }",
                  std::string(12, '\0'));
  expect_error(run({"run", g, "--feed", "x=@" + x, "--fetch", "add"}), 1,
               x + ": truncated .npy data: float32[1000000,1000000,1000] needs 4000000000000000 "
                   "bytes, 12 present");
  // More elements than int64 counts.
  const std::string y = (dir_ / "huger.npy").string();
  std::ofstream(y, std::ios::binary) << npy_file(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 100000000000), }",
      std::string(12, '\0'));
  expect_error(run({"run", g, "--feed", "x=@" + y, "--fetch", "add"}), 1, y + ": shape");
}

// The probe's "more elements than int64 counts" shape: 0 and two INT64_MAX.
TEST_F(CliErrorTest, NpyShapesAreJudgedWhereverTheZeroStands) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const std::string x = (dir_ / "zero_first.npy").string();
  std::ofstream(x, std::ios::binary) << npy_file(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807, "
      "9223372036854775807), }",
      "");
  expect_error(run({"run", g, "--feed", "x=@" + x, "--fetch", "add"}), 1,
               x + ": shape [0,9223372036854775807,9223372036854775807] has more elements than "
                   "int64 can count");
  // Zero elements, but 2^64 bytes of the other dimensions: named.
  const std::string y = (dir_ / "too_large.npy").string();
  std::ofstream(y, std::ios::binary) << npy_file(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 1, 0), }", "");
  expect_error(run({"run", g, "--feed", "x=@" + y, "--fetch", "add"}), 1,
               y + ": tensor float32[4611686018427387904,1,0] is too large");
}

std::string const_graph(const std::string& name, const std::vector<int64_t>& dims) {
  std::string shape;
  for (const int64_t d : dims) shape += fmt::format("dim {{ size: {} }} ", d);
  return fmt::format(
      "node {{ name: \"{}\" op: \"Const\" attr {{ key: \"dtype\" value {{ type: DT_FLOAT }} }} "
      "attr {{ key: \"value\" value {{ tensor {{ dtype: DT_FLOAT tensor_shape {{ {}}} }} }} }} "
      "}}\n",
      name, shape);
}

// A Const of [M,M,0] and of [0,M,M] (M = INT64_MAX) are refused alike; the
// second was accepted and written as a .npy graphrun then refused to read.
TEST_F(CliErrorTest, ConstShapesAreJudgedWhereverTheZeroStands) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{kMax, kMax, 0}, {0, kMax, kMax}, {kMax, 0, kMax}}) {
    const std::string g = (dir_ / "g.pbtxt").string();
    std::ofstream(g) << const_graph("c", dims);
    expect_error(run({"run", g, "--fetch", "c", "--out-dir", (dir_ / "od").string()}), 1,
                 "more elements than int64 can count");
  }
}

// A zero-element fetch prints within --print-limit (before: [10^8,0] printed
// 400 MB, [10^5,10^5,0] never ended) and round-trips through --out-dir.
TEST_F(CliErrorTest, ZeroElementFetchesPrintWithinTheLimit) {
  const std::string g = (dir_ / "g.pbtxt").string();
  std::ofstream(g) << const_graph("c", {3000, 3000, 0}) + const_graph("d", {0, 1 << 29, 1 << 30});
  const std::string od = (dir_ / "od").string();
  const auto o =
      run({"run", g, "--fetch", "c", "--fetch", "d", "--print-limit", "1", "--out-dir", od});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out,
            "c: float32[3000,3000,0] [[[], ...], ...] (1 of 9000000 empty lists shown)\n"
            "d: float32[0,536870912,1073741824] []\n");
  // graphrun reads back what it wrote.
  const std::string g2 = (dir_ / "g2.pbtxt").string();
  std::ofstream(g2) << "node { name: \"x\" op: \"Placeholder\" attr { key: \"dtype\" value { "
                       "type: DT_FLOAT } } }\n";
  for (const char* name : {"c", "d"}) {
    const auto back =
        run({"run", g2, "--feed", fmt::format("x=@{}/{}.npy", od, name), "--fetch", "x"});
    EXPECT_EQ(back.code, 0) << back.err;
  }
}

// Empty output paths are usage errors naming the option, not silently
// ignored.
TEST_F(CliErrorTest, EmptyOutputPathsExit2) {
  const std::string g = kTf + "/const_sum_axis1.pbtxt";
  expect_error(run({"run", g, "--fetch", "Sum", "--out-dir", ""}), 2, "--out-dir");
  expect_error(run({"run", g, "--fetch", "Sum", "--trace", ""}), 2, "--trace");
  expect_error(run({"run", g, "--fetch", "Sum", "--out-dir", "", "--trace", ""}), 2,
               "the path is empty");
  expect_error(run({"dot", g, "-o", ""}), 2, "--out");
  expect_error(run({"dot", g, "--svg", ""}), 2, "--svg");
}

// A node name escaping past NAME_MAX gets a shortened file name (before:
// "File name too long" after the values were printed).
TEST_F(CliErrorTest, LongNodeNamesGetShortenedOutputFiles) {
  std::string name;
  for (int i = 0; i < 100; ++i) name += "a/";
  name += 'x';
  const std::string g = (dir_ / "g.pbtxt").string();
  std::ofstream(g) << fmt::format(
      "node {{ name: \"{}\" op: \"Const\" attr {{ key: \"dtype\" value {{ type: DT_FLOAT }} }} "
      "attr {{ key: \"value\" value {{ tensor {{ dtype: DT_FLOAT tensor_shape {{ }} float_val: "
      "1 }} }} }} }}\n",
      name);
  const std::string od = (dir_ / "od").string();
  const auto o = run({"run", g, "--fetch", name, "--out-dir", od});
  ASSERT_EQ(o.code, 0) << o.err;
  const std::filesystem::path file = std::filesystem::path(od) / cli::output_file_name(name);
  EXPECT_TRUE(std::filesystem::is_regular_file(file)) << file;
  EXPECT_LE(file.filename().string().size(), 255u);
  auto back = npy::read_file(file);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->scalar<float>(), 1.0f);
}

// A cycle of 20,000 nodes: the error line is cut, not 250 kB long.
TEST_F(CliErrorTest, LongCycleErrorIsCut) {
  const std::string g = (dir_ / "cycle.pbtxt").string();
  {
    std::ofstream out(g);
    constexpr int kNodes = 20000;
    for (int i = 0; i < kNodes; ++i) {
      out << fmt::format(
          "node {{ name: \"n{}\" op: \"Identity\" input: \"n{}\" attr {{ key: \"T\" value {{ "
          "type: DT_FLOAT }} }} }}\n",
          i, (i + kNodes - 1) % kNodes);
    }
  }
  const auto o = run({"run", g, "--fetch", "n5"});
  // The import names a long cycle by its ends and a count (the CLI's own
  // cut of long lines is CliErrorLineTest's).
  expect_error(o, 1, "is on a cycle of inputs of 20000 nodes: ");
  EXPECT_LT(o.err.size(), 1000U);
  EXPECT_THAT(o.err, HasSubstr(" <- ... 19984 more ... <- "));
}

TEST_F(CliErrorTest, OutputPathsThatCannotBeWrittenExit1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const std::string file = (dir_ / "file").string();
  std::ofstream(file) << "x";
  expect_error(run({"run", g, "--feed", "x=1,2,3", "--fetch", "add", "--out-dir", file}), 1,
               "--out-dir '" + file + "': exists and is not a directory");
  // A symbolic link to nothing is named so (it said "File exists").
  const std::string dangling = (dir_ / "dangling").string();
  std::filesystem::create_symlink(dir_ / "nowhere", dangling);
  expect_error(run({"run", g, "--feed", "x=1,2,3", "--fetch", "add", "--out-dir", dangling}), 1,
               "--out-dir '" + dangling + "': a symbolic link to a missing path");
  // The fetch's .npy path is taken by a directory.
  const std::string out = (dir_ / "out").string();
  std::filesystem::create_directories(out + "/add.npy");
  Outcome o = run({"run", g, "--feed", "x=1,2,3", "--fetch", "add", "--out-dir", out});
  EXPECT_EQ(o.signal, 0);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_THAT(o.err, ::testing::StartsWith("graphrun: " + out + "/add.npy: cannot create"));
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  // --trace is written after the run (its fetches are printed).
  o = run({"run", g, "--feed", "x=1,2,3", "--fetch", "add", "--trace", dir_.string()});
  EXPECT_EQ(o.signal, 0);
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_EQ(o.err,
            "graphrun: --trace '" + dir_.string() + "': cannot create the file: Is a directory\n");
  EXPECT_EQ(o.out, "add: float32[3] [2, 4, 6]\n");
  expect_error(run({"dot", g, "-o", dir_.string()}), 1,
               "-o '" + dir_.string() + "': cannot create the file: Is a directory");
}

}  // namespace
}  // namespace graphrun
