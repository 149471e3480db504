/// @file graphrun/tensor.h
/// DType, Shape and Tensor: the values that flow along a graph's edges.
///
/// A Tensor is a typed, shaped, reference-counted view of a 64-byte aligned
/// buffer. Copying a Tensor shares the buffer (cheap); `deep_copy()` does not.
/// Element access is by std::span; Eigen views live in <graphrun/eigen.h>.
///
/// @code
///   Tensor a = Tensor::matrix<float>({{1, 2}, {3, 4}});
///   Tensor b(3.0f);                        // scalar
///   Tensor c{1.0f, 2.0f, 3.0f};            // vector of 3 (note: Tensor{3.0f} is a vector)
///   for (float& v : a.flat<float>()) v *= 2;
/// @endcode
///
/// Thread safety: thread-compatible. Copies of one Tensor may be used from
/// different threads (the reference count is atomic); writing the elements of
/// a shared buffer while another thread reads them is a data race.
#pragma once

#include <graphrun/status.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace graphrun {

/// Numbered as TensorFlow's DataType so that GraphDefs map directly.
/// `fmt::format("{}", dtype)` prints dtype_name().
enum class DType : uint8_t {
  kInvalid = 0,  ///< no dtype: an uninitialized tensor
  kFloat32 = 1,  ///< float
  kFloat64 = 2,  ///< double
  kInt32 = 3,    ///< int32_t
  kInt64 = 9,    ///< int64_t
  kBool = 10,    ///< bool
};

/// "float32", "float64", "int32", "int64", "bool", "invalid".
std::string_view dtype_name(DType dtype);
/// Bytes per element; 0 for kInvalid.
constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
    case DType::kInvalid: break;
  }
  return 0;
}
/// Parses the names above (and TF's "float", "double"); kInvalid when unknown.
DType dtype_from_name(std::string_view name);

/// The DType of element type T (float, double, int32_t, int64_t, bool);
/// any other T does not compile.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kFloat64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kInt64;
  else if constexpr (std::is_same_v<T, bool>)
    return DType::kBool;
  else
    static_assert(sizeof(T) == 0, "graphrun: unsupported element type");
}

/// Calls fn(T{}) with T the C++ type of `dtype` (float, double, int32_t,
/// int64_t, bool). Returns fn's result; `dtype` must be valid.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat64: return fn(double{});
    case DType::kInt32: return fn(int32_t{});
    case DType::kInt64: return fn(int64_t{});
    case DType::kBool: return fn(bool{});
    case DType::kInvalid: break;
  }
  internal::check_failed(__FILE__, __LINE__, "visit_dtype", "invalid dtype");
}

/// A tensor shape. Rank may be unknown (for placeholders declared without a
/// shape) and dimensions may be unknown (-1), e.g. [?,784]. Dimensions are
/// stored inline (no heap), up to kMaxRank. `fmt::format("{}", shape)`
/// prints to_string().
///
/// Thread safety: thread-compatible (a value).
class Shape {
 public:
  static constexpr int kMaxRank = 8;          ///< the most dimensions a shape has
  static constexpr int64_t kUnknownDim = -1;  ///< an unknown dimension, printed as ?

  Shape() = default;                              ///< a scalar: rank 0, one element
  Shape(std::initializer_list<int64_t> dims);     ///< aborts past kMaxRank
  explicit Shape(std::span<const int64_t> dims);  ///< aborts past kMaxRank

  /// Validating constructor for untrusted input: rank <= kMaxRank, every
  /// dimension >= -1, the product of the non-zero dimensions fits int64
  /// (wherever a 0 stands: [0,M,M] is refused like [M,M,0]).
  static Result<Shape> make(std::span<const int64_t> dims);
  /// A shape of unknown rank.
  static Shape unknown() {
    Shape s;
    s.rank_ = -1;
    return s;
  }

  /// -1 when the rank is unknown.
  int rank() const { return rank_; }
  /// True when the rank is unknown.
  bool is_unknown_rank() const { return rank_ < 0; }
  ///@{
  /// Dimension `i` (kUnknownDim when unknown); `i` must be below rank().
  int64_t dim(int i) const { return dims_[static_cast<std::size_t>(i)]; }
  int64_t operator[](int i) const { return dim(i); }
  ///@}
  /// The dimensions: empty for a scalar and for an unknown rank.
  std::span<const int64_t> dims() const {
    return {dims_.data(), static_cast<std::size_t>(rank_ < 0 ? 0 : rank_)};
  }
  /// Sets dimension `i`, which must be below rank().
  void set_dim(int i, int64_t value) { dims_[static_cast<std::size_t>(i)] = value; }
  void add_dim(int64_t value);  ///< aborts past kMaxRank

