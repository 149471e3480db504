// Per-thread caches of same-size memory blocks, for objects made and freed
// in every step (small tensor buffers, MPI operations): the next object of
// the kind takes a block its thread freed, with no allocator call.
#pragma once

#include <cstddef>
#include <new>

namespace graphrun::internal {

// Blocks of kBlock bytes, at most kKept freed ones kept per thread.
// A block freed on another thread goes to that thread's blocks, or back to
// the allocator when they are full. At a thread's end its blocks go back,
// and blocks it frees later still (from other thread-local destructors) go
// straight back. The state is constant-initialized and trivially
// destructible, so it is usable at any point of a thread's life.
//
// Thread-safety: each thread touches only its own blocks. Blocks come from
// `Memory::allocate()` and go back by `Memory::deallocate(void*)`; the
// default is operator new/delete.
struct PlainMemory {
  template <std::size_t kBlock>
  static void* allocate() {
    return ::operator new(kBlock);
  }
  static void deallocate(void* p) { ::operator delete(p); }
};

template <std::size_t kBlock, std::size_t kKept = 4, class Memory = PlainMemory>
class BlockCache {
 public:
  static constexpr std::size_t kSize = kBlock;

  static void* take() {
    Kept& mine = kept_;
    if (mine.count > 0) return mine.blocks[--mine.count];
    return Memory::template allocate<kBlock>();
  }
  static void give(void* p) {
    Kept& mine = kept_;
    if (mine.gone || mine.count == kKept) {
      Memory::deallocate(p);
      return;
    }
    if (!mine.registered) {
      mine.registered = true;
      static thread_local Flush flush;
      static_cast<void>(flush);
    }
    mine.blocks[mine.count++] = p;
  }

 private:
  struct Kept {
    void* blocks[kKept];
    std::size_t count;
    bool registered;  // the thread's flush at exit is set up
    bool gone;        // the thread is ending: blocks go back at once
  };
  struct Flush {
    Flush() = default;
    Flush(const Flush&) = delete;
    Flush& operator=(const Flush&) = delete;
    ~Flush() {
      Kept& mine = kept_;
      for (std::size_t i = 0; i < mine.count; ++i) Memory::deallocate(mine.blocks[i]);
      mine.count = 0;
      mine.gone = true;
    }
  };
  static inline constinit thread_local Kept kept_{};
};

}  // namespace graphrun::internal
