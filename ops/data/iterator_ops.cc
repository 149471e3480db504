// IteratorGetNext and IteratorReset: one-shot iterators over an in-graph
// dataset (the rows of a tensor, or an int64 range), with the
// TensorRowsIterator and RangeIterator builders.
//
// The dataset is described by the GetNext node's attrs: "kind" ("rows" or
// "range"), "data" (rows), "start"/"stop"/"step" (range). The iterator's
// state lives in the session's ResourceManager under "iterator:<GetNext node
// name>": the dataset and an atomic position. Each GetNext execution claims
// the next index with one fetch_add, so concurrent runs never see the same
// element twice; past the end it fails with OutOfRange. IteratorReset (attr
// "iterator": the GetNext node's name) rewinds the position to 0.
#include <graphrun/ops.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "ops/data/data_ops.h"
#include "ops/internal/families.h"
#include "ops/internal/names.h"

namespace graphrun {
namespace {

// The elements an iterator walks. Immutable.
struct Dataset {
  enum class Kind { kRows, kRange };
  Kind kind = Kind::kRange;
  Tensor data;  // kRows
  Shape row_shape;
  int64_t start = 0, step = 1;  // kRange
  int64_t size = 0;             // number of elements
};

// Elements of start, start+step, ... short of stop. InvalidArgument when
// step is 0 or the count does not fit an int64.
Result<int64_t> range_size(int64_t start, int64_t stop, int64_t step) {
  if (step == 0) return invalid_argument("a range's step must not be 0");
  // Unsigned arithmetic: exact differences with no signed overflow.
  uint64_t distance = 0;
  uint64_t stride = 0;
  if (step > 0) {
    if (stop <= start) return int64_t{0};
    distance = static_cast<uint64_t>(stop) - static_cast<uint64_t>(start);
    stride = static_cast<uint64_t>(step);
  } else {
    if (stop >= start) return int64_t{0};
    distance = static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    stride = static_cast<uint64_t>(-(step + 1)) + 1;
  }
  const uint64_t count = (distance - 1) / stride + 1;
  if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return invalid_argument("range({}, {}, {}) has too many elements", start, stop, step);
  }
  return static_cast<int64_t>(count);
}

// Parses and checks a GetNext node's attrs (bare messages: the caller names
// the node).
Result<Dataset> dataset_from_attrs(const AttrMap& attrs, std::string_view owner) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::string kind, get_attr<std::string>(attrs, "kind", owner));
  GRAPHRUN_ASSIGN_OR_RETURN(DType output_type, get_attr<DType>(attrs, "output_type", owner));
  Dataset d;
  if (kind == "rows") {
    d.kind = Dataset::Kind::kRows;
    GRAPHRUN_ASSIGN_OR_RETURN(d.data, get_attr<Tensor>(attrs, "data", owner));
    if (!d.data.is_initialized()) return invalid_argument("attribute 'data' holds no tensor");
    if (d.data.shape().rank() < 1) {
      return invalid_argument("the rows of a scalar: 'data' must have rank >= 1, got {}",
                              d.data.debug_type());
    }
    if (d.data.dtype() != output_type) {
      return invalid_argument("output_type is {} but the data is {}", output_type,
                              d.data.debug_type());
    }
    const std::span<const int64_t> dims = d.data.shape().dims();
    d.row_shape = Shape(dims.subspan(1));
    d.size = dims[0];
  } else if (kind == "range") {
    d.kind = Dataset::Kind::kRange;
    GRAPHRUN_ASSIGN_OR_RETURN(d.start, get_attr<int64_t>(attrs, "start", owner));
    GRAPHRUN_ASSIGN_OR_RETURN(int64_t stop, get_attr<int64_t>(attrs, "stop", owner));
    GRAPHRUN_ASSIGN_OR_RETURN(d.step, get_attr<int64_t>(attrs, "step", owner));
    GRAPHRUN_ASSIGN_OR_RETURN(d.size, range_size(d.start, stop, d.step));
    if (output_type != DType::kInt64) {
      return invalid_argument("a range yields int64, but output_type is {}", output_type);
    }
  } else {
    return invalid_argument("attribute 'kind' is '{}'; expected 'rows' or 'range'", kind);
  }
  return d;
}

// Thread safety: thread-safe; the dataset is immutable and the position
// atomic. Lives as long as the session that owns it.
class IteratorState final : public Resource {
 public:
  IteratorState(std::string name, Dataset dataset)
      : name_(std::move(name)), dataset_(std::move(dataset)) {}

  // The GetNext node's name.
  const std::string& name() const { return name_; }
  const Dataset& dataset() const { return dataset_; }

  // The index of the element this call owns (>= size past the end).
  int64_t claim_next() { return position_.fetch_add(1); }
  void rewind() { position_.store(0); }

 private:
  const std::string name_;
  const Dataset dataset_;
  std::atomic<int64_t> position_{0};
};

// The state of the iterator whose GetNext node is `get_next` in the graph
// of the kernel being constructed, created (at position 0) on first use.
Result<IteratorState*> lookup_iterator(const OpKernelConstruction& ctx, std::string_view get_next) {
  const Node* node = ctx.node().graph().find_node(get_next);
  if (node == nullptr || node->op() != "IteratorGetNext") {
    return invalid_argument("'{}' is not an IteratorGetNext node of the graph", get_next);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Dataset dataset, dataset_from_attrs(node->attrs(), node->name()));
  return ctx.resources().lookup_or_create<IteratorState>(
      "iterator:" + node->name(), [&]() -> Result<std::unique_ptr<IteratorState>> {
        return std::make_unique<IteratorState>(node->name(), std::move(dataset));
      });
}

