/// @file graphrun/op_kernel.h
/// The op and kernel interface: what an op is (OpDef), how its kernel runs
/// (OpKernel, OpKernelContext), and where ops are found (OpRegistry). Built-in
/// ops use exactly this interface, so custom ops are first-class.
///
/// Registering a custom op (explicitly; graphrun has no static registrars):
///
/// @code
///   class TimesTwoOp final : public graphrun::OpKernel {
///    public:
///     Status compute(OpKernelContext& ctx) override {
///       const Tensor& x = ctx.input(0);
///       GRAPHRUN_ASSIGN_OR_RETURN(Tensor* y, ctx.allocate_output(0, x.shape()));
///       auto in = x.flat<float>(); auto out = y->flat<float>();
///       ctx.parallel_for(in.size(), 4096, [&](int64_t b, int64_t e) {
///         for (int64_t i = b; i < e; ++i) out[i] = 2 * in[i];
///       });
///       return Status::ok();
///     }
///   };
///   Status s = OpRegistry::global().add(
///       OpDef("TimesTwo").input("x", DType::kFloat32).output("y", DType::kFloat32)
///           .shape_fn(shape_fns::unchanged),
///       [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
///         return std::make_unique<TimesTwoOp>();
///       });
/// @endcode
///
/// For a one-off node, ops::Call (<graphrun/ops.h>) wraps a C++ callable.
#pragma once

#include <graphrun/attr_value.h>
#include <graphrun/graph.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace graphrun {

/// A non-owning reference to a callable, for hot paths (no allocation).
///
/// Thread safety: as the callable it refers to.
template <typename Sig>
class FunctionRef;
/// FunctionRef for callables of signature R(Args...). The callable must
/// outlive the FunctionRef (pass it down a call, never store it).
///
/// Thread safety: as the callable it refers to.
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  /// Refers to `f` (implicit, so a lambda can be passed where a FunctionRef
  /// is expected).
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}
  /// Calls the callable.
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

/// The dtypes one type variable (e.g. "T") of an op may take.
using DTypeSet = std::vector<DType>;
/// float32, float64, int32, int64 and bool.
inline const DTypeSet& all_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                          DType::kBool};
  return s;
}
/// float32, float64, int32 and int64.
inline const DTypeSet& numeric_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64};
  return s;
}
/// float32 and float64.
inline const DTypeSet& float_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64};
  return s;
}

/// Build-time view of a node for its op's shape function: input dtypes and
/// shapes, constant inputs when known, attrs. The shape function sets each
/// output's shape (output dtypes come from the OpDef and are already set).
///
/// Thread safety: not thread-safe; one context per shape-function call.
class InferenceContext {
 public:
  /// Made by Graph::add_node; the spans and vectors must outlive the context.
  InferenceContext(const NodeSpec& spec, std::span<const DType> input_dtypes,
                   std::span<const Shape> input_shapes, std::span<const Tensor* const> constants,
                   std::vector<DType>* output_dtypes, std::vector<Shape>* output_shapes)
      : spec_(spec),
        input_dtypes_(input_dtypes),
        input_shapes_(input_shapes),
        constants_(constants),
        output_dtypes_(output_dtypes),
        output_shapes_(output_shapes) {}

  /// The node's name.
  const std::string& node_name() const { return spec_.name; }
  /// The op's name.
  const std::string& op() const { return spec_.op; }
  /// The number of data inputs.
  int num_inputs() const { return static_cast<int>(input_shapes_.size()); }
  /// The dtype of input `i`.
  DType input_dtype(int i) const { return input_dtypes_[static_cast<std::size_t>(i)]; }
  /// The shape of input `i` (dimensions may be unknown).
  const Shape& input_shape(int i) const { return input_shapes_[static_cast<std::size_t>(i)]; }
  /// The value of input i when it comes straight from a Const node, else null.
  const Tensor* input_constant(int i) const { return constants_[static_cast<std::size_t>(i)]; }
  /// The number of outputs.
  int num_outputs() const { return static_cast<int>(output_shapes_->size()); }
  /// The dtype of output `i`, already set from the OpDef.
  DType output_dtype(int i) const { return (*output_dtypes_)[static_cast<std::size_t>(i)]; }
  /// Sets the shape of output `i`.
  void set_output(int i, Shape shape) { (*output_shapes_)[static_cast<std::size_t>(i)] = shape; }
  /// The node's attributes, defaults filled in.
  const AttrMap& attrs() const { return spec_.attrs; }
  /// The attribute `name` as a T (get_attr).
  template <typename T>
  Result<T> attr(std::string_view name) const {
    return get_attr<T>(spec_.attrs, name, spec_.name);
  }
  /// "node 'x' (Op)" prefix for messages.
  std::string describe() const;

