#include <graphrun/graph.h>
#include <graphrun/op_kernel.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>

#include "api/src/huge_pages.h"
#include "api/src/op_def_attrs.h"

namespace graphrun {

// ---- Output, names ----

DType Output::dtype() const { return node_->output_dtype(index_); }
const Shape& Output::shape() const { return node_->output_shape(index_); }
std::string Output::name() const {
  if (node_ == nullptr) return "<invalid output>";
  return fmt::format("{}:{}", node_->name(), index_);
}
std::ostream& operator<<(std::ostream& os, const Output& o) { return os << o.name(); }

Result<TensorName> parse_tensor_name(std::string_view name) {
  if (name.empty()) return invalid_argument("empty tensor name");
  const auto colon = name.rfind(':');
  if (colon == std::string_view::npos) return TensorName{name, 0};
  std::string_view node = name.substr(0, colon);
  std::string_view index = name.substr(colon + 1);
  if (node.empty()) return invalid_argument("tensor name '{}' has no node part", name);
  int value = -1;
  auto [ptr, ec] = std::from_chars(index.data(), index.data() + index.size(), value);
  if (index.empty() || ec != std::errc() || ptr != index.data() + index.size() || value < 0) {
    return invalid_argument("tensor name '{}': output index '{}' is not a non-negative integer",
                            name, index);
  }
  return TensorName{node, value};
}

std::string TargetRef::to_string() const { return node_ != nullptr ? node_->name() : name_; }

// ---- Node ----

const OpDef& Node::op_def() const { return proto_->registration->def; }
const std::string& Node::op() const { return proto_->registration->def.name(); }
bool Node::is_stateful() const { return proto_->registration->def.is_stateful(); }
const AttrValue* Node::find_attr(std::string_view name) const {
  auto it = proto_->attrs.find(name);
  return it == proto_->attrs.end() ? nullptr : &it->second;
}
std::string Node::describe() const { return fmt::format("node '{}' ({})", name_, op()); }

// ---- Edges ----

namespace graph_internal {

uint32_t Edges::capacity(uint32_t n) { return n == 0 ? 0 : std::bit_ceil(n); }

void Edges::allocate_and_copy(std::span<const Output> inputs, std::span<const Node* const> controls,
                              uint32_t control_capacity) {
  const std::size_t bytes = num_inputs_ * sizeof(Output) + control_capacity * sizeof(const Node*);
  u_.heap = bytes == 0 ? nullptr : ::operator new(bytes);
  std::uninitialized_copy(inputs.begin(), inputs.end(), input_data());
  std::uninitialized_copy(controls.begin(), controls.end(), control_data());
}

Edges::Edges(std::span<const Output> inputs, std::span<const Node* const> controls)
    : num_inputs_(static_cast<uint32_t>(inputs.size())),
      num_controls_(static_cast<uint32_t>(controls.size())) {
  if (is_inline()) {
    u_.one = controls.front();
    return;
  }
  allocate_and_copy(inputs, controls, capacity(num_controls_));
}

Edges::Edges(std::span<const Output> inputs, std::span<const Node* const> controls,
             const Node* extra)
    : num_inputs_(static_cast<uint32_t>(inputs.size())),
      num_controls_(static_cast<uint32_t>(controls.size()) + 1) {
  allocate_and_copy(inputs, controls, capacity(num_controls_));
  control_data()[num_controls_ - 1] = extra;
}

void Edges::add_control(const Node* dep) {
  if (num_inputs_ == 0 && num_controls_ == 0) {
    u_.one = dep;
    num_controls_ = 1;
  } else if (is_inline() || num_controls_ == capacity(num_controls_)) {  // full
    *this = Edges(inputs(), controls(), dep);
  } else {
    control_data()[num_controls_++] = dep;
  }
}

}  // namespace graph_internal

// ---- Graph ----

Graph::NodeChunk::NodeChunk(std::size_t size)
    : nodes_(static_cast<Node*>(internal::allocate_maybe_huge(size * sizeof(Node), alignof(Node)))),
      size_(size) {
  // Node's default constructor (private: Graph's) does not throw, as its
  // members' do not.
  static_assert(noexcept(Node()));
  for (std::size_t i = 0; i < size_; ++i) ::new (static_cast<void*>(nodes_ + i)) Node;
}

Graph::NodeChunk::~NodeChunk() {
  if (nodes_ == nullptr) return;
  std::destroy_n(nodes_, size_);
  internal::free_maybe_huge(nodes_, size_ * sizeof(Node), alignof(Node));
}

namespace {
// Chunks double from 4 nodes up to this many: 6.5 MiB of nodes, so that a
// big graph's chunks are on huge pages (api/src/huge_pages.h); a chunk's
// nodes are made when it is, so at most one chunk's worth is spare.
constexpr std::size_t kMaxChunk = 65536;
}  // namespace

Node* Graph::new_node() {
  if (chunks_.empty() || chunk_used_ == chunk_size_) {
    chunk_size_ = std::clamp<std::size_t>(2 * chunk_size_, 4, kMaxChunk);
    chunks_.emplace_back(chunk_size_);
    chunk_used_ = 0;
  }
  return &chunks_.back()[chunk_used_++];
}

// See graph.h. A node's proto is a function of its op, the attributes it was
// given, its inputs' dtypes and shapes, and the values of Const inputs (which
// shape functions may read): with no Const input, an equal signature gives
// an equal proto, and only nodes that were added are remembered.
struct Graph::SignatureCache {
  struct Entry {
    std::size_t key = 0;
    const OpRegistration* reg = nullptr;
    AttrMap attrs;  // as given to add_node, before defaults
    std::vector<DType> input_dtypes;
    std::vector<Shape> input_shapes;
    std::shared_ptr<const graph_internal::NodeProto> proto;  // null: empty
    bool matches(const OpRegistration* r, std::size_t k, const NodeSpec& spec,
                 const AttrMap& given) const {
      if (proto == nullptr || key != k || reg != r || input_dtypes.size() != spec.inputs.size()) {
        return false;
      }
      for (std::size_t i = 0; i < spec.inputs.size(); ++i) {
        if (input_dtypes[i] != spec.inputs[i].dtype() ||
            input_shapes[i] != spec.inputs[i].shape()) {
          return false;
        }
      }
      return attrs == given;
    }
  };
  static constexpr std::size_t kEntries = 64;
  std::array<Entry, kEntries> entries;
  // The last op looked up and its registration (registrations are never
  // removed): runs of one op skip the registry's lock and hash.
  std::string last_op;
  const OpRegistration* last_reg = nullptr;
};

Graph::Graph(const OpRegistry& registry) : registry_(&registry) {}
Graph::Graph(Graph&& other) noexcept { *this = std::move(other); }
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this == &other) return *this;
  registry_ = other.registry_;
  nodes_ = std::move(other.nodes_);
  chunks_ = std::move(other.chunks_);
  chunk_used_ = std::exchange(other.chunk_used_, 0);
  chunk_size_ = std::exchange(other.chunk_size_, 0);
  by_name_ = std::move(other.by_name_);
  last_suffix_ = std::move(other.last_suffix_);
  protos_ = std::move(other.protos_);
  scope_ = std::move(other.scope_);
  control_scope_ = std::move(other.control_scope_);
  devices_ = std::move(other.devices_);
  device_ids_ = std::move(other.device_ids_);
  device_scope_ = std::exchange(other.device_scope_, -1);
  seed_ = other.seed_;
  op_seed_counter_ = other.op_seed_counter_;
  collections_ = std::move(other.collections_);
  status_ = std::move(other.status_);
  signatures_ = std::move(other.signatures_);
  // Nodes point back at their graph.
  for (Node* n : nodes_) n->graph_ = this;
  // The moved-from graph is empty (and usable: a new graph on the same
  // registry).
  other.nodes_.clear();
  other.chunks_.clear();
  other.by_name_.clear();
  other.last_suffix_.clear();
  other.protos_.clear();
  other.collections_.clear();
  other.devices_.clear();
  other.device_ids_.clear();
  other.status_ = Status::ok();
  return *this;
}
Graph::~Graph() = default;

