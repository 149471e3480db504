// The tables of ops/cpu/kernels.h called directly, level by level: every
// level this CPU runs against a plain scalar reference written here, and
// the AVX2 and AVX-512 tables against the baseline's. Inputs are random
// with odd sizes (around every vector width, with ragged tails), pointers
// one element off alignment, padded leading dimensions and sub-blocks of C,
// plus the values where vector and scalar code part ways: NaN, infinities,
// signed zeros and integer wrap-around. Every output buffer carries a guard
// region (and C its unwritten rows, columns and padding) that must come
// back untouched.
#include <graphrun/op_kernel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cpu/kernels.h"

namespace graphrun {

// gtest prints the levels with this ("avx2", not "1-byte object <01>").
static void PrintTo(CpuIsa isa, std::ostream* os) { *os << cpu_isa_name(isa); }

namespace cpu {
namespace {

constexpr CpuIsa kLevels[] = {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512};
// Shorter than one vector, one short of and one past a whole vector (4, 8
// or 16 floats), and long runs with a ragged tail.
constexpr int64_t kSizes[] = {1, 7, 15, 17, 33, 1000, 4099};
// Elements past each output the kernels must leave alone.
constexpr int64_t kGuard = 19;

constexpr UnaryOp kUnaryOps[] = {UnaryOp::kNeg,  UnaryOp::kSquare, UnaryOp::kRelu,
                                 UnaryOp::kSqrt, UnaryOp::kExp,    UnaryOp::kLog,
                                 UnaryOp::kTanh, UnaryOp::kSigmoid};
constexpr BinaryOp kBinaryOps[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv};
constexpr Operands kForms[] = {Operands::kBothVectors, Operands::kScalarX, Operands::kScalarY};
constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kMax};

const char* name_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg: return "Neg";
    case UnaryOp::kSquare: return "Square";
    case UnaryOp::kRelu: return "Relu";
    case UnaryOp::kSqrt: return "Sqrt";
    case UnaryOp::kExp: return "Exp";
    case UnaryOp::kLog: return "Log";
    case UnaryOp::kTanh: return "Tanh";
    case UnaryOp::kSigmoid: return "Sigmoid";
  }
  return "?";
}
const char* name_of(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "Add";
    case BinaryOp::kSub: return "Sub";
    case BinaryOp::kMul: return "Mul";
    case BinaryOp::kDiv: return "Div";
  }
  return "?";
}
const char* name_of(Operands form) {
  switch (form) {
    case Operands::kBothVectors: return "vector-vector";
    case Operands::kScalarX: return "scalar-vector";
    case Operands::kScalarY: return "vector-scalar";
  }
  return "?";
}
const char* name_of(ReduceOp op) { return op == ReduceOp::kSum ? "Sum" : "Max"; }
const char* name_of(Activation a) {
  switch (a) {
    case Activation::kNone: return "none";
    case Activation::kRelu: return "relu";
    case Activation::kSigmoid: return "sigmoid";
    case Activation::kTanh: return "tanh";
  }
  return "?";
}

template <typename T>
const char* dtype_name() {
  if constexpr (std::is_same_v<T, float>) {
    return "float32";
  } else if constexpr (std::is_same_v<T, double>) {
    return "float64";
  } else if constexpr (std::is_same_v<T, int32_t>) {
    return "int32";
  } else {
    return "int64";
  }
}

template <typename T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

// ---------------------------------------------------------------------------
// Scalar arithmetic of the reference: integers wrap (two's complement, via
// the unsigned twin), floats are IEEE operations in T.

template <typename T>
T add(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return a + b;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
}
template <typename T>
T sub(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return a - b;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  }
}
template <typename T>
T mul(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return a * b;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  }
}
// Integers: truncating, and x / -1 == -x wrapped (INT_MIN / -1 == INT_MIN).
template <typename T>
T div(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return a / b;
  } else {
    return b == T{-1} ? sub(T{0}, a) : static_cast<T>(a / b);
  }
}
template <typename T>
T binary_ref(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd: return add(a, b);
    case BinaryOp::kSub: return sub(a, b);
    case BinaryOp::kMul: return mul(a, b);
    case BinaryOp::kDiv: return div(a, b);
  }
  return T{};
}
// NaN wins, else the larger.
template <typename T>
T max_ref(T a, T b) {
  if constexpr (kIsFloat<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return b > a ? b : a;
}

// The functions of Sqrt..Sigmoid in F (long double for float inputs, double
// for the integer path, which goes through double).
template <typename F>
F function_ref(UnaryOp op, F x) {
  switch (op) {
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kSigmoid: return F{1} / (F{1} + std::exp(-x));
    default: return x;
  }
}

// ---------------------------------------------------------------------------
// What a kernel's output buffer must hold: `want`, within `tol` per element
// (exactly where tol is 0; NaN matches NaN, and +0 matches -0).

template <typename T>
struct Expected {
  std::vector<T> want;
  std::vector<double> tol;  // same size as want
};

// Every buffer starts as this so that untouched elements can be told apart.
template <typename T>
T sentinel() {
  return static_cast<T>(-7777);
}

template <typename T>
std::string show(T v) {
  std::ostringstream os;
  if constexpr (kIsFloat<T>) os << std::setprecision(std::numeric_limits<T>::max_digits10);
  os << v;
  return os.str();
}

template <typename T>
bool close(T got, T want, double tol) {
  if constexpr (kIsFloat<T>) {
    if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
    if (got == want) return true;  // also equal infinities
    if (std::isinf(got) || std::isinf(want)) return false;
    return std::abs(static_cast<long double>(got) - static_cast<long double>(want)) <= tol;
  } else {
    // Exact but for the integer path of the float functions (unary_ref).
    return got == want ||
           std::abs(static_cast<long double>(got) - static_cast<long double>(want)) <= tol;
  }
}

// Collects mismatches of one test; prints the first few cases in full.
class Checker {
 public:
  explicit Checker(std::string level) : level_(std::move(level)) {}
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;
  ~Checker() {
    if (failed_cases_ > kShownCases) {
      ADD_FAILURE() << level_ << ": " << failed_cases_ - kShownCases << " more failing cases";
    }
  }

  // `what` names the case; `row_width` > 0 prints indices as [row][col].
  template <typename T>
  void expect(const std::vector<T>& got, const Expected<T>& e, const std::string& what,
              int64_t row_width = 0) {
    ASSERT_EQ(got.size(), e.want.size()) << what;
    int64_t bad = 0;
    std::ostringstream first;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (close(got[i], e.want[i], e.tol[i])) continue;
      if (++bad <= 6) {
        const auto at = static_cast<int64_t>(i);
        first << "\n  at ";
        if (row_width > 0) {
          first << "[" << at / row_width << "][" << at % row_width << "]";
        } else {
          first << "[" << at << "]";
        }
        first << ": got " << show(got[i]) << ", want " << show(e.want[i]);
        if (e.tol[i] > 0) first << " +- " << e.tol[i];
        if (e.want[i] == sentinel<T>()) first << " (the sentinel: must be left untouched)";
      }
    }
    if (bad == 0) return;
    if (++failed_cases_ > kShownCases) return;
    ADD_FAILURE() << level_ << ", " << dtype_name<T>() << " " << what << ": " << bad << " of "
                  << got.size() << " elements differ" << first.str();
  }

 private:
  static constexpr int kShownCases = 12;
  std::string level_;
  int failed_cases_ = 0;
};

