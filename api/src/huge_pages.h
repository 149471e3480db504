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
// Thread safety: thread-safe (no state).
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

}  // namespace graphrun::internal