// Thread safety: thread-safe.
class IteratorGetNextOp final : public OpKernel {
 public:
  explicit IteratorGetNextOp(IteratorState* iterator) : iterator_(iterator) {}

  Status compute(OpKernelContext& ctx) override {
    const Dataset& d = iterator_->dataset();
    const int64_t index = iterator_->claim_next();
    if (index >= d.size) {
      return out_of_range("End of sequence (iterator '{}')", iterator_->name());
    }
    if (d.kind == Dataset::Kind::kRange) {
      // Unsigned: start + index * step lies in the range, but the product
      // alone may not fit.
      const auto value =
          static_cast<int64_t>(static_cast<uint64_t>(d.start) +
                               static_cast<uint64_t>(index) * static_cast<uint64_t>(d.step));
      return ctx.set_output(0, Tensor(value));
    }
    GRAPHRUN_ASSIGN_OR_RETURN(Tensor * row, ctx.allocate_output_uninitialized(0, d.row_shape));
    const std::size_t bytes = row->byte_size();
    if (bytes > 0) {
      std::memcpy(
          row->raw_data(),
          static_cast<const char*>(d.data.raw_data()) + static_cast<std::size_t>(index) * bytes,
          bytes);
    }
    return Status::ok();
  }
  bool is_cheap() const override { return iterator_->dataset().kind == Dataset::Kind::kRange; }

 private:
  IteratorState* const iterator_;  // Not owned: the session's ResourceManager owns it.
};

// Thread safety: thread-safe.
class IteratorResetOp final : public OpKernel {
 public:
  explicit IteratorResetOp(IteratorState* iterator) : iterator_(iterator) {}

  Status compute(OpKernelContext&) override {
    iterator_->rewind();
    return Status::ok();
  }
  bool is_cheap() const override { return true; }

 private:
  IteratorState* const iterator_;  // Not owned: the session's ResourceManager owns it.
};

Status get_next_shape(InferenceContext& c) {
  GRAPHRUN_ASSIGN_OR_RETURN(Dataset d, dataset_from_attrs(c.attrs(), c.node_name()));
  c.set_output(0, d.kind == Dataset::Kind::kRows ? d.row_shape : Shape{});
  return Status::ok();
}

Result<std::unique_ptr<OpKernel>> make_get_next_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(IteratorState * iterator, lookup_iterator(ctx, ctx.node().name()));
  return std::make_unique<IteratorGetNextOp>(iterator);
}

Result<std::unique_ptr<OpKernel>> make_reset_kernel(OpKernelConstruction& ctx) {
  GRAPHRUN_ASSIGN_OR_RETURN(std::string get_next, ctx.attr<std::string>("iterator"));
  GRAPHRUN_ASSIGN_OR_RETURN(IteratorState * iterator, lookup_iterator(ctx, get_next));
  return std::make_unique<IteratorResetOp>(iterator);
}

// Adds the GetNext node (named `name`) and its "<name>/initializer" reset.
ops::Iterator add_iterator(Graph& g, AttrMap attrs, std::string_view name) {
  Result<Node*> next = g.add_node(NodeSpec{
      .op = "IteratorGetNext",
      .name = std::string(name.empty() ? "IteratorGetNext" : name),
      .attrs = std::move(attrs),
  });
  if (!next.is_ok()) return {};
  Result<Node*> reset = g.add_node(NodeSpec{
      .op = "IteratorReset",
      .name = ops_internal::relative_name(g, **next) + "/initializer",
      .attrs = {{"iterator", (*next)->name()}},
  });
  if (!reset.is_ok()) return {};
  return ops::Iterator{.next = (*next)->output(0), .initializer = *reset};
}

}  // namespace

namespace ops_internal {

void register_iterator_ops(OpRegistry& r) {
  must(r.add(OpDef("IteratorGetNext")
                 .output("components", "output_type")
                 .type_attr("output_type", all_dtypes())
                 .required_attr("kind", std::string())
                 .attr("data", Tensor())
                 .attr("start", int64_t{0})
                 .attr("stop", int64_t{0})
                 .attr("step", int64_t{1})
                 .stateful()
                 .shape_fn(get_next_shape)
                 .doc("The next element of the dataset the attrs describe (a row of `data`, or "
                      "the next value of range(start, stop, step)); OutOfRange past the end."),
             make_get_next_kernel));
  must(r.add(OpDef("IteratorReset")
                 .required_attr("iterator", std::string())
                 .stateful()
                 .doc("Rewinds the iterator whose IteratorGetNext node is `iterator`."),
             make_reset_kernel));
}

}  // namespace ops_internal

namespace ops {

Iterator TensorRowsIterator(Graph& g, Tensor data, std::string_view name) {
  if (!data.is_initialized()) {
    g.record_error(
        invalid_argument("node '{}' (IteratorGetNext): TensorRowsIterator's data holds no tensor",
                         g.unique_name(name.empty() ? "IteratorGetNext" : name)));
    return {};
  }
  const DType dtype = data.dtype();
  return add_iterator(
      g, AttrMap{{"kind", std::string("rows")}, {"data", std::move(data)}, {"output_type", dtype}},
      name);
}

Iterator RangeIterator(Graph& g, int64_t start, int64_t stop, int64_t step, std::string_view name) {
  return add_iterator(g,
                      AttrMap{{"kind", std::string("range")},
                              {"start", start},
                              {"stop", stop},
                              {"step", step},
                              {"output_type", DType::kInt64}},
                      name);
}

}  // namespace ops
}  // namespace graphrun