// Checks `run(table)` against `e` (from the reference) or, when `against`
// is set, against `run(*against)` with the reference's allowance doubled
// (both levels round); exact elements stay exact.
template <typename T, typename Run>
void check(Checker& checker, const KernelTable& table, const KernelTable* against, Expected<T> e,
           const std::string& what, Run run, int64_t row_width = 0) {
  const std::vector<T> got = run(table);
  if (against != nullptr) {
    e.want = run(*against);
    for (double& t : e.tol) t *= 2;
  }
  checker.expect(got, e, what, row_width);
}

// ---------------------------------------------------------------------------
// Inputs.

using Rng = std::mt19937_64;

template <typename T>
T uniform(Rng& rng, double lo, double hi) {
  return static_cast<T>(std::uniform_real_distribution<double>(lo, hi)(rng));
}
template <typename T>
T any_integer(Rng& rng) {
  return std::uniform_int_distribution<T>(std::numeric_limits<T>::min(),
                                          std::numeric_limits<T>::max())(rng);
}
template <typename T>
T small_integer(Rng& rng, int lo, int hi) {
  return static_cast<T>(std::uniform_int_distribution<int>(lo, hi)(rng));
}

// Floats uniform in [lo, hi]; integers half small (|x| <= 40), half over
// the whole range, so that sums and products wrap.
template <typename T>
std::vector<T> random_values(Rng& rng, int64_t n, double lo, double hi) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) {
    if constexpr (kIsFloat<T>) {
      x = uniform<T>(rng, lo, hi);
    } else {
      x = (rng() & 1) != 0 ? small_integer<T>(rng, -40, 40) : any_integer<T>(rng);
    }
  }
  return v;
}

template <typename T>
std::vector<T> special_values() {
  using L = std::numeric_limits<T>;
  if constexpr (kIsFloat<T>) {
    return {T{0},
            -T{0},
            T{1},
            T{-1},
            L::infinity(),
            -L::infinity(),
            L::quiet_NaN(),
            L::max(),
            L::lowest(),
            L::min(),
            -L::min(),
            L::denorm_min(),
            L::min() / 1024,
            T{100},
            T{-100},
            T{0.5},
            T{-0.5}};
  } else {
    return {T{0},
            T{1},
            T{-1},
            L::max(),
            L::min(),
            static_cast<T>(L::max() - 1),
            static_cast<T>(L::min() + 1)};
  }
}

// Overwrites spread-out elements (vector body and tail alike) with the
// special values. A second operand sprinkled with shift 37 pairs each
// special with its neighbour in the list (inf with -1, -inf with inf, ...).
template <typename T>
void sprinkle(std::vector<T>& v, const std::vector<T>& specials, int64_t shift = 0) {
  const auto n = static_cast<int64_t>(v.size());
  if (n < 7) return;
  for (std::size_t j = 0; j < specials.size(); ++j) {
    const int64_t at = (static_cast<int64_t>(j) * 37 + 5 + shift) % n;
    v[static_cast<std::size_t>(at)] = specials[j];
  }
  v.back() = specials[static_cast<std::size_t>(n) % specials.size()];
}

// An output buffer: `values` from element `offset` (1: off vector
// alignment), then kGuard sentinels.
template <typename T>
std::vector<T> with_offset(const std::vector<T>& values, int64_t offset) {
  std::vector<T> buf(static_cast<std::size_t>(offset), sentinel<T>());
  buf.insert(buf.end(), values.begin(), values.end());
  buf.insert(buf.end(), static_cast<std::size_t>(kGuard), sentinel<T>());
  return buf;
}
// An input buffer: `values` from element `offset` and nothing after, so
// that an ASan build catches a read past the end.
template <typename T>
std::vector<T> input_at(const std::vector<T>& values, int64_t offset) {
  std::vector<T> buf(static_cast<std::size_t>(offset), sentinel<T>());
  buf.insert(buf.end(), values.begin(), values.end());
  return buf;
}

// Expected output buffer: sentinels around [offset, offset + want.size()).
template <typename T>
Expected<T> framed(const std::vector<T>& want, const std::vector<double>& tol, int64_t offset) {
  Expected<T> e;
  e.want = with_offset(want, offset);
  e.tol.assign(e.want.size(), 0.0);
  std::copy(tol.begin(), tol.end(), e.tol.begin() + offset);
  return e;
}

// The allowance for Exp, Log, Tanh and Sigmoid of T at result y: Eigen's
// vectorised functions are a few ulp off (relative), but for its float
// logistic, a rational approximation accurate to ~1.2e-7 absolute, not
// relative, below 0 (and exp(x) itself below -9). The absolute floor of the
// others covers subnormal results.
template <typename T>
double function_tol(UnaryOp op, double y) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  const double rel = kFloat ? 1e-5 : 1e-12;
  double abs = 4 * static_cast<double>(std::numeric_limits<T>::min());
  if (kFloat && op == UnaryOp::kSigmoid) abs = 3e-7;
  return rel * std::abs(y) + abs;
}
template <typename T>
constexpr double kEps = static_cast<double>(std::numeric_limits<T>::epsilon());

// ---------------------------------------------------------------------------
// Unary.

// Inputs in the function's interesting range (negative ones still reach
// Sqrt and Log through the special values).
std::pair<double, double> unary_domain(UnaryOp op) {
  switch (op) {
    case UnaryOp::kSqrt:
    case UnaryOp::kLog: return {0.0, 100.0};
    case UnaryOp::kExp: return {-30.0, 30.0};
    case UnaryOp::kTanh:
    case UnaryOp::kSigmoid: return {-20.0, 20.0};
    default: return {-10.0, 10.0};
  }
}

