#include <graphrun/op_kernel.h>

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>

namespace graphrun {

// ---- OpDef ----

OpDef& OpDef::input(std::string name, DType fixed) {
  inputs_.push_back(ArgDef{std::move(name), fixed, {}});
  return *this;
}
OpDef& OpDef::input(std::string name, std::string type_attr) {
  inputs_.push_back(ArgDef{std::move(name), DType::kInvalid, std::move(type_attr)});
  return *this;
}
OpDef& OpDef::variadic_inputs() {
  variadic_inputs_ = true;
  return *this;
}
OpDef& OpDef::output(std::string name, DType fixed) {
  outputs_.push_back(ArgDef{std::move(name), fixed, {}});
  return *this;
}
OpDef& OpDef::output(std::string name, std::string type_attr) {
  outputs_.push_back(ArgDef{std::move(name), DType::kInvalid, std::move(type_attr)});
  return *this;
}
OpDef& OpDef::output_list(std::string attr) {
  output_list_attr_ = std::move(attr);
  return *this;
}
OpDef& OpDef::type_attr(std::string name, DTypeSet allowed) {
  type_attrs_.push_back(TypeAttr{std::move(name), std::move(allowed)});
  return *this;
}
OpDef& OpDef::attr(std::string name, AttrValue default_value) {
  attrs_.push_back(AttrDef{std::move(name), std::move(default_value), false});
  return *this;
}
OpDef& OpDef::required_attr(std::string name, AttrValue kind_example) {
  attrs_.push_back(AttrDef{std::move(name), std::move(kind_example), true});
  return *this;
}
OpDef& OpDef::shape_fn(ShapeFn fn) {
  shape_fn_ = std::move(fn);
  return *this;
}
OpDef& OpDef::stateful(bool value) {
  stateful_ = value;
  return *this;
}
OpDef& OpDef::doc(std::string text) {
  doc_ = std::move(text);
  return *this;
}

// ---- Shape functions ----

std::string InferenceContext::describe() const {
  return fmt::format("node '{}' ({})", spec_.name, spec_.op);
}

namespace shape_fns {
Status unchanged(InferenceContext& c) {
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, c.input_shape(0));
  return Status::ok();
}
Status unknown(InferenceContext& c) {
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, Shape::unknown());
  return Status::ok();
}
Status scalar(InferenceContext& c) {
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, Shape{});
  return Status::ok();
}
Status broadcast_binary(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(c.input_shape(0), c.input_shape(1)));
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, s);
  return Status::ok();
}
}  // namespace shape_fns

Result<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  if (a.is_unknown_rank() || b.is_unknown_rank()) return Shape::unknown();
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int i = 0; i < rank; ++i) out.add_dim(1);
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i;
    const int ib = b.rank() - rank + i;
    const int64_t da = ia >= 0 ? a.dim(ia) : 1;
    const int64_t db = ib >= 0 ? b.dim(ib) : 1;
    int64_t d;
    if (da == 1) {
      d = db;
    } else if (db == 1) {
      d = da;
    } else if (da < 0 || db < 0) {
      d = da < 0 ? db : da;  // the known one if any; runtime check decides
      if (da < 0 && db < 0) d = Shape::kUnknownDim;
    } else if (da == db) {
      d = da;
    } else {
      return invalid_argument(
          "shapes {} and {} cannot be broadcast together (dimension {}: {} vs {})", a.to_string(),
          b.to_string(), i, da, db);
    }
    out.set_dim(i, d);
  }
  return out;
}

// ---- OpKernelContext ----

Status OpKernelContext::check_output_size(int i, const Shape& shape) const {
  // As set_output: a user's kernel may pass any index.
  if (i < 0 || i >= num_outputs()) {
    return internal_error("output index {} out of range ({} outputs)", i, num_outputs());
  }
  if (runtime_.max_tensor_bytes <= 0 || shape.is_unknown_rank()) return Status::ok();
  const DType dtype = node_.output_dtype(i);
  // The one counting rule (product_of_positive_dims): the dimensions above
  // 0 must fit wherever a 0 stands; a tensor with a 0 takes no bytes.
  const std::optional<int64_t> counted = product_of_positive_dims(
      static_cast<int64_t>(dtype_size(dtype)), shape.dims(), std::numeric_limits<int64_t>::max());
  if (!counted) {
    return resource_exhausted(
        "output {} ({}{}) would take more than {} bytes (limit SessionOptions::max_tensor_bytes = "
        "{})",
        i, dtype_name(dtype), shape.to_string(), std::numeric_limits<int64_t>::max(),
        runtime_.max_tensor_bytes);
  }
  const bool empty = std::ranges::find(shape.dims(), 0) != shape.dims().end();
  const int64_t bytes = empty ? 0 : *counted;
  if (bytes > runtime_.max_tensor_bytes) {
    return resource_exhausted(
        "output {} ({}{}) would take {} bytes (limit SessionOptions::max_tensor_bytes = {})", i,
        dtype_name(dtype), shape.to_string(), bytes, runtime_.max_tensor_bytes);
  }
  return Status::ok();
}

