#include "api/src/huge_pages.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

// Slabs hide use-after-free and races on node objects from sanitizers:
// those builds use operator new.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GRAPHRUN_NODE_SLABS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define GRAPHRUN_NODE_SLABS 0
#endif
#endif
#if !defined(GRAPHRUN_NODE_SLABS) && defined(__linux__)
#define GRAPHRUN_NODE_SLABS 1
#endif
#if !defined(GRAPHRUN_NODE_SLABS)
#define GRAPHRUN_NODE_SLABS 0
#endif

namespace graphrun::internal {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

void advise_huge_pages(void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (p == nullptr || bytes < kHugePageMinBytes) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const std::uintptr_t last = (begin + bytes) & ~(kHugePage - 1);
  if (last <= first) return;
  // Best effort: EINVAL (THP not built in) or ENOMEM change nothing.
  (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

void* allocate_maybe_huge(std::size_t bytes, std::size_t align) {
  if (bytes < kHugePageMinBytes) return ::operator new (bytes, std::align_val_t{align});
  // Not rounded up to whole pages (posix_memalign takes any size, where
  // aligned_alloc may want a multiple of the alignment): the tail past the
  // last whole 2 MiB page stays in 4 KiB pages, so a buffer takes no more
  // resident memory than it uses.
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) throw std::bad_alloc();
  advise_huge_pages(p, bytes);
  return p;
}

void free_maybe_huge(void* p, std::size_t bytes, std::size_t align) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugePageMinBytes) {
    ::operator delete (p, bytes, std::align_val_t{align});
  } else {
    std::free(p);
  }
}

#if GRAPHRUN_NODE_SLABS
namespace {

// Slabs of one size class of node objects. A slab is a 2 MiB-aligned piece
// of the reserved range; its header sits in its first bytes.
class NodeSlabs {
 public:
  static NodeSlabs& get() {
    static NodeSlabs* slabs = new NodeSlabs();  // never destroyed: objects may outlive main
    return *slabs;
  }

  void* allocate(std::size_t bytes) {
    if (bytes == 0 || bytes > kNodeSlabMaxBytes) return ::operator new(bytes);
    const std::size_t c = (bytes + kGranule - 1) / kGranule - 1;
    Class& k = classes_[c];
    std::unique_lock lock(k.mu);
    if (k.served < kNodeSlabAfter) {
      ++k.served;
      lock.unlock();
      return ::operator new(bytes);
    }
    Slab* s = k.partial;
    if (s == nullptr) {
      s = new_slab(c);
      if (s == nullptr) {
        lock.unlock();
        return ::operator new(bytes);
      }
      push(k, s);
    }
    void* p = nullptr;
    if (s->free != nullptr) {
      p = s->free;
      s->free = *static_cast<void**>(p);
    } else {
      p = s->bump;
      s->bump += s->object_bytes;
    }
    ++s->in_use;
    if (s->free == nullptr && s->bump + s->object_bytes > s->end) {
      unlink(k, s);
      s->full = true;
    }
    return p;
  }

  bool owns(const void* p) const noexcept {
    const std::size_t n = range_bytes_.load(std::memory_order_acquire);  // 0: no range
    return reinterpret_cast<std::uintptr_t>(p) - base_.load(std::memory_order_relaxed) < n;
  }

  void free(void* p) noexcept {
    if (!owns(p)) {
      ::operator delete(p);
      return;
    }
    auto* s = reinterpret_cast<Slab*>(reinterpret_cast<std::uintptr_t>(p) & ~(kHugePage - 1));
    Class& k = classes_[s->size_class];
    std::unique_lock lock(k.mu);
    *static_cast<void**>(p) = s->free;
    s->free = p;
    --s->in_use;
    if (s->full) {
      s->full = false;
      push(k, s);
    }
    if (s->in_use == 0 && (k.partial != s || s->next != nullptr)) {
      // Another slab of the class has room: this one goes back.
      unlink(k, s);
      lock.unlock();
      release(s);
    }
  }

  std::size_t in_use() noexcept {
    std::lock_guard lock(range_mu_);
    return slabs_in_use_;
  }

 private:
  static constexpr std::size_t kGranule = 16;
  static constexpr std::size_t kClasses = kNodeSlabMaxBytes / kGranule;
  // Address space only (MAP_NORESERVE): memory is taken page by page.
  static constexpr std::size_t kRangeBytes = std::size_t{64} << 30;