template <typename T>
std::pair<T, double> unary_ref(UnaryOp op, T x) {
  if constexpr (kIsFloat<T>) {
    switch (op) {
      case UnaryOp::kNeg: return {-x, 0.0};
      case UnaryOp::kSquare: return {x * x, 0.0};
      case UnaryOp::kRelu: return {std::isnan(x) ? x : std::max(x, T{0}), 0.0};
      case UnaryOp::kSqrt: return {std::sqrt(x), 0.0};  // correctly rounded
      default: {
        const T y = static_cast<T>(function_ref<long double>(op, x));
        const double tol = std::isfinite(y) ? function_tol<T>(op, y) : 0.0;
        return {y, tol};
      }
    }
  } else {
    switch (op) {
      case UnaryOp::kNeg: return {sub(T{0}, x), 0.0};
      case UnaryOp::kSquare: return {mul(x, x), 0.0};
      case UnaryOp::kRelu: return {x > 0 ? x : T{0}, 0.0};
      default: {
        // The float functions on integers (the ops refuse them): through
        // double, truncated; 0 unless the result is finite and fits. Eigen's
        // double exp and logistic are a few ulp off std's, which truncation
        // turns into a step where d is within those ulps of an integer (or
        // past 2^53, e.g. exp(40)): allow what 4 ulps can change.
        auto truncated = [](double d) {
          const bool fits =
              std::isfinite(d) && std::abs(d) < static_cast<double>(std::numeric_limits<T>::max());
          return fits ? static_cast<T>(d) : T{0};
        };
        const double d = function_ref<double>(op, static_cast<double>(x));
        const double slack = std::isfinite(d) ? 4 * kEps<double> * std::abs(d) : 0.0;
        const T want = truncated(d);
        const long double step =
            std::max(std::abs(static_cast<long double>(truncated(d - slack)) - want),
                     std::abs(static_cast<long double>(truncated(d + slack)) - want));
        return {want, static_cast<double>(step)};
      }
    }
  }
}

// One unary op on `x`, at offsets 0 and 1.
template <typename T>
void check_unary_on(Checker& checker, const KernelTable& table, const KernelTable* against,
                    UnaryOp op, const std::vector<T>& x, const std::string& what) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<T> want(x.size());
  std::vector<double> tol(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) std::tie(want[i], tol[i]) = unary_ref(op, x[i]);
  for (int64_t offset : {0, 1}) {
    const std::vector<T> in = input_at(x, offset);
    check(checker, table, against, framed(want, tol, offset),
          std::string(name_of(op)) + " " + what + " offset=" + std::to_string(offset),
          [&](const KernelTable& t) {
            std::vector<T> out = with_offset(std::vector<T>(x.size(), sentinel<T>()), offset);
            t.typed<T>().unary(op, in.data() + offset, out.data() + offset, n);
            return out;
          });
  }
}

template <typename T>
void check_unary(Checker& checker, const KernelTable& table, const KernelTable* against) {
  Rng rng(17);
  for (UnaryOp op : kUnaryOps) {
    const std::vector<T> specials = special_values<T>();
    for (int64_t n : kSizes) {
      const auto [lo, hi] = unary_domain(op);
      std::vector<T> x = random_values<T>(rng, n, lo, hi);
      sprinkle(x, specials);
      check_unary_on(checker, table, against, op, x, "n=" + std::to_string(n));
    }
  }
}

