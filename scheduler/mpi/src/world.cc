#include <graphrun/mpi.h>
#include <mpi.h>

#include <chrono>
#include <mutex>
#include <unordered_map>

#include "scheduler/mpi/src/engine.h"
#include "scheduler/mpi/src/wire.h"

namespace graphrun::mpi {

namespace {
std::mutex g_mu;
std::weak_ptr<World> g_world;  // guarded by g_mu
bool g_finalized = false;      // guarded by g_mu: a World finalised MPI
// Tags carry a collective's key id and invocation number: see
// collectives.cc. MPI guarantees only 32767; Open MPI gives 2^31 - 1.
constexpr int kNeededTagBound = (1 << 30) - 1;
// How long a rank other than 0 waits, as its World ends, for rank 0's
// farewell (Engine::say_farewell) before it finalises MPI without it.
constexpr auto kFarewellWait = std::chrono::seconds(10);
}  // namespace

struct World::Invocations {
  std::mutex mu;
  // key hash -> next invocation; a node-based map, so a counter stays where
  // it is while others are added.
  std::unordered_map<uint64_t, std::atomic<uint64_t>> next;
};

Result<std::shared_ptr<World>> World::init(int* argc, char*** argv) {
  const std::lock_guard lock(g_mu);
  if (std::shared_ptr<World> live = g_world.lock()) return live;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_finalized || finalized != 0) {
    return failed_precondition(
        "MPI was finalised in this process (when the last graphrun::mpi::World ended, or by the "
        "program); a process initialises MPI once");
  }
  std::shared_ptr<World> world(new World());
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (initialized == 0) {
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return internal::mpi_error(rc, "MPI_Init_thread");
    world->finalize_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  auto fail = [&](Status s) -> Result<std::shared_ptr<World>> {
    if (world->finalize_) {
      MPI_Finalize();
      g_finalized = true;
    }
    world->finalize_ = false;
    return s;
  };
  if (provided < MPI_THREAD_SERIALIZED) {
    return fail(failed_precondition(
        "MPI granted thread level {}: graphrun needs MPI_THREAD_SERIALIZED or "
        "MPI_THREAD_MULTIPLE (initialise MPI with MPI_Init_thread, or let World::init do it)",
        provided));
  }
  // One communicator for the kernels' tensors, one for the distributed
  // session's control messages: their tags never meet.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;
  if (const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm); rc != MPI_SUCCESS) {
    return fail(internal::mpi_error(rc, "MPI_Comm_dup"));
  }
  if (const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &control); rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return fail(internal::mpi_error(rc, "MPI_Comm_dup"));
  }
  // Errors come back as codes (turned into Status), never abort the job.
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &world->rank_);
  MPI_Comm_size(comm, &world->size_);
  int* tag_bound = nullptr;
  int has_bound = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, static_cast<void*>(&tag_bound), &has_bound);
  if (has_bound == 0 || tag_bound == nullptr || *tag_bound < kNeededTagBound) {
    MPI_Comm_free(&comm);
    MPI_Comm_free(&control);
    return fail(unimplemented("this MPI's largest tag is {}; graphrun needs at least 2^30 - 1",
                              has_bound != 0 && tag_bound != nullptr ? *tag_bound : 0));
  }
  world->thread_level_ = provided;
  world->invocations_ = std::make_unique<Invocations>();
  world->engine_ =
      std::make_unique<internal::Engine>(comm, control, provided == MPI_THREAD_MULTIPLE);
  if (world->rank_ != 0) world->engine_->expect_farewell();
  internal::open_collective_book(*world);
  register_ops(OpRegistry::global());
  g_world = world;
  return world;
}

std::shared_ptr<World> World::current() {
  const std::lock_guard lock(g_mu);
  return g_world.lock();
}

World::~World() {
  if (engine_ != nullptr) {
    if (rank_ == 0) {
      engine_->say_farewell(size_);
    } else if (finalize_) {
      // MPI_Finalize waits for every rank anyway; here the wait is bounded
      // (a rank 0 that never made a World sends no farewell).
      static_cast<void>(engine_->wait_for_farewell(kFarewellWait));
    }
  }
  MPI_Comm comm = engine_ != nullptr ? engine_->comm() : MPI_COMM_NULL;
  MPI_Comm control = engine_ != nullptr ? engine_->control_comm() : MPI_COMM_NULL;
  engine_.reset();  // joins the progress thread
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  if (control != MPI_COMM_NULL) MPI_Comm_free(&control);
  if (finalize_) {
    MPI_Finalize();
    const std::lock_guard lock(g_mu);
    g_finalized = true;
  }
}

std::atomic<uint64_t>& World::invocation_counter(uint64_t key_hash) {
  const std::lock_guard lock(invocations_->mu);
  return invocations_->next[key_hash];
}

}  // namespace graphrun::mpi