  /// True when the rank and every dimension are known.
  bool is_fully_defined() const;
  /// Product of dimensions; -1 when not fully defined; 0 when a dimension
  /// is 0 (wherever it stands); saturates at INT64_MAX.
  int64_t num_elements() const;
  /// True if some fully defined shape could match both. Inline: every
  /// prepared run checks its feeds with it.
  bool is_compatible_with(const Shape& other) const {
    if (rank_ < 0 || other.rank_ < 0) return true;
    if (rank_ != other.rank_) return false;
    for (int i = 0; i < rank_; ++i) {
      if (dim(i) >= 0 && other.dim(i) >= 0 && dim(i) != other.dim(i)) return false;
    }
    return true;
  }

  /// "[]", "[2,3]", "[?,3]", "<unknown>".
  std::string to_string() const;

  /// Same rank (known or not) and the same dimensions.
  friend bool operator==(const Shape& a, const Shape& b);

 private:
  int rank_ = 0;
  std::array<int64_t, kMaxRank> dims_{};
};

/// `unit` times the product of the dimensions of `dims` that are above 0,
/// or nullopt when that passes `limit` (unit >= 1, limit >= 0).
/// The one rule of every size check on untrusted shapes: dimensions of 0
/// (or unknown) are skipped, so a 0 anywhere neither hides nor makes an
/// overflow of the others ([0,M,M] is judged like [M,M,0]). A caller that
/// counts bytes counts 0 when some dimension is 0.
inline std::optional<int64_t> product_of_positive_dims(int64_t unit, std::span<const int64_t> dims,
                                                       int64_t limit) {
  if (unit > limit) return std::nullopt;
  int64_t n = unit;
  for (const int64_t d : dims) {
    if (d <= 0) continue;
    if (__builtin_mul_overflow(n, d, &n) || n > limit) return std::nullopt;
  }
  return n;
}

namespace internal {
struct TensorBuffer;
// Tensor buffers the calling thread has allocated so far (allocation tests).
int64_t tensor_buffers_allocated_by_this_thread();
// A buffer's reference count, up and down (the last down frees it).
void ref_tensor_buffer(TensorBuffer* b) noexcept;
void unref_tensor_buffer(TensorBuffer* b) noexcept;
// A buffer's elements follow its header of this size.
inline constexpr std::size_t kTensorBufferHeader = 64;
}  // namespace internal

/// A typed, shaped, reference-counted view of a 64-byte aligned buffer.
/// Copying a Tensor shares the buffer (cheap); deep_copy() does not.
///
/// Thread safety: thread-compatible. Copies of one Tensor may be used from
/// different threads (the reference count is atomic); writing the elements
/// of a shared buffer while another thread reads them is a data race.
class Tensor {
 public:
  /// An empty, uninitialized tensor (dtype kInvalid). Slots of a step that
  /// were never written hold one.
  Tensor() = default;
  /// Zero-filled storage. `shape` must be fully defined and the byte size
  /// representable; aborts otherwise (use allocate() for untrusted sizes).
  Tensor(DType dtype, const Shape& shape);
  /// Validating form: InvalidArgument for bad shapes, ResourceExhausted when
  /// the allocation fails or the byte size of the non-zero dimensions
  /// passes INT64_MAX / 2 (also for a shape holding a 0). Contents are zero.
  static Result<Tensor> allocate(DType dtype, const Shape& shape);
  /// Storage left uninitialized (kernels that overwrite every element).
  static Result<Tensor> allocate_uninitialized(DType dtype, const Shape& shape);

  ///@{
  /// Scalars.
  Tensor(float v) : Tensor(from_scalar(v)) {}    // NOLINT(google-explicit-constructor)
  Tensor(double v) : Tensor(from_scalar(v)) {}   // NOLINT
  Tensor(int32_t v) : Tensor(from_scalar(v)) {}  // NOLINT
  Tensor(int64_t v) : Tensor(from_scalar(v)) {}  // NOLINT
  Tensor(bool v) : Tensor(from_scalar(v)) {}     // NOLINT
  ///@}
  ///@{
  /// Vectors and matrices from initializer lists.
  template <typename T>
  Tensor(std::initializer_list<T> values) : Tensor(vector<T>(values)) {}
  template <typename T>
  Tensor(std::initializer_list<std::initializer_list<T>> rows) : Tensor(matrix<T>(rows)) {}
  ///@}
  /// Any shape from a flat list of values, row-major; sizes must agree.
  template <typename T>
  Tensor(const Shape& shape, std::initializer_list<T> values)
      : Tensor(from_span(shape, std::span<const T>(values.begin(), values.size()))) {}

