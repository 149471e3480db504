#include <graphrun/tensor.h>

#include <malloc.h>
#if GRAPHRUN_TBBMALLOC
#include <oneapi/tbb/scalable_allocator.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <ostream>
#include <vector>

#include "api/src/block_cache.h"

namespace graphrun {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kInvalid: break;
  }
  return "invalid";
}

DType dtype_from_name(std::string_view name) {
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "float64" || name == "double") return DType::kFloat64;
  if (name == "int32") return DType::kInt32;
  if (name == "int64") return DType::kInt64;
  if (name == "bool") return DType::kBool;
  return DType::kInvalid;
}

// ---- Shape ----

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  GRAPHRUN_CHECK_MSG(
      dims.size() <= static_cast<std::size_t>(kMaxRank),
      fmt::format("rank {} exceeds graphrun's maximum of {}", dims.size(), kMaxRank));
  rank_ = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), dims_.begin());
}

Result<Shape> Shape::make(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<std::size_t>(kMaxRank)) {
    return invalid_argument("rank {} exceeds graphrun's maximum of {}", dims.size(), kMaxRank);
  }
  for (int64_t d : dims) {
    if (d < kUnknownDim) return invalid_argument("negative dimension {} in a shape", d);
  }
  // The product of the known non-zero dimensions must fit int64, wherever a
  // 0 stands (code multiplying some of the dimensions would meet it).
  if (!product_of_positive_dims(1, dims, std::numeric_limits<int64_t>::max())) {
    return invalid_argument("shape [{}] has more elements than int64 can count",
                            fmt::join(dims, ","));
  }
  return Shape(dims);
}

void Shape::add_dim(int64_t value) {
  GRAPHRUN_CHECK(rank_ >= 0 && rank_ < kMaxRank);
  dims_[static_cast<std::size_t>(rank_++)] = value;
}

bool Shape::is_fully_defined() const {
  if (rank_ < 0) return false;
  for (int64_t d : dims()) {
    if (d < 0) return false;
  }
  return true;
}

int64_t Shape::num_elements() const {
  if (!is_fully_defined()) return -1;
  // A 0 wherever it stands: [M,M,0] holds 0 elements, not "too many".
  if (std::ranges::find(dims(), 0) != dims().end()) return 0;
  // Saturates instead of overflowing (shapes may come from untrusted input).
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return product_of_positive_dims(1, dims(), kMax).value_or(kMax);
}

std::string Shape::to_string() const {
  if (rank_ < 0) return "<unknown>";
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i > 0) s += ',';
    s += dim(i) < 0 ? std::string("?") : std::to_string(dim(i));
  }
  s += ']';
  return s;
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < std::max(a.rank_, 0); ++i) {
    if (a.dim(i) != b.dim(i)) return false;
  }
  return true;
}

// ---- TensorBuffer: one allocation, header then 64-byte aligned data ----

namespace internal {
namespace {
// 64-byte aligned memory (header, then data).
struct BufferMemory {
  static void* allocate(std::size_t n) {
#if GRAPHRUN_TBBMALLOC
    void* mem = scalable_aligned_malloc(n, 64);
    if (mem == nullptr) throw std::bad_alloc();
    return mem;
#else
    return ::operator new (n, std::align_val_t{64});
#endif
  }
  template <std::size_t kBlock>
  static void* allocate() {
    return allocate(kBlock);
  }
  static void deallocate(void* mem) {
#if GRAPHRUN_TBBMALLOC
    scalable_aligned_free(mem);
#else
    ::operator delete (mem, std::align_val_t{64});
#endif
  }
};

// Buffers of at most kSmallBytes (a scalar's, a short vector's: made and
// dropped in every step of a small graph) are all of one block size, and a
// few freed blocks are kept per thread for the next ones.
// With tbbmalloc only: builds without it (the sanitizers' builds) make
// every buffer with operator new, at its exact size, so that the
// sanitizers see each buffer and its end, and the allocation tests count
// one operator new per buffer. The sanitizer checks below matter only for
// a build that asks for tbbmalloc and a sanitizer together.
constexpr std::size_t kSmallBytes = 64;
#if !GRAPHRUN_TBBMALLOC || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCacheSmall = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kCacheSmall = false;
#else
constexpr bool kCacheSmall = true;
#endif
#else
constexpr bool kCacheSmall = true;
#endif
using SmallBlocks = BlockCache<kTensorBufferHeader + kSmallBytes, 8, BufferMemory>;
}  // namespace

struct alignas(64) TensorBuffer {
  std::atomic<int64_t> refs{1};
  std::size_t bytes = 0;

