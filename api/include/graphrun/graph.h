/// @file graphrun/graph.h
/// Graph, Node and Output: a dataflow graph under construction.
///
/// Nodes are added by the op builder functions of <graphrun/ops.h> (or by
/// Graph::add_node for custom ops). Names are unique: a taken name gets a
/// suffix, as in TensorFlow ("MatMul", "MatMul_1"), and name scopes prefix
/// them ("layer1/MatMul"). An Output is one endpoint of a node, printed and
/// parsed as "node:index" (a bare node name means index 0).
///
/// Building never throws: a builder that fails (unknown op, wrong dtype,
/// incompatible shapes known at build time) records the first error in
/// `graph.status()`, names the node and the shapes, and returns an invalid
/// Output; later builders given an invalid Output do nothing. Check
/// `graph.status()` once after building; Session::create refuses a graph
/// whose status is not OK.
///
/// Thread safety: thread-compatible: build from one thread at a time. Nodes
/// are never removed or moved, so Node pointers and Outputs stay valid for the
/// graph's lifetime.
#pragma once

#include <graphrun/attr_value.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace graphrun {

class Graph;
class Node;
class OpDef;
class OpKernel;
class OpKernelConstruction;
class OpRegistry;
struct OpRegistration;

/// OpRegistry::global(); defined in the ops library.
const OpRegistry& default_op_registry();

/// One output endpoint of a node. Invalid (node() == nullptr) when the
/// builder that produced it failed.
///
/// Thread safety: thread-compatible (a value); as its graph.
class Output {
 public:
  Output() = default;  ///< an invalid Output
  /// Output `index` of `node`.
  Output(const Node* node, int index) : node_(node), index_(index) {}

  /// False when the builder that made it failed.
  bool is_valid() const { return node_ != nullptr; }
  /// The producing node; nullptr when invalid.
  const Node* node() const { return node_; }
  /// Which of the node's outputs.
  int index() const { return index_; }
  /// The dtype inferred at build time; the Output must be valid.
  DType dtype() const;
  /// The shape inferred at build time (dimensions may be unknown); the
  /// Output must be valid.
  const Shape& shape() const;
  /// "node:index".
  std::string name() const;

  /// Same node and index.
  friend bool operator==(const Output& a, const Output& b) {
    return a.node_ == b.node_ && a.index_ == b.index_;
  }

 private:
  const Node* node_ = nullptr;
  int index_ = 0;
};

/// A parsed "node:index" name.
struct TensorName {
  std::string_view node;  ///< the node's name (a view into the parsed string)
  int index = 0;          ///< the output index; 0 for a bare node name
};
/// "a" -> {a, 0}; "a:3" -> {a, 3}; "a:x", "a:-1", ":0", "" -> InvalidArgument.
Result<TensorName> parse_tensor_name(std::string_view name);

/// TensorFlow's rule for a node's full name, [A-Za-z0-9.][A-Za-z0-9_./>-]*:
/// Graph::add_node refuses other names (a name with ':' or a space could
/// not be fetched, nor written to a graph file and read back).
bool is_valid_node_name(std::string_view name);

/// How a kernel is made for one node: a registered op's factory, or a node's
/// own (custom callables).
using KernelFactory = std::function<Result<std::unique_ptr<OpKernel>>(OpKernelConstruction&)>;

/// What Graph::add_node needs. `name` empty means the op's name.
struct NodeSpec {
  std::string op;                           ///< the registered op, e.g. "MatMul"
  std::string name;                         ///< made unique and scoped by add_node;
                                            ///< the full name must be is_valid_node_name()
  std::vector<Output> inputs;               ///< data inputs, in the op's order
  std::vector<const Node*> control_inputs;  ///< nodes that must run first
  AttrMap attrs;                            ///< attributes; defaults are filled in
  /// Optional kernel for this node only, used instead of the op's factory.
  std::shared_ptr<const KernelFactory> kernel;
  /// Where the node runs across processes ("/rank:1", "/job:worker/task:1";
  /// parse_device). Empty: the graph's device() scope, if any.
  std::string device;
};