  /// A scalar (rank 0) holding `value`.
  template <typename T>
  static Tensor scalar(T value) {
    return from_scalar(value);
  }
  ///@{
  /// A vector (rank 1) of `values`.
  template <typename T>
  static Tensor vector(std::initializer_list<T> values) {
    return from_span(Shape{static_cast<int64_t>(values.size())},
                     std::span<const T>(values.begin(), values.size()));
  }
  template <typename T>
  static Tensor vector(std::span<const T> values) {
    return from_span(Shape{static_cast<int64_t>(values.size())}, values);
  }
  ///@}
  /// A matrix (rank 2) of `rows`, which must all have the same length.
  template <typename T>
  static Tensor matrix(std::initializer_list<std::initializer_list<T>> rows);
  /// Aborts when shape.num_elements() != values.size().
  template <typename T>
  static Tensor from_span(const Shape& shape, std::span<const T> values);
  /// Every element equal to `value`.
  template <typename T>
  static Tensor filled(const Shape& shape, T value);

  ///@{
  /// Copies share the buffer; a moved-from tensor is empty (uninitialized).
  Tensor(const Tensor& other) noexcept;
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ///@}
  ~Tensor();

  /// False for an empty tensor (dtype kInvalid).
  bool is_initialized() const { return dtype_ != DType::kInvalid; }
  /// The element type.
  DType dtype() const { return dtype_; }
  /// The shape (always fully defined).
  const Shape& shape() const { return shape_; }
  /// The number of elements.
  int64_t num_elements() const { return num_elements_; }
  /// The size of the elements in bytes.
  std::size_t byte_size() const {
    return static_cast<std::size_t>(num_elements_) * dtype_size(dtype_);
  }

  ///@{
  /// The first element's address (64-byte aligned), untyped; null for an
  /// empty tensor.
  void* raw_data() {
    return buffer_ == nullptr
               ? nullptr
               : reinterpret_cast<std::byte*>(buffer_) + internal::kTensorBufferHeader;
  }
  const void* raw_data() const {
    return buffer_ == nullptr
               ? nullptr
               : reinterpret_cast<const std::byte*>(buffer_) + internal::kTensorBufferHeader;
  }
  ///@}

  ///@{
  /// Typed element access, row-major. Aborts when T does not match dtype().
  template <typename T>
  std::span<T> flat() {
    check_type(dtype_of<T>());
    return {static_cast<T*>(raw_data()), static_cast<std::size_t>(num_elements_)};
  }
  template <typename T>
  std::span<const T> flat() const {
    check_type(dtype_of<T>());
    return {static_cast<const T*>(raw_data()), static_cast<std::size_t>(num_elements_)};
  }
  ///@}
  /// The single element of a one-element tensor.
  template <typename T>
  T scalar() const {
    check_type(dtype_of<T>());
    GRAPHRUN_CHECK_MSG(num_elements_ == 1, "Tensor::scalar() on " + shape_.to_string());
    return *static_cast<const T*>(raw_data());
  }

  /// True when this tensor is the only reference to its buffer, so a kernel
  /// may write it in place (copy-on-write).
  bool is_sole_owner() const;
  /// True when both tensors view the same buffer.
  bool shares_buffer_with(const Tensor& other) const { return buffer_ == other.buffer_; }
  /// A new buffer with the same contents.
  Tensor deep_copy() const;
  /// Same buffer, another shape with the same number of elements.
  Result<Tensor> reshaped(const Shape& shape) const;

  /// Same dtype, shape and elements (bitwise for floats, but +0 == -0, and
  /// NaN != NaN).
  bool equals(const Tensor& other) const;
  /// Same dtype and shape, and |a - b| <= atol + rtol * |b| elementwise.
  bool all_close(const Tensor& other, double rtol = 1e-5, double atol = 1e-8) const;

  /// "float32[2,2] [[1, 2], [3, 4]]", elided ("...") past `max_elements`.
  /// An empty innermost list ("[]") counts as one element, so the text is
  /// bounded by `max_elements` for any shape, zero-element ones included.
  std::string to_string(int64_t max_elements = 32) const;
  /// "float32[2,2]".
  std::string debug_type() const;

  /// equals().
  friend bool operator==(const Tensor& a, const Tensor& b) { return a.equals(b); }

 private:
  template <typename T>
  static Tensor from_scalar(T value) {
    return from_span(Shape{}, std::span<const T>(&value, 1));
  }
  static Tensor from_bytes(DType dtype, const Shape& shape, const void* data, std::size_t bytes);
  static Result<Tensor> allocate_storage(DType dtype, const Shape& shape, bool zero);
  void check_type(DType requested) const;