  std::byte* data() { return reinterpret_cast<std::byte*>(this + 1); }

  static TensorBuffer* create(std::size_t bytes, bool zero) {
    ++allocated_by_this_thread;
    void* mem = kCacheSmall && bytes <= kSmallBytes
                    ? SmallBlocks::take()
                    : BufferMemory::allocate(sizeof(TensorBuffer) + bytes);
    auto* b = new (mem) TensorBuffer;
    b->bytes = bytes;
    if (zero && bytes > 0) std::memset(b->data(), 0, bytes);
    return b;
  }
  void ref() {
    refs.fetch_add(1, std::memory_order_relaxed);
  }  // relaxed: a new ref comes from an existing one
  void unref() {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      const bool small = kCacheSmall && bytes <= kSmallBytes;
      this->~TensorBuffer();
      if (small) {
        SmallBlocks::give(this);
      } else {
        BufferMemory::deallocate(this);
      }
    }
  }

  static thread_local int64_t allocated_by_this_thread;
};

thread_local int64_t TensorBuffer::allocated_by_this_thread = 0;

int64_t tensor_buffers_allocated_by_this_thread() { return TensorBuffer::allocated_by_this_thread; }
void ref_tensor_buffer(TensorBuffer* b) noexcept { b->ref(); }
void unref_tensor_buffer(TensorBuffer* b) noexcept { b->unref(); }
static_assert(sizeof(TensorBuffer) == kTensorBufferHeader);
}  // namespace internal

namespace {
// The byte size of a `dtype` tensor of `shape`, its element count in
// `elements`.
Result<std::size_t> checked_bytes(DType dtype, const Shape& shape, int64_t& elements) {
  if (dtype == DType::kInvalid)
    return invalid_argument("cannot allocate a tensor of invalid dtype");
  if (!shape.is_fully_defined()) {
    return invalid_argument("cannot allocate a tensor of shape {}: not fully defined",
                            shape.to_string());
  }
  // Overflow-checked product: shapes may come from untrusted input. The
  // limit applies to the non-zero dimensions wherever a 0 stands, so that
  // [0,M,M] and [M,M,0] are treated alike (both refused when M*M is too
  // large, although neither holds an element).
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  constexpr int64_t kLimit = std::numeric_limits<int64_t>::max() / 2;
  const std::optional<int64_t> counted = product_of_positive_dims(size, shape.dims(), kLimit);
  if (!counted) {
    return resource_exhausted("tensor {}{} is too large", dtype_name(dtype), shape.to_string());
  }
  // (a fully defined shape: no dimension below 0)
  const int64_t bytes = std::ranges::find(shape.dims(), 0) != shape.dims().end() ? 0 : *counted;
  elements = bytes / size;
  return static_cast<std::size_t>(bytes);
}
}  // namespace

Tensor::Tensor(DType dtype, const Shape& shape) {
  Result<Tensor> t = allocate(dtype, shape);
  GRAPHRUN_CHECK_MSG(t.is_ok(), t.status().to_string());
  *this = std::move(*t);
}

Result<Tensor> Tensor::allocate_storage(DType dtype, const Shape& shape, bool zero) {
  int64_t elements = 0;
  GRAPHRUN_ASSIGN_OR_RETURN(std::size_t bytes, checked_bytes(dtype, shape, elements));
  Tensor t;
  try {
    t.buffer_ = bytes == 0 ? nullptr : internal::TensorBuffer::create(bytes, zero);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("out of memory allocating {} bytes for a {}{} tensor", bytes,
                              dtype_name(dtype), shape.to_string());
  }
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.num_elements_ = elements;
  return t;
}

Result<Tensor> Tensor::allocate(DType dtype, const Shape& shape) {
  return allocate_storage(dtype, shape, /*zero=*/true);
}

Result<Tensor> Tensor::allocate_uninitialized(DType dtype, const Shape& shape) {
  return allocate_storage(dtype, shape, /*zero=*/false);
}

