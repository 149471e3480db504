// RandomUniform and RandomStandardNormal (TensorFlow's names), with the
// RandomUniform and RandomNormal builders and TensorFlow's seed rules.
//
// Each kernel owns a Philox4x32-10 stream picked by its (seed, seed2) attrs
// and an atomic block counter. An execution reserves the blocks its draw
// needs with one fetch_add, so consecutive runs draw different values,
// concurrent runs draw disjoint ranges, and a new session (new kernels)
// replays the same sequence for the same seeds. seed == seed2 == 0 means
// "not seeded": the kernel picks a random stream when it is made.
#include <graphrun/eigen.h>
#include <graphrun/ops.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "ops/internal/families.h"
#include "ops/internal/names.h"
#include "ops/internal/philox.h"
#include "ops/random/random_ops.h"

namespace graphrun {
namespace {

using ops_internal::box_muller;
using ops_internal::Philox4x32;
using ops_internal::uint32_to_unit_float;
using ops_internal::uint64_to_unit_double;

enum class Distribution { kUniform, kStandardNormal };

// Blocks per parallel_for chunk: 1024 blocks are 2-4k samples.
constexpr int64_t kGrainBlocks = 1024;

// A draw's shape from an int32/int64 vector of non-negative sizes.
Result<Shape> shape_from_tensor(const Tensor& t) {
  if (t.dtype() != DType::kInt32 && t.dtype() != DType::kInt64) {
    return invalid_argument("shape must be int32 or int64, got {}", t.debug_type());
  }
  if (t.shape().rank() != 1)
    return invalid_argument("shape must be a vector, got {}", t.debug_type());
  std::vector<int64_t> dims;
  dims.reserve(static_cast<std::size_t>(t.num_elements()));
  if (t.dtype() == DType::kInt32) {
    for (int32_t d : t.flat<int32_t>()) dims.push_back(d);
  } else {
    for (int64_t d : t.flat<int64_t>()) dims.push_back(d);
  }
  for (int64_t d : dims) {
    if (d < 0) return invalid_argument("shape has a negative dimension: {}", t.to_string());
  }
  return Shape::make(dims);
}

// Samples one 128-bit block yields.
int64_t samples_per_block(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Writes the first `count` samples of `bits` to `out`.
template <typename T>
void fill_from_block(Distribution dist, const Philox4x32::Block& bits, T* out, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    std::array<float, 4> u;
    for (int k = 0; k < 4; ++k) u[k] = uint32_to_unit_float(bits[k]);
    if (dist == Distribution::kStandardNormal) {
      const auto [a, b] = box_muller(u[0], u[1]);
      const auto [c, d] = box_muller(u[2], u[3]);
      u = {a, b, c, d};
    }
    std::copy_n(u.begin(), count, out);
  } else {
    std::array<double, 2> u{uint64_to_unit_double(bits[0], bits[1]),
                            uint64_to_unit_double(bits[2], bits[3])};
    if (dist == Distribution::kStandardNormal) {
      const auto [a, b] = box_muller(u[0], u[1]);
      u = {a, b};
    }
    std::copy_n(u.begin(), count, out);
  }
}

// Thread safety: thread-safe; the generator is immutable and the block
// counter atomic, so concurrent steps fill disjoint ranges without a lock.
class RandomOp final : public OpKernel {
 public:
  RandomOp(Distribution dist, DType dtype, uint64_t seed, uint64_t seed2)
      : dist_(dist), dtype_(dtype), generator_(seed, seed2) {}

  Status compute(OpKernelContext& ctx) override {
    GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, shape_from_tensor(ctx.input(0)));
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * out, ctx.allocate_output_uninitialized(0, shape));
    const int64_t n = out->num_elements();
    if (n == 0) return Status::ok();
    const int64_t per_block = samples_per_block(dtype_);
    const int64_t blocks = (n + per_block - 1) / per_block;
    // relaxed: only the disjointness of reserved ranges matters; the values
    // are a pure function of the block index.
    const uint64_t start =
        next_block_.fetch_add(static_cast<uint64_t>(blocks), std::memory_order_relaxed);
    auto fill = [&](auto zero) {
      using T = decltype(zero);
      T* data = out->flat<T>().data();
      ctx.parallel_for(blocks, kGrainBlocks, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t first = i * per_block;
          fill_from_block<T>(dist_, generator_(start + static_cast<uint64_t>(i)), data + first,
                             std::min(per_block, n - first));
        }
      });
    };
    if (dtype_ == DType::kFloat32) {
      fill(float{});
    } else {
      fill(double{});
    }
    return Status::ok();
  }

 private:
  const Distribution dist_;
  const DType dtype_;
  const Philox4x32 generator_;
  std::atomic<uint64_t> next_block_{0};
};