namespace {

// Hash mixing (a 64-bit multiply and an xor-shift; collisions only cost a
// compare).
void mix(std::size_t& h, std::size_t v) {
  h = (h ^ v) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
}

}  // namespace

uint32_t Graph::NameIndex::tag_of(std::string_view name) {
  // Names that differ only in a trailing number ("n41", "n42"; "MatMul_7",
  // "MatMul_8", as unique names are made) share a hash for each run of 8
  // numbers and take the 8 slots of one cache line by the number's low
  // bits: a big graph built in name order touches a line of the index per
  // 8 nodes instead of one per node. Leading zeros count as digits ("n01"
  // is not "n1"), and the runs are spread like any other hash.
  std::size_t digits = 0;
  while (digits < name.size() && digits < 18 &&
         static_cast<unsigned>(name[name.size() - 1 - digits] - '0') < 10u) {
    ++digits;
  }
  uint64_t number = 0;
  for (std::size_t i = name.size() - digits; i < name.size(); ++i) {
    number = number * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  std::size_t h = std::hash<std::string_view>{}(name.substr(0, name.size() - digits));
  mix(h, digits + 1);
  mix(h, static_cast<std::size_t>(number >> 3));
  const auto tag = static_cast<uint32_t>(h ^ (h >> 32));
  return digits == 0 ? tag : (tag & ~7u) | static_cast<uint32_t>(number & 7);
}

int Graph::NameIndex::find(std::string_view name, uint32_t tag,
                           const std::vector<Node*>& nodes) const {
  if (slots_.empty()) return -1;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = tag & mask;; i = (i + 1) & mask) {
    const uint64_t slot = slots_[i];
    if (slot == 0) return -1;
    if (static_cast<uint32_t>(slot >> 32) == tag) {
      const auto id = static_cast<int>((slot & 0xffffffffu) - 1);
      if (nodes[static_cast<std::size_t>(id)]->name_ == name) return id;
    }
  }
}

void Graph::NameIndex::prefetch(uint32_t tag) const {
  if (slots_.empty()) return;
  __builtin_prefetch(&slots_[tag & (slots_.size() - 1)]);
}

