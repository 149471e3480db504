// Send and Recv between ranks (part of mpi_test, run under mpirun on 1, 2
// and 4 ranks). Most tests pass tensors round a ring: every rank sends to
// the next and receives from the previous (on one rank, to itself). Every
// step has a deadline, so a lost message ends in an error, not a hang.
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/op_harness.h"

namespace graphrun {
namespace {

using namespace std::chrono_literals;
using testing::IsOk;
using testing::StatusIs;

int rank() { return mpi::World::current()->rank(); }
int size() { return mpi::World::current()->size(); }
int next() { return (rank() + 1) % size(); }
int previous() { return (rank() + size() - 1) % size(); }

RunOptions bounded() {
  RunOptions options;
  options.timeout = 30s;
  return options;
}

std::unique_ptr<Session> session_of(const Graph& g, int threads = 2) {
  SessionOptions options;
  options.inter_op_threads = threads;
  return Session::create(g, options).value();
}

class SendRecvTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(SendRecvTest, RingPassesEveryDtypeInOneStep) {
  Graph g;
  Output xf = ops::Placeholder(g, DType::kFloat32, Shape{3}, "xf");
  Output xd = ops::Placeholder(g, DType::kFloat64, Shape{2, 2}, "xd");
  Output xi = ops::Placeholder(g, DType::kInt32, Shape{}, "xi");
  Output xl = ops::Placeholder(g, DType::kInt64, Shape{1}, "xl");
  Output xb = ops::Placeholder(g, DType::kBool, Shape{2}, "xb");
  std::vector<TargetRef> sends;
  std::vector<TensorRef> received;
  const std::pair<Output, DType> all[] = {{xf, DType::kFloat32},
                                          {xd, DType::kFloat64},
                                          {xi, DType::kInt32},
                                          {xl, DType::kInt64},
                                          {xb, DType::kBool}};
  int k = 0;
  for (const auto& [x, dtype] : all) {
    const std::string name = "ring" + std::to_string(k++);
    sends.push_back(ops::Send(g, x, next(), name, name + "_send"));
    received.push_back(ops::Recv(g, dtype, previous(), name, Shape::unknown(), name + "_recv"));
  }
  ASSERT_THAT(g.status(), IsOk());
  auto s = session_of(g);
  const int r = rank();
  const int p = previous();
  const auto fr = static_cast<float>(r);
  auto out = s->run({{xf, Tensor{fr, fr + 0.5f, -fr}},
                     {xd, Tensor::from_span<double>(
                              Shape{2, 2}, std::vector<double>{1.0 * r, 2.0, 3.0, 4.0 * r})},
                     {xi, Tensor(100 + r)},
                     {xl, Tensor{int64_t{r} << 40}},
                     {xb, Tensor{r % 2 == 0, r % 2 != 0}}},
                    received, sends, bounded());
  ASSERT_THAT(out, IsOk());
  const auto fp = static_cast<float>(p);
  EXPECT_TRUE((*out)[0].equals(Tensor{fp, fp + 0.5f, -fp}));
  EXPECT_TRUE((*out)[1].equals(
      Tensor::from_span<double>(Shape{2, 2}, std::vector<double>{1.0 * p, 2.0, 3.0, 4.0 * p})));
  EXPECT_TRUE((*out)[2].equals(Tensor(100 + p)));
  EXPECT_TRUE((*out)[3].equals(Tensor{int64_t{p} << 40}));
  EXPECT_TRUE((*out)[4].equals(Tensor{p % 2 == 0, p % 2 != 0}));
}

// Past MPI's eager limit a send completes only once its receive is posted;
// an empty tensor sends only its header.
TEST_F(SendRecvTest, LargeAndEmptyTensorsGoAcross) {
  constexpr int64_t kFloats = int64_t{1} << 20;  // 4 MiB
  Graph g;
  Output big = ops::Placeholder(g, DType::kFloat32, Shape{kFloats}, "big");
  Output none = ops::Placeholder(g, DType::kInt32, Shape{0, 3}, "none");
  const Node* send_big = ops::Send(g, big, next(), "big", "send_big");
  const Node* send_none = ops::Send(g, none, next(), "none", "send_none");
  Output got_big = ops::Recv(g, DType::kFloat32, previous(), "big", Shape{kFloats}, "recv_big");
  Output got_none = ops::Recv(g, DType::kInt32, previous(), "none", Shape::unknown(), "recv_none");
  auto s = session_of(g);
  for (int step = 0; step < 3; ++step) {
    Tensor mine = Tensor::filled<float>(Shape{kFloats}, static_cast<float>(rank() * 10 + step));
    mine.flat<float>()[kFloats - 1] = -1.0f * static_cast<float>(rank());
    auto out = s->run({{big, mine}, {none, Tensor::filled<int32_t>(Shape{0, 3}, 0)}},
                      {got_big, got_none}, {send_big, send_none}, bounded());
    ASSERT_THAT(out, IsOk());
    Tensor expected =
        Tensor::filled<float>(Shape{kFloats}, static_cast<float>(previous() * 10 + step));
    expected.flat<float>()[kFloats - 1] = -1.0f * static_cast<float>(previous());
    EXPECT_TRUE((*out)[0].equals(expected)) << "step " << step;
    EXPECT_EQ((*out)[1].shape(), (Shape{0, 3}));
    EXPECT_EQ((*out)[1].dtype(), DType::kInt32);
  }
}

// The n-th Send of a name meets the n-th Recv: 50 steps in order, each
// with its own value, and the received value used downstream.
TEST_F(SendRecvTest, StepsPairInOrderAndFeedTheirConsumers) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kInt64, Shape{}, "x");
  const Node* send = ops::Send(g, x, next(), "ordered");
  Output got = ops::Recv(g, DType::kInt64, previous(), "ordered", Shape{});
  Output doubled = ops::Mul(g, got, ops::Const(g, Tensor(int64_t{2})));
  auto s = session_of(g);
  auto callable = s->make_callable({x}, {doubled}, {send}).value();
  std::vector<Tensor> out(1);
  for (int64_t step = 0; step < 50; ++step) {
    const Tensor feed(int64_t{rank()} * 1000 + step);
    ASSERT_THAT(callable.run({&feed, 1}, out), IsOk());
    EXPECT_EQ(out[0].scalar<int64_t>(), 2 * (int64_t{previous()} * 1000 + step));
  }
}