namespace graph_internal {
/// What a node shares with every node of its graph that has the same op,
/// equal attributes and output signature (interned by Graph::add_node;
/// immutable). Many nodes of one op usually have the same attributes, so a
/// graph keeps one copy instead of one per node, and a clone shares it.
struct NodeProto {
  const OpRegistration* registration = nullptr;  ///< the op's registry entry
  AttrMap attrs;
  std::vector<DType> output_dtypes;
  std::vector<Shape> output_shapes;
};

/// A node's data inputs and control inputs in one allocation (two vectors
/// cost 48 bytes a node and an allocation each); a lone control input (a
/// chain's, a tree's) is held in place of the pointer, with no allocation.
/// Control inputs may be appended (capacity: the next power of two).
class Edges {
 public:
  Edges() = default;
  Edges(std::span<const Output> inputs, std::span<const Node* const> controls);
  Edges(const Edges& o) : Edges(o.inputs(), o.controls()) {}
  Edges(Edges&& o) noexcept
      : u_(std::exchange(o.u_, {})),
        num_inputs_(std::exchange(o.num_inputs_, 0)),
        num_controls_(std::exchange(o.num_controls_, 0)) {}
  Edges& operator=(Edges o) noexcept {
    std::swap(u_, o.u_);
    std::swap(num_inputs_, o.num_inputs_);
    std::swap(num_controls_, o.num_controls_);
    return *this;
  }
  ~Edges() {
    if (!is_inline()) ::operator delete(u_.heap);
  }

  std::span<const Output> inputs() const { return {input_data(), num_inputs_}; }
  std::span<Output> mutable_inputs() { return {input_data(), num_inputs_}; }
  std::span<const Node* const> controls() const {
    return {is_inline() ? &u_.one : control_data(), num_controls_};
  }
  std::span<const Node*> mutable_controls() {
    return {is_inline() ? &u_.one : control_data(), num_controls_};
  }
  /// Appends a control input.
  void add_control(const Node* dep);

 private:
  // A heap copy of `inputs` and `controls` followed by `extra` (never the
  // in-place form): what add_control grows into.
  Edges(std::span<const Output> inputs, std::span<const Node* const> controls, const Node* extra);
  static uint32_t capacity(uint32_t n);
  // Allocates room for num_inputs_ inputs and `control_capacity` control
  // inputs, and copies `inputs` and `controls` into it.
  void allocate_and_copy(std::span<const Output> inputs, std::span<const Node* const> controls,
                         uint32_t control_capacity);
  bool is_inline() const { return num_inputs_ == 0 && num_controls_ == 1; }
  Output* input_data() const { return static_cast<Output*>(u_.heap); }
  const Node** control_data() const {
    return reinterpret_cast<const Node**>(static_cast<char*>(u_.heap) +
                                          num_inputs_ * sizeof(Output));
  }
  union Storage {
    void* heap = nullptr;  // inputs, then capacity(num_controls_) control inputs
    const Node* one;       // the control input when is_inline()
  };
  Storage u_;
  uint32_t num_inputs_ = 0;
  uint32_t num_controls_ = 0;
};
}  // namespace graph_internal

/// One node of a Graph, made by Graph::add_node and owned by the graph.
/// Immutable once added.
///
/// Thread safety: thread-compatible; as its graph. Never moved or removed, so
/// a Node pointer stays valid for the graph's lifetime.
class Node {
 public:
  /// The position in the graph, 0 for the first node added.
  int id() const { return id_; }
  /// The unique, scoped name.
  const std::string& name() const { return name_; }
  /// The op's name.
  const std::string& op() const;
  /// The op's definition.
  const OpDef& op_def() const;
  /// The op's registry entry (definition and kernel factory).
  const OpRegistration& registration() const { return *proto_->registration; }