// Log of positive subnormals, every element one (so vector lanes and the
// scalar tail both see them).
template <typename T>
void check_log_of_subnormals(Checker& checker, const KernelTable& table) {
  using L = std::numeric_limits<T>;
  const T subnormals[] = {L::denorm_min(), L::min() / 1024, L::min() / 2};
  for (int64_t n : kSizes) {
    std::vector<T> x(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = subnormals[i % 3];
    check_unary_on(checker, table, nullptr, UnaryOp::kLog, x,
                   "n=" + std::to_string(n) + " subnormal inputs");
  }
}

// ---------------------------------------------------------------------------
// Binary.

template <typename T>
void check_binary(Checker& checker, const KernelTable& table, const KernelTable* against) {
  Rng rng(29);
  int round = 0;
  for (BinaryOp op : kBinaryOps) {
    for (Operands form : kForms) {
      for (int64_t n : kSizes) {
        std::vector<T> x = random_values<T>(rng, form == Operands::kScalarX ? 1 : n, -10, 10);
        std::vector<T> y = random_values<T>(rng, form == Operands::kScalarY ? 1 : n, -10, 10);
        sprinkle(x, special_values<T>());
        if constexpr (kIsFloat<T>) sprinkle(y, special_values<T>(), 37);
        if constexpr (!kIsFloat<T>) {
          if (op == BinaryOp::kDiv) {
            // No zero divisors (the ops rule them out); -1 often, and the
            // scalar divisor cycles through the interesting ones.
            const T scalars[] = {T{-1}, T{7}, T{-3}, std::numeric_limits<T>::min(), T{1}};
            for (std::size_t i = 0; i < y.size(); ++i) {
              if (i % 5 == 2) y[i] = T{-1};
              if (y[i] == T{0}) y[i] = T{3};
            }
            if (y.size() == 1) y[0] = scalars[round % 5];
          }
        }
        ++round;
        std::vector<T> want(static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < want.size(); ++i) {
          want[i] = binary_ref(op, x.size() == 1 ? x[0] : x[i], y.size() == 1 ? y[0] : y[i]);
        }
        const std::vector<double> tol(want.size(), 0.0);  // one IEEE operation: exact
        for (int64_t offset : {0, 1}) {
          const std::vector<T> xs = input_at(x, offset);
          const std::vector<T> ys = input_at(y, offset);
          check(checker, table, against, framed(want, tol, offset),
                std::string(name_of(op)) + " " + name_of(form) + " n=" + std::to_string(n) +
                    " offset=" + std::to_string(offset),
                [&](const KernelTable& t) {
                  std::vector<T> z =
                      with_offset(std::vector<T>(want.size(), sentinel<T>()), offset);
                  t.typed<T>().binary(op, form, xs.data() + offset, ys.data() + offset,
                                      z.data() + offset, n);
                  return z;
                });
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Reduce and accumulate.

// The result as a one-element buffer, so that it goes through Checker.
template <typename T>
Expected<T> one(T want, double tol) {
  return Expected<T>{{want}, {tol}};
}

template <typename T>
void check_reduce(Checker& checker, const KernelTable& table, const KernelTable* against) {
  Rng rng(41);
  for (ReduceOp op : kReduceOps) {
    for (int64_t n : kSizes) {
      // Real-valued floats (Sum within n eps sum|x|), and floats holding
      // small integers, whose every partial sum is exact in any order.
      for (bool integer_valued : {false, true}) {
        if (!kIsFloat<T> && integer_valued) continue;
        std::vector<T> x(static_cast<std::size_t>(n));
        if (integer_valued) {
          for (T& v : x) v = small_integer<T>(rng, -8, 8);
        } else {
          x = random_values<T>(rng, n, -1, 1);
        }
        T want{};
        double tol = 0;
        if (op == ReduceOp::kMax) {
          want = x[0];
          for (T v : x) want = max_ref(want, v);
        } else if constexpr (kIsFloat<T>) {
          long double sum = 0;
          long double magnitude = 0;
          for (T v : x) {
            sum += v;
            magnitude += std::abs(static_cast<long double>(v));
          }
          want = static_cast<T>(sum);
          if (!integer_valued) {
            tol = static_cast<double>(n) * kEps<T> * static_cast<double>(magnitude) +
                  kEps<T> * std::abs(static_cast<double>(want));
          }
        } else {
          for (T v : x) want = add(want, v);
        }
        for (int64_t offset : {0, 1}) {
          const std::vector<T> in = input_at(x, offset);
          check(checker, table, against, one(want, tol),
                std::string(name_of(op)) + " n=" + std::to_string(n) +
                    " offset=" + std::to_string(offset) + (integer_valued ? " integer-valued" : ""),
                [&](const KernelTable& t) {
                  return std::vector<T>{t.typed<T>().reduce(op, in.data() + offset, n)};
                });
        }
      }
    }
  }
  if constexpr (kIsFloat<T>) {
    // Max propagates a NaN from any position: first, vector body, tail.
    const T nan = std::numeric_limits<T>::quiet_NaN();
    for (int64_t n : kSizes) {
      std::vector<T> base = random_values<T>(rng, n, -1, 1);
      for (int64_t at : {int64_t{0}, n / 2, n - 1, n - 2}) {
        if (at < 0) continue;
        std::vector<T> x = base;
        x[static_cast<std::size_t>(at)] = nan;
        check(checker, table, against, one(nan, 0.0),
              "Max n=" + std::to_string(n) + " NaN at " + std::to_string(at),
              [&](const KernelTable& t) {
                return std::vector<T>{t.typed<T>().reduce(ReduceOp::kMax, x.data(), n)};
              });
      }
      // All -inf but one: the one; all -inf: -inf.
      std::vector<T> x(static_cast<std::size_t>(n), -std::numeric_limits<T>::infinity());
      check(checker, table, against, one(x[0], 0.0), "Max n=" + std::to_string(n) + " all -inf",
            [&](const KernelTable& t) {
              return std::vector<T>{t.typed<T>().reduce(ReduceOp::kMax, x.data(), n)};
            });
      x[static_cast<std::size_t>(n - 1)] = T{-3};
      check(checker, table, against, one(T{-3}, 0.0),
            "Max n=" + std::to_string(n) + " -inf but the last", [&](const KernelTable& t) {
              return std::vector<T>{t.typed<T>().reduce(ReduceOp::kMax, x.data(), n)};
            });
    }
  } else {
    // The smallest value everywhere, and a sum that wraps past the maximum.
    for (int64_t n : kSizes) {
      const std::vector<T> lowest(static_cast<std::size_t>(n), std::numeric_limits<T>::min());
      check(checker, table, against, one(std::numeric_limits<T>::min(), 0.0),
            "Max n=" + std::to_string(n) + " all min", [&](const KernelTable& t) {
              return std::vector<T>{t.typed<T>().reduce(ReduceOp::kMax, lowest.data(), n)};
            });
      std::vector<T> x(static_cast<std::size_t>(n), T{1});
      x[0] = std::numeric_limits<T>::max();
      check(checker, table, against,
            one(add(std::numeric_limits<T>::max(), static_cast<T>(n - 1)), 0.0),
            "Sum n=" + std::to_string(n) + " max + (n - 1) ones", [&](const KernelTable& t) {
              return std::vector<T>{t.typed<T>().reduce(ReduceOp::kSum, x.data(), n)};
            });
    }
  }
}

template <typename T>
void check_accumulate(Checker& checker, const KernelTable& table, const KernelTable* against) {
  Rng rng(53);
  for (ReduceOp op : kReduceOps) {
    for (int64_t n : kSizes) {
      std::vector<T> acc = random_values<T>(rng, n, -10, 10);
      std::vector<T> row = random_values<T>(rng, n, -10, 10);
      sprinkle(acc, special_values<T>());
      sprinkle(row, special_values<T>(), 37);
      std::vector<T> want(acc.size());
      for (std::size_t j = 0; j < want.size(); ++j) {
        want[j] = op == ReduceOp::kSum ? add(acc[j], row[j]) : max_ref(acc[j], row[j]);
      }
      const std::vector<double> tol(want.size(), 0.0);  // one IEEE operation: exact
      for (int64_t offset : {0, 1}) {
        const std::vector<T> in = input_at(row, offset);
        check(checker, table, against, framed(want, tol, offset),
              std::string(name_of(op)) + " n=" + std::to_string(n) +
                  " offset=" + std::to_string(offset),
              [&](const KernelTable& t) {
                std::vector<T> out = with_offset(acc, offset);
                t.typed<T>().accumulate(op, in.data() + offset, out.data() + offset, n);
                return out;
              });
      }
    }
  }
}

// float32 sums in double (sum_to_double, accumulate_to_double): within a
// few double ulps of the exact sum, where a float running total loses
// everything past 2^24 times its addends.
void check_float_sums_in_double(Checker& checker, const KernelTable& table,
                                const KernelTable* against) {
  Rng rng(67);
  constexpr double kDoubleEps = std::numeric_limits<double>::epsilon();
  for (int64_t n : kSizes) {
    std::vector<float> x = random_values<float>(rng, n, -1, 1);
    x[0] = 16777216.0f;  // 2^24: float addends of 1 and less would vanish
    long double sum = 0;
    long double magnitude = 0;
    for (float v : x) {
      sum += v;
      magnitude += std::abs(static_cast<long double>(v));
    }
    const double tol = static_cast<double>(n) * kDoubleEps * static_cast<double>(magnitude);
    for (int64_t offset : {0, 1}) {
      const std::vector<float> in = input_at(x, offset);
      check(checker, table, against, one(static_cast<double>(sum), tol),
            "sum_to_double n=" + std::to_string(n) + " offset=" + std::to_string(offset),
            [&](const KernelTable& t) {
              return std::vector<double>{t.f32.sum_to_double(in.data() + offset, n)};
            });
    }
    std::vector<double> acc(static_cast<std::size_t>(n));
    for (double& a : acc) a = uniform<double>(rng, -1e9, 1e9);
    std::vector<double> want(acc.size());
    for (std::size_t j = 0; j < want.size(); ++j) want[j] = acc[j] + static_cast<double>(x[j]);
    const std::vector<double> exact(want.size(), 0.0);  // one IEEE addition each
    for (int64_t offset : {0, 1}) {
      const std::vector<float> in = input_at(x, offset);
      check(checker, table, against, framed(want, exact, offset),
            "accumulate_to_double n=" + std::to_string(n) + " offset=" + std::to_string(offset),
            [&](const KernelTable& t) {
              std::vector<double> out = with_offset(acc, offset);
              t.f32.accumulate_to_double(in.data() + offset, out.data() + offset, n);
              return out;
            });
    }
  }
}

// ---------------------------------------------------------------------------
// GEMM.

struct GemmShape {
  int64_t m, k, n;
};
constexpr GemmShape kGemmShapes[] = {{1, 1, 1}, {7, 13, 5}, {33, 517, 261}, {64, 256, 256}};

// Which part of C one call computes.
enum class Block { kAll, kInterior, kCorner, kNoRows, kNoColumns };
const char* name_of(Block b) {
  switch (b) {
    case Block::kAll: return "all of C";
    case Block::kInterior: return "interior block";
    case Block::kCorner: return "last-row corner";
    case Block::kNoRows: return "no rows";
    case Block::kNoColumns: return "no columns";
  }
  return "?";
}
struct Range2 {
  int64_t row_begin, row_end, col_begin, col_end;
};
Range2 block_of(Block b, const GemmShape& s) {
  switch (b) {
    case Block::kAll: return {0, s.m, 0, s.n};
    case Block::kInterior: return {s.m / 4, s.m - s.m / 5, s.n / 3, s.n - s.n / 7};
    case Block::kCorner: return {s.m - 1, s.m, s.n - std::min<int64_t>(s.n, 3), s.n};
    case Block::kNoRows: return {s.m / 2, s.m / 2, 0, s.n};
    case Block::kNoColumns: return {0, s.m, s.n / 2, s.n / 2};
  }
  return {};
}

struct GemmVariant {
  bool padded;  // leading dimensions past the width (else equal to it)
  bool bias;
  Activation activation;
  Block block;
};
// For every dtype.
constexpr GemmVariant kGemmVariants[] = {
    {false, false, Activation::kNone, Block::kAll},
    {true, false, Activation::kNone, Block::kAll},
    {true, true, Activation::kNone, Block::kAll},
    {true, true, Activation::kNone, Block::kInterior},
    {false, false, Activation::kNone, Block::kCorner},
    {true, true, Activation::kNone, Block::kNoRows},
    {true, false, Activation::kNone, Block::kNoColumns},
};
// Floats also (the activations are for floats only).
constexpr GemmVariant kGemmActivationVariants[] = {
    {true, false, Activation::kRelu, Block::kAll},
    {true, true, Activation::kRelu, Block::kAll},
    {true, true, Activation::kSigmoid, Block::kAll},
    {false, true, Activation::kTanh, Block::kAll},
    {true, true, Activation::kRelu, Block::kInterior},
    {true, true, Activation::kSigmoid, Block::kInterior},
    {true, false, Activation::kTanh, Block::kCorner},
};

// Packed products (floats; whole column blocks, so every column).
constexpr GemmVariant kGemmPackedVariants[] = {
    {false, false, Activation::kNone, Block::kAll},
    {true, true, Activation::kRelu, Block::kAll},
    {true, true, Activation::kSigmoid, Block::kInterior},
    {false, true, Activation::kTanh, Block::kCorner},
};

// Row-major [rows, cols]: once with ld == cols, once with ld past it,
// where the gap holds values the kernel must not read (NaN for floats).
template <typename T>
struct Operand {
  int64_t rows = 0, cols = 0, ld_padded = 0;
  std::vector<T> dense, padded;
  const T* data(bool pad) const { return pad ? padded.data() : dense.data(); }
  int64_t ld(bool pad) const { return pad ? ld_padded : cols; }
};

template <typename T>
Operand<T> make_operand(int64_t rows, int64_t cols, int64_t pad, std::vector<T> values, Rng& rng) {
  Operand<T> o{rows, cols, cols + pad, std::move(values), {}};
  o.padded.resize(static_cast<std::size_t>(rows * o.ld_padded));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < o.ld_padded; ++c) {
      T filler{};
      if constexpr (kIsFloat<T>) {
        filler = std::numeric_limits<T>::quiet_NaN();
      } else {
        filler = any_integer<T>(rng);
      }
      o.padded[static_cast<std::size_t>(r * o.ld_padded + c)] =
          c < cols ? o.dense[static_cast<std::size_t>(r * cols + c)] : filler;
    }
  }
  return o;
}

// One product: operands, the exact result (long double for floats, wrapped
// for integers) and, per element of C, sum_p |a_ip b_pj|.
template <typename T>
struct GemmProblem {
  GemmShape s;
  bool transpose_a, transpose_b;
  bool integer_valued;  // floats holding small integers: every result exact
  Operand<T> a, b;
  std::vector<T> bias;
  using Acc = std::conditional_t<kIsFloat<T>, long double, T>;
  std::vector<Acc> product;       // [m, n]
  std::vector<double> magnitude;  // [m, n]
};

template <typename T>
GemmProblem<T> make_problem(const GemmShape& s, bool ta, bool tb, bool integer_valued, Rng& rng) {
  auto values = [&](int64_t count) {
    std::vector<T> v(static_cast<std::size_t>(count));
    for (T& x : v) {
      if constexpr (kIsFloat<T>) {
        x = integer_valued ? small_integer<T>(rng, -4, 4) : uniform<T>(rng, -1, 1);
      } else {
        x = any_integer<T>(rng);  // every product wraps
      }
    }
    return v;
  };
  GemmProblem<T> p{s, ta, tb, integer_valued, {}, {}, values(s.n), {}, {}};
  p.a = make_operand<T>(ta ? s.k : s.m, ta ? s.m : s.k, 3, values(s.m * s.k), rng);
  p.b = make_operand<T>(tb ? s.n : s.k, tb ? s.k : s.n, 5, values(s.k * s.n), rng);
  p.product.resize(static_cast<std::size_t>(s.m * s.n));
  p.magnitude.resize(p.product.size());
  // op(A) as [m, k] and op(B) as [n, k], so that the inner loop is contiguous.
  std::vector<T> a(static_cast<std::size_t>(s.m * s.k));
  std::vector<T> b(static_cast<std::size_t>(s.n * s.k));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t q = 0; q < s.k; ++q) {
      a[static_cast<std::size_t>(i * s.k + q)] =
          p.a.dense[static_cast<std::size_t>(ta ? q * s.m + i : i * s.k + q)];
    }
  }
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t q = 0; q < s.k; ++q) {
      b[static_cast<std::size_t>(j * s.k + q)] =
          p.b.dense[static_cast<std::size_t>(tb ? j * s.k + q : q * s.n + j)];
    }
  }
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const T* ar = a.data() + i * s.k;
      const T* br = b.data() + j * s.k;
      typename GemmProblem<T>::Acc sum{};
      long double magnitude = 0;
      for (int64_t q = 0; q < s.k; ++q) {
        if constexpr (kIsFloat<T>) {
          const long double t = static_cast<long double>(ar[q]) * br[q];
          sum += t;
          magnitude += std::abs(t);
        } else {
          sum = add(sum, mul(ar[q], br[q]));
        }
      }
      p.product[static_cast<std::size_t>(i * s.n + j)] = sum;
      p.magnitude[static_cast<std::size_t>(i * s.n + j)] = static_cast<double>(magnitude);
    }
  }
  return p;
}