// A ping-pong between ranks 0 and 1 through two graphs: rank 1 adds one
// and sends it back; a partial run on rank 0 sends, then fetches the answer.
TEST_F(SendRecvTest, PingPongThroughAPartialRunSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  if (rank() > 1) return;
  Graph g;
  if (rank() == 0) {
    Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
    const Node* ping = ops::Send(g, x, 1, "ping");
    Output pong = ops::Recv(g, DType::kFloat32, 1, "pong", Shape{2});
    auto s = session_of(g);
    for (int i = 0; i < 5; ++i) {
      auto handle = s->partial_run_setup({pong}, {x}, {ping});
      ASSERT_THAT(handle, IsOk());
      const auto v = static_cast<float>(i);
      ASSERT_THAT(s->partial_run(*handle, {{x, Tensor{v, -v}}}, {}, {ping}), IsOk());
      auto out = s->partial_run(*handle, {}, {pong});
      ASSERT_THAT(out, IsOk());
      EXPECT_TRUE((*out)[0].equals(Tensor{v + 1.0f, 1.0f - v}));
    }
  } else {
    Output got = ops::Recv(g, DType::kFloat32, 0, "ping", Shape{2});
    const Node* pong = ops::Send(g, ops::Add(g, got, ops::Const(g, Tensor(1.0f))), 0, "pong");
    auto s = session_of(g);
    for (int i = 0; i < 5; ++i) ASSERT_THAT(s->run({}, {}, {pong}, bounded()), IsOk());
  }
}