 private:
  const NodeSpec& spec_;
  std::span<const DType> input_dtypes_;
  std::span<const Shape> input_shapes_;
  std::span<const Tensor* const> constants_;
  std::vector<DType>* output_dtypes_;
  std::vector<Shape>* output_shapes_;
};

/// An op's shape function: sets each output's shape, or returns an error
/// that names the shapes (Graph::add_node prefixes the node).
using ShapeFn = std::function<Status(InferenceContext&)>;

/// Ready-made shape functions.
namespace shape_fns {
/// Every output has input 0's shape.
Status unchanged(InferenceContext& c);
/// Every output has an unknown shape.
Status unknown(InferenceContext& c);
/// Every output is a scalar.
Status scalar(InferenceContext& c);
/// NumPy broadcasting of inputs 0 and 1; InvalidArgument naming both shapes
/// when they cannot broadcast.
Status broadcast_binary(InferenceContext& c);
}  // namespace shape_fns

/// NumPy broadcast of two shapes (unknown dims allowed); InvalidArgument
/// naming both when incompatible.
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b);

/// How an input or output's dtype is given: a fixed dtype, or a type
/// variable ("T") that is an attr of the node, inferred from the first input
/// that uses it when the attr is not given.
struct ArgDef {
  std::string name;               ///< the input's or output's name
  DType fixed = DType::kInvalid;  ///< when not kInvalid
  std::string type_attr;          ///< else this type variable
};

/// An op's signature. Builder style:
/// @code
///   OpDef("MatMul").input("a", "T").input("b", "T").output("product", "T")
///       .type_attr("T", numeric_dtypes())
///       .attr("transpose_a", false).attr("transpose_b", false)
///       .shape_fn(matmul_shape);
/// @endcode
///
/// Thread safety: thread-compatible (a value); registered definitions are
/// only read.
class OpDef {
 public:
  /// An op named `name` (TensorFlow's name when TensorFlow has the op).
  explicit OpDef(std::string name) : name_(std::move(name)) {}

  ///@{
  /// Adds an input of a fixed dtype, or of the dtype of type variable
  /// `type_attr`.
  OpDef& input(std::string name, DType fixed);
  OpDef& input(std::string name, std::string type_attr);
  ///@}
  /// Any number of inputs of any dtypes (custom callables); checked by the
  /// shape function.
  OpDef& variadic_inputs();
  ///@{
  /// Adds an output of a fixed dtype, or of the dtype of type variable
  /// `type_attr`.
  OpDef& output(std::string name, DType fixed);
  OpDef& output(std::string name, std::string type_attr);
  ///@}
  /// Outputs whose dtypes are the list(type) attr `attr` (custom callables).
  OpDef& output_list(std::string attr);
  /// Declares type variable `name` (e.g. "T") and the dtypes it may take.
  OpDef& type_attr(std::string name, DTypeSet allowed);
  /// An attr with a default; its kind is the default's.
  OpDef& attr(std::string name, AttrValue default_value);
  /// A required attr of the kind of `kind_example`.
  OpDef& required_attr(std::string name, AttrValue kind_example);
  /// Sets the shape function, run by Graph::add_node. It must depend only on
  /// what its InferenceContext shows: a node with the same attributes, input
  /// dtypes and shapes as a recent one (and no Const input) reuses that
  /// node's result without calling it again.
  OpDef& shape_fn(ShapeFn fn);
  /// Stateful ops touch state outside their inputs (variables, RNG, iterators):
  /// never deduplicated, and each runs once per step.
  OpDef& stateful(bool value = true);
  /// Sets a one-paragraph description of the op.
  OpDef& doc(std::string text);