  struct Slab {
    std::size_t size_class;
    std::size_t object_bytes;
    std::size_t in_use;
    void* free;  // freed objects, linked through their first bytes
    char* bump;  // the first never-used object
    char* end;
    Slab* prev;  // in the class's list of slabs with room
    Slab* next;
    bool full;
  };
  static constexpr std::size_t kHeaderBytes = (sizeof(Slab) + kGranule - 1) / kGranule * kGranule;

  struct Class {
    std::mutex mu;
    std::size_t served = 0;   // objects operator new served first
    Slab* partial = nullptr;  // slabs with room
  };

  static void push(Class& k, Slab* s) {
    s->prev = nullptr;
    s->next = k.partial;
    if (k.partial != nullptr) k.partial->prev = s;
    k.partial = s;
  }
  static void unlink(Class& k, Slab* s) {
    if (s->prev != nullptr) s->prev->next = s->next;
    if (s->next != nullptr) s->next->prev = s->prev;
    if (k.partial == s) k.partial = s->next;
    s->prev = s->next = nullptr;
  }

  // A slab for class c, or null without the range.
  Slab* new_slab(std::size_t c) {
    char* mem = nullptr;
    {
      std::lock_guard lock(range_mu_);
      if (!reserved_) reserve();
      if (!free_slabs_.empty()) {
        mem = free_slabs_.back();
        free_slabs_.pop_back();
      } else if (next_ + kHugePage <= range_bytes_.load(std::memory_order_relaxed)) {
        mem = reinterpret_cast<char*>(base_.load(std::memory_order_relaxed) + next_);
        next_ += kHugePage;
      } else {
        return nullptr;
      }
      ++slabs_in_use_;
    }
    const std::size_t object_bytes = (c + 1) * kGranule;
    return new (mem) Slab{.size_class = c,
                          .object_bytes = object_bytes,
                          .in_use = 0,
                          .free = nullptr,
                          .bump = mem + kHeaderBytes,
                          .end = mem + kHugePage,
                          .prev = nullptr,
                          .next = nullptr,
                          .full = false};
  }

  void release(Slab* s) noexcept {
    char* mem = reinterpret_cast<char*>(s);
    // The memory goes back to the system; the addresses stay reserved.
    (void)madvise(mem, kHugePage, MADV_DONTNEED);
    std::lock_guard lock(range_mu_);
    free_slabs_.push_back(mem);
    --slabs_in_use_;
  }

  void reserve() {
    reserved_ = true;
    // Room for every slab's address, so that release() never allocates.
    free_slabs_.reserve(kRangeBytes / kHugePage);
    void* p = mmap(nullptr, kRangeBytes + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;  // range_bytes_ stays 0: operator new
    const auto first = (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) & ~(kHugePage - 1);
#if defined(MADV_HUGEPAGE)
    (void)madvise(reinterpret_cast<void*>(first), kRangeBytes, MADV_HUGEPAGE);
#endif
    base_.store(first, std::memory_order_relaxed);
    range_bytes_.store(kRangeBytes, std::memory_order_release);
  }

  std::array<Class, kClasses> classes_;
  std::mutex range_mu_;
  bool reserved_ = false;
  std::atomic<std::uintptr_t> base_ = 0;
  std::atomic<std::size_t> range_bytes_ = 0;  // set last: owns() reads it first
  std::size_t next_ = 0;                      // offset of the next never-used slab
  std::vector<char*> free_slabs_;
  std::size_t slabs_in_use_ = 0;
};

}  // namespace

void* allocate_node_object(std::size_t bytes) { return NodeSlabs::get().allocate(bytes); }
void free_node_object(void* p) noexcept {
  if (p != nullptr) NodeSlabs::get().free(p);
}
bool node_slabs_enabled() noexcept { return true; }
bool in_node_slab(const void* p) noexcept { return NodeSlabs::get().owns(p); }
std::size_t node_slabs_in_use() noexcept { return NodeSlabs::get().in_use(); }
#else
void* allocate_node_object(std::size_t bytes) { return ::operator new(bytes); }
void free_node_object(void* p) noexcept { ::operator delete(p); }
bool node_slabs_enabled() noexcept { return false; }
bool in_node_slab(const void*) noexcept { return false; }
std::size_t node_slabs_in_use() noexcept { return 0; }
#endif

}  // namespace graphrun::internal