void Graph::NameIndex::place(uint64_t slot) {
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = static_cast<uint32_t>(slot >> 32) & mask;
  while (slots_[i] != 0) i = (i + 1) & mask;
  slots_[i] = slot;
}

void Graph::NameIndex::insert(uint32_t tag, int id) {
  if (2 * (size_ + 1) > slots_.size()) {
    // Grow to twice: the tags give every entry its place again, without
    // hashing the names.
    std::vector<uint64_t> old = std::move(slots_);
    const std::size_t size = old.empty() ? 16 : 2 * old.size();
    internal::reserve_maybe_huge(slots_, size);
    slots_.assign(size, 0);
    for (const uint64_t slot : old) {
      if (slot != 0) place(slot);
    }
  }
  place((static_cast<uint64_t>(tag) << 32) | (static_cast<uint64_t>(id) + 1));
  ++size_;
}

Graph::NameIndex& Graph::NameIndex::operator=(const NameIndex& other) {
  if (this == &other) return *this;
  slots_.clear();
  internal::reserve_maybe_huge(slots_, other.slots_.size());
  slots_.assign(other.slots_.begin(), other.slots_.end());
  size_ = other.size_;
  return *this;
}

Graph Graph::clone() const {
  Graph copy(*registry_);
  internal::reserve_maybe_huge(copy.nodes_, nodes_.size());
  if (!nodes_.empty()) {
    // One chunk holds them all.
    copy.chunks_.emplace_back(nodes_.size());
    copy.chunk_used_ = copy.chunk_size_ = nodes_.size();
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node* c = &copy.chunks_.back()[i];
    *c = *nodes_[i];
    c->graph_ = &copy;
    copy.nodes_.push_back(c);
  }
  // Remap pointers into the copy (ids are indices).
  for (Node* c : copy.nodes_) {
    for (Output& in : c->edges_.mutable_inputs())
      in = Output(copy.nodes_[in.node()->id()], in.index());
    for (const Node*& dep : c->edges_.mutable_controls()) dep = copy.nodes_[dep->id()];
  }
  copy.by_name_ = by_name_;
  copy.last_suffix_ = last_suffix_;
  copy.protos_ = protos_;
  copy.scope_ = scope_;
  copy.devices_ = devices_;
  copy.device_ids_ = device_ids_;
  copy.device_scope_ = device_scope_;
  for (const Node* dep : control_scope_) copy.control_scope_.push_back(copy.nodes_[dep->id()]);
  copy.seed_ = seed_;
  copy.op_seed_counter_ = op_seed_counter_;
  for (const auto& [key, list] : collections_) {
    auto& out = copy.collections_[key];
    for (const Node* n : list) out.push_back(copy.nodes_[n->id()]);
  }
  copy.status_ = status_;
  return copy;
}

Status Graph::append_nodes_from(const Graph& grown) {
  if (&grown == this) return Status::ok();
  if (!grown.status().is_ok()) {
    return grown.status().with_prefix("cannot extend from a graph with a build error");
  }
  if (grown.registry_ != registry_) {
    return invalid_argument("cannot extend from a graph that uses another op registry");
  }
  const std::size_t have = nodes_.size();
  if (grown.nodes_.size() < have) {
    return invalid_argument(
        "the graph to extend from has {} node(s), fewer than the {} already here: it must be "
        "this graph grown with new nodes",
        grown.nodes_.size(), have);
  }
  auto same_node = [](const Node& a, const Node& b) {
    if (a.name_ != b.name_ || &a.registration() != &b.registration() ||
        a.num_inputs() != b.num_inputs() ||
        a.control_inputs().size() != b.control_inputs().size()) {
      return false;
    }
    for (int i = 0; i < a.num_inputs(); ++i) {
      if (a.input(i).node()->id() != b.input(i).node()->id() ||
          a.input(i).index() != b.input(i).index()) {
        return false;
      }
    }
    for (std::size_t i = 0; i < a.control_inputs().size(); ++i) {
      if (a.control_inputs()[i]->id() != b.control_inputs()[i]->id()) return false;
    }
    return true;
  };
  for (std::size_t id = 0; id < have; ++id) {
    const Node& mine = *nodes_[id];
    const Node& theirs = *grown.nodes_[id];
    if (!same_node(mine, theirs)) {
      return invalid_argument(
          "cannot extend: node {} of the given graph is {} but here it is {} (changed since, or "
          "not a graph grown from this one)",
          id, theirs.describe(), mine.describe());
    }
  }
  nodes_.reserve(grown.nodes_.size());
  for (std::size_t id = have; id < grown.nodes_.size(); ++id) {
    Node* c = new_node();
    *c = *grown.nodes_[id];
    c->graph_ = this;
    if (c->device_ >= 0)
      c->device_ = intern_device(grown.devices_[static_cast<std::size_t>(c->device_)]);
    // Inputs point at earlier nodes: remap them into this graph by id.
    for (Output& in : c->edges_.mutable_inputs()) in = Output(nodes_[in.node()->id()], in.index());
    for (const Node*& dep : c->edges_.mutable_controls()) dep = nodes_[dep->id()];
    nodes_.push_back(c);
    by_name_.insert(c->name_, static_cast<int>(id));
  }
  for (const auto& [key, list] : grown.collections_) {
    auto& mine = collections_[key];
    for (const Node* n : list) {
      if (static_cast<std::size_t>(n->id()) >= have) mine.push_back(nodes_[n->id()]);
    }
  }
  seed_ = grown.seed_;
  op_seed_counter_ = std::max(op_seed_counter_, grown.op_seed_counter_);
  return Status::ok();
}

