#include "scheduler/plan.h"

#include <algorithm>
#include <span>
#include <unordered_map>

#include "api/src/huge_pages.h"

namespace graphrun::sched {

std::string placeholder_message(const Node& n) {
  auto dtype = n.attr<DType>("dtype");
  auto shape = n.attr<Shape>("shape");
  std::string msg = fmt::format("You must feed a value for placeholder tensor '{}' with dtype {}",
                                n.name(), dtype.is_ok() ? dtype_name(*dtype) : "?");
  if (shape.is_ok() && !shape->is_unknown_rank())
    msg += fmt::format(" and shape {}", shape->to_string());
  return msg;
}

namespace {

int64_t feed_key(const Output& o) {
  return (static_cast<int64_t>(o.node()->id()) << 20) | o.index();
}

// Which declared feeds each node, fetch and target depends on, and where
// feeds enter the flow graph.
void add_partial_run_info(Plan& plan, const Signature& sig,
                          const std::unordered_map<int64_t, int>& fed,
                          const std::vector<int32_t>& index_of) {
  plan.partial = true;
  const std::size_t n_feeds = sig.feeds.size();
  const std::size_t words = (n_feeds + 63) / 64;
  std::vector<uint64_t> deps(plan.nodes.size() * words, 0);
  auto node_deps = [&](std::size_t i) { return deps.data() + i * words; };
  plan.feed_readers.assign(n_feeds, {});
  plan.node_feed_inputs.assign(plan.nodes.size(), 0);
  for (std::size_t i = 0; i < plan.nodes.size(); ++i) {
    const Node* n = plan.nodes[i].node;
    uint64_t* mine = node_deps(i);
    for (const Output& in : n->inputs()) {
      auto it = fed.find(feed_key(in));
      if (it != fed.end()) {
        const auto f = static_cast<std::size_t>(it->second);
        mine[f / 64] |= uint64_t{1} << (f % 64);
        auto& readers = plan.feed_readers[f];
        if (readers.empty() || readers.back() != static_cast<int32_t>(i)) {
          readers.push_back(static_cast<int32_t>(i));
          ++plan.node_feed_inputs[i];
        }
      } else {
        const uint64_t* theirs = node_deps(
            static_cast<std::size_t>(index_of[static_cast<std::size_t>(in.node()->id())]));
        for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
      }
    }
    for (const Node* dep : n->control_inputs()) {
      const uint64_t* theirs =
          node_deps(static_cast<std::size_t>(index_of[static_cast<std::size_t>(dep->id())]));
      for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
    }
  }
  auto list = [&](const uint64_t* bits) {
    std::vector<int32_t> out;
    for (std::size_t f = 0; f < n_feeds; ++f) {
      if ((bits[f / 64] >> (f % 64)) & 1) out.push_back(static_cast<int32_t>(f));
    }
    return out;
  };
  for (const Output& f : sig.fetches) {
    auto it = fed.find(feed_key(f));
    if (it != fed.end()) {
      plan.fetch_producers.push_back(-1);
      plan.fetch_feeds.push_back(it->second);
      plan.fetch_needs.push_back({it->second});
    } else {
      const int32_t p = index_of[static_cast<std::size_t>(f.node()->id())];
      plan.fetch_producers.push_back(p);
      plan.fetch_feeds.push_back(-1);
      plan.fetch_needs.push_back(list(node_deps(static_cast<std::size_t>(p))));
    }
  }
  for (const Node* t : sig.targets) {
    const int32_t p = index_of[static_cast<std::size_t>(t->id())];
    plan.target_nodes.push_back(p);
    plan.target_needs.push_back(list(node_deps(static_cast<std::size_t>(p))));
  }
}

// A fused group: the kernel and its inputs, keyed by the group's last node.
struct FusedGroup {
  std::vector<Output> inputs;
  OpKernel* kernel = nullptr;
};

// Finds chains a head node's kernel fuses (OpKernel::fuse) among the needed
// nodes: each intermediate output has exactly one reader (the next node),
// is neither fetched nor fed nor a target, and no node of the chain but the
// last has a control edge (the head and the chain nodes take none either).
// Marks absorbed nodes not needed; their kernels' plan entries go to the
// last node's group.
Status find_fusions(const Graph& graph, const Signature& sig,
                    const std::unordered_map<int64_t, int>& fed, std::vector<char>& needed,
                    const KernelProvider& kernels, Plan& plan,
                    std::unordered_map<int, FusedGroup>& groups) {
  const auto n_graph = static_cast<std::size_t>(graph.num_nodes());
  std::vector<int32_t> readers(n_graph, 0);
  std::vector<int32_t> reader(n_graph, -1);  // the last reader seen
  std::vector<char> pinned(n_graph, 0);      // fetched, a target, or a control input
  for (std::size_t id = 0; id < n_graph; ++id) {
    if (!needed[id]) continue;
    const Node* n = graph.node(static_cast<int>(id));
    for (const Output& in : n->inputs()) {
      if (fed.contains(feed_key(in))) continue;
      const auto p = static_cast<std::size_t>(in.node()->id());
      ++readers[p];
      reader[p] = static_cast<int32_t>(id);
    }
    for (const Node* dep : n->control_inputs()) pinned[static_cast<std::size_t>(dep->id())] = 1;
  }
  for (const Output& f : sig.fetches) {
    if (!fed.contains(feed_key(f))) pinned[static_cast<std::size_t>(f.node()->id())] = 1;
  }
  for (const Node* t : sig.targets) pinned[static_cast<std::size_t>(t->id())] = 1;

  std::vector<char> grouped(n_graph, 0);
  for (std::size_t id = 0; id < n_graph; ++id) {
    if (!needed[id] || grouped[id]) continue;
    const Node* head = graph.node(static_cast<int>(id));
    if (!head->control_inputs().empty()) continue;
    std::vector<const Node*> chain;
    const Node* cur = head;
    while (chain.size() < kMaxFusedChain) {
      const auto c = static_cast<std::size_t>(cur->id());
      if (pinned[c] || readers[c] != 1 || cur->num_outputs() != 1) break;
      const Node* next = graph.node(reader[c]);
      // A node with a kernel of its own (a kernel override) keeps it.
      if (grouped[static_cast<std::size_t>(next->id())] || !next->control_inputs().empty() ||
          next->kernel_override() != nullptr) {
        break;
      }
      chain.push_back(next);
      cur = next;
    }
    if (chain.empty()) continue;
    Result<OpKernel*> head_kernel = kernels(*head);
    if (!head_kernel.is_ok()) return head_kernel.status();
    std::unique_ptr<OpKernel> fused;
    std::size_t len = chain.size();
    for (; len > 0 && fused == nullptr; --len) {
      fused = (*head_kernel)->fuse(std::span<const Node* const>(chain.data(), len));
      if (fused != nullptr) break;
    }
    if (fused == nullptr) continue;
    FusedGroup group;
    group.inputs.assign(head->inputs().begin(), head->inputs().end());
    const Node* prev = head;
    for (std::size_t i = 0; i < len; ++i) {
      for (const Output& in : chain[i]->inputs()) {
        if (in.node() != prev) group.inputs.push_back(in);
      }
      prev = chain[i];
    }
    group.kernel = fused.get();
    plan.fused_kernels.push_back(std::move(fused));
    grouped[id] = 1;
    needed[id] = 0;
    for (std::size_t i = 0; i < len; ++i) {
      grouped[static_cast<std::size_t>(chain[i]->id())] = 1;
      if (i + 1 < len) needed[static_cast<std::size_t>(chain[i]->id())] = 0;
    }
    plan.fused_nodes += static_cast<int32_t>(len);
    groups.emplace(chain[len - 1]->id(), std::move(group));
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const Plan>> build_plan(const Graph& graph, const Signature& sig,
                                               const KernelProvider& kernels) {
  const int n_graph = graph.num_nodes();
  std::unordered_map<int64_t, int> fed;  // feed key -> feed index
  for (std::size_t i = 0; i < sig.feeds.size(); ++i)
    fed.emplace(feed_key(sig.feeds[i]), static_cast<int>(i));

  // 1. Prune: reverse reachability from fetches and targets, stopping at fed
  // tensors.
  std::vector<char> needed(static_cast<std::size_t>(n_graph), 0);
  std::vector<const Node*> stack;
  auto want = [&](const Node* n) {
    if (!needed[static_cast<std::size_t>(n->id())]) {
      needed[static_cast<std::size_t>(n->id())] = 1;
      stack.push_back(n);
    }
  };
  for (const Output& f : sig.fetches) {
    if (!fed.contains(feed_key(f))) want(f.node());
  }
  for (const Node* t : sig.targets) want(t);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Output& in : n->inputs()) {
      if (!fed.contains(feed_key(in))) want(in.node());
    }
    for (const Node* dep : n->control_inputs()) want(dep);
  }

  // 2. Unfed placeholders are an error before anything runs.
  for (int id = 0; id < n_graph; ++id) {
    if (needed[static_cast<std::size_t>(id)] && graph.node(id)->op() == "Placeholder") {
      return invalid_argument("{}", placeholder_message(*graph.node(id)));
    }
  }

  // 2b. Fusion (full runs only): absorbed nodes leave the needed set; the
  // last node of each group reads the group's inputs.
  auto plan = std::make_shared<Plan>();
  std::unordered_map<int, FusedGroup> groups;
  if (sig.fuse && !sig.partial) {
    GRAPHRUN_RETURN_IF_ERROR(find_fusions(graph, sig, fed, needed, kernels, *plan, groups));
    if (plan->fused_nodes > 0) {
      plan->unfused = sig;
      plan->unfused.fuse = false;
    }
  }
  auto inputs_of = [&](const Node* n) -> std::span<const Output> {
    if (!groups.empty()) {
      auto it = groups.find(n->id());
      if (it != groups.end()) return it->second.inputs;
    }
    return n->inputs();
  };

  // 3. Topological order (Kahn) over the pruned set; leftovers form a cycle.
  // Distinct in-plan predecessors and successors as flat arrays (a vector
  // per node cost 56 bytes a node, more than the plan itself).
  std::vector<int> indegree(static_cast<std::size_t>(n_graph), 0);
  std::vector<int32_t> preds;  // per needed node in id order, distinct
  std::vector<int32_t> succ_begin(static_cast<std::size_t>(n_graph) + 1, 0);
  {
    std::vector<int32_t> scratch;
    for (int id = 0; id < n_graph; ++id) {
      if (!needed[static_cast<std::size_t>(id)]) continue;
      const Node* n = graph.node(id);
      scratch.clear();
      for (const Output& in : inputs_of(n)) {
        if (!fed.contains(feed_key(in))) scratch.push_back(in.node()->id());
      }
      for (const Node* dep : n->control_inputs()) scratch.push_back(dep->id());
      std::sort(scratch.begin(), scratch.end());
      scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
      indegree[static_cast<std::size_t>(id)] = static_cast<int>(scratch.size());
      for (const int32_t p : scratch) ++succ_begin[static_cast<std::size_t>(p) + 1];
      preds.insert(preds.end(), scratch.begin(), scratch.end());
    }
  }
  for (std::size_t i = 1; i < succ_begin.size(); ++i) succ_begin[i] += succ_begin[i - 1];
  // Successors of each node in id order, as a vector per node gave them.
  std::vector<int32_t> succ(preds.size());
  {
    std::vector<int32_t> fill(succ_begin.begin(), succ_begin.end() - 1);
    std::size_t k = 0;
    for (int id = 0; id < n_graph; ++id) {
      if (!needed[static_cast<std::size_t>(id)]) continue;
      for (int d = 0; d < indegree[static_cast<std::size_t>(id)]; ++d) {
        succ[static_cast<std::size_t>(fill[static_cast<std::size_t>(preds[k++])]++)] = id;
      }
    }
  }
  preds = {};
  auto successors_of = [&](int id) {
    return std::span<const int32_t>(succ).subspan(
        static_cast<std::size_t>(succ_begin[static_cast<std::size_t>(id)]),
        static_cast<std::size_t>(succ_begin[static_cast<std::size_t>(id) + 1] -
                                 succ_begin[static_cast<std::size_t>(id)]));
  };
  // Ready nodes leave last in, first out, each node's successors pushed in
  // their edge order: the plan's order is the one a 1-thread oneTBB flow
  // graph runs them in (a node's task bypasses into its last successor,
  // and the others wait in a LIFO deque), so the nodes that run one after
  // another sit next to each other in every per-node array (plan entries,
  // kernels, flow-graph nodes). On a 65,535-node fan-out tree of Call
  // tasks this took a step from 8.7-11.8 ms to 4.3-5.1 ms; the node-id
  // order it replaces was breadth-first there. Roots leave in id order.
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(n_graph));
  std::vector<int> ready;
  for (int id = n_graph; id-- > 0;) {
    if (needed[static_cast<std::size_t>(id)] && indegree[static_cast<std::size_t>(id)] == 0)
      ready.push_back(id);
  }
  std::vector<int> remaining = indegree;
  while (!ready.empty()) {
    int id = ready.back();
    ready.pop_back();
    order.push_back(id);
    for (const int32_t s : successors_of(id)) {
      if (--remaining[static_cast<std::size_t>(s)] == 0) ready.push_back(s);
    }
  }
  const auto n_needed = std::count(needed.begin(), needed.end(), 1);
  if (static_cast<int64_t>(order.size()) != n_needed) {
    std::string names;
    int listed = 0;
    for (int id = 0; id < n_graph && listed < 8; ++id) {
      if (needed[static_cast<std::size_t>(id)] && remaining[static_cast<std::size_t>(id)] > 0) {
        names += fmt::format("{}'{}'", listed++ == 0 ? "" : ", ", graph.node(id)->name());
      }
    }
    return invalid_argument("the graph has a cycle through {}", names);
  }

