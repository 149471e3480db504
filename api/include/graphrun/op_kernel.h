// File: graphrun/op_kernel.h
// The op and kernel interface: what an op is (OpDef), how its kernel runs
// (OpKernel, OpKernelContext), and where ops are found (OpRegistry). Built-in
// ops use exactly this interface, so custom ops are first-class.
//
// Registering a custom op (explicitly; graphrun has no static registrars):
//
//   class TimesTwoOp final : public graphrun::OpKernel {
//    public:
//     Status compute(OpKernelContext& ctx) override {
//       const Tensor& x = ctx.input(0);
//       GRAPHRUN_ASSIGN_OR_RETURN(Tensor* y, ctx.allocate_output(0, x.shape()));
//       auto in = x.flat<float>(); auto out = y->flat<float>();
//       ctx.parallel_for(in.size(), 4096, [&](int64_t b, int64_t e) {
//         for (int64_t i = b; i < e; ++i) out[i] = 2 * in[i];
//       });
//       return Status::ok();
//     }
//   };
//   Status s = OpRegistry::global().add(
//       OpDef("TimesTwo").input("x", DType::kFloat32).output("y", DType::kFloat32)
//           .shape_fn(shape_fns::unchanged),
//       [](OpKernelConstruction&) -> Result<std::unique_ptr<OpKernel>> {
//         return std::make_unique<TimesTwoOp>();
//       });
//
// For a one-off node, ops::Call (<graphrun/ops.h>) wraps a C++ callable.
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

// A non-owning reference to a callable, for hot paths (no allocation).
template <typename Sig>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

// The dtypes one type variable (e.g. "T") of an op may take.
using DTypeSet = std::vector<DType>;
inline const DTypeSet& all_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                          DType::kBool};
  return s;
}
inline const DTypeSet& numeric_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64};
  return s;
}
inline const DTypeSet& float_dtypes() {
  static const DTypeSet s{DType::kFloat32, DType::kFloat64};
  return s;
}

// Build-time view of a node for its op's shape function: input dtypes and
// shapes, constant inputs when known, attrs. The shape function sets each
// output's shape (output dtypes come from the OpDef and are already set).
class InferenceContext {
 public:
  InferenceContext(const NodeSpec& spec, std::span<const DType> input_dtypes,
                   std::span<const Shape> input_shapes, std::span<const Tensor* const> constants,
                   std::vector<DType>* output_dtypes, std::vector<Shape>* output_shapes)
      : spec_(spec),
        input_dtypes_(input_dtypes),
        input_shapes_(input_shapes),
        constants_(constants),
        output_dtypes_(output_dtypes),
        output_shapes_(output_shapes) {}

  const std::string& node_name() const { return spec_.name; }
  const std::string& op() const { return spec_.op; }
  int num_inputs() const { return static_cast<int>(input_shapes_.size()); }
  DType input_dtype(int i) const { return input_dtypes_[static_cast<std::size_t>(i)]; }
  const Shape& input_shape(int i) const { return input_shapes_[static_cast<std::size_t>(i)]; }
  // The value of input i when it comes straight from a Const node, else null.
  const Tensor* input_constant(int i) const { return constants_[static_cast<std::size_t>(i)]; }
  int num_outputs() const { return static_cast<int>(output_shapes_->size()); }
  DType output_dtype(int i) const { return (*output_dtypes_)[static_cast<std::size_t>(i)]; }
  void set_output(int i, Shape shape) { (*output_shapes_)[static_cast<std::size_t>(i)] = shape; }
  const AttrMap& attrs() const { return spec_.attrs; }
  template <typename T>
  Result<T> attr(std::string_view name) const {
    return get_attr<T>(spec_.attrs, name, spec_.name);
  }
  // "node 'x' (Op)" prefix for messages.
  std::string describe() const;