  /// The op's name.
  const std::string& name() const { return name_; }
  /// The inputs, in order.
  const std::vector<ArgDef>& inputs() const { return inputs_; }
  /// The outputs, in order.
  const std::vector<ArgDef>& outputs() const { return outputs_; }
  /// True after variadic_inputs().
  bool has_variadic_inputs() const { return variadic_inputs_; }
  /// The attribute output_list() named; empty when not set.
  const std::string& output_list_attr() const { return output_list_attr_; }
  /// A type variable and the dtypes it may take.
  struct TypeAttr {
    std::string name;  ///< e.g. "T"
    DTypeSet allowed;  ///< the dtypes it may take
  };
  /// The type variables, in the order declared.
  const std::vector<TypeAttr>& type_attrs() const { return type_attrs_; }
  /// An attribute: its name, default (or kind) and whether it is required.
  struct AttrDef {
    std::string name;       ///< the attribute's name
    AttrValue value;        ///< default, or kind example when required
    bool required = false;  ///< true when a node must set it
  };
  /// The attributes, in the order declared.
  const std::vector<AttrDef>& attrs() const { return attrs_; }
  /// The shape function; empty when none was set.
  const ShapeFn& shape_function() const { return shape_fn_; }
  /// True after stateful().
  bool is_stateful() const { return stateful_; }
  /// The text doc() set.
  const std::string& documentation() const { return doc_; }

 private:
  std::string name_;
  std::vector<ArgDef> inputs_;
  std::vector<ArgDef> outputs_;
  bool variadic_inputs_ = false;
  std::string output_list_attr_;
  std::vector<TypeAttr> type_attrs_;
  std::vector<AttrDef> attrs_;
  ShapeFn shape_fn_;
  bool stateful_ = false;
  std::string doc_;
};

/// Session-owned state shared by kernels (variables, iterators): looked up by
/// name, created on first use, destroyed with the session.
///
/// Thread safety: subclasses must be thread-safe: the kernels of concurrent
/// steps share a resource.
class Resource {
 public:
  virtual ~Resource() = default;
};

/// A session's resources by name. Kernel factories reach it through
/// OpKernelConstruction::resources(); it owns every resource.
///
/// Thread safety: thread-safe.
class ResourceManager {
 public:
  /// The resource named `name`, made by `create` if absent. InvalidArgument
  /// when it exists with another type.
  template <typename T>
  Result<T*> lookup_or_create(std::string_view name,
                              FunctionRef<Result<std::unique_ptr<T>>()> create) {
    std::lock_guard lock(mu_);
    auto it = resources_.find(std::string(name));
    if (it != resources_.end()) {
      T* typed = dynamic_cast<T*>(it->second.get());
      if (typed == nullptr) return invalid_argument("resource '{}' has another type", name);
      return typed;
    }
    Result<std::unique_ptr<T>> made = create();
    if (!made.is_ok()) return made.status();
    T* raw = made->get();
    resources_.emplace(std::string(name), std::move(*made));
    return raw;
  }
  /// The number of resources.
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return resources_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Resource>> resources_;
};

/// What a kernel factory sees once per (session, node).
///
/// Thread safety: not thread-safe; one object per factory call.
class OpKernelConstruction {
 public:
  /// Made by the session for `node`, with the session's resources.
  OpKernelConstruction(const Node& node, ResourceManager& resources)
      : node_(node), resources_(resources) {}
  /// The node the kernel is for.
  const Node& node() const { return node_; }
  /// The session's resources (variables, iterators).
  ResourceManager& resources() const { return resources_; }
  /// The node's attribute `name` as a T (Node::attr).
  template <typename T>
  Result<T> attr(std::string_view name) const {
    return node_.attr<T>(name);
  }

 private:
  const Node& node_;
  ResourceManager& resources_;
};