// Concurrent steps from several threads, each thread on its own name: every
// value arrives at its thread's Recv. A step waiting for a Recv keeps its
// place among the session's inter_op_threads running steps, so the session
// has a thread per caller: with fewer, rank 0 could run lanes 0 and 1 while
// rank 1 runs lanes 2 and 3, each waiting for the other's.
TEST_F(SendRecvTest, ConcurrentStepsOnTheirOwnNamesAllArrive) {
  constexpr int kThreads = 4;
  constexpr int kSteps = 20;
  Graph g;
  std::vector<Output> feeds;
  std::vector<const Node*> sends;
  std::vector<Output> got;
  for (int t = 0; t < kThreads; ++t) {
    const std::string name = "lane" + std::to_string(t);
    feeds.push_back(ops::Placeholder(g, DType::kInt32, Shape{}, name + "_x"));
    sends.push_back(ops::Send(g, feeds.back(), next(), name, name + "_send"));
    got.push_back(ops::Recv(g, DType::kInt32, previous(), name, Shape{}, name + "_recv"));
  }
  auto s = session_of(g, kThreads);
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto i = static_cast<std::size_t>(t);
      for (int step = 0; step < kSteps; ++step) {
        auto out = s->run({{feeds[i], Tensor(rank() * 10000 + t * 100 + step)}}, {got[i]},
                          {sends[i]}, bounded());
        if (!out.is_ok() || (*out)[0].scalar<int32_t>() != previous() * 10000 + t * 100 + step) {
          if (wrong[i]++ == 0) {
            ADD_FAILURE() << "lane " << t << " step " << step << ": "
                          << (out.is_ok() ? (*out)[0].to_string() : out.status().to_string());
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << t;
}

// What is sent must be what the Recv expects: a dtype or a shape apart is
// InvalidArgument naming the sending rank, and the names stay usable. The
// sends run in steps of their own (small tensors: done once MPI has them),
// so that a failed Recv cannot skip the Send its peer waits for.
TEST_F(SendRecvTest, AMismatchedDtypeOrShapeNamesTheSender) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{-1}, "x");
  const Node* send = ops::Send(g, x, next(), "typed");
  Output as_int = ops::Recv(g, DType::kInt32, previous(), "typed", Shape::unknown(), "as_int");
  Output as_float = ops::Recv(g, DType::kFloat32, previous(), "typed", Shape{2}, "as_pair");
  auto s = session_of(g);
  const std::string sender = "rank " + std::to_string(previous());
  ASSERT_THAT(s->run({{x, Tensor{1.0f, 2.0f}}}, {}, {send}, bounded()), IsOk());
  EXPECT_THAT(s->run({}, {as_int}, {}, bounded()),
              StatusIs(StatusCode::kInvalidArgument, sender + " sent float32"));
  ASSERT_THAT(s->run({{x, Tensor{1.0f, 2.0f, 3.0f}}}, {}, {send}, bounded()), IsOk());
  EXPECT_THAT(s->run({}, {as_float}, {}, bounded()),
              StatusIs(StatusCode::kInvalidArgument, sender + " sent shape [3]"));
  ASSERT_THAT(s->run({{x, Tensor{4.0f, 5.0f}}}, {}, {send}, bounded()), IsOk());
  auto out = s->run({}, {as_float}, {}, bounded());
  ASSERT_THAT(out, IsOk());
  EXPECT_TRUE((*out)[0].equals(Tensor{4.0f, 5.0f}));
}

// A one-element tensor (any rank of ones) travels as a compact message of
// its value and a word of dtype, rank and checks: each dtype and rank
// arrives whole, a Recv of unknown or partly known shape learns it, and
// a dtype or a shape apart is refused naming the sender, as for others.
TEST_F(SendRecvTest, OneElementTensorsTravelCompactAndAreCheckedAsOthers) {
  Graph g;
  const Tensor values[] = {
      Tensor(2.5f + static_cast<float>(rank())),
      Tensor::from_span<int32_t>(Shape{1}, std::vector<int32_t>{-7 - rank()}),
      Tensor::filled<bool>(Shape{1, 1, 1}, rank() % 2 == 0),
      Tensor(1e300 / (rank() + 1)),
      Tensor::filled<int64_t>(Shape{1, 1}, (int64_t{1} << 50) + rank()),
      Tensor::filled<float>(Shape{1, 1, 1, 1, 1, 1, 1, 1}, -1.0f * static_cast<float>(rank())),
  };
  // Half the Recvs know the shape, half learn it.
  std::vector<Output> in;
  std::vector<TargetRef> sends;
  std::vector<TensorRef> received;
  int k = 0;
  for (const Tensor& v : values) {
    const std::string name = fmt::format("one{}", k);
    in.push_back(ops::Placeholder(g, v.dtype(), v.shape(), name + "_x"));
    sends.push_back(ops::Send(g, in.back(), next(), name, name + "_send"));
    received.push_back(ops::Recv(g, v.dtype(), previous(), name,
                                 k % 2 == 0 ? v.shape() : Shape::unknown(), name + "_recv"));
    ++k;
  }
  ASSERT_THAT(g.status(), IsOk());
  auto s = session_of(g);
  FeedList feeds;
  for (std::size_t i = 0; i < in.size(); ++i) feeds.push_back({in[i], values[i]});
  auto out = s->run(feeds, received, sends, bounded());
  ASSERT_THAT(out, IsOk());
  const int p = previous();
  const Tensor expected[] = {
      Tensor(2.5f + static_cast<float>(p)),
      Tensor::from_span<int32_t>(Shape{1}, std::vector<int32_t>{-7 - p}),
      Tensor::filled<bool>(Shape{1, 1, 1}, p % 2 == 0),
      Tensor(1e300 / (p + 1)),
      Tensor::filled<int64_t>(Shape{1, 1}, (int64_t{1} << 50) + p),
      Tensor::filled<float>(Shape{1, 1, 1, 1, 1, 1, 1, 1}, -1.0f * static_cast<float>(p)),
  };
  for (std::size_t i = 0; i < std::size(expected); ++i) {
    EXPECT_TRUE((*out)[i].equals(expected[i]))
        << i << ": " << (*out)[i].shape() << " " << dtype_name((*out)[i].dtype());
  }

  // Mismatches, each Send in a step of its own (done once MPI has it).
  Graph h;
  Output x = ops::Placeholder(h, DType::kFloat32, Shape::unknown(), "x");
  const Node* send = ops::Send(h, x, next(), "checked");
  Output as_int = ops::Recv(h, DType::kInt32, previous(), "checked", Shape::unknown(), "as_int");
  Output as_pair = ops::Recv(h, DType::kFloat32, previous(), "checked", Shape{2}, "as_pair");
  Output as_row = ops::Recv(h, DType::kFloat32, previous(), "checked", Shape{1, -1}, "as_row");
  auto t = session_of(h);
  const std::string sender = "rank " + std::to_string(previous());
  ASSERT_THAT(t->run({{x, Tensor(1.0f)}}, {}, {send}, bounded()), IsOk());
  EXPECT_THAT(t->run({}, {as_int}, {}, bounded()),
              StatusIs(StatusCode::kInvalidArgument, sender + " sent float32"));
  ASSERT_THAT(t->run({{x, Tensor{1.0f}}}, {}, {send}, bounded()), IsOk());
  EXPECT_THAT(t->run({}, {as_pair}, {}, bounded()),
              StatusIs(StatusCode::kInvalidArgument, sender + " sent shape [1]"));
  ASSERT_THAT(t->run({{x, Tensor::filled<float>(Shape{1, 1}, 4.0f)}}, {}, {send}, bounded()),
              IsOk());
  auto row = t->run({}, {as_row}, {}, bounded());
  ASSERT_THAT(row, IsOk());
  EXPECT_TRUE((*row)[0].equals(Tensor::filled<float>(Shape{1, 1}, 4.0f)));
}

TEST_F(SendRecvTest, BadAttributesAreInvalidArgumentNamingTheNode) {
  Graph g;
  Output x = ops::Const(g, Tensor(1.0f), "x");
  const Node* far = ops::Send(g, x, size(), "far", "far_send");
  const Node* unnamed = ops::Send(g, x, 0, "", "unnamed_send");
  Output from_far = ops::Recv(g, DType::kFloat32, -1, "far", Shape{}, "far_recv");
  auto s = session_of(g);
  EXPECT_THAT(s->run({}, {}, {far}), StatusIs(StatusCode::kInvalidArgument, "'far_send'"));
  EXPECT_THAT(s->run({}, {}, {far}),
              StatusIs(StatusCode::kInvalidArgument, "is not a rank of this world"));
  EXPECT_THAT(s->run({}, {}, {unnamed}),
              StatusIs(StatusCode::kInvalidArgument, "tensor_name is empty"));
  EXPECT_THAT(s->run({}, {from_far}), StatusIs(StatusCode::kInvalidArgument, "'far_recv'"));
}

// A Recv whose Send never comes ends with its step's deadline, and close()
// ends another; rank 1 never sends, so nothing is left unmatched.
TEST_F(SendRecvTest, ADeadlineOrCloseEndsARecvWaitingForItsSendSkippedOnOneRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  if (rank() != 0) return;
  Graph g;
  Output never = ops::Recv(g, DType::kFloat32, 1, "never", Shape{}, "never");
  auto s = session_of(g);
  RunOptions short_deadline;
  short_deadline.timeout = 100ms;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(s->run({}, {never}, {}, short_deadline),
              StatusIs(StatusCode::kDeadlineExceeded, "'never'"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto pending = s->run_async({}, {never});
  std::this_thread::sleep_for(50ms);
  ASSERT_THAT(s->close(), IsOk());
  EXPECT_THAT(pending.get(), StatusIs(StatusCode::kCancelled, "closed"));
}

// A Send whose Recv was stopped first leaves a message no Recv takes. 1024
// invocations later a Recv has the same tag; it must drop the stale
// transfer (an older invocation, by its header) and take its own: a
// tensor of `n` floats, its bytes in the header's message or (past the
// inline limit) in a second one, which is drained.
void stale_transfer_is_dropped(int64_t n) {
  const int sender = 0;
  const int receiver = size() > 1 ? 1 : 0;
  if (rank() != sender && rank() != receiver) return;
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{n}, "x");
  const Node* send = ops::Send(g, x, receiver, "stale", "send");
  Output got = ops::Recv(g, DType::kFloat32, sender, "stale", Shape{n}, "recv");
  ASSERT_THAT(g.status(), IsOk());
  auto s = session_of(g);
  const MPI_Comm pair = MPI_COMM_WORLD;
  auto barrier = [&] {
    // Only the two ranks: a point-to-point handshake.
    if (sender == receiver) return;
    int token = 0;
    if (rank() == sender) {
      MPI_Sendrecv(&token, 1, MPI_INT, receiver, 77, &token, 1, MPI_INT, receiver, 77, pair,
                   MPI_STATUS_IGNORE);
    } else {
      MPI_Sendrecv(&token, 1, MPI_INT, sender, 77, &token, 1, MPI_INT, sender, 77, pair,
                   MPI_STATUS_IGNORE);
    }
  };
  auto value = [n](float v) {
    Tensor t = Tensor::filled<float>(Shape{n}, v);
    t.flat<float>()[static_cast<std::size_t>(n - 1)] = -v;
    return t;
  };
  // Invocation 0 of the Recv gives up before invocation 0 of the Send goes.
  if (rank() == receiver) {
    RunOptions soon;
    soon.timeout = 50ms;
    EXPECT_THAT(s->run({}, {got}, {}, soon), StatusIs(StatusCode::kDeadlineExceeded, ""));
  }
  barrier();
  if (rank() == sender) {
    ASSERT_THAT(s->run({{x, value(-1.0f)}}, {}, {send}, bounded()), IsOk());
  }
  barrier();
  // Invocations 1..1024: the last has invocation 0's tag.
  for (int k = 1; k <= 1024; ++k) {
    const Tensor v = value(static_cast<float>(k));
    if (sender == receiver) {
      auto out = s->run({{x, v}}, {got}, {send}, bounded());
      ASSERT_THAT(out, IsOk()) << k;
      ASSERT_TRUE((*out)[0].equals(v)) << k;
    } else if (rank() == sender) {
      ASSERT_THAT(s->run({{x, v}}, {}, {send}, bounded()), IsOk()) << k;
    } else {
      auto out = s->run({}, {got}, {}, bounded());
      ASSERT_THAT(out, IsOk()) << k;
      ASSERT_TRUE((*out)[0].equals(v)) << k;
    }
  }
}

TEST_F(SendRecvTest, AStaleTransferOnTheSameTagIsDroppedNotTaken) { stale_transfer_is_dropped(1); }

// 200 floats (800 bytes): past the inline limit (512 bytes), within the
// eager limits of Open MPI's self and shared-memory transports, so that the
// stale Send completes without its Recv.
TEST_F(SendRecvTest, AStaleTwoMessageTransferIsDrainedNotTaken) { stale_transfer_is_dropped(200); }

// Tensors on both sides of the inline limit (512 bytes: 128 floats) and at
// it arrive whole, each with its own values.
TEST_F(SendRecvTest, TensorsAroundTheInlineLimitGoAcross) {
  const int64_t sizes[] = {1, 127, 128, 129, 1024};
  Graph g;
  std::vector<Output> in;
  std::vector<Output> got;
  std::vector<const Node*> sends;
  for (const int64_t n : sizes) {
    const std::string name = fmt::format("n{}", n);
    in.push_back(ops::Placeholder(g, DType::kFloat32, Shape{n}, fmt::format("x_{}", name)));
    sends.push_back(ops::Send(g, in.back(), next(), name, fmt::format("send_{}", name)));
    got.push_back(
        ops::Recv(g, DType::kFloat32, previous(), name, Shape{n}, fmt::format("recv_{}", name)));
  }
  auto s = session_of(g);
  auto value = [](int r, int64_t n, int step) {
    Tensor t(DType::kFloat32, Shape{n});
    for (int64_t i = 0; i < n; ++i)
      t.flat<float>()[static_cast<std::size_t>(i)] =
          static_cast<float>(r * 100000 + step * 5000 + i);
    return t;
  };
  for (int step = 0; step < 3; ++step) {
    FeedList feeds;
    for (std::size_t k = 0; k < in.size(); ++k)
      feeds.push_back({in[k], value(rank(), sizes[k], step)});
    std::vector<TargetRef> targets(sends.begin(), sends.end());
    std::vector<TensorRef> fetches(got.begin(), got.end());
    auto out = s->run(feeds, fetches, targets, bounded());
    ASSERT_THAT(out, IsOk());
    for (std::size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE((*out)[k].equals(value(previous(), sizes[k], step)))
          << sizes[k] << " floats, step " << step;
    }
  }
}

}  // namespace
}  // namespace graphrun