// 64 bits from the system's entropy source (a clock mix if it has none).
uint64_t random_seed64() {
  try {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device();
  } catch (...) {
    // No entropy device: splitmix64 of the clock and a process counter.
    static std::atomic<uint64_t> calls{0};
    uint64_t z =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) +
        0x9E3779B97F4A7C15ull * (calls.fetch_add(1) + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
}

KernelFactory random_factory(Distribution dist) {
  return [dist](OpKernelConstruction& ctx) -> Result<std::unique_ptr<OpKernel>> {
    GRAPHRUN_ASSIGN_OR_RETURN(DType dtype, ctx.attr<DType>("dtype"));
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t seed, ctx.attr<int64_t>("seed"));
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t seed2, ctx.attr<int64_t>("seed2"));
    auto s = static_cast<uint64_t>(seed);
    auto s2 = static_cast<uint64_t>(seed2);
    if (s == 0 && s2 == 0) {
      s = random_seed64();
      s2 = random_seed64();
    }
    return std::make_unique<RandomOp>(dist, dtype, s, s2);
  };
}

// The output shape: the shape input's value when it is a Const, else its
// rank when known.
Status random_shape(InferenceContext& c) {
  const Shape& in = c.input_shape(0);
  if (!in.is_unknown_rank() && in.rank() != 1) {
    return invalid_argument("shape must be a vector, got a tensor of shape {}", in);
  }
  if (const Tensor* value = c.input_constant(0)) {
    GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, shape_from_tensor(*value));
    c.set_output(0, shape);
    return Status::ok();
  }
  if (in.is_unknown_rank() || in.dim(0) == Shape::kUnknownDim) {
    c.set_output(0, Shape::unknown());
    return Status::ok();
  }
  if (in.dim(0) > Shape::kMaxRank) {
    return invalid_argument("shape has {} dimensions; at most {} are supported", in.dim(0),
                            Shape::kMaxRank);
  }
  Shape out;
  for (int64_t i = 0; i < in.dim(0); ++i) out.add_dim(Shape::kUnknownDim);
  c.set_output(0, out);
  return Status::ok();
}

OpDef random_def(std::string name, std::string doc) {
  OpDef def(std::move(name));
  def.input("shape", "T")
      .output("output", "dtype")
      .type_attr("T", {DType::kInt32, DType::kInt64})
      .type_attr("dtype", float_dtypes())
      .attr("seed", int64_t{0})
      .attr("seed2", int64_t{0})
      .stateful()
      .shape_fn(random_shape)
      .doc(std::move(doc));
  return def;
}

// TensorFlow's seed rules (random_seed.get_seed): neither seed -> (0, 0),
// nondeterministic; graph seed only -> (graph, next op seed); op seed only
// -> (DEFAULT_GRAPH_SEED, op); both -> (graph, op). A deterministic pair
// that happens to be (0, 0) becomes (0, INT32_MAX), as in TF, so that it is
// not read as "unseeded".
std::pair<int64_t, int64_t> resolve_seeds(Graph& g, std::optional<int64_t> op_seed) {
  const std::optional<int64_t> graph_seed = g.seed();
  if (!graph_seed && !op_seed) return {0, 0};
  std::pair<int64_t, int64_t> seeds;
  if (!op_seed) {
    seeds = {*graph_seed, g.next_op_seed()};
  } else if (!graph_seed) {
    seeds = {ops_internal::kDefaultGraphSeed, *op_seed};
  } else {
    seeds = {*graph_seed, *op_seed};
  }
  if (seeds.first == 0 && seeds.second == 0) seeds.second = 2147483647;
  return seeds;
}

Output first_output(const Result<Node*>& node) {
  return node.is_ok() ? (*node)->output(0) : Output{};
}

