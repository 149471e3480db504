// The collectives on 1, 2 and 4 ranks (ctest runs this binary under
// mpirun, see CMakeLists.txt). Every rank runs every test in the same order
// with its own session over the same graph, as a data-parallel program
// does; results are checked on every rank. Each step has a deadline, so a
// rank left waiting by a failed peer ends with an error instead of a hang.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;
using testing::StatusIs;

std::shared_ptr<mpi::World> g_world;

int rank() { return g_world->rank(); }
int size() { return g_world->size(); }

RunOptions bounded() {
  RunOptions options;
  options.timeout = 30s;
  return options;
}

std::unique_ptr<Session> session_with_threads(const Graph& g, int threads = 2) {
  SessionOptions options;
  options.inter_op_threads = threads;
  return Session::create(g, options).value();
}

// Every rank agrees on the outcome of a test before the next starts, so a
// failure on one rank does not leave the others' next collective unpaired.
void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override { barrier(); }
};

TEST_F(MpiTest, WorldMatchesMpiAndIsOnePerProcess) {
  int r = -1;
  int n = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  EXPECT_EQ(rank(), r);
  EXPECT_EQ(size(), n);
  EXPECT_GE(g_world->thread_level(), MPI_THREAD_SERIALIZED);
  auto again = mpi::World::init();
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->get(), g_world.get());
  EXPECT_EQ(mpi::World::current().get(), g_world.get());
}

TEST_F(MpiTest, AllReduceSumsAndAveragesEveryDtype) {
  Graph g;
  Output xf = ops::Placeholder(g, DType::kFloat32, Shape{3}, "xf");
  Output xd = ops::Placeholder(g, DType::kFloat64, Shape{2, 2}, "xd");
  Output xi = ops::Placeholder(g, DType::kInt32, Shape{2}, "xi");
  Output xl = ops::Placeholder(g, DType::kInt64, Shape{}, "xl");
  Output sum_f = ops::AllReduce(g, xf, mpi::Reduction::kSum, "sum_f");
  Output mean_f = ops::AllReduce(g, xf, mpi::Reduction::kMean, "mean_f");
  Output mean_d = ops::AllReduce(g, xd, mpi::Reduction::kMean, "mean_d");
  Output sum_i = ops::AllReduce(g, xi, mpi::Reduction::kSum, "sum_i");
  Output sum_l = ops::AllReduce(g, xl, mpi::Reduction::kSum, "sum_l");
  ASSERT_THAT(g.status(), IsOk());
  auto s = session_with_threads(g);
  const auto r = static_cast<float>(rank());
  const int n = size();
  auto out = s->run({{xf, Tensor{r, 2 * r, 1.0f}},
                     {xd, Tensor::matrix<double>({{r, 1}, {0, -r}})},
                     {xi, Tensor{rank(), 1}},
                     {xl, Tensor(int64_t{1} << 40)}},
                    {sum_f, mean_f, mean_d, sum_i, sum_l}, {}, bounded());
  ASSERT_THAT(out, IsOk());
  const float ranks_sum = static_cast<float>(n * (n - 1) / 2);  // 0 + 1 + ... + n-1
  EXPECT_TRUE((*out)[0].equals(Tensor{ranks_sum, 2 * ranks_sum, static_cast<float>(n)}))
      << (*out)[0].to_string();
  EXPECT_TRUE((*out)[1].all_close(Tensor{ranks_sum / n, 2 * ranks_sum / n, 1.0f}))
      << (*out)[1].to_string();
  const double mean_rank = static_cast<double>(ranks_sum) / n;
  EXPECT_TRUE((*out)[2].all_close(Tensor::matrix<double>({{mean_rank, 1}, {0, -mean_rank}})))
      << (*out)[2].to_string();
  EXPECT_TRUE((*out)[3].equals(Tensor{n * (n - 1) / 2, n}));
  EXPECT_EQ((*out)[4].scalar<int64_t>(), static_cast<int64_t>(n) << 40);
}