  internal::TensorBuffer* buffer_ = nullptr;
  DType dtype_ = DType::kInvalid;
  Shape shape_;
  int64_t num_elements_ = 0;
};

///@{
/// gtest prints tensors with this.
void PrintTo(const Tensor& t, std::ostream* os);
void PrintTo(const Shape& s, std::ostream* os);
///@}
///@{
/// Writes to_string().
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::ostream& operator<<(std::ostream& os, const Shape& s);
///@}

// Copies, moves and the destructor are inline: a step moves tensors from
// slot to slot many times.
inline Tensor::Tensor(const Tensor& other) noexcept
    : buffer_(other.buffer_),
      dtype_(other.dtype_),
      shape_(other.shape_),
      num_elements_(other.num_elements_) {
  if (buffer_ != nullptr) internal::ref_tensor_buffer(buffer_);
}

inline Tensor::Tensor(Tensor&& other) noexcept
    : buffer_(other.buffer_),
      dtype_(other.dtype_),
      shape_(other.shape_),
      num_elements_(other.num_elements_) {
  other.buffer_ = nullptr;
  other.dtype_ = DType::kInvalid;
  other.shape_ = Shape();
  other.num_elements_ = 0;
}

inline Tensor& Tensor::operator=(const Tensor& other) noexcept {
  if (this != &other) {
    if (other.buffer_ != nullptr) internal::ref_tensor_buffer(other.buffer_);
    internal::TensorBuffer* old = buffer_;
    buffer_ = other.buffer_;
    dtype_ = other.dtype_;
    shape_ = other.shape_;
    num_elements_ = other.num_elements_;
    if (old != nullptr) internal::unref_tensor_buffer(old);
  }
  return *this;
}

inline Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    internal::TensorBuffer* old = buffer_;
    buffer_ = other.buffer_;
    dtype_ = other.dtype_;
    shape_ = other.shape_;
    num_elements_ = other.num_elements_;
    other.buffer_ = nullptr;
    other.dtype_ = DType::kInvalid;
    other.shape_ = Shape();
    other.num_elements_ = 0;
    if (old != nullptr) internal::unref_tensor_buffer(old);
  }
  return *this;
}

inline Tensor::~Tensor() {
  if (buffer_ != nullptr) internal::unref_tensor_buffer(buffer_);
}

template <typename T>
Tensor Tensor::from_span(const Shape& shape, std::span<const T> values) {
  GRAPHRUN_CHECK_MSG(shape.num_elements() == static_cast<int64_t>(values.size()),
                     "Tensor::from_span: shape " + shape.to_string() + " does not hold " +
                         std::to_string(values.size()) + " values");
  if constexpr (std::is_same_v<T, bool>) {
    // std::span<const bool> is contiguous bools; sizeof(bool) == 1 here.
    static_assert(sizeof(bool) == 1);
  }
  return from_bytes(dtype_of<T>(), shape, values.data(), values.size() * sizeof(T));
}

template <typename T>
Tensor Tensor::matrix(std::initializer_list<std::initializer_list<T>> rows) {
  const auto n_rows = static_cast<int64_t>(rows.size());
  const auto n_cols = n_rows == 0 ? int64_t{0} : static_cast<int64_t>(rows.begin()->size());
  Tensor t(dtype_of<T>(), Shape{n_rows, n_cols});
  std::span<T> out = t.flat<T>();
  std::size_t k = 0;
  for (const auto& row : rows) {
    GRAPHRUN_CHECK_MSG(static_cast<int64_t>(row.size()) == n_cols, "Tensor::matrix: ragged rows");
    for (const T& v : row) out[k++] = v;
  }
  return t;
}

template <typename T>
Tensor Tensor::filled(const Shape& shape, T value) {
  Tensor t(dtype_of<T>(), shape);
  for (T& v : t.flat<T>()) v = value;
  return t;
}

/// Gives back to the system the memory the allocators behind tensors and
/// graphs keep cached after it was freed (tbbmalloc's buffers, the free top
/// of glibc's heaps): freed memory otherwise stays in the process's
/// resident set. Takes milliseconds; a server calls it after closing a
/// large session. Thread-safe.
void release_cached_memory();

}  // namespace graphrun

/// @cond
template <>
struct fmt::formatter<graphrun::Shape> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const graphrun::Shape& s, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(s.to_string(), ctx);
  }
};
template <>
struct fmt::formatter<graphrun::DType> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(graphrun::DType d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(graphrun::dtype_name(d), ctx);
  }
};
/// @endcond