Output random_node(Graph& g, std::string_view op, Output shape, DType dtype, ops::RandomAttrs attrs,
                   std::string_view name) {
  const auto [seed, seed2] = resolve_seeds(g, attrs.seed);
  return first_output(g.add_node(NodeSpec{
      .op = std::string(op),
      .name = std::string(name.empty() ? op : name),
      .inputs = {shape},
      .attrs = {{"dtype", dtype}, {"seed", seed}, {"seed2", seed2}},
  }));
}

// An int64 Const of `shape`'s dimensions named `name`; records an error
// naming `node` when the shape is not fully defined.
Output shape_const(Graph& g, const Shape& shape, std::string_view node, std::string_view op,
                   const std::string& name) {
  if (!shape.is_fully_defined()) {
    g.record_error(invalid_argument("node '{}' ({}): the shape must be fully defined, got {}",
                                    g.unique_name(node), op, shape));
    return Output{};
  }
  return ops::Const(g, Tensor::from_span(Shape{shape.rank()}, shape.dims()), name);
}

Output scalar_const(Graph& g, DType dtype, double value, const std::string& name) {
  return ops::Const(g, dtype == DType::kFloat32 ? Tensor(static_cast<float>(value)) : Tensor(value),
                    name);
}

Output binary(Graph& g, std::string op, Output x, Output y, const std::string& name) {
  return first_output(g.add_node(NodeSpec{.op = std::move(op), .name = name, .inputs = {x, y}}));
}

}  // namespace

namespace ops_internal {

void register_random_sampling_ops(OpRegistry& r) {
  must(r.add(random_def("RandomUniform",
                        "Uniform samples in [0, 1) of shape `shape`; new values on every run."),
             random_factory(Distribution::kUniform)));
  must(r.add(random_def("RandomStandardNormal",
                        "Standard normal samples of shape `shape`; new values on every run."),
             random_factory(Distribution::kStandardNormal)));
}

}  // namespace ops_internal

namespace ops {

Output RandomUniform(Graph& g, Output shape, DType dtype, RandomAttrs attrs,
                     std::string_view name) {
  return random_node(g, "RandomUniform", shape, dtype, attrs, name);
}

Output RandomUniform(Graph& g, Shape shape, DType dtype, RandomAttrs attrs, std::string_view name) {
  const std::string base =
      ops_internal::unique_relative_name(g, name.empty() ? "RandomUniform" : name);
  Output dims = shape_const(g, shape, base, "RandomUniform", base + "/shape");
  if (!dims.is_valid()) return Output{};
  return random_node(g, "RandomUniform", dims, dtype, attrs, base);
}

Output RandomNormal(Graph& g, Output shape, DType dtype, double mean, double stddev,
                    RandomAttrs attrs, std::string_view name) {
  if (mean == 0.0 && stddev == 1.0) {
    return random_node(g, "RandomStandardNormal", shape, dtype, attrs, name);
  }
  // As TF's random_normal: "<name>/RandomStandardNormal" * stddev + mean,
  // the last node named `name`.
  const std::string base =
      ops_internal::unique_relative_name(g, name.empty() ? "random_normal" : name);
  Output y =
      random_node(g, "RandomStandardNormal", shape, dtype, attrs, base + "/RandomStandardNormal");
  if (!y.is_valid()) return Output{};
  if (stddev != 1.0) {
    y = binary(g, "Mul", y, scalar_const(g, dtype, stddev, base + "/stddev"),
               mean == 0.0 ? base : base + "/mul");
  }
  if (mean != 0.0) y = binary(g, "Add", y, scalar_const(g, dtype, mean, base + "/mean"), base);
  return y;
}

Output RandomNormal(Graph& g, Shape shape, DType dtype, double mean, double stddev,
                    RandomAttrs attrs, std::string_view name) {
  const std::string plain = mean == 0.0 && stddev == 1.0 ? "RandomStandardNormal" : "random_normal";
  const std::string base = ops_internal::unique_relative_name(g, name.empty() ? plain : name);
  Output dims = shape_const(g, shape, base, "RandomStandardNormal", base + "/shape");
  if (!dims.is_valid()) return Output{};
  return RandomNormal(g, dims, dtype, mean, stddev, attrs, base);
}

}  // namespace ops
}  // namespace graphrun