namespace {
// The characters TensorFlow allows in a node name after its first:
// [A-Za-z0-9_./>-]. A table: add_node checks every name.
constexpr std::array<bool, 256> kNameChars = [] {
  std::array<bool, 256> t{};
  for (int c = 'a'; c <= 'z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = 'A'; c <= 'Z'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (int c = '0'; c <= '9'; ++c) t[static_cast<std::size_t>(c)] = true;
  for (const char c : {'_', '.', '/', '>', '-'}) t[static_cast<unsigned char>(c)] = true;
  return t;
}();

// Every character may follow the first of a name.
bool valid_name_chars(std::string_view s) {
  for (const char c : s) {
    if (!kNameChars[static_cast<unsigned char>(c)]) return false;
  }
  return true;
}

// The first character of a name: [A-Za-z0-9.].
bool valid_name_start(char c) {
  return c == '.' || (kNameChars[static_cast<unsigned char>(c)] && c != '_' && c != '/' &&
                      c != '>' && c != '-');
}

// "a:b" -> "':' at 1": the first character that breaks the rule (`start`:
// the name's first is held to valid_name_start).
std::string first_bad_char(std::string_view name, bool start = true) {
  for (std::size_t k = 0; k < name.size(); ++k) {
    const char c = name[k];
    if (k == 0 && start ? !valid_name_start(c) : !kNameChars[static_cast<unsigned char>(c)]) {
      if (c >= 0x20 && c < 0x7f) return fmt::format("'{}' at {}", c, k);
      return fmt::format("byte 0x{:02x} at {}", static_cast<unsigned char>(c), k);
    }
  }
  return name.empty() ? "it is empty" : "none";
}

// InvalidArgument naming the first of `attrs` that `def` does not declare
// (and that is no '_' annotation), with the ones it does.
Status check_declared(const OpDef& def, const AttrMap& attrs, const std::string& node) {
  auto declared = [&](const std::string& a) {
    return a.starts_with('_') || a == def.output_list_attr() ||
           std::any_of(def.attrs().begin(), def.attrs().end(),
                       [&](const OpDef::AttrDef& d) { return d.name == a; }) ||
           std::any_of(def.type_attrs().begin(), def.type_attrs().end(),
                       [&](const OpDef::TypeAttr& t) { return t.name == a; });
  };
  for (const auto& [a, value] : attrs) {
    if (declared(a)) continue;
    return invalid_argument("node '{}' ({}): {} declares no attribute '{}' (its attributes: {})",
                            node, def.name(), def.name(), a, internal::declared_attr_names(def));
  }
  return Status::ok();
}
}  // namespace

bool is_valid_node_name(std::string_view name) {
  return !name.empty() && valid_name_start(name[0]) && valid_name_chars(name.substr(1));
}

std::string Graph::scoped(std::string_view base) const {
  if (scope_.empty()) return std::string(base);
  return fmt::format("{}/{}", scope_, base);
}

std::string Graph::unique_name(std::string_view base) const {
  return unique_scoped_name(scoped(base));
}

std::string Graph::unique_scoped_name(std::string name) const {
  if (by_name_.find(name, nodes_) < 0) return name;
  int& last = last_suffix_[name];
  for (int i = last + 1;; ++i) {
    std::string candidate = fmt::format("{}_{}", name, i);
    if (by_name_.find(candidate, nodes_) < 0) {
      last = i;
      return candidate;
    }
  }
}

const Node* Graph::find_node(std::string_view name) const {
  const int id = by_name_.find(name, nodes_);
  return id < 0 ? nullptr : nodes_[static_cast<std::size_t>(id)];
}

Result<Output> Graph::find_output(std::string_view name) const {
  GRAPHRUN_ASSIGN_OR_RETURN(TensorName tn, parse_tensor_name(name));
  const Node* n = find_node(tn.node);
  if (n == nullptr) return not_found("no node named '{}' in the graph", tn.node);
  if (tn.index >= n->num_outputs()) {
    if (n->num_outputs() == 0) {
      return invalid_argument("{} has no outputs; '{}' does not exist", n->describe(), name);
    }
    return invalid_argument("{} has {} output(s); index {} in '{}' is out of range", n->describe(),
                            n->num_outputs(), tn.index, name);
  }
  return Output(n, tn.index);
}

namespace {

// An attribute name's part of a signature key: its length and its first
// and last (up to) 8 bytes. The key only picks an entry of the signature
// cache, whose full comparison decides (names an op declares differ in
// those); std::hash of each name took 175 instructions a node. Values, and
// intern()'s keys (buckets a collision would make long), keep std::hash.
void mix_name(std::size_t& h, std::string_view s) {
  const char* p = s.data();
  const std::size_t n = s.size();
  uint64_t head = 0;
  uint64_t tail = 0;
  // Fixed-size loads (a variable-length memcpy cost more than std::hash).
  if (n >= 8) {
    std::memcpy(&head, p, 8);
    std::memcpy(&tail, p + n - 8, 8);
  } else if (n >= 4) {
    uint32_t a = 0;
    uint32_t b = 0;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + n - 4, 4);
    head = a;
    tail = b;
  } else if (n > 0) {
    head = static_cast<unsigned char>(p[0]) |
           static_cast<uint64_t>(static_cast<unsigned char>(p[n / 2])) << 8 |
           static_cast<uint64_t>(static_cast<unsigned char>(p[n - 1])) << 16;
  }
  mix(h, n);
  mix(h, head);
  mix(h, tail);
}

void mix_shape(std::size_t& h, const Shape& s) {
  mix(h, static_cast<std::size_t>(s.rank() + 2));
  for (const int64_t d : s.dims()) mix(h, static_cast<std::size_t>(d));
}

// False for a value not worth hashing and comparing: a tensor's, and -0.0.
bool mix_attr(std::size_t& h, const AttrValue& v) {
  mix(h, v.index());
  return std::visit(
      [&h](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Tensor>) {
          // An empty default is; a value (a Const's) is not compared.
          if (x.is_initialized()) return false;
          mix(h, static_cast<std::size_t>(x.dtype()));
          mix_shape(h, x.shape());
        } else if constexpr (std::is_same_v<T, std::string>) {
          mix(h, std::hash<std::string>{}(x));
        } else if constexpr (std::is_same_v<T, Shape>) {
          mix_shape(h, x);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<DType>>) {
          mix(h, x.size());
          for (const auto& e : x) mix(h, static_cast<std::size_t>(e));
        } else if constexpr (std::is_same_v<T, double>) {
          // -0.0 == 0.0: keep such a node's own value rather than share.
          if (x == 0.0 && std::signbit(x)) return false;
          mix(h, std::hash<double>{}(x));
        } else {
          mix(h, static_cast<std::size_t>(x));
        }
        return true;
      },
      v);
}

