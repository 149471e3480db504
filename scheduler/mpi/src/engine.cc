#include "scheduler/mpi/src/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

namespace graphrun::mpi::internal {

namespace {
// Rounds without progress the thread spins (yielding) before it sleeps,
// and how long it sleeps between tests: while messages came in the last
// kBusyWindow, kShortSleep (a message that ends a long kernel elsewhere,
// or a listener's next step, is seen within it: polling 1 ms apart made a
// 2-rank fan-out of 64 MatMuls 1.2x faster than one rank, 100 us apart
// 1.8-2.0x; 20 us apart steals from the kernels of a rank bound to one
// core); after that kLongSleep, so a quiet worker costs little.
constexpr int kSpinRounds = 256;
constexpr auto kShortSleep = std::chrono::microseconds(100);
constexpr auto kLongSleep = std::chrono::microseconds(1000);
constexpr auto kBusyWindow = std::chrono::milliseconds(50);
constexpr auto kFirstSleep = kShortSleep;
// How many times start() tests an operation's round on the kernel's thread
// before the progress thread takes it over (about a microsecond): enough
// for a message already on its way or an eager send, short enough not to
// hold a thread that a local sender may need.
constexpr int kTestsHere = 16;
// How long the end of the engine waits for abandoned sends to complete.
constexpr auto kDrainAtEnd = std::chrono::seconds(1);

Status check_bytes(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    return unimplemented("MPI messages of {} bytes: at most 2^31 - 1 bytes go in one message",
                         bytes);
  }
  return Status::ok();
}

// A valid address for empty messages.
char g_empty = 0;

// The farewell's tag on the control communicator (the distributed
// session's messages use 1 and 2: control.h).
constexpr int kFarewellTag = 3;

// One byte from rank 0 to `dest`; `left` counts the sends not yet complete.
class FarewellSend final : public Operation {
 public:
  FarewellSend(int dest, MPI_Comm comm, std::shared_ptr<std::atomic<int>> left)
      : dest_(dest), comm_(comm), left_(std::move(left)) {}
  bool advance(Round& round) override {
    if (!posted_) {
      posted_ = true;
      if (round.send(&byte_, 1, dest_, kFarewellTag, comm_).is_ok()) return false;
    }
    left_->fetch_sub(1, std::memory_order_release);
    return true;
  }
  bool stopped() const override { return false; }
  void abandon(Status /*why*/) override { left_->fetch_sub(1, std::memory_order_release); }

 private:
  const int dest_;
  const MPI_Comm comm_;
  std::shared_ptr<std::atomic<int>> left_;
  char byte_ = 0;
  bool posted_ = false;
};

// Rank 0's byte, received: sets `arrived`. Cancelled when the engine ends.
class FarewellReceive final : public StepFreeOperation {
 public:
  FarewellReceive(MPI_Comm comm, std::atomic<bool>& arrived) : comm_(comm), arrived_(arrived) {}
  bool advance(Round& round) override {
    if (posted_) {
      arrived_.store(true, std::memory_order_release);
      return true;
    }
    posted_ = true;
    return !round.recv(&byte_, 1, 0, kFarewellTag, comm_).is_ok();
  }

 private:
  const MPI_Comm comm_;
  std::atomic<bool>& arrived_;  // the engine's, which outlives its operations
  char byte_ = 0;
  bool posted_ = false;
};
}  // namespace

Status mpi_error(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return unavailable("{}: {}", call, std::string_view(text, static_cast<std::size_t>(len)));
}

Status Round::post(bool cancellable_receive, void* data, std::size_t bytes, int peer, int tag,
                   MPI_Comm comm, bool receive) {
  receive = receive || cancellable_receive;
  GRAPHRUN_RETURN_IF_ERROR(check_bytes(bytes));
  void* buffer = bytes == 0 ? &g_empty : data;
  const int count = static_cast<int>(bytes);
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = receive ? MPI_Irecv(buffer, count, MPI_BYTE, peer, tag, comm, &request)
                         : MPI_Isend(buffer, count, MPI_BYTE, peer, tag, comm, &request);
  if (rc != MPI_SUCCESS) return mpi_error(rc, receive ? "MPI_Irecv" : "MPI_Isend");
  const uint8_t cancellable = cancellable_receive ? 1 : 0;
  if (size_ < kInline) {
    inline_requests_[size_] = request;
    inline_receives_[size_] = cancellable;
  } else {
    if (size_ == kInline) {
      heap_requests_.assign(inline_requests_, inline_requests_ + kInline);
      heap_receives_.assign(inline_receives_, inline_receives_ + kInline);
    }
    heap_requests_.push_back(request);
    heap_receives_.push_back(cancellable);
  }
  ++size_;
  return Status::ok();
}