Result<Tensor*> OpKernelContext::allocate_output(int i, const Shape& shape) {
  GRAPHRUN_RETURN_IF_ERROR(check_output_size(i, shape));
  GRAPHRUN_ASSIGN_OR_RETURN(outputs_[i], Tensor::allocate(node_.output_dtype(i), shape));
  return &outputs_[i];
}

Result<Tensor*> OpKernelContext::allocate_output_uninitialized(int i, const Shape& shape) {
  GRAPHRUN_RETURN_IF_ERROR(check_output_size(i, shape));
  GRAPHRUN_ASSIGN_OR_RETURN(outputs_[i],
                            Tensor::allocate_uninitialized(node_.output_dtype(i), shape));
  return &outputs_[i];
}

Status OpKernelContext::set_output(int i, Tensor t) {
  if (i < 0 || i >= num_outputs()) {
    return internal_error("output index {} out of range ({} outputs)", i, num_outputs());
  }
  if (t.dtype() != node_.output_dtype(i)) {
    return internal_error("output {} must be {}, the kernel produced {}", i,
                          dtype_name(node_.output_dtype(i)), t.debug_type());
  }
  outputs_[i] = std::move(t);
  return Status::ok();
}

void OpKernelContext::parallel_for(int64_t n, int64_t grain,
                                   FunctionRef<void(int64_t, int64_t)> fn) const {
  if (n <= 0) return;
  if (n <= grain || runtime_.parallel_for == nullptr) {
    fn(0, n);
    return;
  }
  runtime_.parallel_for(n, grain, fn);
}

// ---- OpRegistry ----

Status AsyncOpKernel::compute(OpKernelContext& ctx) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
  };
  // Shared: a kernel may call done after compute_async threw, or twice.
  auto wait = std::make_shared<Wait>();
  auto finish = [wait](Status s) {
    const std::lock_guard lock(wait->mu);
    if (wait->done) return;
    wait->status = std::move(s);
    wait->done = true;
    wait->cv.notify_all();
  };
  try {
    compute_async(ctx, finish);
  } catch (const std::exception& e) {
    finish(internal_error("kernel threw: {}", e.what()));
  } catch (...) {
    finish(internal_error("kernel threw a non-standard exception"));
  }
  std::unique_lock lock(wait->mu);
  wait->cv.wait(lock, [&] { return wait->done; });
  return wait->status;
}

bool small_static_shapes(const Node& node, int64_t max_elements) {
  for (const Output& in : node.inputs()) {
    const int64_t n = in.shape().num_elements();  // -1 when not fully defined
    if (n < 0 || n > max_elements) return false;
  }
  int64_t total = 0;
  for (int o = 0; o < node.num_outputs(); ++o) {
    const int64_t n = node.output_shape(o).num_elements();
    if (n < 0 || n > max_elements - total) return false;
    total += n;
  }
  return true;
}

Status OpRegistry::add(OpDef def, KernelFactory factory) {
  if (def.name().empty()) return invalid_argument("an op needs a name");
  if (!factory) return invalid_argument("op '{}' has no kernel factory", def.name());
  for (const ArgDef& a : def.inputs()) {
    if (a.fixed == DType::kInvalid) {
      const auto& tas = def.type_attrs();
      if (std::none_of(tas.begin(), tas.end(),
                       [&](const auto& t) { return t.name == a.type_attr; })) {
        return invalid_argument("op '{}': input '{}' uses undeclared type attribute '{}'",
                                def.name(), a.name, a.type_attr);
      }
    }
  }
  for (const ArgDef& a : def.outputs()) {
    if (a.fixed == DType::kInvalid) {
      const auto& tas = def.type_attrs();
      if (std::none_of(tas.begin(), tas.end(),
                       [&](const auto& t) { return t.name == a.type_attr; })) {
        return invalid_argument("op '{}': output '{}' uses undeclared type attribute '{}'",
                                def.name(), a.name, a.type_attr);
      }
    }
  }
  std::unique_lock lock(mu_);
  if (ops_.contains(def.name())) return already_exists("op '{}' is already registered", def.name());
  std::string name = def.name();
  ops_.emplace(std::move(name), std::make_unique<OpRegistration>(
                                    OpRegistration{std::move(def), std::move(factory)}));
  return Status::ok();
}

const OpRegistration* OpRegistry::find(std::string_view op) const {
  std::shared_lock lock(mu_);
  auto it = ops_.find(std::string(op));
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<std::string> OpRegistry::op_names() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> names;
  names.reserve(ops_.size());
  for (const auto& [name, reg] : ops_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace graphrun