// Sums whose value depends on the order of the additions: every rank adds
// in rank order, so every rank holds the same bits.
TEST_F(MpiTest, AllReduceGivesEveryRankTheSameBits) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{64}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "sum");
  Output every = ops::AllGather(g, ops::Reshape(g, sum, std::vector<int64_t>{1, 64}), "every");
  auto s = session_with_threads(g);
  std::vector<float> mine(64);
  for (int i = 0; i < 64; ++i) {
    mine[static_cast<std::size_t>(i)] =
        (rank() % 2 == 0 ? 1e8f : 1.0f) * static_cast<float>(i + 1) / 3.0f + 1e-3f * rank();
  }
  auto out = s->run({{x, Tensor::from_span<float>(Shape{64}, mine)}}, {sum, every}, {}, bounded());
  ASSERT_THAT(out, IsOk());
  const Tensor& all = (*out)[1];
  ASSERT_EQ(all.shape(), (Shape{size(), 64}));
  for (int r = 0; r < size(); ++r) {
    EXPECT_EQ(std::memcmp(static_cast<const char*>(all.raw_data()) + r * 64 * sizeof(float),
                          (*out)[0].raw_data(), 64 * sizeof(float)),
              0)
        << "rank " << r << " holds other bits than rank " << rank();
  }
}

// Tensors past MPI's eager limit (a few KiB on shared memory) are sent only
// once the peer posts the receive: 4 MiB each way, several in one step.
TEST_F(MpiTest, LargeTensorsGoAcrossInEveryCollective) {
  constexpr int64_t kFloats = int64_t{1} << 20;  // 4 MiB
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{kFloats}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "big_sum");
  Output root = ops::Broadcast(g, x, size() - 1, "big_bcast");
  Output rows = ops::AllGather(g, ops::Reshape(g, x, {1, kFloats}), "big_gather");
  auto s = session_with_threads(g);
  for (int step = 0; step < 3; ++step) {
    auto out =
        s->run({{x, Tensor::filled<float>(Shape{kFloats}, static_cast<float>(rank() + step))}},
               {sum, root, rows}, {}, bounded());
    ASSERT_THAT(out, IsOk());
    const float total = static_cast<float>(size() * (size() - 1) / 2 + size() * step);
    EXPECT_TRUE((*out)[0].equals(Tensor::filled<float>(Shape{kFloats}, total)));
    EXPECT_TRUE((*out)[1].equals(
        Tensor::filled<float>(Shape{kFloats}, static_cast<float>(size() - 1 + step))));
    ASSERT_EQ((*out)[2].shape(), (Shape{size(), kFloats}));
    for (int r = 0; r < size(); ++r) {
      EXPECT_EQ((*out)[2].flat<float>()[static_cast<std::size_t>(r * kFloats + kFloats - 1)],
                static_cast<float>(r + step));
    }
  }
}

TEST_F(MpiTest, BroadcastGivesEveryRankTheRootsValue) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt64, Shape{2}, "x");
  std::vector<Output> from;
  for (int root = 0; root < size(); ++root) {
    from.push_back(ops::Broadcast(g, x, root, "from" + std::to_string(root)));
  }
  auto s = session_with_threads(g);
  auto out = s->run({{x, Tensor{int64_t{rank()}, int64_t{100 + rank()}}}},
                    std::vector<TensorRef>(from.begin(), from.end()), {}, bounded());
  ASSERT_THAT(out, IsOk());
  for (int root = 0; root < size(); ++root) {
    EXPECT_TRUE(
        (*out)[static_cast<std::size_t>(root)].equals(Tensor{int64_t{root}, int64_t{100 + root}}))
        << "root " << root;
  }
}

TEST_F(MpiTest, AllGatherConcatenatesInRankOrderWithDifferentFirstDimensions) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1, 2}, "x");
  Output all = ops::AllGather(g, x, "all");
  EXPECT_EQ(all.shape(), (Shape{-1, 2}));
  auto s = session_with_threads(g);
  // Rank r gives r + 1 rows of value r.
  auto out = s->run({{x, Tensor::filled<float>(Shape{rank() + 1, 2}, static_cast<float>(rank()))}},
                    {all}, {}, bounded());
  ASSERT_THAT(out, IsOk());
  const Tensor& t = (*out)[0];
  const int rows = size() * (size() + 1) / 2;
  ASSERT_EQ(t.shape(), (Shape{rows, 2}));
  int row = 0;
  for (int r = 0; r < size(); ++r) {
    for (int k = 0; k <= r; ++k, ++row) {
      EXPECT_EQ(t.flat<float>()[static_cast<std::size_t>(2 * row)], static_cast<float>(r));
      EXPECT_EQ(t.flat<float>()[static_cast<std::size_t>(2 * row + 1)], static_cast<float>(r));
    }
  }
}