  // 4. Renumber and lay out slots.
  std::vector<int32_t> index_of(static_cast<std::size_t>(n_graph), -1);
  int32_t slot = 0;
  internal::reserve_maybe_huge(plan->nodes, order.size());
  plan->nodes.resize(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Node* n = graph.node(order[i]);
    index_of[static_cast<std::size_t>(n->id())] = static_cast<int32_t>(i);
    NodeItem& item = plan->nodes[i];
    item.node = n;
    item.output_base = slot;
    item.num_outputs = n->num_outputs();
    slot += n->num_outputs();
    if (auto it = groups.find(n->id()); it != groups.end()) {
      item.kernel = it->second.kernel;
    } else {
      Result<OpKernel*> k = kernels(*n);
      if (!k.is_ok()) return k.status();
      item.kernel = *k;
    }
    // NoOp does nothing: its body skips the kernel call.
    item.skip_kernel = n->op() == "NoOp";
    item.async = !item.skip_kernel && item.kernel->as_async() != nullptr;
    plan->has_async = plan->has_async || item.async;
  }
  const int32_t feed_base = slot;
  for (std::size_t f = 0; f < sig.feeds.size(); ++f) {
    plan->feed_slots.push_back(feed_base + static_cast<int32_t>(f));
    plan->feed_dtypes.push_back(sig.feeds[f].dtype());
    plan->feed_shapes.push_back(sig.feeds[f].shape());
    plan->feed_names.push_back(sig.feeds[f].name());
  }
  plan->num_slots = feed_base + static_cast<int32_t>(sig.feeds.size());
  plan->slot_readers.assign(static_cast<std::size_t>(plan->num_slots), 0);

