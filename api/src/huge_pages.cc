#include "api/src/huge_pages.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
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

}  // namespace graphrun::internal