  /// The data inputs, in the op's order.
  std::span<const Output> inputs() const { return edges_.inputs(); }
  /// The number of data inputs.
  int num_inputs() const { return static_cast<int>(edges_.inputs().size()); }
  /// Data input `i`.
  const Output& input(int i) const { return edges_.inputs()[static_cast<std::size_t>(i)]; }
  /// The nodes that must run before this one.
  std::span<const Node* const> control_inputs() const { return edges_.controls(); }
  /// The requested placement (NodeSpec::device or the device() scope), as
  /// written; empty when unplaced. place() turns it into a rank.
  const std::string& device() const;

  /// The number of outputs.
  int num_outputs() const { return static_cast<int>(proto_->output_dtypes.size()); }
  /// The dtype of output `i`.
  DType output_dtype(int i) const { return proto_->output_dtypes[static_cast<std::size_t>(i)]; }
  /// The shape of output `i` inferred at build time.
  const Shape& output_shape(int i) const {
    return proto_->output_shapes[static_cast<std::size_t>(i)];
  }
  /// Output `i` as an Output.
  Output output(int i = 0) const { return Output(this, i); }

  /// Every attribute, defaults included.
  const AttrMap& attrs() const { return proto_->attrs; }
  /// The attribute `name`; nullptr when absent.
  const AttrValue* find_attr(std::string_view name) const;
  /// The attribute `name` as a T: NotFound when missing, InvalidArgument
  /// when of another kind (get_attr).
  template <typename T>
  Result<T> attr(std::string_view name) const {
    return get_attr<T>(proto_->attrs, name, name_);
  }

  /// True when the op is stateful (OpDef::stateful).
  bool is_stateful() const;
  /// The node's own kernel factory, if it has one (else the op's).
  const std::shared_ptr<const KernelFactory>& kernel_override() const { return kernel_; }
  /// The graph that owns the node.
  const Graph& graph() const { return *graph_; }

  /// "node 'mm1' (MatMul)" — how messages name a node.
  std::string describe() const;

 private:
  friend class Graph;
  Node() = default;
  Node(const Node&) = default;
  Node& operator=(const Node&) = default;  // Graph::clone copies into place

  const Graph* graph_ = nullptr;
  int id_ = -1;
  int32_t device_ = -1;  // index into the graph's device strings; -1: none
  std::string name_;
  graph_internal::Edges edges_;
  // Attributes and output signature, shared with the graph's other nodes
  // that have equal ones; never null.
  std::shared_ptr<const graph_internal::NodeProto> proto_;
  std::shared_ptr<const KernelFactory> kernel_;
};

/// A dataflow graph under construction: nodes added by the ops:: builders or
/// add_node, the first build error, name and control-dependency scopes, the
/// graph seed and collections. Movable, not copyable (clone() copies).
///
/// Thread safety: thread-compatible: build from one thread at a time. Nodes
/// are never removed or moved, so Node pointers and Outputs stay valid for
/// the graph's lifetime.
class Graph {
 public:
  /// Uses the process-wide registry (built-in ops + yours).
  Graph() : Graph(default_op_registry()) {}
  /// `registry` must outlive the graph.
  explicit Graph(const OpRegistry& registry);
  ///@{
  /// Moves the nodes; Node pointers and Outputs stay valid (they name the
  /// new graph's nodes). The moved-from graph is left empty.
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  ///@}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  /// A deep copy; Outputs of this graph are not valid in the copy (look them
  /// up by name or by node id).
  Graph clone() const;

  /// Appends the nodes `grown` has beyond this graph's: `grown` must be this
  /// graph (or a clone of it) with nodes added since, its first num_nodes()
  /// nodes matching this graph's by name, op, inputs and control inputs.
  /// Copies the new nodes, their collection entries and the seed state;
  /// nothing is changed on error. Existing Node pointers stay valid.
  Status append_nodes_from(const Graph& grown);