/// The vector instruction-set levels the built-in heavy kernels (MatMul,
/// Conv2D, elementwise math, reductions) are compiled for, in one binary.
enum class CpuIsa : uint8_t {
  kBaseline,  ///< x86-64's SSE2 (or the target's default)
  kAvx2,      ///< AVX2 + FMA
  kAvx512,    ///< AVX-512 F/BW/DQ/VL (with AVX2 + FMA)
};
/// "baseline", "avx2" or "avx512".
std::string_view cpu_isa_name(CpuIsa isa);
/// The best level this CPU (and OS) supports.
CpuIsa cpu_isa_supported();
/// The level the built-in kernels run at: cpu_isa_supported(), or the lower
/// level the environment variable GRAPHRUN_CPU_ISA (baseline|avx2|avx512)
/// names. Chosen once per process, at the first call.
CpuIsa cpu_isa();
/// OK, or InvalidArgument naming GRAPHRUN_CPU_ISA's value when it names no
/// level or one this CPU lacks (cpu_isa() is then cpu_isa_supported());
/// Session::create returns this error. Thread safety: all four are
/// thread-safe.
const Status& cpu_isa_status();

/// Hooks the scheduler installs in every kernel context: intra-op
/// parallelism in the session's arena.
///
/// Thread safety: set before the session runs; only read while it runs.
struct KernelRuntime {
  /// Runs fn over [0, n) in chunks of at least `grain` on the session's
  /// threads; null: OpKernelContext::parallel_for runs fn(0, n) inline.
  void (*parallel_for)(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) = nullptr;
  /// Threads parallel_for may use (the session's pool size); 1 when unset.
  int threads = 1;
  /// Largest output allocate_output*() makes (SessionOptions::max_tensor_bytes);
  /// 0: no limit.
  int64_t max_tensor_bytes = 0;
};

/// What a step's kernels poll to stop early: the step failed or was
/// cancelled, the session was closed, or the run's deadline passed. Owned by
/// the scheduler (one per step); kernels only read it.
///
/// Thread safety: thread-safe to read while the step runs.
struct StepCancellation {
  std::atomic<bool> cancelled{false};                 ///< set when the step fails or is cancelled
  const std::atomic<bool>* session_closed = nullptr;  ///< the session's closed flag, if any
  /// The run's deadline; max() when it has none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  /// True once any of the three says stop.
  bool is_cancelled() const {
    // relaxed: advisory; the scheduler decides the step's status.
    if (cancelled.load(std::memory_order_relaxed)) return true;
    if (session_closed != nullptr && session_closed->load(std::memory_order_relaxed)) return true;
    return deadline != std::chrono::steady_clock::time_point::max() &&
           std::chrono::steady_clock::now() > deadline;
  }
};

/// Work an asynchronous kernel lends the thread that waits for its step
/// (OpKernelContext::lend_to_waiter): a caller blocked in run() that runs
/// the step itself tests for the kernel's progress instead of sleeping,
/// which spares a thread hand-off per completion (a message's round trip
/// then costs no wake-up).
///
/// Thread safety: both calls come from the waiting thread, never at once;
/// the kernel owns the helper (it may delete itself in either call).
class WaitHelper {
 public:
  /// Tests for progress once, without blocking (it may call the kernel's
  /// `done`). Returns true when the helper needs the thread no more (its
  /// work finished, or it handed the rest over): it is not called again.
  virtual bool poll() = 0;
  /// The thread stops waiting (it is about to sleep or return) before
  /// poll() returned true: the kernel must finish without it from now on.
  /// Called once, and then nothing else.
  virtual void release() = 0;

 protected:
  ~WaitHelper() = default;
};

namespace internal {
/// The waiting thread's side of WaitHelper. The scheduler sets the calling
/// thread's sink around compute_async() when that thread will wait for the
/// step (null otherwise).
class WaitSink {
 public:
  virtual void lend(WaitHelper& helper) = 0;

 protected:
  ~WaitSink() = default;
};
/// The calling thread's sink (thread-local; inline: read at every
/// asynchronous kernel's start).
inline constinit thread_local WaitSink* t_current_wait_sink = nullptr;
inline WaitSink*& current_wait_sink() { return t_current_wait_sink; }
}  // namespace internal

/// What a kernel sees while it runs: its inputs and where its outputs go.
///
/// Thread safety: one context per node execution; not shared.
class OpKernelContext {
 public:
  /// Made by the scheduler for one execution of `node`.
  OpKernelContext(const Node& node, const Tensor* slots, std::span<const int32_t> input_slots,
                  Tensor* outputs, const KernelRuntime& runtime,
                  const StepCancellation* cancellation, int64_t step_id)
      : OpKernelContext(node, node.num_outputs(), slots, input_slots, outputs, runtime,
                        cancellation, step_id) {}
  /// The same with the node's number of outputs given (the scheduler keeps
  /// it next to the slots, sparing a read of the node).
  OpKernelContext(const Node& node, int num_outputs, const Tensor* slots,
                  std::span<const int32_t> input_slots, Tensor* outputs,
                  const KernelRuntime& runtime, const StepCancellation* cancellation,
                  int64_t step_id)
      : node_(node),
        num_outputs_(num_outputs),
        slots_(slots),
        input_slots_(input_slots),
        outputs_(outputs),
        runtime_(runtime),
        cancellation_(cancellation),
        step_id_(step_id) {}

