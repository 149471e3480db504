/// @file graphrun/ops.h
/// Op builder functions: each adds one node (or a few) to a Graph, checks
/// dtypes and infers shapes at build time. On error they record it in
/// graph.status() (naming the node and the shapes) and return an invalid
/// Output; see <graphrun/graph.h>. `name` empty means the op's name; names
/// are made unique and prefixed by the current name scope.
///
/// @code
///   Graph g;
///   Output x = ops::Placeholder(g, DType::kFloat32, Shape{2, 2}, "x");
///   Output y = ops::MatMul(g, x, ops::Const(g, Tensor::matrix<float>({{1, 0}, {0, 1}})));
///   Output z = ops::Relu(g, y, "z");
/// @endcode
///
/// Thread safety: as Graph (thread-compatible).
#pragma once

#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace graphrun::ops {

// ---- Array and control (ops/array, ops/control) ----

/// Must be fed. `shape` may have unknown dims ([?,3]) or unknown rank.
Output Placeholder(Graph& g, DType dtype, Shape shape = Shape::unknown(),
                   std::string_view name = {});
/// Passes `default_value` through unless fed; `shape` may be less specific.
Output PlaceholderWithDefault(Graph& g, Output default_value, Shape shape,
                              std::string_view name = {});
/// A constant: `value`, shared with every run (fetches of it are read-only).
/// Do not write `value`'s elements once a session has the graph: kernels
/// may keep a prepared copy (MatMul keeps its B operand packed when it is a
/// float Const of at most 16 MiB).
Output Const(Graph& g, Tensor value, std::string_view name = {});
/// `x` itself (the output shares its buffer).
Output Identity(Graph& g, Output x, std::string_view name = {});
/// Does nothing; a target and an anchor for control dependencies.
const Node* NoOp(Graph& g, std::string_view name = {});
/// A NoOp that runs after every node of `deps` (TF's tf.group).
const Node* Group(Graph& g, std::vector<const Node*> deps, std::string_view name = {});
///@{
/// `x` with another shape of as many elements, sharing its buffer.
/// `shape` is an int32 or int64 vector; one entry may be -1 (inferred).
Output Reshape(Graph& g, Output x, Output shape, std::string_view name = {});
Output Reshape(Graph& g, Output x, std::vector<int64_t> shape, std::string_view name = {});
inline Output Reshape(Graph& g, Output x, std::initializer_list<int64_t> shape,
                      std::string_view name = {}) {
  return Reshape(g, x, std::vector<int64_t>(shape), name);
}
///@}
/// `x` converted to dtype `to`, elementwise.
Output Cast(Graph& g, Output x, DType to, std::string_view name = {});
/// A tensor of shape `dims` (int32/int64 vector) filled with scalar `value`.
Output Fill(Graph& g, Output dims, Output value, std::string_view name = {});
/// A Const of `shape` (fully defined) filled with zeros.
Output Zeros(Graph& g, Shape shape, DType dtype = DType::kFloat32, std::string_view name = {});
/// A Const of `shape` (fully defined) filled with ones.
Output Ones(Graph& g, Shape shape, DType dtype = DType::kFloat32, std::string_view name = {});

// ---- Math (ops/math) ----

/// x + y. Elementwise with NumPy broadcasting; both inputs of one dtype.
Output Add(Graph& g, Output x, Output y, std::string_view name = {});
/// x - y, as Add.
Output Sub(Graph& g, Output x, Output y, std::string_view name = {});
/// x * y, as Add.
Output Mul(Graph& g, Output x, Output y, std::string_view name = {});
/// x / y, as Add. Integer division truncates toward zero; division by zero
/// is an error.
Output Div(Graph& g, Output x, Output y, std::string_view name = {});

/// -x elementwise (numeric dtypes).
Output Neg(Graph& g, Output x, std::string_view name = {});
/// x * x elementwise (numeric dtypes).
Output Square(Graph& g, Output x, std::string_view name = {});
/// Square root elementwise (float32, float64).
Output Sqrt(Graph& g, Output x, std::string_view name = {});
/// e^x elementwise (float32, float64).
Output Exp(Graph& g, Output x, std::string_view name = {});
/// Natural logarithm elementwise (float32, float64).
Output Log(Graph& g, Output x, std::string_view name = {});
/// Hyperbolic tangent elementwise (float32, float64).
Output Tanh(Graph& g, Output x, std::string_view name = {});
/// 1 / (1 + exp(-x)) elementwise (float32, float64).
Output Sigmoid(Graph& g, Output x, std::string_view name = {});
/// max(x, 0) elementwise (numeric dtypes).
Output Relu(Graph& g, Output x, std::string_view name = {});