  /// Validates the op, the inputs (count, dtypes, same graph), the attrs
  /// (filling defaults), infers output dtypes and shapes, and picks a unique
  /// name. On error returns it, and also records it in status().
  Result<Node*> add_node(NodeSpec spec);
  /// The same, with the attributes given apart (`spec.attrs` must be empty)
  /// and only read: a builder adding many nodes of equal attributes keeps
  /// one map, which is copied only for a node of a new signature.
  Result<Node*> add_node(NodeSpec spec, const AttrMap& attrs);
  /// Adds a control edge: `node` runs after `dep`.
  Status add_control_input(Node* node, const Node* dep);

  /// The first error of any builder; OK if none.
  const Status& status() const { return status_; }
  /// Builders call this when they fail before reaching add_node.
  void record_error(Status s) { status_.update(s); }

  /// The number of nodes.
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  ///@{
  /// The node with id `id`, which must be below num_nodes().
  const Node* node(int id) const { return nodes_[static_cast<std::size_t>(id)]; }
  Node* mutable_node(int id) { return nodes_[static_cast<std::size_t>(id)]; }
  ///@}
  /// nullptr when absent.
  const Node* find_node(std::string_view name) const;
  /// "node:index" -> Output: NotFound for an unknown node, InvalidArgument for
  /// a bad name or an index out of range.
  Result<Output> find_output(std::string_view name) const;

  /// The registry the graph's ops come from.
  const OpRegistry& registry() const { return *registry_; }

  /// Ends the scope name_scope() or control_dependencies() opened when
  /// destroyed. Movable, not copyable.
  ///
  /// Thread safety: as its graph (one thread at a time).
  class ScopeGuard {
   public:
    /// Takes over `o`'s scope; `o` then ends nothing.
    ScopeGuard(ScopeGuard&& o) noexcept : graph_(o.graph_), kind_(o.kind_), saved_(o.saved_) {
      o.graph_ = nullptr;
    }
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;
    ScopeGuard& operator=(ScopeGuard&&) = delete;
    ~ScopeGuard();

   private:
    friend class Graph;
    ScopeGuard(Graph* g, int kind, std::size_t saved) : graph_(g), kind_(kind), saved_(saved) {}
    Graph* graph_;
    int kind_;
    std::size_t saved_;
  };
  /// Name scopes: while the returned guard lives, new nodes are named
  /// "<scope>/<name>". Scopes nest; an empty one at the top is no scope. A
  /// scope that would make names is_valid_node_name() refuses (empty inside
  /// another, other characters, or at the top starting with '_', '-', '/'
  /// or '>') is an error the graph keeps (Session::create returns it), as
  /// TensorFlow's name_scope raises.
  [[nodiscard]] ScopeGuard name_scope(std::string_view scope);
  /// While the guard lives, every new node runs after `deps` (TF's
  /// control_dependencies). Nests: inner scopes add to outer ones. A null
  /// node or one of another graph is left out and recorded in status().
  [[nodiscard]] ScopeGuard control_dependencies(std::vector<const Node*> deps);
  /// Device scope (TF's `with g.device(...)`): while the guard lives, new
  /// nodes without a device of their own get `device` ("/rank:1",
  /// "/job:worker/task:1"; checked when a node is added). An inner scope
  /// replaces the outer one; "" clears it.
  [[nodiscard]] ScopeGuard device(std::string_view device);
  /// The name a node named `base` would get now (scope prefix + suffix).
  std::string unique_name(std::string_view base) const;

  /// Graph-level random seed (TF's tf.set_random_seed). Random ops built
  /// after this call derive their op seed from it deterministically.
  void set_seed(int64_t seed) { seed_ = seed; }
  /// The graph-level seed; unset unless set_seed() was called.
  std::optional<int64_t> seed() const { return seed_; }
  /// A new per-op seed (graph seed set: deterministic sequence).
  int64_t next_op_seed() { return ++op_seed_counter_; }

  /// Named lists of nodes, e.g. "variable_initializers".
  void add_to_collection(std::string_view key, const Node* node);
  /// The nodes of collection `key`, in the order added; empty when absent.
  std::span<const Node* const> collection(std::string_view key) const;