bool same_proto(const graph_internal::NodeProto& a, const graph_internal::NodeProto& b) {
  return a.registration == b.registration && a.output_dtypes == b.output_dtypes &&
         a.output_shapes == b.output_shapes && a.attrs == b.attrs;
}

// The hash of a node's signature (SignatureCache), or false when it is not
// kept: a Const input (a shape function may read its value) or an attribute
// intern() would not share; also for an input add_node refuses (of another
// graph, out of range), which it reports later.
bool signature_key(const Graph* g, const OpRegistration* reg, const NodeSpec& spec,
                   const AttrMap& attrs, std::size_t& h) {
  h = reinterpret_cast<std::uintptr_t>(reg);
  mix(h, attrs.size());
  for (const auto& [name, value] : attrs) {
    mix_name(h, name);
    if (!mix_attr(h, value)) return false;
  }
  for (const Output& in : spec.inputs) {
    if (&in.node()->graph() != g || in.index() < 0 || in.index() >= in.node()->num_outputs() ||
        in.node()->op() == "Const") {
      return false;
    }
    mix(h, static_cast<std::size_t>(in.dtype()));
    mix_shape(h, in.shape());
  }
  return true;
}

// Resolves the dtype bound to type variable `attr` for a node being built.
Status bind_type_attr(const OpDef& def, const std::string& attr, DType dtype, AttrMap& attrs,
                      const std::string& node, std::string_view arg) {
  auto it = attrs.find(attr);
  if (it == attrs.end()) {
    attrs.emplace(attr, dtype);
    return Status::ok();
  }
  const DType* bound = std::get_if<DType>(&it->second);
  if (bound == nullptr) {
    return invalid_argument("node '{}' ({}): attribute '{}' must be a type", node, def.name(),
                            attr);
  }
  if (*bound != dtype) {
    return invalid_argument(
        "node '{}' ({}): input '{}' is {} but {} is {} (from an earlier input or attribute)", node,
        def.name(), arg, dtype_name(dtype), attr, dtype_name(*bound));
  }
  return Status::ok();
}

}  // namespace

Result<Node*> Graph::add_node(NodeSpec spec) { return add_node_with(spec, spec.attrs); }

Result<Node*> Graph::add_node(NodeSpec spec, const AttrMap& attrs) {
  if (!spec.attrs.empty()) {
    Status s = invalid_argument(
        "node '{}' ({}): attributes given both in the NodeSpec and apart; give them once",
        scoped(spec.name.empty() ? spec.op : spec.name), spec.op);
    status_.update(s);
    return s;
  }
  return add_node_with(spec, attrs);
}

