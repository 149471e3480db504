// A prepared run (Callable) allocates nothing on the heap beyond the tensors
// its kernels produce. Counts global operator new calls and tensor buffers
// (which come from tbbmalloc in optimised builds) around steady-state runs;
// this binary replaces the global allocation functions. The graphs here are
// cheap enough to run inline, so every buffer is allocated on the caller:
// the sessions raise the inline threshold, because a sanitizer build's
// instrumented elementwise kernel can measure above the default 8000 cycles,
// and the cost model would then give it a task on a worker thread.
#include <graphrun/graphrun.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "tests/testing/op_harness.h"

// g++ 12 pairs an inlined `new T` with the std::free in the replaced
// operator delete below and warns of a mismatch; both sides are this file's
// own malloc-based pair, so the warning is a false positive here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

void* counted_alloc(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed))
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n == 0 ? 1 : n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace graphrun {
namespace {

// Sessions whose kernels all stay cheap (run inline on the caller).
std::unique_ptr<Session> inline_session(const Graph& g) {
  SessionOptions options;
  options.inline_below_cycles = 1'000'000'000;
  return testing::make_session(g, options);
}

struct PerRun {
  double heap = 0;     // operator new calls (tensor buffers included without tbbmalloc)
  double buffers = 0;  // tensor buffers
};

// Allocations per run of `callable`, averaged over steady-state runs.
PerRun allocations_per_run(const Callable& callable, std::span<const Tensor> feeds,
                           std::span<Tensor> fetches) {
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(callable.run(feeds, fetches).is_ok());  // warm pools
  constexpr int kRuns = 500;
  const int64_t buffers_before = internal::tensor_buffers_allocated_by_this_thread();
  g_allocations.store(0);
  g_counting.store(true);
  for (int i = 0; i < kRuns; ++i) {
    Status s = callable.run(feeds, fetches);
    if (!s.is_ok()) ADD_FAILURE() << s.to_string();
  }
  g_counting.store(false);
  const int64_t buffers = internal::tensor_buffers_allocated_by_this_thread() - buffers_before;
  return {static_cast<double>(g_allocations.load()) / kRuns, static_cast<double>(buffers) / kRuns};
}

// Heap allocations besides tensor buffers, per run.
double other_heap_per_run(const PerRun& r) {
#if GRAPHRUN_TBBMALLOC
  return r.heap;
#else
  return r.heap - r.buffers;
#endif
}

TEST(AllocationTest, PreparedRunOfBufferSharingOpsAllocatesNothing) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{16}, "x");
  Output y = x;
  for (int i = 0; i < 10; ++i) y = ops::Identity(g, y);
  Output z = ops::Reshape(g, y, std::vector<int64_t>{4, 4});
  auto s = inline_session(g);
  auto callable = s->make_callable({x}, {z});
  ASSERT_TRUE(callable.is_ok()) << callable.status().to_string();
  Tensor feed = Tensor::filled<float>(Shape{16}, 1.0f);
  std::vector<Tensor> out(1);
  const PerRun per_run = allocations_per_run(*callable, {&feed, 1}, out);
  EXPECT_EQ(per_run.buffers, 0.0);
  EXPECT_EQ(other_heap_per_run(per_run), 0.0);
  EXPECT_EQ(out[0].shape(), (Shape{4, 4}));
}

TEST(AllocationTest, PreparedRunAllocatesOnlyKernelOutputs) {
  Graph g;
  Output x = ops::Placeholder(g, DType::kFloat32, Shape{8}, "x");
  Output a = ops::Add(g, x, x);  // one new tensor
  Output b = ops::Mul(g, a, x);  // one new tensor
  Output c = ops::Neg(g, b);     // one new tensor
  auto s = inline_session(g);
  auto callable = s->make_callable({x}, {c});
  ASSERT_TRUE(callable.is_ok()) << callable.status().to_string();
  Tensor feed = Tensor::filled<float>(Shape{8}, 2.0f);
  std::vector<Tensor> out(1);
  const PerRun per_run = allocations_per_run(*callable, {&feed, 1}, out);
  EXPECT_EQ(per_run.buffers, 3.0);
  EXPECT_EQ(other_heap_per_run(per_run), 0.0);
  EXPECT_TRUE(out[0].equals(Tensor::filled<float>(Shape{8}, -8.0f)));
}

}  // namespace
}  // namespace graphrun
