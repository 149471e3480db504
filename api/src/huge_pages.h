// Transparent huge pages for graphrun's biggest per-node buffers.
//
// Where the first touch of a 4 KiB page is expensive (it is about 10 us on
// the 2-core VMs graphrun is measured on: a 16 MiB buffer took 43 ms to
// fill, 1.1 ms with 2 MiB pages), a buffer of a million nodes' entries
// spends most of its first use faulting pages in. These helpers ask Linux
// for transparent huge pages (madvise MADV_HUGEPAGE) on buffers of at least
// kHugePageMinBytes before they are filled. They change nothing else: below
// kHugePageMinBytes, on other systems, or with THP disabled ("never"), memory is
// the allocator's as usual.
// Thread safety: thread-safe (the buffer helpers keep no state; the
// node-object slabs below lock per size class).
#pragma once

#include <cstddef>
#include <vector>

namespace graphrun::internal {

// Buffers from this size up are advised: at least one whole, aligned
// 2 MiB page then lies inside.
inline constexpr std::size_t kHugePageMinBytes = std::size_t{4} << 20;

// Advises the whole 2 MiB pages inside [p, p + bytes), if bytes >=
// kHugePageMinBytes. Best effort: failures are ignored.
void advise_huge_pages(void* p, std::size_t bytes) noexcept;

// `bytes` of uninitialised memory aligned to `align` (at most 2 MiB), 2
// MiB-aligned and advised when `bytes` >= kHugePageMinBytes; throws
// std::bad_alloc. Free with free_maybe_huge and the same `bytes` and
// `align`.
void* allocate_maybe_huge(std::size_t bytes, std::size_t align);
void free_maybe_huge(void* p, std::size_t bytes, std::size_t align) noexcept;

// v.reserve(n), then advises the new buffer: call before filling v.
template <typename T>
void reserve_maybe_huge(std::vector<T>& v, std::size_t n) {
  if (n <= v.capacity()) return;
  v.reserve(n);
  advise_huge_pages(v.data(), v.capacity() * sizeof(T));
}

// Memory for the small objects a node keeps for the life of its graph or
// session (a Call node's callable, its kernel): a million of them spread over
// the heap's 4 KiB pages cost a page fault every 40 or so. Objects of up to
// kNodeSlabMaxBytes come, once kNodeSlabAfter of one size class (16 bytes
// apart) have been served by operator new, from 2 MiB slabs that ask for
// huge pages, carved from one reserved address range; a slab whose objects
// are all freed goes back to the system (when another of its class has
// room). Without the range (sanitizer builds, a failed reservation, the
// range used up), operator new. Alignment: 16 bytes. Thread-safe.
inline constexpr std::size_t kNodeSlabMaxBytes = 256;
inline constexpr std::size_t kNodeSlabAfter = std::size_t{1} << 14;
void* allocate_node_object(std::size_t bytes);
void free_node_object(void* p) noexcept;
// For tests: whether this build has slabs, whether `p` lies in one, and how
// many slabs hold objects.
bool node_slabs_enabled() noexcept;
bool in_node_slab(const void* p) noexcept;
std::size_t node_slabs_in_use() noexcept;

// A std allocator over allocate_node_object (for std::allocate_shared).
template <typename T>
struct NodeObjectAllocator {
  using value_type = T;
  NodeObjectAllocator() = default;
  template <typename U>
  NodeObjectAllocator(const NodeObjectAllocator<U>&) noexcept {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= 16);
    return static_cast<T*>(allocate_node_object(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t) noexcept { free_node_object(p); }
  template <typename U>
  bool operator==(const NodeObjectAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace graphrun::internal