 private:
  const NodeSpec& spec_;
  std::span<const DType> input_dtypes_;
  std::span<const Shape> input_shapes_;
  std::span<const Tensor* const> constants_;
  std::vector<DType>* output_dtypes_;
  std::vector<Shape>* output_shapes_;
};

using ShapeFn = std::function<Status(InferenceContext&)>;

// Ready-made shape functions.
namespace shape_fns {
// Every output has input 0's shape.
Status unchanged(InferenceContext& c);
// Every output has an unknown shape.
Status unknown(InferenceContext& c);
// Every output is a scalar.
Status scalar(InferenceContext& c);
// NumPy broadcasting of inputs 0 and 1; InvalidArgument naming both shapes
// when they cannot broadcast.
Status broadcast_binary(InferenceContext& c);
}  // namespace shape_fns

// NumPy broadcast of two shapes (unknown dims allowed); InvalidArgument
// naming both when incompatible.
Result<Shape> broadcast_shapes(const Shape& a, const Shape& b);

// How an input or output's dtype is given: a fixed dtype, or a type
// variable ("T") that is an attr of the node, inferred from the first input
// that uses it when the attr is not given.
struct ArgDef {
  std::string name;
  DType fixed = DType::kInvalid;  // when not kInvalid
  std::string type_attr;          // else this type variable
};

// An op's signature. Builder style:
//   OpDef("MatMul").input("a", "T").input("b", "T").output("product", "T")
//       .type_attr("T", numeric_dtypes())
//       .attr("transpose_a", false).attr("transpose_b", false)
//       .shape_fn(matmul_shape);
class OpDef {
 public:
  explicit OpDef(std::string name) : name_(std::move(name)) {}

  OpDef& input(std::string name, DType fixed);
  OpDef& input(std::string name, std::string type_attr);
  // Any number of inputs of any dtypes (custom callables); checked by the
  // shape function.
  OpDef& variadic_inputs();
  OpDef& output(std::string name, DType fixed);
  OpDef& output(std::string name, std::string type_attr);
  // Outputs whose dtypes are the list(type) attr `attr` (custom callables).
  OpDef& output_list(std::string attr);
  OpDef& type_attr(std::string name, DTypeSet allowed);
  // An attr with a default; its kind is the default's.
  OpDef& attr(std::string name, AttrValue default_value);
  // A required attr of the kind of `kind_example`.
  OpDef& required_attr(std::string name, AttrValue kind_example);
  OpDef& shape_fn(ShapeFn fn);
  // Stateful ops touch state outside their inputs (variables, RNG, iterators):
  // never deduplicated, and each runs once per step.
  OpDef& stateful(bool value = true);
  OpDef& doc(std::string text);

  const std::string& name() const { return name_; }
  const std::vector<ArgDef>& inputs() const { return inputs_; }
  const std::vector<ArgDef>& outputs() const { return outputs_; }
  bool has_variadic_inputs() const { return variadic_inputs_; }
  const std::string& output_list_attr() const { return output_list_attr_; }
  struct TypeAttr {
    std::string name;
    DTypeSet allowed;
  };
  const std::vector<TypeAttr>& type_attrs() const { return type_attrs_; }
  struct AttrDef {
    std::string name;
    AttrValue value;  // default, or kind example when required
    bool required = false;
  };
  const std::vector<AttrDef>& attrs() const { return attrs_; }
  const ShapeFn& shape_function() const { return shape_fn_; }
  bool is_stateful() const { return stateful_; }
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

// Session-owned state shared by kernels (variables, iterators): looked up by
// name, created on first use, destroyed with the session.
class Resource {
 public:
  virtual ~Resource() = default;
};

// Thread safety: thread-safe.
class ResourceManager {
 public:
  // The resource named `name`, made by `create` if absent. InvalidArgument
  // when it exists with another type.
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
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return resources_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<Resource>> resources_;
};

// What a kernel factory sees once per (session, node).
class OpKernelConstruction {
 public:
  OpKernelConstruction(const Node& node, ResourceManager& resources)
      : node_(node), resources_(resources) {}
  const Node& node() const { return node_; }
  ResourceManager& resources() const { return resources_; }
  template <typename T>
  Result<T> attr(std::string_view name) const {
    return node_.attr<T>(name);
  }