// Four independent AllReduces become ready in opposite orders on even and
// odd ranks, on one session thread each: MPI's own collectives would need
// one order everywhere, and blocking kernels would hold the one thread.
TEST_F(MpiTest, IndependentCollectivesReadyInAnyOrderOnOneThreadAllComplete) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  std::vector<Output> sums;
  for (int i = 0; i < 4; ++i) {
    const int delay_ms = rank() % 2 == 0 ? i : 3 - i;
    Output delayed = ops::Call(
        g, {x}, {DType::kFloat32},
        [delay_ms](std::span<const Tensor> in) -> Result<std::vector<Tensor>> {
          std::this_thread::sleep_for(std::chrono::milliseconds(2 * delay_ms));
          return std::vector<Tensor>{in[0]};
        },
        {}, "delay" + std::to_string(i))[0];
    sums.push_back(ops::AllReduce(g, ops::Mul(g, delayed, ops::Const(g, Tensor(float(i + 1)))),
                                  mpi::Reduction::kSum, "sum" + std::to_string(i)));
  }
  auto s = session_with_threads(g, 1);
  for (int step = 0; step < 5; ++step) {
    auto out = s->run({{x, Tensor(1.0f)}}, std::vector<TensorRef>(sums.begin(), sums.end()), {},
                      bounded());
    ASSERT_THAT(out, IsOk());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ((*out)[static_cast<std::size_t>(i)].scalar<float>(),
                static_cast<float>(size() * (i + 1)));
    }
  }
}

// The n-th step of every rank meets the n-th of every other.
TEST_F(MpiTest, StepsPairInOrder) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt64, Shape{}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "sum");
  auto s = session_with_threads(g);
  auto callable = s->make_callable({x}, {sum});
  ASSERT_THAT(callable, IsOk());
  for (int64_t step = 0; step < 50; ++step) {
    Tensor feed(step * 1000 + rank());
    std::vector<Tensor> out(1);
    ASSERT_THAT(callable->run({&feed, 1}, out, bounded()), IsOk());
    EXPECT_EQ(out[0].scalar<int64_t>(), size() * step * 1000 + size() * (size() - 1) / 2);
  }
}

// Concurrent steps on every rank: contributions pair by invocation order,
// and since every contribution is the same, every sum is the rank count.
TEST_F(MpiTest, ConcurrentRunsFromManyThreadsAllComplete) {
  Graph g;
  Output ones = ops::Const(g, Tensor::filled<float>(Shape{256}, 1.0f), "ones");
  Output sum = ops::AllReduce(g, ones, mpi::Reduction::kSum, "sum");
  auto s = session_with_threads(g, 2);
  std::atomic<int> wrong{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        auto out = s->run({}, {sum}, {}, bounded());
        if (!out.is_ok()) {
          ++failed;
        } else if (!(*out)[0].equals(
                       Tensor::filled<float>(Shape{256}, static_cast<float>(size())))) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(MpiTest, CollectivesRunInPartialRunsAndAsynchronousCalls) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output y = ops::Placeholder(g, DType::kFloat32, Shape{}, "y");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "sum");
  Output total = ops::Add(g, sum, y, "total");
  auto s = session_with_threads(g);
  auto h = s->partial_run_setup({sum, total}, {x, y}, {}, bounded());
  ASSERT_THAT(h, IsOk());
  auto first = s->partial_run(*h, {{x, Tensor(2.0f)}}, {sum});
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ((*first)[0].scalar<float>(), 2.0f * size());
  auto second = s->partial_run(*h, {{y, Tensor(0.5f)}}, {total});
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ((*second)[0].scalar<float>(), 2.0f * size() + 0.5f);
  auto later = s->run_async({{x, Tensor(1.0f)}, {y, Tensor(0.0f)}}, {total}, {}, bounded());
  auto out = later.get();
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ((*out)[0].scalar<float>(), static_cast<float>(size()));
}