Tensor Tensor::from_bytes(DType dtype, const Shape& shape, const void* data, std::size_t bytes) {
  Result<Tensor> t = allocate_uninitialized(dtype, shape);
  GRAPHRUN_CHECK_MSG(t.is_ok(), t.status().to_string());
  GRAPHRUN_CHECK(t->byte_size() == bytes);
  if (bytes > 0) std::memcpy(t->raw_data(), data, bytes);
  return std::move(*t);
}

void Tensor::check_type(DType requested) const {
  if (requested != dtype_) {
    internal::check_failed(
        __FILE__, __LINE__, "Tensor element type",
        fmt::format("accessed a {} tensor as {}", dtype_name(dtype_), dtype_name(requested)));
  }
}

bool Tensor::is_sole_owner() const {
  return buffer_ == nullptr || buffer_->refs.load(std::memory_order_acquire) == 1;
}

Tensor Tensor::deep_copy() const {
  if (!is_initialized()) return Tensor();
  return from_bytes(dtype_, shape_, raw_data(), byte_size());
}

Result<Tensor> Tensor::reshaped(const Shape& shape) const {
  if (shape.num_elements() != num_elements_) {
    return invalid_argument("cannot reshape a tensor of shape {} ({} elements) to {}",
                            shape_.to_string(), num_elements_, shape.to_string());
  }
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

bool Tensor::equals(const Tensor& other) const {
  if (dtype_ != other.dtype_ || !(shape_ == other.shape_)) return false;
  if (!is_initialized()) return true;
  return visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    auto a = flat<T>();
    auto b = other.flat<T>();
    return std::equal(a.begin(), a.end(), b.begin());
  });
}

bool Tensor::all_close(const Tensor& other, double rtol, double atol) const {
  if (dtype_ != other.dtype_ || !(shape_ == other.shape_)) return false;
  if (!is_initialized()) return true;
  return visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    auto a = flat<T>();
    auto b = other.flat<T>();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto x = static_cast<double>(a[i]);
      const auto y = static_cast<double>(b[i]);
      if (std::isnan(x) || std::isnan(y)) {
        if (std::isnan(x) != std::isnan(y)) return false;
        continue;
      }
      if (std::abs(x - y) > atol + rtol * std::abs(y)) return false;
    }
    return true;
  });
}

std::string Tensor::debug_type() const {
  return fmt::format("{}{}", dtype_name(dtype_), shape_.to_string());
}

namespace {
// Appends dimension `d` of the block starting at flat index `base`.
template <typename T>
void print_block(std::string& out, std::span<const T> v, const Shape& shape, int d, int64_t base,
                 int64_t stride, int64_t& budget) {
  if (d == shape.rank()) {
    out += fmt::format("{}", v[static_cast<std::size_t>(base)]);
    --budget;
    return;
  }
  if (shape.dim(d) == 0) {
    // An empty list counts as one element against the budget, so that a
    // zero-element tensor of shape [N,M,0] prints at most `budget` of its
    // N*M empty lists rather than all of them.
    out += "[]";
    --budget;
    return;
  }
  const int64_t inner = stride / shape.dim(d);
  out += '[';
  for (int64_t i = 0; i < shape.dim(d); ++i) {
    if (i > 0) out += ", ";
    if (budget <= 0) {
      out += "...";
      break;
    }
    print_block(out, v, shape, d + 1, base + i * inner, inner, budget);
  }
  out += ']';
}
}  // namespace

std::string Tensor::to_string(int64_t max_elements) const {
  if (!is_initialized()) return "<uninitialized tensor>";
  std::string out = debug_type() + " ";
  visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    int64_t budget = max_elements;
    print_block<T>(out, flat<T>(), shape_, 0, 0, num_elements_, budget);
    return 0;
  });
  return out;
}

void PrintTo(const Tensor& t, std::ostream* os) { *os << t.to_string(); }
void PrintTo(const Shape& s, std::ostream* os) { *os << s.to_string(); }
std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

void release_cached_memory() {
#if GRAPHRUN_TBBMALLOC
  scalable_allocation_command(TBBMALLOC_CLEAN_ALL_BUFFERS, nullptr);
#endif
  // glibc keeps the freed graph and plan memory of a closed session in its
  // heaps (measured: all of a 300,000-node session's 400 MB) until trimmed.
  ::malloc_trim(0);
}

}  // namespace graphrun