// What C ([m, ldc], sentinels outside `r`) must hold after computing the
// block `r` of p's product with v's bias and activation.
template <typename T>
Expected<T> gemm_expectation(const GemmProblem<T>& p, const GemmVariant& v, const Range2& r,
                             int64_t ldc) {
  const GemmShape& s = p.s;
  Expected<T> e;
  e.want.assign(static_cast<std::size_t>(s.m * ldc), sentinel<T>());
  e.tol.assign(e.want.size(), 0.0);
  for (int64_t i = r.row_begin; i < r.row_end; ++i) {
    for (int64_t j = r.col_begin; j < r.col_end; ++j) {
      const auto at = static_cast<std::size_t>(i * ldc + j);
      const auto pj = static_cast<std::size_t>(i * s.n + j);
      if constexpr (kIsFloat<T>) {
        const T bias = v.bias ? p.bias[static_cast<std::size_t>(j)] : T{0};
        long double c = p.product[pj] + bias;
        // Rounding in a k-term dot product (Higham's gamma_k, doubled),
        // passed through the activation (slope <= 1).
        double tol = p.integer_valued ? 0.0
                                      : static_cast<double>(s.k) * kEps<T> *
                                            (p.magnitude[pj] + std::abs(static_cast<double>(bias)));
        switch (v.activation) {
          case Activation::kNone: break;
          case Activation::kRelu: c = std::max(c, 0.0L); break;
          case Activation::kSigmoid: c = 1.0L / (1.0L + std::exp(-c)); break;
          case Activation::kTanh: c = std::tanh(c); break;
        }
        e.want[at] = static_cast<T>(c);
        if (tol > 0) tol += kEps<T> * std::abs(static_cast<double>(c));  // want's own rounding
        if (v.activation == Activation::kSigmoid) {
          tol += function_tol<T>(UnaryOp::kSigmoid, static_cast<double>(c));
        } else if (v.activation == Activation::kTanh) {
          tol += function_tol<T>(UnaryOp::kTanh, static_cast<double>(c));
        }
        e.tol[at] = tol;
      } else {
        e.want[at] =
            v.bias ? add(p.product[pj], p.bias[static_cast<std::size_t>(j)]) : p.product[pj];
      }
    }
  }
  return e;
}