TEST_F(MpiTest, MismatchedShapesFailOnEveryRankSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "mismatch");
  auto s = session_with_threads(g);
  auto out = s->run({{x, Tensor::filled<float>(Shape{rank() + 1}, 1.0f)}}, {sum}, {}, bounded());
  EXPECT_THAT(out, StatusIs(StatusCode::kInvalidArgument, "'mismatch'"));
  EXPECT_THAT(out, StatusIs(StatusCode::kInvalidArgument, "has shape"));
  // The session and the key stay usable.
  auto again = s->run({{x, Tensor::filled<float>(Shape{2}, 1.0f)}}, {sum}, {}, bounded());
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE((*again)[0].equals(Tensor::filled<float>(Shape{2}, static_cast<float>(size()))));
}

// Under key "k", this rank runs what `mine` builds: when the ranks' choices
// differ (another collective, reduction, root or shape), every rank's step
// fails at once with InvalidArgument containing `message`, and no message
// is left behind: an AllReduce under the same key then works on every rank.
void expect_mismatch_fails_on_every_rank(const std::function<Output(Graph&, Output)>& mine,
                                         const Shape& shape, const std::string& message) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape::unknown(), "x");
  Output y = mine(g, x);
  Output after = ops::AllReduce(g, x, mpi::Reduction::kSum, "after", "k");
  auto s = session_with_threads(g);
  RunOptions quick;
  quick.timeout = 10s;  // a rank left waiting would end here, not fail at once
  auto out = s->run({{x, Tensor::filled<float>(shape, 1.0f)}}, {y}, {}, quick);
  EXPECT_THAT(out, StatusIs(StatusCode::kInvalidArgument, message)) << "rank " << rank();
  barrier();
  auto again = s->run({{x, Tensor::filled<float>(Shape{2}, 1.0f)}}, {after}, {}, quick);
  ASSERT_THAT(again, IsOk()) << "rank " << rank();
  EXPECT_TRUE((*again)[0].equals(Tensor::filled<float>(Shape{2}, static_cast<float>(size()))));
}

TEST_F(MpiTest, AnotherCollectiveUnderOneKeyFailsOnEveryRankSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_mismatch_fails_on_every_rank(
      [](Graph& g, Output x) {
        return rank() == 0 ? ops::AllReduce(g, x, mpi::Reduction::kSum, "mixed", "k")
                           : ops::Broadcast(g, x, 0, "mixed", "k");
      },
      Shape{2}, "every rank must run the same collective on one key");
}

TEST_F(MpiTest, AnotherReductionUnderOneKeyFailsOnEveryRankSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_mismatch_fails_on_every_rank(
      [](Graph& g, Output x) {
        return ops::AllReduce(g, x, rank() == 0 ? mpi::Reduction::kMean : mpi::Reduction::kSum,
                              "mixed", "k");
      },
      Shape{2},
      rank() == 0 ? "runs AllReduce (sum) under this key, rank 0 runs AllReduce (mean)"
                  : "rank 0 runs AllReduce (mean) under this key");
}

TEST_F(MpiTest, AnotherBroadcastRootFailsOnEveryRankSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_mismatch_fails_on_every_rank(
      [](Graph& g, Output x) { return ops::Broadcast(g, x, rank() == 0 ? 0 : 1, "mixed", "k"); },
      Shape{2}, "Broadcast from rank");
}

// The root's shape and the others' must agree, and every rank says so (the
// root once returned OK while the others failed).
TEST_F(MpiTest, ABroadcastShapeMismatchFailsOnEveryRankSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_mismatch_fails_on_every_rank(
      [](Graph& g, Output x) { return ops::Broadcast(g, x, 0, "mixed", "k"); },
      Shape{rank() == 0 ? 2 : 3}, "has shape");
}

TEST_F(MpiTest, BadAttributesAreInvalidArgumentNamingTheNode) {
  Graph g;
  Output i = ops::Placeholder(g, DType::kInt32, Shape{}, "i");
  Output mean = ops::AllReduce(g, i, mpi::Reduction::kMean, "int_mean");
  Output far = ops::Broadcast(g, i, size(), "far_root");
  auto s = session_with_threads(g);
  EXPECT_THAT(s->run({{i, Tensor(1)}}, {mean}),
              StatusIs(StatusCode::kInvalidArgument, "'int_mean'"));
  EXPECT_THAT(s->run({{i, Tensor(1)}}, {far}),
              StatusIs(StatusCode::kInvalidArgument, "is not a rank of this world"));
  Graph scalar;
  Output z = ops::Const(scalar, Tensor(1.0f), "z");
  EXPECT_FALSE(ops::AllGather(scalar, z, "gather_scalar").node() != nullptr);
  EXPECT_THAT(scalar.status(), StatusIs(StatusCode::kInvalidArgument, "rank >= 1"));
}