Result<Node*> Graph::add_node_with(NodeSpec& spec, const AttrMap& attrs) {
  auto fail = [&](Status s) -> Result<Node*> {
    status_.update(s);
    return s;
  };
  if (signatures_ == nullptr) signatures_ = std::make_unique<SignatureCache>();
  const OpRegistration* reg = signatures_->last_reg;
  if (reg == nullptr || signatures_->last_op != spec.op) {
    reg = registry_->find(spec.op);
    if (reg != nullptr) {
      signatures_->last_op = spec.op;
      signatures_->last_reg = reg;
    }
  }
  if (spec.name.empty()) spec.name = spec.op;
  // The scope was checked as it opened: the name's own part is checked
  // here (the whole name once scoped: TensorFlow's rule).
  if (scope_.empty() ? !is_valid_node_name(spec.name)
                     : !valid_name_chars(spec.name) || spec.name.empty()) [[unlikely]] {
    const std::string full = scoped(spec.name);
    return fail(invalid_argument(
        "node '{}' ({}): not a valid node name ({}; names match [A-Za-z0-9.][A-Za-z0-9_./>-]*)",
        full, spec.op, first_bad_char(full)));
  }
  if (reg == nullptr) {
    return fail(not_found("node '{}': op '{}' is not registered", scoped(spec.name), spec.op));
  }
  const OpDef& def = reg->def;
  // A failed earlier builder leaves invalid Outputs: do nothing more (the
  // graph already holds that error).
  for (const Output& in : spec.inputs) {
    if (!in.is_valid()) {
      Status s = status_.is_ok() ? invalid_argument("node '{}' ({}): an input is invalid",
                                                    scoped(spec.name), spec.op)
                                 : status_;
      return fail(s);
    }
  }
  // The name's slot in the index is likely a cache miss on a big graph:
  // start loading it while the signature is looked up.
  std::string scoped_name = scoped(spec.name);
  const uint32_t scoped_tag = NameIndex::tag_of(scoped_name);
  by_name_.prefetch(scoped_tag);
  std::size_t key = 0;
  SignatureCache::Entry* entry = nullptr;
  std::shared_ptr<const graph_internal::NodeProto> proto;
  if (signature_key(this, reg, spec, attrs, key)) {
    entry = &signatures_->entries[key % SignatureCache::kEntries];
    if (entry->matches(reg, key, spec, attrs)) proto = entry->proto;
  }
  // The node's unique name, in spec.name once resolved. A node of a known
  // signature resolves it last, after writing its other fields, so that the
  // prefetched slot has had time to arrive; messages resolve it first.
  uint32_t name_tag = scoped_tag;
  bool named = false;
  auto resolve_name = [&]() -> const std::string& {
    if (!named) {
      if (by_name_.find(scoped_name, scoped_tag, nodes_) < 0) {
        spec.name = std::move(scoped_name);
      } else {
        spec.name = unique_scoped_name(std::move(scoped_name));
        name_tag = NameIndex::tag_of(spec.name);
      }
      named = true;
    }
    return spec.name;
  };
  for (const Output& in : spec.inputs) {
    if (&in.node()->graph() != this) {
      return fail(invalid_argument("node '{}' ({}): input '{}' belongs to another graph",
                                   resolve_name(), spec.op, in.name()));
    }
    if (in.index() < 0 || in.index() >= in.node()->num_outputs()) {
      return fail(invalid_argument("node '{}' ({}): input '{}' is out of range", resolve_name(),
                                   spec.op, in.name()));
    }
  }
  for (const Node* dep : spec.control_inputs) {
    if (dep == nullptr || &dep->graph() != this) {
      return fail(
          invalid_argument("node '{}' ({}): a control input is invalid or belongs to "
                           "another graph",
                           resolve_name(), spec.op));
    }
  }
  if (proto == nullptr) {
    const std::string& name = resolve_name();
    // The checks below fill defaults into spec.attrs.
    if (&attrs != &spec.attrs) spec.attrs = attrs;
    // The attributes as given, for the signature cache.
    AttrMap given;
    if (entry != nullptr) given = spec.attrs;
    // Input count and dtypes.
    if (!def.has_variadic_inputs() && spec.inputs.size() != def.inputs().size()) {
      return fail(invalid_argument("node '{}' ({}): expects {} input(s), got {}", name, spec.op,
                                   def.inputs().size(), spec.inputs.size()));
    }
    if (!def.has_variadic_inputs()) {
      for (std::size_t i = 0; i < def.inputs().size(); ++i) {
        const ArgDef& arg = def.inputs()[i];
        const DType got = spec.inputs[i].dtype();
        if (arg.fixed != DType::kInvalid) {
          if (got != arg.fixed) {
            return fail(invalid_argument("node '{}' ({}): input '{}' ({}) must be {}, got {}", name,
                                         spec.op, arg.name, spec.inputs[i].name(),
                                         dtype_name(arg.fixed), dtype_name(got)));
          }
        } else {
          Status s = bind_type_attr(def, arg.type_attr, got, spec.attrs, name, arg.name);
          if (!s.is_ok()) return fail(s);
        }
      }
    }
    // Type attrs: present and allowed.
    for (const auto& ta : def.type_attrs()) {
      auto it = spec.attrs.find(ta.name);
      if (it == spec.attrs.end()) {
        return fail(invalid_argument("node '{}' ({}): type attribute '{}' is not set", name,
                                     spec.op, ta.name));
      }
      const DType* d = std::get_if<DType>(&it->second);
      if (d == nullptr) {
        return fail(invalid_argument("node '{}' ({}): attribute '{}' must be a type", name, spec.op,
                                     ta.name));
      }
      if (std::find(ta.allowed.begin(), ta.allowed.end(), *d) == ta.allowed.end()) {
        std::string allowed;
        for (DType a : ta.allowed)
          allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", dtype_name(a));
        return fail(invalid_argument("node '{}' ({}): {} is {}, which is not one of {{{}}}", name,
                                     spec.op, ta.name, dtype_name(*d), allowed));
      }
    }
    // Other attrs: defaults and kinds.
    for (const auto& ad : def.attrs()) {
      auto it = spec.attrs.find(ad.name);
      if (it == spec.attrs.end()) {
        if (ad.required) {
          return fail(invalid_argument("node '{}' ({}): required attribute '{}' ({}) is missing",
                                       name, spec.op, ad.name, attr_kind_name(ad.value)));
        }
        spec.attrs.emplace(ad.name, ad.value);
      } else if (it->second.index() != ad.value.index()) {
        return fail(invalid_argument("node '{}' ({}): attribute '{}' must be a {}, got a {}", name,
                                     spec.op, ad.name, attr_kind_name(ad.value),
                                     attr_kind_name(it->second)));
      }
    }
    // Every declared attribute is set now: more means one the op does not
    // declare (a typo such as transpose_B would silently do nothing), which
    // TensorFlow's NodeDef check refuses too. Names starting with '_' are
    // annotations (_class, _output_shapes) and go through.
    if (spec.attrs.size() != def.attrs().size() + def.type_attrs().size()) {
      if (Status s = check_declared(def, spec.attrs, name); !s.is_ok()) return fail(s);
    }
    // Output dtypes.
    std::vector<DType> out_dtypes;
    if (!def.output_list_attr().empty()) {
      auto list = get_attr<std::vector<DType>>(spec.attrs, def.output_list_attr(), name);
      if (!list.is_ok()) return fail(list.status());
      out_dtypes = *list;
    }
    for (const ArgDef& arg : def.outputs()) {
      if (arg.fixed != DType::kInvalid) {
        out_dtypes.push_back(arg.fixed);
      } else {
        auto d = get_attr<DType>(spec.attrs, arg.type_attr, name);
        if (!d.is_ok()) return fail(d.status());
        out_dtypes.push_back(*d);
      }
    }
    // Shapes.
    std::vector<DType> in_dtypes;
    std::vector<Shape> in_shapes;
    std::vector<const Tensor*> constants;
    for (const Output& in : spec.inputs) {
      in_dtypes.push_back(in.dtype());
      in_shapes.push_back(in.shape());
      const Tensor* c = nullptr;
      if (in.node()->op() == "Const") {
        if (const AttrValue* v = in.node()->find_attr("value")) c = std::get_if<Tensor>(v);
      }
      constants.push_back(c);
    }
    std::vector<Shape> out_shapes(out_dtypes.size(), Shape::unknown());
    if (def.shape_function()) {
      InferenceContext ctx(spec, in_dtypes, in_shapes, constants, &out_dtypes, &out_shapes);
      Status s = def.shape_function()(ctx);
      if (!s.is_ok()) {
        // Shape functions report bare reasons; name the node here.
        return fail(s.with_prefix(ctx.describe()));
      }
    }
    proto = intern(graph_internal::NodeProto{.registration = reg,
                                             .attrs = std::move(spec.attrs),
                                             .output_dtypes = std::move(out_dtypes),
                                             .output_shapes = std::move(out_shapes)});
    if (entry != nullptr) {
      *entry = SignatureCache::Entry{.key = key,
                                     .reg = reg,
                                     .attrs = std::move(given),
                                     .input_dtypes = std::move(in_dtypes),
                                     .input_shapes = std::move(in_shapes),
                                     .proto = proto};
    }
  }
  // Placement: the node's own device, else the scope's.
  const int32_t device = spec.device.empty() ? device_scope_ : intern_device(spec.device);
  if (device >= 0) {
    Result<DeviceName> parsed = parse_device(devices_[static_cast<std::size_t>(device)]);
    if (!parsed.is_ok()) {
      return fail(
          parsed.status().with_prefix(fmt::format("node '{}' ({})", resolve_name(), spec.op)));
    }
  }
  // Control scope.
  for (const Node* dep : control_scope_) {
    if (std::find(spec.control_inputs.begin(), spec.control_inputs.end(), dep) ==
        spec.control_inputs.end()) {
      spec.control_inputs.push_back(dep);
    }
  }

  Node* node = new_node();
  node->graph_ = this;
  node->id_ = static_cast<int>(nodes_.size());
  node->device_ = device;
  node->edges_ = graph_internal::Edges(spec.inputs, spec.control_inputs);
  node->proto_ = std::move(proto);
  node->kernel_ = std::move(spec.kernel);
  // (Should naming throw, the node stays out of nodes_ and the index: an
  // unused slot of its chunk, destroyed with it.)
  resolve_name();
  node->name_ = std::move(spec.name);
  if (nodes_.size() == nodes_.capacity()) {
    internal::reserve_maybe_huge(nodes_, std::max<std::size_t>(16, 2 * nodes_.size()));
  }
  nodes_.push_back(node);
  by_name_.insert(name_tag, node->id_);
  return node;
}