template <typename T>
std::string gemm_description(const GemmProblem<T>& p, const GemmVariant& v, const Range2& r) {
  const GemmShape& s = p.s;
  std::ostringstream what;
  what << s.m << "x" << s.k << "x" << s.n << (p.transpose_a ? " A^T" : " A")
       << (p.transpose_b ? " B^T" : " B") << (v.padded ? " padded" : " dense")
       << (v.bias ? " +bias" : "") << " activation=" << name_of(v.activation) << " "
       << name_of(v.block) << " rows [" << r.row_begin << "," << r.row_end << ") cols ["
       << r.col_begin << "," << r.col_end << ")" << (p.integer_valued ? " integer-valued" : "");
  return what.str();
}

template <typename T>
GemmArgs<T> gemm_args(const GemmProblem<T>& p, const GemmVariant& v, T* c, int64_t ldc) {
  const GemmShape& s = p.s;
  GemmArgs<T> g;
  g.a = p.a.data(v.padded);
  g.lda = p.a.ld(v.padded);
  g.transpose_a = p.transpose_a;
  g.b = p.b.data(v.padded);
  g.ldb = p.b.ld(v.padded);
  g.transpose_b = p.transpose_b;
  g.c = c;
  g.ldc = ldc;
  g.m = s.m;
  g.n = s.n;
  g.k = s.k;
  g.bias = v.bias ? p.bias.data() : nullptr;
  g.activation = v.activation;
  return g;
}

template <typename T>
void check_gemm_variant(Checker& checker, const KernelTable& table, const KernelTable* against,
                        const GemmProblem<T>& p, const GemmVariant& v) {
  const GemmShape& s = p.s;
  const Range2 r = block_of(v.block, s);
  const int64_t ldc = v.padded ? s.n + 7 : s.n;
  check(
      checker, table, against, gemm_expectation(p, v, r, ldc), gemm_description(p, v, r),
      [&](const KernelTable& t) {
        std::vector<T> c(static_cast<std::size_t>(s.m * ldc), sentinel<T>());
        const GemmArgs<T> g = gemm_args(p, v, c.data(), ldc);
        t.typed<T>().gemm(g, r.row_begin, r.row_end, r.col_begin, r.col_end);
        return c;
      },
      ldc);
}