// Rank 0 waits for peers that never come: its deadline ends the step, and
// close() ends another that waits. The other ranks never run the key:
// they learn that rank 0 gave up each invocation, and receive what it sent.
TEST_F(MpiTest, ADeadlineOrCloseEndsAStepWaitingForPeersSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  if (rank() != 0) return;
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  Output lonely = ops::AllReduce(g, x, mpi::Reduction::kSum, "lonely");
  Output lonely2 = ops::AllReduce(g, x, mpi::Reduction::kSum, "lonely2");
  auto s = session_with_threads(g);
  // Long enough for the step to reach the collective on a loaded machine (a
  // blocking call of a plan with asynchronous kernels runs on the pool's
  // workers, which must be scheduled first).
  RunOptions short_deadline;
  short_deadline.timeout = 500ms;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(s->run({}, {lonely}, {}, short_deadline),
              StatusIs(StatusCode::kDeadlineExceeded, "'lonely'"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto pending = s->run_async({}, {lonely2});
  std::this_thread::sleep_for(50ms);
  ASSERT_THAT(s->close(), IsOk());
  EXPECT_THAT(pending.get(), StatusIs(StatusCode::kCancelled, "closed"));
}

// A collective key's invocations pair across ranks in order. When a rank
// gives up an invocation (its deadline) that another rank never ran, the
// others learn of it and skip it, so the ranks' next invocations meet
// again (the counts once stayed one apart for good: every later step
// waited for its deadline on every rank).
TEST_F(MpiTest, AnInvocationOneRankSkippedIsSkippedByAllAfterAPeersDeadlineSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "skipped_once");
  auto s = session_with_threads(g);
  const int skipper = size() - 1;
  if (rank() != skipper) {
    RunOptions short_deadline;
    short_deadline.timeout = 300ms;
    auto out = s->run({{x, Tensor(1.0f)}}, {sum}, {}, short_deadline);
    // The first rank to reach its deadline gives up; a rank that waited
    // with it may learn of that before its own deadline.
    ASSERT_FALSE(out.is_ok());
    EXPECT_TRUE(out.status().code() == StatusCode::kDeadlineExceeded ||
                out.status().code() == StatusCode::kAborted)
        << out.status().to_string();
  }
  barrier();
  std::this_thread::sleep_for(200ms);  // the notices of the given-up invocation arrive
  const float expected = static_cast<float>(size() * (size() + 1) / 2);
  // Past the invocation whose tag is the given-up one's again (tags hold
  // 10 bits of the number): what rank 0 sent for it was received then and
  // there, or it would meet that later invocation.
  for (int step = 0; step < 1030; ++step) {
    auto out = s->run({{x, Tensor(static_cast<float>(rank() + 1))}}, {sum}, {}, bounded());
    ASSERT_THAT(out, IsOk()) << "rank " << rank() << " step " << step;
    EXPECT_EQ((*out)[0].scalar<float>(), expected) << "rank " << rank() << " step " << step;
  }
}

// A rank that comes to an invocation after a peer gave up on it (past the
// peer's deadline) skips it and meets the peer's next invocation; the
// invocation it would have joined is not left half done on either side.
TEST_F(MpiTest, ARankLatePastAPeersDeadlineMeetsItsNextInvocationSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
  Output sum = ops::AllReduce(g, x, mpi::Reduction::kSum, "late_once");
  auto s = session_with_threads(g);
  const int late = 1;
  const float expected = static_cast<float>(size() * (size() + 1) / 2);
  auto mine = [&] {
    const auto v = static_cast<float>(rank() + 1);
    return Tensor{v, 2 * v};
  };
  if (rank() == late) {
    std::this_thread::sleep_for(1s);  // the others' first step has ended by now
    auto out = s->run({{x, mine()}}, {sum}, {}, bounded());
    ASSERT_THAT(out, IsOk());
    EXPECT_TRUE((*out)[0].equals(Tensor{expected, 2 * expected})) << (*out)[0].to_string();
  } else {
    RunOptions short_deadline;
    short_deadline.timeout = 300ms;
    auto first = s->run({{x, Tensor{-100.0f, -100.0f}}}, {sum}, {}, short_deadline);
    ASSERT_FALSE(first.is_ok());
    auto second = s->run({{x, mine()}}, {sum}, {}, bounded());
    ASSERT_THAT(second, IsOk()) << "rank " << rank();
    EXPECT_TRUE((*second)[0].equals(Tensor{expected, 2 * expected})) << (*second)[0].to_string();
  }
  barrier();
  auto together = s->run({{x, mine()}}, {sum}, {}, bounded());
  ASSERT_THAT(together, IsOk()) << "rank " << rank();
  EXPECT_TRUE((*together)[0].equals(Tensor{expected, 2 * expected}));
}

// Deadlines that end invocations at every point of their exchange, on
// every rank (a rank given up in its headers' round while a peer, already
// past it, sent its tensor; one that gave up after sending its own; a
// Broadcast's non-root that completed while another gave up): once the
// ranks have learned of every given-up invocation, their next ones meet,
// and none meets a message left from those (run past the point where the
// tags repeat). `collective` builds the collective of x (each test under
// its own key); `expected` is its value when every rank feeds ones.
void expect_racing_deadlines_leave_the_ranks_aligned(
    const std::function<Output(Graph&, Output)>& collective, const Tensor& expected) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{2048}, "x");
  Output y = collective(g, x);
  auto s = session_with_threads(g);
  const Tensor ones = Tensor::filled<float>(Shape{2048}, 1.0f);
  std::mt19937 random(static_cast<unsigned>(rank() * 7919 + 1));
  int failed = 0;
  for (int step = 0; step < 300; ++step) {
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 3000));
    RunOptions racing;
    racing.timeout = std::chrono::milliseconds(1 + random() % 3);
    if (!s->run({{x, ones}}, {y}, {}, racing).is_ok()) ++failed;
  }
  barrier();
  std::this_thread::sleep_for(300ms);  // every notice has arrived
  for (int step = 0; step < 1400; ++step) {
    auto out = s->run({{x, ones}}, {y}, {}, bounded());
    ASSERT_THAT(out, IsOk()) << "rank " << rank() << " step " << step << " (" << failed
                             << " of the racing steps failed)";
    ASSERT_TRUE((*out)[0].equals(expected)) << "rank " << rank() << " step " << step;
  }
}