  /// The node being executed (for a fused kernel, the chain's last node).
  const Node& node() const { return node_; }
  /// The number of inputs.
  int num_inputs() const { return static_cast<int>(input_slots_.size()); }
  /// Input `i`; read-only (it may be shared with other nodes and fetches).
  const Tensor& input(int i) const { return slots_[input_slots_[static_cast<std::size_t>(i)]]; }
  /// The number of outputs.
  int num_outputs() const { return num_outputs_; }

  /// A zero-filled output of the node's declared dtype. Validates the shape
  /// and reports allocation failure as ResourceExhausted.
  /// Both are ResourceExhausted past the session's SessionOptions::max_tensor_bytes,
  /// and Internal for an index out of range.
  Result<Tensor*> allocate_output(int i, const Shape& shape);
  /// Storage not zeroed: for kernels that write every element.
  /// ResourceExhausted as allocate_output().
  Result<Tensor*> allocate_output_uninitialized(int i, const Shape& shape);
  /// Sets output i to `t` (sharing its buffer, e.g. Identity). Internal error
  /// if its dtype is not the declared one.
  Status set_output(int i, Tensor t);
  /// Output `i` as it stands (empty until allocated or set); `i` must be
  /// below num_outputs() (unchecked; allocate_output and set_output check).
  Tensor* mutable_output(int i) { return &outputs_[i]; }

  /// Splits [0, n) into chunks of at least `grain` and runs fn(begin, end)
  /// on the session's threads (the caller helps). Sequential when n <= grain.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) const;
  /// Threads parallel_for runs on (the caller included): at least 1. Kernels
  /// size their pieces from it.
  int num_threads() const { return runtime_.parallel_for == nullptr ? 1 : runtime_.threads; }

  /// True once the step failed or was cancelled, the session was closed, or
  /// the run's deadline passed. Long kernels should poll it (it costs a clock
  /// read when the run has a deadline) and then return any error: the run
  /// reports Cancelled or DeadlineExceeded, not the kernel's status.
  bool is_cancelled() const { return cancellation_ != nullptr && cancellation_->is_cancelled(); }
  /// The step's id, unique in the process.
  int64_t step_id() const { return step_id_; }
  /// Asynchronous kernels, from compute_async() only: lends `helper` to the
  /// thread that will wait for this step (see WaitHelper). False, and
  /// nothing lent, when no thread waits (the step runs on the pool's
  /// threads): the kernel then finishes on its own, as always.
  bool lend_to_waiter(WaitHelper& helper) const {
    internal::WaitSink* sink = internal::current_wait_sink();
    if (sink == nullptr) return false;
    sink->lend(helper);
    return true;
  }

 private:
  const Node& node_;
  int num_outputs_;
  const Tensor* slots_;
  std::span<const int32_t> input_slots_;
  Tensor* outputs_;
  Status check_output_size(int i, const Shape& shape) const;
  const KernelRuntime& runtime_;
  const StepCancellation* cancellation_;
  int64_t step_id_;
};

class AsyncOpKernel;