// The same product with op(B) packed first (blocks of at most `max_block`
// columns, 0: the kernel's choice), for the rows of v's block and every
// column, computed in three calls: the first half of those rows in two
// groups of column blocks, then the other half over all blocks.
template <typename T>
void check_gemm_packed_variant(Checker& checker, const KernelTable& table,
                               const KernelTable* against, const GemmProblem<T>& p,
                               const GemmVariant& v, int64_t max_block) {
  const GemmShape& s = p.s;
  const Range2 block = block_of(v.block, s);
  const Range2 r{block.row_begin, block.row_end, 0, s.n};
  const int64_t ldc = v.padded ? s.n + 7 : s.n;
  check(
      checker, table, against, gemm_expectation(p, v, r, ldc),
      gemm_description(p, v, r) + " packed B, max_block=" + std::to_string(max_block),
      [&](const KernelTable& t) {
        std::vector<T> c(static_cast<std::size_t>(s.m * ldc), sentinel<T>());
        const GemmArgs<T> g = gemm_args(p, v, c.data(), ldc);
        const TypedKernels<T>& k = t.typed<T>();
        const std::unique_ptr<PackedGemmB<T>> b =
            k.pack_b(g.b, g.ldb, g.transpose_b, g.k, g.n, s.m, max_block);
        EXPECT_EQ(b->isa, t.isa);
        EXPECT_EQ(b->blocks(), (s.n + b->block - 1) / b->block);
        if (max_block > 0) {
          EXPECT_LE(b->block, max_block);
        }
        const int64_t mid = (r.row_begin + r.row_end) / 2;
        const int64_t half = b->blocks() / 2;
        k.gemm_packed(g, *b, r.row_begin, mid, 0, half);
        k.gemm_packed(g, *b, r.row_begin, mid, half, b->blocks());
        k.gemm_packed(g, *b, mid, r.row_end, 0, b->blocks());
        return c;
      },
      ldc);
}