TEST_F(MpiTest, RacingDeadlinesLeaveAllReducesAlignedAndNoMessageBehindSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_racing_deadlines_leave_the_ranks_aligned(
      [](Graph& g, Output x) { return ops::AllReduce(g, x, mpi::Reduction::kSum, "racing"); },
      Tensor::filled<float>(Shape{2048}, static_cast<float>(size())));
}

TEST_F(MpiTest, RacingDeadlinesLeaveBroadcastsAlignedAndNoMessageBehindSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_racing_deadlines_leave_the_ranks_aligned(
      [](Graph& g, Output x) { return ops::Broadcast(g, x, 1, "racing_broadcast"); },
      Tensor::filled<float>(Shape{2048}, 1.0f));
}

TEST_F(MpiTest, RacingDeadlinesLeaveAllGathersAlignedAndNoMessageBehindSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  expect_racing_deadlines_leave_the_ranks_aligned(
      [](Graph& g, Output x) {
        return ops::AllGather(g, ops::Reshape(g, x, std::vector<int64_t>{1, 2048}),
                              "racing_gather");
      },
      Tensor::filled<float>(Shape{size(), 2048}, 1.0f));
}

// Data parallelism: each rank holds its own shard of a least-squares
// problem, computes its gradient, and the ranks average the gradients with
// AllReduce before every update (the README's example, in small). Every
// rank ends with the same weights, those of full-batch gradient descent.
TEST_F(MpiTest, AveragedGradientsKeepEveryReplicaEqualToFullBatchDescent) {
  constexpr int kRows = 8;  // per rank
  auto shard = [](int r) {
    std::vector<float> a(kRows * 2);
    std::vector<float> b(kRows);
    for (int i = 0; i < kRows; ++i) {
      const float u = static_cast<float>(r * kRows + i) / 10.0f;
      a[static_cast<std::size_t>(2 * i)] = u;
      a[static_cast<std::size_t>(2 * i + 1)] = 1.0f;
      b[static_cast<std::size_t>(i)] = 3.0f * u - 2.0f;
    }
    return std::pair{Tensor::from_span<float>(Shape{kRows, 2}, a),
                     Tensor::from_span<float>(Shape{kRows, 1}, b)};
  };
  auto build = [](Graph& g, bool averaged, int rows) {
    Output a = ops::Placeholder(g, DType::kFloat32, Shape{rows, 2}, "a");
    Output b = ops::Placeholder(g, DType::kFloat32, Shape{rows, 1}, "b");
    Output w = ops::Variable(g, Tensor::filled<float>(Shape{2, 1}, 0.0f), "w");
    const Node* init = ops::GlobalVariablesInitializer(g);
    // grad = A^T (A w - b) / rows
    Output residual = ops::Sub(g, ops::MatMul(g, a, w), b);
    Output grad = ops::Mul(g, ops::MatMul(g, a, residual, {.transpose_a = true}),
                           ops::Const(g, Tensor(1.0f / static_cast<float>(rows))));
    if (averaged) grad = ops::AllReduce(g, grad, mpi::Reduction::kMean, "average");
    Output step = ops::AssignSub(g, w, ops::Mul(g, grad, ops::Const(g, Tensor(0.1f))));
    return std::tuple{a, b, init, step};
  };
  Graph g;
  auto [a, b, init, step] = build(g, true, kRows);
  ASSERT_THAT(g.status(), IsOk());
  auto s = session_with_threads(g);
  auto [my_a, my_b] = shard(rank());
  ASSERT_THAT(s->run({}, {}, {init}), IsOk());
  Tensor w;
  for (int i = 0; i < 30; ++i) {
    auto out = s->run({{a, my_a}, {b, my_b}}, {step}, {}, bounded());
    ASSERT_THAT(out, IsOk());
    w = (*out)[0];
  }
  // The same descent on one process over every shard.
  Graph full;
  auto [fa, fb, finit, fstep] = build(full, false, kRows * size());
  auto single = Session::create(full).value();
  std::vector<float> all_a;
  std::vector<float> all_b;
  for (int r = 0; r < size(); ++r) {
    auto [ra, rb] = shard(r);
    all_a.insert(all_a.end(), ra.flat<float>().begin(), ra.flat<float>().end());
    all_b.insert(all_b.end(), rb.flat<float>().begin(), rb.flat<float>().end());
  }
  const Tensor ta = Tensor::from_span<float>(Shape{kRows * size(), 2}, all_a);
  const Tensor tb = Tensor::from_span<float>(Shape{kRows * size(), 1}, all_b);
  ASSERT_THAT(single->run({}, {}, {finit}), IsOk());
  Tensor expected;
  for (int i = 0; i < 30; ++i) expected = single->run({{fa, ta}, {fb, tb}}, {fstep}).value()[0];
  EXPECT_TRUE(w.all_close(expected, 1e-4, 1e-5)) << w.to_string() << " vs " << expected.to_string();
}

// Failures of this rank, prefixed with its number; rank 0 keeps gtest's
// whole output.
class RankFailures : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailures(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::printf("[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                  r.line_number(), r.message());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace graphrun

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = graphrun::mpi::World::init(&argc, &argv);
  if (!world.is_ok()) {
    std::fprintf(stderr, "mpi_test: %s\n", world.status().to_string().c_str());
    return 1;
  }
  graphrun::g_world = *world;
  if (graphrun::g_world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new graphrun::RankFailures(graphrun::g_world->rank()));
  }
  const int result = RUN_ALL_TESTS();
  // Every rank's verdict: mpirun's exit code is non-zero if any failed.
  int failed = result != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (graphrun::g_world->rank() == 0 && any_failed != 0) {
    std::printf("mpi_test: a rank failed (see its [rank N] lines)\n");
  }
  graphrun::g_world.reset();
  world->reset();  // the last reference: MPI is finalised here
  return any_failed;
}