Engine::Engine(MPI_Comm comm, MPI_Comm control, bool multiple)
    : comm_(comm), control_(control), multiple_(multiple), thread_([this] { loop(); }) {}

Engine::~Engine() {
  {
    const std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Engine::say_farewell(int size) {
  if (size <= 1) return;
  auto left = std::make_shared<std::atomic<int>>(size - 1);
  for (int dest = 1; dest < size; ++dest) {
    submit(std::make_unique<FarewellSend>(dest, control_, left));
  }
  // A byte is an eager send: it completes at once, wherever its receiver
  // is. The bound only keeps a broken transport from holding the end.
  const auto give_up = std::chrono::steady_clock::now() + kDrainAtEnd;
  while (left->load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void Engine::expect_farewell() { submit(std::make_unique<FarewellReceive>(control_, farewell_)); }

bool Engine::wait_for_farewell(std::chrono::milliseconds timeout) const {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!farewell_received()) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void Engine::submit(std::unique_ptr<Operation> op) {
  hand_over(Active{std::move(op), Round{}, false});
}

void Engine::hand_over(Active a) {
  {
    const std::lock_guard lock(mu_);
    queue_.push_back(std::move(a));
  }
  cv_.notify_one();
}

Engine::Here Engine::advance_here(Active& a) {
  bool done = false;
  // An error, a stop: the progress thread deals with them.
  if (a.op->stopped() || !test(a.round, done).is_ok()) return Here::kTrouble;
  if (!done) return Here::kOut;
  a.round.clear();
  if (!a.op->advance(a.round)) return Here::kOut;
  finished_here(a);
  return Here::kFinished;
}

void Engine::finished_here(Active& a) {
  // Finished with requests out (an error while posting): the progress
  // thread lets them complete before the operation goes.
  if (a.round.empty()) return;
  a.finished = true;
  hand_over(std::move(a));
}

// An operation lent to the thread that waits for its step: that thread
// tests and advances it between its other work until it finishes, or hands
// it to the progress thread (a stop, an MPI error, the thread going to
// sleep).
class Engine::Lent final : public WaitHelper {
 public:
  Lent(Engine& engine, Active a) : engine_(engine), a_(std::move(a)) {}

  // A Recv that waits lends one per transfer: from the thread's blocks,
  // not the heap (it is freed as its kernel ends, before the successors
  // start).
  using Blocks = BlockCache<256>;
  static void* operator new(std::size_t bytes) {
    GRAPHRUN_CHECK(bytes <= Blocks::kSize);
    return Blocks::take();
  }
  static void operator delete(void* p) { Blocks::give(p); }

  bool poll() override {
    switch (engine_.advance_here(a_)) {
      case Here::kOut: return false;
      case Here::kTrouble: release(); return true;
      case Here::kFinished: delete this; return true;
    }
    return false;
  }
  void release() override {
    engine_.hand_over(std::move(a_));
    delete this;
  }

 private:
  ~Lent() = default;
  Engine& engine_;
  Active a_;
};

void Engine::start(std::unique_ptr<Operation> op, OpKernelContext* ctx) {
  static_assert(sizeof(Lent) <= Lent::Blocks::kSize);
  if (!multiple_) {
    submit(std::move(op));
    return;
  }
  Active a{std::move(op), Round{}, false};
  if (a.op->advance(a.round)) {
    finished_here(a);
    return;
  }
  for (int tests = 0; tests < kTestsHere; ++tests) {
    switch (advance_here(a)) {
      case Here::kOut: continue;
      case Here::kFinished: return;
      case Here::kTrouble: hand_over(std::move(a)); return;
    }
  }
  if (ctx != nullptr) {
    auto* lent = new Lent(*this, std::move(a));
    if (!ctx->lend_to_waiter(*lent)) lent->release();
    return;
  }
  hand_over(std::move(a));
}

Status Engine::test(Round& round, bool& done) {
  int flag = 0;
  // One request (most rounds): MPI_Test, which in Open MPI tests again
  // after the progress it makes, so that a message the progress brought in
  // is seen in this call; MPI_Testall makes progress only after its test,
  // and the message would wait for the next poll.
  const bool one = round.size() == 1;
  const int rc = one ? MPI_Test(round.requests(), &flag, MPI_STATUS_IGNORE)
                     : MPI_Testall(static_cast<int>(round.size()), round.requests(), &flag,
                                   MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return mpi_error(rc, one ? "MPI_Test" : "MPI_Testall");
  done = flag != 0;
  return Status::ok();
}

void Engine::cancel_receives(Round& round) {
  MPI_Request* requests = round.requests();
  for (std::size_t k = 0; k < round.size(); ++k) {
    // A receive that already matched completes anyway; one that did not
    // completes as cancelled. Sends complete when their peer receives.
    if (round.cancellable(k) && requests[k] != MPI_REQUEST_NULL) {
      MPI_Cancel(&requests[k]);
    }
  }
}

void Engine::drop(Active& a, Status why) {
  cancel_receives(a.round);
  a.op->abandon(std::move(why));
  if (a.round.empty()) {
    a.op->after_drain({});
  } else {
    a.abandoned = true;
    draining_.push_back(std::move(a));
  }
}

void Engine::drain(Active& a) {
  cancel_receives(a.round);
  if (!a.round.empty()) draining_.push_back(std::move(a));
}

void Engine::test_draining() {
  std::vector<MPI_Status> statuses;
  for (std::size_t k = 0; k < draining_.size();) {
    Round& round = draining_[k].round;
    statuses.resize(round.size());
    int flag = 0;
    const int rc =
        MPI_Testall(static_cast<int>(round.size()), round.requests(), &flag, statuses.data());
    if (rc == MPI_SUCCESS && flag != 0 && draining_[k].abandoned) {
      draining_[k].op->after_drain(statuses);
    }
    if (rc != MPI_SUCCESS || flag != 0) {
      if (k + 1 != draining_.size()) draining_[k] = std::move(draining_.back());
      draining_.pop_back();
    } else {
      ++k;
    }
  }
}

void Engine::loop() {
  int idle = 0;
  auto last_progress = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto wake = [&] { return stopping_ || !queue_.empty(); };
      // Idle, it spins a while too: the next step's operations usually
      // come soon, and a sleeping thread takes a futex wake-up to start.
      if (active_.empty() && draining_.empty() && idle > kSpinRounds) {
        cv_.wait(lock, wake);
      } else if (idle > kSpinRounds) {
        const bool busy = std::chrono::steady_clock::now() - last_progress < kBusyWindow;
        cv_.wait_for(lock, busy ? kShortSleep : kLongSleep, wake);
      }
      if (stopping_) break;
      while (!queue_.empty()) {
        Active& a = queue_.front();
        if (a.finished) {
          drain(a);
        } else {
          active_.push_back(std::move(a));
        }
        queue_.pop_front();
        idle = 0;
        last_progress = std::chrono::steady_clock::now();
      }
    }
    bool progressed = false;
    for (std::size_t k = 0; k < active_.size();) {
      Active& a = active_[k];
      bool finished = false;
      if (a.op->stopped()) {
        drop(a, cancelled("the step stopped while a collective waited"));
        finished = true;
      } else {
        bool done = false;
        // A new operation (empty round) starts; one from start() goes on.
        Status s = test(a.round, done);
        if (!s.is_ok()) {
          drop(a, std::move(s));
          finished = true;
        } else if (done) {
          a.round.clear();
          finished = a.op->advance(a.round);
          // Finished early (an error while posting): what it posted must
          // complete before its buffers go.
          if (finished && !a.round.empty()) {
            drain(a);
          }
        }
        progressed = progressed || done;
      }
      if (finished) {
        progressed = true;
        if (k + 1 != active_.size()) active_[k] = std::move(active_.back());
        active_.pop_back();
      } else {
        ++k;
      }
    }
    test_draining();
    if (progressed) {
      idle = 0;
      last_progress = std::chrono::steady_clock::now();
    } else if (idle <= kSpinRounds) {
      ++idle;  // stops at kSpinRounds + 1: no overflow however long it waits
      std::this_thread::yield();
    }
  }
  // The end: what still waits is abandoned, then its sends get a moment.
  for (Active& a : active_) drop(a, cancelled("the MPI world was shut down"));
  active_.clear();
  // Taken out of the queue first: an operation abandoned here may submit
  // others (a collective's notices), which then go unsent.
  std::deque<Active> left;
  {
    const std::lock_guard lock(mu_);
    left.swap(queue_);
  }
  for (Active& a : left) {
    if (a.finished) {
      drain(a);
    } else {
      drop(a, cancelled("the MPI world was shut down"));
    }
  }
  left.clear();
  const auto give_up = std::chrono::steady_clock::now() + kDrainAtEnd;
  while (!draining_.empty() && std::chrono::steady_clock::now() < give_up) {
    test_draining();
    std::this_thread::sleep_for(kFirstSleep);
  }
  // Sends no peer will receive: MPI may still read their buffers until it
  // is finalised, so they are left allocated.
  for (Active& a : draining_) {
    MPI_Request* requests = a.round.requests();
    for (std::size_t k = 0; k < a.round.size(); ++k) {
      if (requests[k] != MPI_REQUEST_NULL) MPI_Request_free(&requests[k]);
    }
    static_cast<void>(a.op.release());
  }
  draining_.clear();
}

}  // namespace graphrun::mpi::internal