 private:
  const Node& node_;
  ResourceManager& resources_;
};

// The vector instruction-set levels the built-in heavy kernels (MatMul,
// Conv2D, elementwise math, reductions) are compiled for, in one binary.
enum class CpuIsa : uint8_t {
  kBaseline,  // x86-64's SSE2 (or the target's default)
  kAvx2,      // AVX2 + FMA
  kAvx512,    // AVX-512 F/BW/DQ/VL (with AVX2 + FMA)
};
// "baseline", "avx2" or "avx512".
std::string_view cpu_isa_name(CpuIsa isa);
// The best level this CPU (and OS) supports.
CpuIsa cpu_isa_supported();
// The level the built-in kernels run at: cpu_isa_supported(), or the lower
// level the environment variable GRAPHRUN_CPU_ISA (baseline|avx2|avx512)
// names. Chosen once per process, at the first call.
CpuIsa cpu_isa();
// OK, or InvalidArgument naming GRAPHRUN_CPU_ISA's value when it names no
// level or one this CPU lacks (cpu_isa() is then cpu_isa_supported());
// Session::create returns this error. Thread safety: all four are
// thread-safe.
const Status& cpu_isa_status();

// Hooks the scheduler installs in every kernel context: intra-op
// parallelism in the session's arena.
struct KernelRuntime {
  void (*parallel_for)(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) = nullptr;
  // Threads parallel_for may use (the session's pool size); 1 when unset.
  int threads = 1;
  // Largest output allocate_output*() makes (SessionOptions::max_tensor_bytes);
  // 0: no limit.
  int64_t max_tensor_bytes = 0;
};

// What a step's kernels poll to stop early: the step failed or was
// cancelled, the session was closed, or the run's deadline passed. Owned by
// the scheduler (one per step); kernels only read it.
// Thread safety: thread-safe to read while the step runs.
struct StepCancellation {
  std::atomic<bool> cancelled{false};
  const std::atomic<bool>* session_closed = nullptr;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  bool is_cancelled() const {
    // relaxed: advisory; the scheduler decides the step's status.
    if (cancelled.load(std::memory_order_relaxed)) return true;
    if (session_closed != nullptr && session_closed->load(std::memory_order_relaxed)) return true;
    return deadline != std::chrono::steady_clock::time_point::max() &&
           std::chrono::steady_clock::now() > deadline;
  }
};

// What a kernel sees while it runs: its inputs and where its outputs go.
// Thread safety: one context per node execution; not shared.
class OpKernelContext {
 public:
  OpKernelContext(const Node& node, const Tensor* slots, std::span<const int32_t> input_slots,
                  Tensor* outputs, const KernelRuntime& runtime,
                  const StepCancellation* cancellation, int64_t step_id)
      : node_(node),
        slots_(slots),
        input_slots_(input_slots),
        outputs_(outputs),
        runtime_(runtime),
        cancellation_(cancellation),
        step_id_(step_id) {}

  const Node& node() const { return node_; }
  int num_inputs() const { return static_cast<int>(input_slots_.size()); }
  const Tensor& input(int i) const { return slots_[input_slots_[static_cast<std::size_t>(i)]]; }
  int num_outputs() const { return node_.num_outputs(); }

  // A zero-filled output of the node's declared dtype. Validates the shape
  // and reports allocation failure as ResourceExhausted.
  // Both are ResourceExhausted past the session's SessionOptions::max_tensor_bytes.
  Result<Tensor*> allocate_output(int i, const Shape& shape);
  // Storage not zeroed: for kernels that write every element.
  Result<Tensor*> allocate_output_uninitialized(int i, const Shape& shape);
  // Sets output i to `t` (sharing its buffer, e.g. Identity). Internal error
  // if its dtype is not the declared one.
  Status set_output(int i, Tensor t);
  Tensor* mutable_output(int i) { return &outputs_[i]; }