/// MatMul's attributes (TensorFlow's).
struct MatMulAttrs {
  bool transpose_a = false;  ///< multiply by a's transpose
  bool transpose_b = false;  ///< multiply by b's transpose
};
/// Rank-2 product; inner dimensions must agree.
Output MatMul(Graph& g, Output a, Output b, MatMulAttrs attrs = {}, std::string_view name = {});

/// Conv2D's attributes (TensorFlow's).
struct Conv2DAttrs {
  /// [1, stride_height, stride_width, 1]; every entry positive.
  std::vector<int64_t> strides{1, 1, 1, 1};
  /// "VALID" (only windows wholly inside the input) or "SAME" (zero padding,
  /// output size ceil(input / stride), TF's split: the extra row or column
  /// goes after).
  std::string padding = "VALID";
  /// [1, dilation_height, dilation_width, 1]; every entry positive.
  std::vector<int64_t> dilations{1, 1, 1, 1};
};
/// TF's Conv2D (NHWC only): `input` [batch, height, width, channels] (float32
/// or float64) convolved with `filter` [filter_height, filter_width, channels,
/// out_channels] of the same dtype gives [batch, out_height, out_width,
/// out_channels]. The node also carries TF's data_format "NHWC",
/// use_cudnn_on_gpu and empty explicit_paddings attributes.
Output Conv2D(Graph& g, Output input, Output filter, Conv2DAttrs attrs = {},
              std::string_view name = {});

/// Reductions over `axes` (negative axes count from the end; duplicates count
/// once; empty = none, the identity, as in TF's op). To reduce everything,
/// list every axis: Sum(g, x, {0, 1}) gives the scalar sum of a matrix.
/// `keep_dims` keeps each reduced axis with size 1.
Output Sum(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims = false,
           std::string_view name = {});
/// The mean over `axes`, as Sum.
Output Mean(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims = false,
            std::string_view name = {});
/// The maximum over `axes`, as Sum.
Output Max(Graph& g, Output x, std::vector<int64_t> axes, bool keep_dims = false,
           std::string_view name = {});
///@{
/// Forms taking the axes as an int32/int64 tensor (as in GraphDefs).
Output Sum(Graph& g, Output x, Output axes, bool keep_dims = false, std::string_view name = {});
Output Mean(Graph& g, Output x, Output axes, bool keep_dims = false, std::string_view name = {});
Output Max(Graph& g, Output x, Output axes, bool keep_dims = false, std::string_view name = {});
///@}
///@{
/// Brace lists ({0, 1}) pick these rather than an Output.
inline Output Sum(Graph& g, Output x, std::initializer_list<int64_t> axes, bool keep_dims = false,
                  std::string_view name = {}) {
  return Sum(g, x, std::vector<int64_t>(axes), keep_dims, name);
}
inline Output Mean(Graph& g, Output x, std::initializer_list<int64_t> axes, bool keep_dims = false,
                   std::string_view name = {}) {
  return Mean(g, x, std::vector<int64_t>(axes), keep_dims, name);
}
inline Output Max(Graph& g, Output x, std::initializer_list<int64_t> axes, bool keep_dims = false,
                  std::string_view name = {}) {
  return Max(g, x, std::vector<int64_t>(axes), keep_dims, name);
}
///@}

// ---- Variables (ops/state) ----

/// A variable of `initial_value`'s dtype and shape. Returns its value (a
/// snapshot read). The initializer (an Assign of `initial_value`) is added to
/// the graph's "variable_initializers" collection; run
/// GlobalVariablesInitializer before reading. Reading an uninitialized
/// variable is FailedPrecondition naming it.
Output Variable(Graph& g, Tensor initial_value, std::string_view name = {});
/// The same with an initial value computed by the graph (its dtype and
/// build-time shape, which must be fully defined).
Output Variable(Graph& g, Output initial_value, std::string_view name = {});

/// The attributes of Assign, AssignAdd and AssignSub.
struct AssignAttrs {
  /// true: the read-modify-write is atomic with respect to every other locked
  /// update of the same variable (no update is ever lost). false (TF's
  /// use_locking=false): the new value is computed from a snapshot outside
  /// the lock and then swapped in, so concurrent updates may be lost; a
  /// reader still never sees a torn value (copy-on-write).
  bool use_locking = true;
};
/// Sets the variable to `value`. `var` is an Output of a Variable node.
/// Each returns the new value.
Output Assign(Graph& g, Output var, Output value, AssignAttrs attrs = {},
              std::string_view name = {});