std::shared_ptr<const graph_internal::NodeProto> Graph::intern(graph_internal::NodeProto proto) {
  std::size_t h = reinterpret_cast<std::uintptr_t>(proto.registration);
  mix(h, proto.attrs.size());
  bool internable = true;
  for (const auto& [name, value] : proto.attrs) {
    mix(h, std::hash<std::string>{}(name));
    if (!mix_attr(h, value)) {
      internable = false;
      break;
    }
  }
  if (!internable) return std::make_shared<const graph_internal::NodeProto>(std::move(proto));
  for (const DType d : proto.output_dtypes) mix(h, static_cast<std::size_t>(d));
  for (const Shape& s : proto.output_shapes) mix_shape(h, s);
  auto [first, last] = protos_.equal_range(h);
  for (auto it = first; it != last; ++it) {
    if (same_proto(*it->second, proto)) return it->second;
  }
  auto shared = std::make_shared<const graph_internal::NodeProto>(std::move(proto));
  protos_.emplace(h, shared);
  return shared;
}

Status Graph::add_control_input(Node* node, const Node* dep) {
  if (node == nullptr || dep == nullptr || &node->graph() != this || &dep->graph() != this) {
    return invalid_argument("add_control_input: both nodes must belong to this graph");
  }
  const auto deps = node->control_inputs();
  if (std::find(deps.begin(), deps.end(), dep) == deps.end()) node->edges_.add_control(dep);
  return Status::ok();
}