  // Splits [0, n) into chunks of at least `grain` and runs fn(begin, end)
  // on the session's threads (the caller helps). Sequential when n <= grain.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) const;
  // Threads parallel_for runs on (the caller included): at least 1. Kernels
  // size their pieces from it.
  int num_threads() const { return runtime_.parallel_for == nullptr ? 1 : runtime_.threads; }

  // True once the step failed or was cancelled, the session was closed, or
  // the run's deadline passed. Long kernels should poll it (it costs a clock
  // read when the run has a deadline) and then return any error: the run
  // reports Cancelled or DeadlineExceeded, not the kernel's status.
  bool is_cancelled() const { return cancellation_ != nullptr && cancellation_->is_cancelled(); }
  int64_t step_id() const { return step_id_; }

 private:
  const Node& node_;
  const Tensor* slots_;
  std::span<const int32_t> input_slots_;
  Tensor* outputs_;
  Status check_output_size(int i, const Shape& shape) const;
  const KernelRuntime& runtime_;
  const StepCancellation* cancellation_;
  int64_t step_id_;
};

// A kernel: the code of one op on CPU. One kernel object is made per
// (session, node) and shared by every step of the session, so compute() may
// run concurrently with itself: keep kernels stateless or lock their state.
class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual Status compute(OpKernelContext& ctx) = 0;
  // True for kernels cheap enough to run inline without a task of their own
  // (TensorFlow's !IsExpensive()): the scheduler then runs the node on the
  // thread that completed its last input, right after that input's node.
  // Decided once per (session, node), so a kernel whose cost grows with its
  // tensors answers from the node's build-time shapes (small_static_shapes).
  // A wrong `true` costs parallelism, never correctness. Default: false.
  virtual bool is_cheap() const { return false; }
  // Optional epilogue fusion: one kernel computing this node followed by
  // `chain`, where chain[0] reads this node's only output and each next
  // node reads the previous one's, and nothing else sees those
  // intermediate tensors. The plan asks (with SessionOptions::fuse_kernels,
  // never for a traced run or a partial run); null declines, the default.
  // The fused kernel's inputs are this node's, then each chain node's other
  // inputs in order; it produces the last chain node's outputs, and runs
  // with that node as ctx.node(). The plan owns the returned kernel.
  virtual std::unique_ptr<OpKernel> fuse(std::span<const Node* const> chain) const {
    (void)chain;
    return nullptr;
  }
};

// Elements up to which elementwise work on one node counts as cheap.
inline constexpr int64_t kCheapElements = 4096;

// True when every input and output shape of `node` is fully defined at graph
// build, each input holds at most `max_elements` elements and the outputs
// together at most `max_elements`: what a size-dependent kernel's is_cheap()
// checks (fed tensors are checked against these shapes at run time).
bool small_static_shapes(const Node& node, int64_t max_elements = kCheapElements);

struct OpRegistration {
  OpDef def;
  KernelFactory factory;
};

// Op name -> definition and kernel factory.
// Thread safety: thread-safe. Registrations are never removed, so returned
// pointers stay valid for the registry's lifetime.
class OpRegistry {
 public:
  OpRegistry() = default;
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  // The process-wide registry, holding every built-in op; register your
  // own ops here (or in a registry of your own passed to Graph).
  static OpRegistry& global();

  // AlreadyExists when the name is taken; InvalidArgument for a malformed def.
  Status add(OpDef def, KernelFactory factory);
  // nullptr when absent.
  const OpRegistration* find(std::string_view op) const;
  std::vector<std::string> op_names() const;

 private:
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<OpRegistration>> ops_;
};

// Registers every built-in op into `registry` (OpRegistry::global() does
// this once). Defined in the ops library.
void register_builtin_ops(OpRegistry& registry);

}  // namespace graphrun