 private:
  friend class Node;
  std::string scoped(std::string_view base) const;

  const OpRegistry* registry_;
  // Nodes by id. They live in chunks_ (4 to 65536 nodes each, doubling; a
  // clone's first chunk holds all it copies): one allocation per chunk
  // rather than per node, and never moved.
  std::vector<Node*> nodes_;
  // Nodes constructed in place in one allocation, which asks for huge
  // pages when big (a clone of a million nodes: api/src/huge_pages.h).
  class NodeChunk {
   public:
    explicit NodeChunk(std::size_t size);
    NodeChunk(NodeChunk&& o) noexcept
        : nodes_(std::exchange(o.nodes_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    NodeChunk& operator=(NodeChunk&&) = delete;
    ~NodeChunk();
    Node& operator[](std::size_t i) { return nodes_[i]; }

   private:
    Node* nodes_;
    std::size_t size_;
  };
  std::vector<NodeChunk> chunks_;
  std::size_t chunk_used_ = 0;  // nodes taken from chunks_.back()
  std::size_t chunk_size_ = 0;  // chunks_.back()'s
  Node* new_node();
  // add_node's body; `attrs` are the node's attributes as given (spec.attrs
  // or the map add_node(spec, attrs) was handed).
  Result<Node*> add_node_with(NodeSpec& spec, const AttrMap& attrs);
  // Node name -> id: open addressing over the nodes' own names, one 8-byte
  // slot per node at most half full (an unordered_map spent a 64-byte
  // allocation per node and, on a big graph, two cache misses per lookup).
  class NameIndex {
   public:
    NameIndex() = default;
    NameIndex(const NameIndex& other) { *this = other; }
    NameIndex(NameIndex&&) noexcept = default;
    // A copy's slots ask for huge pages when big, as the original's did.
    NameIndex& operator=(const NameIndex& other);
    NameIndex& operator=(NameIndex&&) noexcept = default;
    ~NameIndex() = default;
    // The hash a name is placed by (the forms taking it save hashing twice).
    static uint32_t tag_of(std::string_view name);
    // The id of the node named `name`, or -1.
    int find(std::string_view name, const std::vector<Node*>& nodes) const {
      return find(name, tag_of(name), nodes);
    }
    int find(std::string_view name, uint32_t tag, const std::vector<Node*>& nodes) const;
    // Starts loading the slot where the lookup of the name with this tag
    // begins, so that a lookup issued a little later does not wait for
    // memory (on a big graph the slot is a cache miss).
    void prefetch(uint32_t tag) const;
    // Adds node `id` (its name, whose tag is given, is absent).
    void insert(std::string_view name, int id) { insert(tag_of(name), id); }
    void insert(uint32_t tag, int id);
    void clear() {
      slots_.clear();
      size_ = 0;
    }

   private:
    void place(uint64_t slot);
    std::vector<uint64_t> slots_;  // hash tag << 32 | (id + 1); 0: empty
    std::size_t size_ = 0;
  };
  NameIndex by_name_;
  // unique_name() of a name already scoped.
  std::string unique_scoped_name(std::string name) const;
  // Recent node signatures (op, attributes as given, input dtypes and
  // shapes) and the proto add_node made of each: a node like a recent one
  // skips the checks, shape inference and interning, which are functions of
  // its signature alone (api/src/graph.cc). Direct-mapped; made on first use.
  struct SignatureCache;
  std::unique_ptr<SignatureCache> signatures_;
  // Per name unique_name() had to suffix, the last suffix it returned:
  // names are never freed, so the next free one is past it (without this,
  // n unnamed nodes of one op cost n^2 / 2 lookups).
  mutable std::unordered_map<std::string, int> last_suffix_;
  // The node protos by hash: a new node with an equal one shares it. Protos
  // holding a tensor value (a Const's) or a -0.0 are not interned.
  std::shared_ptr<const graph_internal::NodeProto> intern(graph_internal::NodeProto proto);
  std::unordered_multimap<std::size_t, std::shared_ptr<const graph_internal::NodeProto>> protos_;
  // The distinct device strings of the nodes (a node keeps an index).
  int32_t intern_device(std::string_view device);
  std::string scope_;
  std::vector<const Node*> control_scope_;
  std::vector<std::string> devices_;
  std::unordered_map<std::string, int32_t> device_ids_;  // devices_ -> index
  int32_t device_scope_ = -1;
  std::optional<int64_t> seed_;
  int64_t op_seed_counter_ = 0;
  std::map<std::string, std::vector<const Node*>, std::less<>> collections_;
  Status status_;
};

/// A parsed device string. graphrun's own form is "/rank:N" (N the MPI
/// rank); TensorFlow's "/job:NAME/replica:R/task:N/device:CPU:K" (any of
/// the parts; "/cpu:0", "/gpu:0" and "CPU:0" too) names rank N by its task.
/// Device type and index are accepted and ignored (every rank is a CPU
/// process).
struct DeviceName {
  int rank = -1;    ///< the rank (task); -1 when the string names none
  std::string job;  ///< the job, when given ("worker")
};
/// "" and "/device:CPU:0" -> rank -1; "/rank:2", "/job:worker/task:2" -> 2;
/// anything else ("/rank:x", "/job:w/task:-1", "/node:1") -> InvalidArgument.
Result<DeviceName> parse_device(std::string_view device);

/// TF's simple placer over the node devices: the rank of every node (by
/// id) for a world of `num_ranks` processes. A placed node runs on its
/// device's rank; an unplaced one with its first data input, else on rank
/// 0. A variable and every node naming it (attr "var": Assign*,
/// ReadVariable) run on one rank, the variable's or the one of them that
/// is placed. InvalidArgument naming the node for a rank outside the world,
/// a variable and a user of it placed apart, or devices of two jobs.
Result<std::vector<int>> place(const Graph& g, int num_ranks);

/// How run() and partial_run() name a tensor: an Output of the session's
/// graph or a "node:index" string.
///
/// Thread safety: thread-compatible (a value).
class TensorRef {
 public:
  /// The tensor `o`.
  TensorRef(const Output& o) : output_(o) {}  // NOLINT(google-explicit-constructor)
  ///@{
  /// The tensor named `name` ("node" or "node:index").
  TensorRef(std::string_view name) : name_(name) {}    // NOLINT
  TensorRef(const char* name) : name_(name) {}         // NOLINT
  TensorRef(const std::string& name) : name_(name) {}  // NOLINT
  ///@}
  /// True when made from a valid Output.
  bool is_output() const { return output_.is_valid(); }
  /// The Output; invalid when made from a name.
  const Output& output() const { return output_; }
  /// The name; empty when made from an Output.
  const std::string& name() const { return name_; }
  /// "node:index" either way.
  std::string to_string() const { return is_output() ? output_.name() : name_; }

 private:
  Output output_;
  std::string name_;
};

/// How run() names a target: a node, any of its Outputs, or its name.
///
/// Thread safety: thread-compatible (a value).
class TargetRef {
 public:
  /// The node `node`.
  TargetRef(const Node* node) : node_(node) {}  // NOLINT
  /// The node that produces `o`.
  TargetRef(const Output& o) : node_(o.node()) {}  // NOLINT
  ///@{
  /// The node named `name`.
  TargetRef(std::string_view name) : name_(name) {}    // NOLINT
  TargetRef(const char* name) : name_(name) {}         // NOLINT
  TargetRef(const std::string& name) : name_(name) {}  // NOLINT
  ///@}
  /// The node; nullptr when made from a name.
  const Node* node() const { return node_; }
  /// The name; empty when made from a node.
  const std::string& name() const { return name_; }
  /// The node's name either way.
  std::string to_string() const;

 private:
  const Node* node_ = nullptr;
  std::string name_;
};

/// Writes o.name().
std::ostream& operator<<(std::ostream& os, const Output& o);

}  // namespace graphrun
