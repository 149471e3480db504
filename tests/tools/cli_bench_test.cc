// `graphrun bench` through the real binary: the --json object parsed with
// protobuf's JSON parser, the exact run count, ordered percentiles, the
// text report, and its errors.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/tools/cli_runner.h"
#include "tools/graphrun/bench.h"

namespace graphrun {
namespace {

using ::testing::HasSubstr;
using testing_cli::CliTest;
using testing_cli::kTf;

TEST_F(CliTest, BenchJsonCountsExactRunsWithOrderedPercentiles) {
  for (const char* threads : {"1", "2"}) {
    SCOPED_TRACE(threads);
    const auto o =
        run({"bench", kTf + "/const_plus_placeholder_add.pbtxt", "--feed", "x=1,2,3", "--fetch",
             "add", "--threads", threads, "--runs", "101", "--warmup", "2", "--json"});
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(o.err, "");  // stderr is a file here: no progress bar
    EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 1);
    google::protobuf::Struct root;
    const auto st = google::protobuf::util::JsonStringToMessage(o.out, &root);
    ASSERT_TRUE(st.ok()) << st.ToString() << o.out;
    const auto& f = root.fields();
    EXPECT_EQ(f.at("runs").number_value(), 101);
    EXPECT_EQ(f.at("threads").number_value(), std::stod(threads));
    EXPECT_EQ(f.at("warmup_runs_per_thread").number_value(), 2);
    EXPECT_THAT(f.at("graph").string_value(), HasSubstr("const_plus_placeholder_add.pbtxt"));
    EXPECT_GT(f.at("seconds").number_value(), 0);
    EXPECT_GT(f.at("runs_per_second").number_value(), 0);
    const auto& lat = f.at("latency_us").struct_value().fields();
    const double min = lat.at("min").number_value();
    const double p50 = lat.at("p50").number_value();
    const double p90 = lat.at("p90").number_value();
    const double p99 = lat.at("p99").number_value();
    const double max = lat.at("max").number_value();
    const double mean = lat.at("mean").number_value();
    EXPECT_GT(min, 0);
    EXPECT_LE(min, p50);
    EXPECT_LE(p50, p90);
    EXPECT_LE(p90, p99);
    EXPECT_LE(p99, max);
    EXPECT_GE(mean, min);
    EXPECT_LE(mean, max);
  }
}

TEST_F(CliTest, BenchTextReportForSeconds) {
  const auto o = run({"bench", kTf + "/const_sum_axis1.pbtxt", "--fetch", "Sum", "--threads", "2",
                      "--seconds", "0.2"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr(" runs on 2 threads in "));
  EXPECT_THAT(o.out, HasSubstr(" runs/s\nlatency (us): p50 "));
  EXPECT_THAT(o.out, HasSubstr(" max "));
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 2);
}

TEST_F(CliTest, BenchErrors) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  expect_error(
      run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--threads", "0", "--runs", "10"}), 2,
      "--threads 0");
  expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "nope", "--runs", "10"}), 1,
               "fetch 'nope'");
  expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add"}), 2,
               "exactly one of --runs N (N >= 1) and --seconds S (S > 0)");
  expect_error(
      run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--runs", "5", "--seconds", "1"}), 2,
      "exactly one of --runs N (N >= 1) and --seconds S (S > 0)");
  // --runs 0 gives no count: the message says so rather than "one of".
  expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--runs", "0"}), 2,
               "--runs 0 and --seconds 0 give neither");
  // --warmup is bounded (9223372036854775807 ran until killed).
  expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--runs", "1", "--warmup",
                    "9223372036854775807"}),
               2, "--warmup 9223372036854775807: must be from 0 to 1000000");
  // No run within the time: an error, not statistics of nothing (zeros).
  expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--seconds", "1e-300"}), 1,
               "no run completed in --seconds 1e-300");
  expect_error(run({"bench", g, "--feed", "x=1,,3", "--fetch", "add", "--runs", "5"}), 2, "x");
  expect_error(run({"bench", g, "--runs", "5"}), 2, "nothing to run");
  // A thread count past the cap is refused before any pool is made (65537
  // once crashed in oneTBB when the pool was destroyed).
  for (const char* threads : {"65537", "10000000", "2147483647"}) {
    expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--runs", "5",
                      "--inter-op-threads", threads}),
                 2, std::string("--inter-op-threads ") + threads + ": at most");
  }
  // An unfed placeholder fails when the signature is compiled.
  expect_error(run({"bench", g, "--fetch", "add", "--runs", "5"}), 1, "'x'");
  expect_error(run({"bench", g, "--feed", "x=1,2", "--fetch", "add", "--runs", "5"}), 1,
               "feed 'x'");
}

// --threads and --seconds are bounded: 100000 threads once aborted
// (std::terminate, a thread that could not start), 2147483647 threw
// bad_alloc, and --seconds 1e300 overflowed the deadline and ran nothing.
TEST_F(CliTest, BenchBoundsThreadsAndSeconds) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  for (const char* threads : {"1025", "100000", "2147483647", "-1"}) {
    expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--threads", threads,
                      "--runs", "10", "--no-progress"}),
                 2, std::string("--threads ") + threads + ": must be from 1 to 1024");
  }
  for (const char* seconds : {"1e300", "604801", "inf", "nan", "-1"}) {
    expect_error(run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--seconds", seconds,
                      "--no-progress"}),
                 2, "--seconds ");
  }
  const auto o = run({"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--threads", "1024",
                      "--runs", "2048", "--warmup", "0", "--json"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("\"threads\": 1024, \"runs\": 2048,"));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
// A thread the system refuses (here: address space for its stack) is an
// error naming the thread, exit 1, not an abort. A huge --runs does not
// reserve memory for itself either.
TEST_F(CliTest, BenchThreadsTheSystemRefusesExit1) {
  const std::string g = kTf + "/const_plus_placeholder_add.pbtxt";
  const auto o = run_with_env(
      "ulimit -v 3000000;", {"bench", g, "--feed", "x=1,2,3", "--fetch", "add", "--threads", "1024",
                             "--runs", "9223372036854775807", "--no-progress"});
  EXPECT_EQ(o.signal, 0) << o.err;
  EXPECT_EQ(o.code, 1) << o.err;
  EXPECT_THAT(o.err,
              ::testing::StartsWith("graphrun: --threads 1024: cannot start client thread "));
  EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
}
#endif

TEST(BenchSummaryTest, NearestRankPercentiles) {
  std::vector<int64_t> ns;
  for (int64_t i = 1; i <= 100; ++i) ns.push_back(i * 1000);
  const cli::LatencySummary s = cli::summarize_latencies(ns);
  EXPECT_DOUBLE_EQ(s.min_us, 1);
  EXPECT_DOUBLE_EQ(s.p50_us, 50);
  EXPECT_DOUBLE_EQ(s.p90_us, 90);
  EXPECT_DOUBLE_EQ(s.p99_us, 99);
  EXPECT_DOUBLE_EQ(s.max_us, 100);
  EXPECT_DOUBLE_EQ(s.mean_us, 50.5);
  const std::vector<int64_t> one = {7000};
  const cli::LatencySummary t = cli::summarize_latencies(one);
  EXPECT_DOUBLE_EQ(t.p50_us, 7);
  EXPECT_DOUBLE_EQ(t.p99_us, 7);
}

}  // namespace
}  // namespace graphrun