/// Adds `value` to the variable, as Assign.
Output AssignAdd(Graph& g, Output var, Output value, AssignAttrs attrs = {},
                 std::string_view name = {});
/// Subtracts `value` from the variable, as Assign.
Output AssignSub(Graph& g, Output var, Output value, AssignAttrs attrs = {},
                 std::string_view name = {});
/// A snapshot of the variable's value (order it after writes with control
/// dependencies).
Output ReadVariable(Graph& g, Output var, std::string_view name = {});
/// Groups every initializer of the graph's variables.
const Node* GlobalVariablesInitializer(Graph& g, std::string_view name = "init");

// ---- Random (ops/random) ----

/// The attributes of the random ops.
struct RandomAttrs {
  /// Op seed. With neither graph seed nor op seed set, draws are not
  /// reproducible across sessions; with either set, a session repeats the
  /// same sequence for the same sequence of runs (as TF).
  std::optional<int64_t> seed;
};
/// Uniform in [0, 1); `shape` an int32/int64 vector. Each execution draws
/// new values.
Output RandomUniform(Graph& g, Output shape, DType dtype = DType::kFloat32, RandomAttrs attrs = {},
                     std::string_view name = {});
/// The same with a fully defined static shape.
Output RandomUniform(Graph& g, Shape shape, DType dtype = DType::kFloat32, RandomAttrs attrs = {},
                     std::string_view name = {});
/// Standard normal (op "RandomStandardNormal"), scaled by stddev and shifted
/// by mean when they are not 1 and 0.
Output RandomNormal(Graph& g, Output shape, DType dtype = DType::kFloat32, double mean = 0.0,
                    double stddev = 1.0, RandomAttrs attrs = {}, std::string_view name = {});
/// The same with a fully defined static shape.
Output RandomNormal(Graph& g, Shape shape, DType dtype = DType::kFloat32, double mean = 0.0,
                    double stddev = 1.0, RandomAttrs attrs = {}, std::string_view name = {});

// ---- Iterators (ops/data) ----

/// An iterator over a dataset. `next` yields the next element each time it
/// runs (once per step) and fails with OutOfRange past the end;
/// `initializer` rewinds it to the start. It starts initialized.
struct Iterator {
  Output next;                        ///< the next element, once per step
  const Node* initializer = nullptr;  ///< run it to rewind
};
/// Elements are the rows (slices along dimension 0) of `data`.
Iterator TensorRowsIterator(Graph& g, Tensor data, std::string_view name = {});
/// Elements are int64 scalars start, start+step, ... < stop (> stop if step < 0).
Iterator RangeIterator(Graph& g, int64_t start, int64_t stop, int64_t step = 1,
                       std::string_view name = {});

// ---- Custom C++ callables (ops/control/call_op.cc) ----

/// Tensors in, tensors out. Must be thread-safe: steps run concurrently.
using CallableFn = std::function<Result<std::vector<Tensor>>(std::span<const Tensor> inputs)>;
/// The same with the kernel context (parallel_for, cancellation).
using CallableKernelFn = std::function<Status(OpKernelContext& ctx)>;

/// The attributes of a Call node.
struct CallAttrs {
  /// Declared output shapes (unknown if omitted).
  std::vector<Shape> output_shapes;
  /// Stateful callables run once per step and never get deduplicated.
  bool stateful = true;
  /// A hint: the callable is cheap (a microsecond or two), so it may run
  /// inline on the thread that made its inputs from the first step on
  /// (OpKernel::is_cheap). Not needed for speed: the scheduler measures
  /// every callable over its first steps and runs the cheap ones inline
  /// anyway. A wrong `true` costs parallelism for those first steps only.
  bool cheap = false;
};
/// Adds a node that runs `fn` on its inputs. Returns one Output per entry of
/// `output_dtypes`; the results must match those dtypes (an error names the
/// node otherwise).
std::vector<Output> Call(Graph& g, std::vector<Output> inputs, std::vector<DType> output_dtypes,
                         CallableFn fn, CallAttrs attrs = {}, std::string_view name = {});
/// The same with a callable that takes the kernel context: it reads
/// ctx.input(i), makes its outputs with ctx.allocate_output(), and may use
/// ctx.parallel_for() and ctx.is_cancelled().
std::vector<Output> Call(Graph& g, std::vector<Output> inputs, std::vector<DType> output_dtypes,
                         CallableKernelFn fn, CallAttrs attrs = {}, std::string_view name = {});

}  // namespace graphrun::ops
