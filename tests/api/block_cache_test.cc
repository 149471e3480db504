// api/src/block_cache.h: per-thread blocks of one size, reused by the
// thread that freed them, given back at the thread's end, and never kept
// once the thread's end has begun.
#include "api/src/block_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace graphrun::internal {
namespace {

// Counts the blocks it hands out and takes back; one tag per test, so that
// each test has caches and counts of its own.
template <int kTag>
struct CountingMemory {
  static inline std::atomic<int> live{0};
  static inline std::atomic<int> allocations{0};
  template <std::size_t kBlock>
  static void* allocate() {
    ++live;
    ++allocations;
    return ::operator new(kBlock);
  }
  static void deallocate(void* p) {
    --live;
    ::operator delete(p);
  }
};

TEST(BlockCacheTest, AFreedBlockIsTheThreadsNextAndTheKeptOnesGoBackAtItsEnd) {
  using Memory = CountingMemory<1>;
  using Cache = BlockCache<64, 2, Memory>;
  std::thread([] {
    void* a = Cache::take();
    void* b = Cache::take();
    void* c = Cache::take();
    EXPECT_EQ(Memory::allocations, 3);
    Cache::give(a);
    Cache::give(b);
    Cache::give(c);  // more than the 2 kept: back to the allocator at once
    EXPECT_EQ(Memory::live, 2);
    EXPECT_EQ(Cache::take(), b);  // the last freed first, without an allocation
    EXPECT_EQ(Cache::take(), a);
    EXPECT_EQ(Memory::allocations, 3);
    Cache::give(a);
    Cache::give(b);
    EXPECT_EQ(Memory::live, 2);
  }).join();
  EXPECT_EQ(Memory::live, 0);  // the thread's kept blocks went back at its end
}

TEST(BlockCacheTest, ABlockFreedOnAnotherThreadJoinsThatThreadsBlocks) {
  using Memory = CountingMemory<2>;
  using Cache = BlockCache<64, 4, Memory>;
  void* made = nullptr;
  std::thread([&made] { made = Cache::take(); }).join();
  ASSERT_EQ(Memory::live, 1);
  std::thread([made] {
    Cache::give(made);
    EXPECT_EQ(Cache::take(), made);  // now this thread's block
    EXPECT_EQ(Memory::allocations, 1);
    Cache::give(made);
  }).join();
  EXPECT_EQ(Memory::live, 0);
}

// A thread-local object destroyed after the cache's end-of-thread flush
// frees a block: it goes straight back instead of into blocks nobody will
// give back.
TEST(BlockCacheTest, ABlockFreedAfterTheThreadsFlushGoesStraightBack) {
  using Memory = CountingMemory<3>;
  using Cache = BlockCache<64, 4, Memory>;
  struct Late {
    void* block = nullptr;
    Late() = default;
    Late(const Late&) = delete;
    Late& operator=(const Late&) = delete;
    ~Late() {
      if (block != nullptr) Cache::give(block);
    }
  };
  std::thread([] {
    // Made before the cache's flush (set up by the first give), so
    // destroyed after it.
    thread_local Late late;
    late.block = Cache::take();
    Cache::give(Cache::take());
    EXPECT_EQ(Memory::live, 2);
  }).join();
  EXPECT_EQ(Memory::live, 0);
}

}  // namespace
}  // namespace graphrun::internal