Graph::ScopeGuard::~ScopeGuard() {
  if (graph_ == nullptr) return;
  if (kind_ == 0) {
    graph_->scope_.resize(saved_);
  } else if (kind_ == 1) {
    graph_->control_scope_.resize(saved_);
  } else {
    graph_->device_scope_ = static_cast<int32_t>(saved_) - 1;
  }
}

Graph::ScopeGuard Graph::device(std::string_view device) {
  const auto saved = static_cast<std::size_t>(device_scope_ + 1);
  device_scope_ = device.empty() ? -1 : intern_device(device);
  return ScopeGuard(this, 2, saved);
}

int32_t Graph::intern_device(std::string_view device) {
  auto [it, inserted] =
      device_ids_.emplace(std::string(device), static_cast<int32_t>(devices_.size()));
  if (inserted) devices_.emplace_back(device);
  return it->second;
}

const std::string& Node::device() const {
  static const std::string kNone;
  return device_ < 0 ? kNone : graph_->devices_[static_cast<std::size_t>(device_)];
}

Graph::ScopeGuard Graph::name_scope(std::string_view scope) {
  const std::size_t saved = scope_.size();
  // As TensorFlow's: at the top a scope starts as a node name does; inside
  // another any name characters go. The scope still opens (its guard
  // closes it), and the graph keeps the error.
  // An empty scope at the top is no scope (TensorFlow's name_scope('')
  // is the root); inside another it would make "outer//x".
  if (scope_.empty() ? !scope.empty() && !is_valid_node_name(scope)
                     : scope.empty() || !valid_name_chars(scope)) {
    status_.update(invalid_argument(
        "name_scope('{}'){}: not a valid scope ({}; names match [A-Za-z0-9.][A-Za-z0-9_./>-]*)",
        scope, scope_.empty() ? std::string() : fmt::format(" inside '{}'", scope_),
        first_bad_char(scope, scope_.empty())));
  }
  scope_ = scope_.empty() ? std::string(scope) : fmt::format("{}/{}", scope_, scope);
  return ScopeGuard(this, 0, saved);
}

Graph::ScopeGuard Graph::control_dependencies(std::vector<const Node*> deps) {
  const std::size_t saved = control_scope_.size();
  for (std::size_t k = 0; k < deps.size(); ++k) {
    const Node* d = deps[k];
    // As add_node refuses such control inputs: kept out of the scope, and
    // the graph holds the error (Session::create refuses it).
    if (d == nullptr || &d->graph() != this) {
      status_.update(invalid_argument("control_dependencies: dependency #{} is {}", k + 1,
                                      d == nullptr
                                          ? std::string("null (a failed builder's node?)")
                                          : fmt::format("node '{}' of another graph", d->name())));
      continue;
    }
    control_scope_.push_back(d);
  }
  return ScopeGuard(this, 1, saved);
}

void Graph::add_to_collection(std::string_view key, const Node* node) {
  auto it = collections_.find(key);
  if (it == collections_.end())
    it = collections_.emplace(std::string(key), std::vector<const Node*>{}).first;
  it->second.push_back(node);
}

std::span<const Node* const> Graph::collection(std::string_view key) const {
  auto it = collections_.find(key);
  if (it == collections_.end()) return {};
  return it->second;
}

}  // namespace graphrun
