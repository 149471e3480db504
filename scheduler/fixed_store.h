// FixedStore<T>: up to a fixed number of objects constructed in place, in
// one allocation (huge pages when big: api/src/huge_pages.h), never moved.
// For a plan's flow-graph nodes (oneTBB nodes cannot move): a std::deque of
// them took a 512-byte block per 3 nodes, and a million nodes' 152 MB came
// in 4 KiB pages, each a costly first touch on the VMs graphrun is
// measured on.
// Thread safety: thread-compatible.
#pragma once

#include <cassert>
#include <cstddef>
#include <new>
#include <utility>

#include "api/src/huge_pages.h"

namespace graphrun::sched {

template <typename T>
class FixedStore {
 public:
  FixedStore() = default;
  FixedStore(const FixedStore&) = delete;
  FixedStore& operator=(const FixedStore&) = delete;
  ~FixedStore() { reset(); }

  // Room for `capacity` objects; once, before the first emplace_back.
  void reserve(std::size_t capacity) {
    assert(data_ == nullptr);
    if (capacity == 0) return;
    data_ = static_cast<T*>(internal::allocate_maybe_huge(capacity * sizeof(T), alignof(T)));
    capacity_ = capacity;
  }

  // Constructs the next object; at most `capacity` of them.
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    assert(size_ < capacity_);
    T* p = ::new (static_cast<void*>(data_ + size_)) T(std::forward<Args>(args)...);
    ++size_;
    return *p;
  }

  std::size_t size() const { return size_; }

  // Destroys the objects in the order they were made, then frees.
  void reset() noexcept {
    for (std::size_t i = 0; i < size_; ++i) data_[i].~T();
    internal::free_maybe_huge(data_, capacity_ * sizeof(T), alignof(T));
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace graphrun::sched