template <typename T>
void check_gemm(Checker& checker, const KernelTable& table, const KernelTable* against) {
  Rng rng(67);
  for (const GemmShape& s : kGemmShapes) {
    for (int transposes = 0; transposes < 4; ++transposes) {
      for (bool integer_valued : {false, true}) {
        if (!kIsFloat<T> && integer_valued) continue;
        const GemmProblem<T> p =
            make_problem<T>(s, (transposes & 1) != 0, (transposes & 2) != 0, integer_valued, rng);
        for (const GemmVariant& v : kGemmVariants)
          check_gemm_variant(checker, table, against, p, v);
        if constexpr (kIsFloat<T>) {
          if (integer_valued) continue;
          for (const GemmVariant& v : kGemmActivationVariants) {
            check_gemm_variant(checker, table, against, p, v);
          }
          // Packed B: the blocked products (the others never take it), with
          // the kernel's blocks and with narrow ones (several blocks, a
          // ragged last one); dense and padded operands, a bias, each
          // activation, some rows only.
          if (!gemm_is_blocked(s.m, s.n, s.k)) continue;
          for (int64_t max_block : {int64_t{0}, int64_t{40}}) {
            for (const GemmVariant& v : kGemmPackedVariants) {
              check_gemm_packed_variant(checker, table, against, p, v, max_block);
            }
          }
          check_gemm_packed_variant(checker, table, against, p, kGemmPackedVariants[0], 16);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Integer wrap-around spelled out (every element the same, so that vector
// lanes and the scalar tail both see it).

template <typename T>
void check_wrap_around(const KernelTable& table) {
  using L = std::numeric_limits<T>;
  const TypedKernels<T>& k = table.typed<T>();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(std::string(dtype_name<T>()) + " n=" + std::to_string(n));
    const auto size = static_cast<std::size_t>(n);
    auto filled = [&](T v) { return std::vector<T>(size, v); };
    auto binary = [&](BinaryOp op, T a, T b) {
      const std::vector<T> x = filled(a), y = filled(b);
      std::vector<T> z = filled(T{0});
      k.binary(op, Operands::kBothVectors, x.data(), y.data(), z.data(), n);
      return z;
    };
    EXPECT_EQ(binary(BinaryOp::kAdd, L::max(), T{1}), filled(L::min())) << "max + 1";
    EXPECT_EQ(binary(BinaryOp::kSub, L::min(), T{1}), filled(L::max())) << "min - 1";
    EXPECT_EQ(binary(BinaryOp::kMul, L::min(), T{-1}), filled(L::min())) << "min * -1";
    EXPECT_EQ(binary(BinaryOp::kMul, L::max(), T{2}), filled(T{-2})) << "max * 2";
    EXPECT_EQ(binary(BinaryOp::kDiv, L::min(), T{-1}), filled(L::min())) << "min / -1";
    EXPECT_EQ(binary(BinaryOp::kDiv, T{-7}, T{2}), filled(T{-3})) << "-7 / 2 truncates";
    EXPECT_EQ(binary(BinaryOp::kDiv, T{7}, T{-2}), filled(T{-3})) << "7 / -2 truncates";
    EXPECT_EQ(binary(BinaryOp::kDiv, L::max(), T{-1}), filled(static_cast<T>(-L::max())))
        << "max / -1";
    auto unary = [&](UnaryOp op, T a) {
      const std::vector<T> x = filled(a);
      std::vector<T> y = filled(T{0});
      k.unary(op, x.data(), y.data(), n);
      return y;
    };
    EXPECT_EQ(unary(UnaryOp::kNeg, L::min()), filled(L::min())) << "-min";
    const T half = T{1} << (L::digits / 2 + 1);  // 2^16 or 2^32: the square is 2^32 or 2^64
    EXPECT_EQ(unary(UnaryOp::kSquare, half), filled(T{0})) << "square wraps to 0";
    EXPECT_EQ(unary(UnaryOp::kSquare, L::max()), filled(T{1})) << "max^2 = 1 (mod 2^bits)";
    EXPECT_EQ(unary(UnaryOp::kRelu, L::min()), filled(T{0}));
    // n copies of max, wrapped.
    const std::vector<T> maxes = filled(L::max());
    T sum{0};
    for (int64_t i = 0; i < n; ++i) sum = add(sum, L::max());
    EXPECT_EQ(k.reduce(ReduceOp::kSum, maxes.data(), n), sum) << "sum of maxes";
    std::vector<T> acc = filled(L::max());
    k.accumulate(ReduceOp::kSum, filled(T{1}).data(), acc.data(), n);
    EXPECT_EQ(acc, filled(L::min())) << "accumulate max + 1";
  }
  // [max, max] . [max, max] = 2 max^2 = 2 (mod 2^bits).
  const T a[] = {L::max(), L::max()};
  T c[] = {T{0}};
  GemmArgs<T> g;
  g.a = a;
  g.lda = 2;
  g.b = a;
  g.ldb = 1;
  g.c = c;
  g.ldc = 1;
  g.m = 1;
  g.n = 1;
  g.k = 2;
  k.gemm(g, 0, 1, 0, 1);
  EXPECT_EQ(c[0], T{2}) << dtype_name<T>() << " gemm [max max] [max max]^T";
}

// ---------------------------------------------------------------------------
// The suites.

// Above the baseline, the name says the test is skipped on a CPU without
// the level (LevelTest::SetUp).
std::string level_name(const ::testing::TestParamInfo<CpuIsa>& info) {
  std::string name(cpu_isa_name(info.param));
  if (info.param != CpuIsa::kBaseline) name += "_SkippedOnACpuWithoutIt";
  return name;
}

// One level's table; skipped when the CPU lacks the level (the table would
// fault with SIGILL) or the binary was built without it.
class LevelTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    const CpuIsa level = GetParam();
    if (static_cast<int>(level) > static_cast<int>(cpu_isa_supported())) {
      GTEST_SKIP() << "this CPU supports up to " << cpu_isa_name(cpu_isa_supported()) << ": the "
                   << cpu_isa_name(level) << " kernels would fault (SIGILL)";
    }
    table_ = kernels_for(level);
    if (table_ == nullptr) {
      GTEST_SKIP() << "this build has no " << cpu_isa_name(level)
                   << " kernels (not an x86-64 target)";
    }
  }

  const KernelTable& table() const { return *table_; }
  Checker& checker() { return checker_; }

  // fn(T{}) for every dtype the tables have.
  template <typename Fn>
  static void for_each_dtype(Fn fn) {
    fn(float{});
    fn(double{});
    fn(int32_t{});
    fn(int64_t{});
  }

 private:
  const KernelTable* table_ = nullptr;
  Checker checker_{std::string(cpu_isa_name(GetParam()))};
};

// Against the scalar reference.
class IsaAgreementTest : public LevelTest {};
INSTANTIATE_TEST_SUITE_P(Levels, IsaAgreementTest, ::testing::ValuesIn(kLevels), level_name);

// Against the baseline's table, on the same inputs.
class IsaCrossLevelTest : public LevelTest {
 protected:
  const KernelTable* baseline() const { return kernels_for(CpuIsa::kBaseline); }
};
INSTANTIATE_TEST_SUITE_P(Levels, IsaCrossLevelTest,
                         ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512), level_name);

TEST_P(IsaAgreementTest, TableIsTheLevels) {
  EXPECT_EQ(table().isa, GetParam());
  auto complete = [](const auto& t) {
    return t.gemm != nullptr && t.unary != nullptr && t.binary != nullptr && t.reduce != nullptr &&
           t.accumulate != nullptr;
  };
  EXPECT_TRUE(complete(table().f32) && complete(table().f64) && complete(table().i32) &&
              complete(table().i64));
  // Packed products are for floats.
  EXPECT_TRUE(table().f32.pack_b != nullptr && table().f32.gemm_packed != nullptr &&
              table().f64.pack_b != nullptr && table().f64.gemm_packed != nullptr);
  EXPECT_TRUE(table().i32.pack_b == nullptr && table().i64.gemm_packed == nullptr);
  if (GetParam() != CpuIsa::kBaseline) {
    // Its own code, not the baseline's (the renaming kept them apart).
    const KernelTable& base = *kernels_for(CpuIsa::kBaseline);
    EXPECT_NE(reinterpret_cast<const void*>(table().f32.gemm),
              reinterpret_cast<const void*>(base.f32.gemm));
    EXPECT_NE(reinterpret_cast<const void*>(table().i64.binary),
              reinterpret_cast<const void*>(base.i64.binary));
  }
  if (GetParam() == cpu_isa()) {
    EXPECT_EQ(&kernels(), &table()) << "kernels() is cpu_isa()'s table";
  }
}

TEST_P(IsaAgreementTest, GemmMatchesReference) {
  for_each_dtype([&](auto t) { check_gemm<decltype(t)>(checker(), table(), nullptr); });
}
TEST_P(IsaAgreementTest, UnaryMatchesReference) {
  for_each_dtype([&](auto t) { check_unary<decltype(t)>(checker(), table(), nullptr); });
}
TEST_P(IsaAgreementTest, BinaryMatchesReference) {
  for_each_dtype([&](auto t) { check_binary<decltype(t)>(checker(), table(), nullptr); });
}
TEST_P(IsaAgreementTest, ReduceMatchesReference) {
  for_each_dtype([&](auto t) { check_reduce<decltype(t)>(checker(), table(), nullptr); });
}
TEST_P(IsaAgreementTest, AccumulateMatchesReference) {
  for_each_dtype([&](auto t) { check_accumulate<decltype(t)>(checker(), table(), nullptr); });
}
TEST_P(IsaAgreementTest, Float32SumsInDoubleMatchReference) {
  check_float_sums_in_double(checker(), table(), nullptr);
}
// Eigen's vectorised log clamps its input to the smallest normal
// (plog_impl_float/double: x = pmax(x, min_norm_pos)): vector lanes gave
// log(FLT_MIN) = -87.34 (float) / log(DBL_MIN) = -708.40 (double) for
// subnormal inputs while the scalar tail, std::log, was right (-103.28 for
// float denorm_min). kernels.cc recomputes those lanes.
TEST_P(IsaAgreementTest, LogOfSubnormalMatchesReference) {
  check_log_of_subnormals<float>(checker(), table());
  check_log_of_subnormals<double>(checker(), table());
}

TEST_P(IsaAgreementTest, IntegersWrapAround) {
  check_wrap_around<int32_t>(table());
  check_wrap_around<int64_t>(table());
}

TEST_P(IsaCrossLevelTest, GemmMatchesBaseline) {
  for_each_dtype([&](auto t) { check_gemm<decltype(t)>(checker(), table(), baseline()); });
}
TEST_P(IsaCrossLevelTest, UnaryMatchesBaseline) {
  for_each_dtype([&](auto t) { check_unary<decltype(t)>(checker(), table(), baseline()); });
}
TEST_P(IsaCrossLevelTest, BinaryMatchesBaseline) {
  for_each_dtype([&](auto t) { check_binary<decltype(t)>(checker(), table(), baseline()); });
}
TEST_P(IsaCrossLevelTest, ReduceMatchesBaseline) {
  for_each_dtype([&](auto t) { check_reduce<decltype(t)>(checker(), table(), baseline()); });
}
TEST_P(IsaCrossLevelTest, AccumulateMatchesBaseline) {
  for_each_dtype([&](auto t) { check_accumulate<decltype(t)>(checker(), table(), baseline()); });
}
TEST_P(IsaCrossLevelTest, Float32SumsInDoubleMatchBaseline) {
  check_float_sums_in_double(checker(), table(), baseline());
}

}  // namespace
}  // namespace cpu
}  // namespace graphrun