  auto slot_of = [&](const Output& o) -> int32_t {
    auto it = fed.find(feed_key(o));
    if (it != fed.end()) return feed_base + it->second;
    return plan->nodes[static_cast<std::size_t>(index_of[static_cast<std::size_t>(o.node()->id())])]
               .output_base +
           o.index();
  };
  plan->successors.reserve(succ.size());
  for (NodeItem& item : plan->nodes) {
    item.input_begin = static_cast<int32_t>(plan->input_slots.size());
    for (const Output& in : inputs_of(item.node)) {
      const int32_t s = slot_of(in);
      plan->input_slots.push_back(s);
      ++plan->slot_readers[static_cast<std::size_t>(s)];
    }
    item.input_end = static_cast<int32_t>(plan->input_slots.size());
    item.succ_begin = static_cast<int32_t>(plan->successors.size());
    for (const int32_t s : successors_of(item.node->id())) {
      plan->successors.push_back(index_of[static_cast<std::size_t>(s)]);
    }
    item.succ_end = static_cast<int32_t>(plan->successors.size());
    item.num_preds = indegree[static_cast<std::size_t>(item.node->id())];
  }
  for (const Output& f : sig.fetches) {
    const int32_t s = slot_of(f);
    plan->fetch_slots.push_back(s);
    plan->slot_readers[static_cast<std::size_t>(s)] = Plan::kKeep;
  }
  // The last fetch of each slot takes its value; earlier ones copy it.
  plan->fetch_moves.assign(plan->fetch_slots.size(), 1);
  {
    std::vector<uint8_t> later(static_cast<std::size_t>(plan->num_slots), 0);
    for (std::size_t k = plan->fetch_slots.size(); k-- > 0;) {
      uint8_t& seen = later[static_cast<std::size_t>(plan->fetch_slots[k])];
      plan->fetch_moves[k] = seen == 0 ? 1 : 0;
      seen = 1;
    }
  }
  if (sig.partial) add_partial_run_info(*plan, sig, fed, index_of);
  plan->costs = std::make_unique<CostModel>(*plan, sig.inline_nodes, sig.inline_below_cycles);
  return std::shared_ptr<const Plan>(std::move(plan));
}

}  // namespace graphrun::sched