/// A kernel: the code of one op on CPU. One kernel object is made per
/// (session, node) and shared by every step of the session, so compute() may
/// run concurrently with itself: keep kernels stateless or lock their state.
///
/// Thread safety: must be thread-safe (see above).
class OpKernel {
 public:
  virtual ~OpKernel() = default;
  /// Computes the node's outputs from its inputs; an error fails the step
  /// (the scheduler prefixes the node).
  virtual Status compute(OpKernelContext& ctx) = 0;
  /// The first estimate of whether the kernel is cheap enough to run inline
  /// without a task of their own (TensorFlow's !IsExpensive()): the node
  /// then runs on the thread that completed its last input. The scheduler
  /// measures the kernel's cycles over its first steps and decides from
  /// them after that (SessionOptions::inline_cheap_nodes); this answer only
  /// counts until then. Asked once per (session, node), so a kernel whose
  /// cost grows with its tensors answers from the node's build-time shapes
  /// (small_static_shapes). Default: false (expensive until measured).
  virtual bool is_cheap() const { return false; }
  /// Optional epilogue fusion: one kernel computing this node followed by
  /// `chain`, where chain[0] reads this node's only output and each next
  /// node reads the previous one's, and nothing else sees those
  /// intermediate tensors. The plan asks (with SessionOptions::fuse_kernels,
  /// never for a traced run or a partial run); null declines, the default.
  /// The fused kernel's inputs are this node's, then each chain node's other
  /// inputs in order; it produces the last chain node's outputs, and runs
  /// with that node as ctx.node(). The plan owns the returned kernel.
  virtual std::unique_ptr<OpKernel> fuse(std::span<const Node* const> chain) const {
    (void)chain;
    return nullptr;
  }
  /// This kernel as an AsyncOpKernel, or null (every synchronous kernel).
  virtual AsyncOpKernel* as_async() { return nullptr; }
};

/// A kernel that finishes later, on any thread, without holding one of the
/// session's threads while it waits (a receive from another process, a
/// collective, an I/O completion): TensorFlow's AsyncOpKernel.
/// compute_async() starts the work and returns; the kernel then calls
/// `done(status)` exactly once, from any thread, after setting its outputs.
/// `ctx`, its inputs and its outputs stay valid until `done` is called; a
/// second call is ignored. The kernel must call `done` also when the step
/// stops: poll ctx.is_cancelled() while waiting and then finish with any
/// error (the run reports Cancelled or DeadlineExceeded). The scheduler runs
/// the node's successors on the session's threads, never on a thread of the
/// kernel's own that called `done`. A blocking caller outside the pool
/// whose other nodes are all cheap runs the step on its own thread and
/// waits there for the kernel, which may lend it a WaitHelper.
///
/// Thread safety: as OpKernel; `done` may be called from any thread.
class AsyncOpKernel : public OpKernel {
 public:
  /// Ends the node: its status (OK or the error that fails the step).
  using Done = std::function<void(Status)>;
  /// Starts the node's work; see the class comment. An exception thrown
  /// before `done` was called fails the node with Internal.
  virtual void compute_async(OpKernelContext& ctx, Done done) = 0;
  /// The synchronous form, for callers outside a session: starts
  /// compute_async() and blocks the calling thread until `done`.
  Status compute(OpKernelContext& ctx) final;
  AsyncOpKernel* as_async() final { return this; }
};

/// Elements up to which elementwise work on one node counts as cheap.
inline constexpr int64_t kCheapElements = 4096;

/// True when every input and output shape of `node` is fully defined at graph
/// build, each input holds at most `max_elements` elements and the outputs
/// together at most `max_elements`: what a size-dependent kernel's is_cheap()
/// checks (fed tensors are checked against these shapes at run time).
bool small_static_shapes(const Node& node, int64_t max_elements = kCheapElements);

/// One registered op: its definition and how its kernels are made.
struct OpRegistration {
  OpDef def;              ///< the op's signature
  KernelFactory factory;  ///< makes the kernel of one (session, node)
};

/// Op name -> definition and kernel factory.
///
/// Thread safety: thread-safe. Registrations are never removed, so returned
/// pointers stay valid for the registry's lifetime.
class OpRegistry {
 public:
  OpRegistry() = default;
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  /// The process-wide registry, holding every built-in op; register your
  /// own ops here (or in a registry of your own passed to Graph).
  static OpRegistry& global();

  /// AlreadyExists when the name is taken; InvalidArgument for a malformed def.
  Status add(OpDef def, KernelFactory factory);
  /// nullptr when absent.
  const OpRegistration* find(std::string_view op) const;
  /// The names of every registered op, sorted.
  std::vector<std::string> op_names() const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<OpRegistration>> ops_;
};

/// Registers every built-in op into `registry` (OpRegistry::global() does
/// this once). Defined in the ops library.
void register_builtin_ops(OpRegistry& registry);

}  // namespace graphrun
