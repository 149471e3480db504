// A test fixture that runs the real `graphrun` binary
// ($<TARGET_FILE:graphrun-cli>) through the shell and captures stdout,
// stderr and the exit code; each test gets its own temporary directory.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace graphrun::testing_cli {

inline const std::string kTf = GRAPHRUN_TF_GRAPHDEFS;
inline const std::string kData = GRAPHRUN_TOOLS_TESTDATA;

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out.append("'\\''");
    } else {
      out.push_back(c);
    }
  }
  out.push_back('\'');
  return out;
}

// Thread safety: one test at a time (gtest fixture).
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "graphrun-cli-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  struct Outcome {
    int code = -1;
    int signal = 0;  // the signal that ended the program, 0 when it exited
    std::string out;
    std::string err;
  };
  Outcome run(const std::vector<std::string>& args) { return run_with_env("", args); }
  // `env`: shell assignments put before the command ("PATH=/nowhere");
  // `stdout_to`: where standard output goes instead of Outcome::out (e.g.
  // /dev/full).
  Outcome run_with_env(const std::string& env, const std::vector<std::string>& args,
                       const std::string& stdout_to = "") {
    std::string cmd = env;
    if (!cmd.empty()) cmd.push_back(' ');
    cmd.append(quote(GRAPHRUN_CLI_BINARY));
    // Appended piece by piece: GCC 12 -O3 misreads `" " + quote(a)` as an
    // overlapping memcpy (-Wrestrict).
    for (const std::string& a : args) {
      cmd.push_back(' ');
      cmd.append(quote(a));
    }
    const std::filesystem::path out =
        stdout_to.empty() ? dir_ / "stdout" : std::filesystem::path(stdout_to);
    const auto err = dir_ / "stderr";
    cmd.append(" >");
    cmd.append(quote(out.string()));
    cmd.append(" 2>");
    cmd.append(quote(err.string()));
    const int status = std::system(cmd.c_str());
    Outcome o;
    o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    // The shell reports a child killed by signal N as exit code 128 + N
    // (or, having exec'd the program, is killed itself).
    if (WIFSIGNALED(status)) {
      o.signal = WTERMSIG(status);
    } else if (o.code > 128) {
      o.signal = o.code - 128;
    }
    o.out = stdout_to.empty() ? read_text(out) : std::string();
    o.err = read_text(err);
    return o;
  }
  // One line on stderr, naming `culprit`, and nothing on stdout; no signal
  // (a crash or an abort).
  void expect_error(const Outcome& o, int code, const std::string& culprit) {
    EXPECT_EQ(o.signal, 0) << o.err;
    EXPECT_EQ(o.code, code) << o.err;
    EXPECT_THAT(o.err, ::testing::StartsWith("graphrun: "));
    EXPECT_THAT(o.err, ::testing::HasSubstr(culprit));
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
    EXPECT_EQ(o.out, "");
  }

  std::filesystem::path dir_;
};

}  // namespace graphrun::testing_cli
