// Device strings and TF's simple placer (graph.h: parse_device, place).
#include <graphrun/graph.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

namespace graphrun {

namespace {

// A non-negative decimal below 2^31.
bool parse_index(std::string_view text, int& out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && out >= 0;
}

bool all_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool is_device_type(std::string_view t) {
  if (t.empty()) return false;
  for (const char c : t) {
    const bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

bool is_job_name(std::string_view j) {
  if (j.empty()) return false;
  for (const char c : j) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// The variable `node` is or names (attr "var": Assign*, ReadVariable).
const std::string* variable_of(const Node& node) {
  if (node.op() == "Variable") return &node.name();
  if (const AttrValue* var = node.find_attr("var")) return std::get_if<std::string>(var);
  return nullptr;
}

}  // namespace

Result<DeviceName> parse_device(std::string_view device) {
  DeviceName out;
  auto bad = [&](std::string_view why) -> Result<DeviceName> {
    return invalid_argument(
        "device '{}' is not a device name ({}): graphrun reads \"/rank:N\" and TensorFlow's "
        "\"/job:NAME/replica:R/task:N/device:TYPE:K\"",
        device, why);
  };
  bool has_rank = false;
  bool has_task = false;
  std::string_view rest = device;
  while (!rest.empty()) {
    const std::size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (part.empty()) continue;
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos) return bad(fmt::format("'{}' has no ':'", part));
    const std::string_view key = part.substr(0, colon);
    const std::string_view value = part.substr(colon + 1);
    int index = 0;
    if (key == "rank" || key == "task") {
      if (!parse_index(value, index)) {
        return bad(all_digits(value) ? fmt::format("{} '{}' is past the largest, {}", key, value,
                                                   std::numeric_limits<int>::max())
                                     : fmt::format("{} '{}' is not a number >= 0", key, value));
      }
      if ((key == "rank" && has_task) || (key == "task" && has_rank) ||
          (key == "rank" ? has_rank : has_task)) {
        return bad("it names the rank twice");
      }
      (key == "rank" ? has_rank : has_task) = true;
      out.rank = index;
    } else if (key == "job") {
      if (!is_job_name(value)) return bad(fmt::format("job '{}'", value));
      out.job = std::string(value);
    } else if (key == "replica") {
      if (!parse_index(value, index)) return bad(fmt::format("replica '{}'", value));
    } else if (key == "device") {
      // "device:CPU:0" or "device:CPU".
      const std::size_t second = value.find(':');
      const std::string_view type = value.substr(0, second);
      if (!is_device_type(type) ||
          (second != std::string_view::npos && !parse_index(value.substr(second + 1), index))) {
        return bad(fmt::format("device '{}'", value));
      }
    } else if ((key == "cpu" || key == "CPU" || key == "gpu" || key == "GPU") &&
               parse_index(value, index)) {
      // The legacy "/cpu:0" and the bare "CPU:0".
    } else {
      return bad(fmt::format("unknown part '{}'", part));
    }
  }
  return out;
}

Result<std::vector<int>> place(const Graph& g, int num_ranks) {
  if (num_ranks < 1) return invalid_argument("place: {} ranks; a world has at least 1", num_ranks);
  const auto n = static_cast<std::size_t>(g.num_nodes());
  std::vector<int> ranks(n, -1);
  // Explicit placements.
  std::string job;
  const Node* job_node = nullptr;
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node* node = g.node(id);
    if (node->device().empty()) continue;
    Result<DeviceName> parsed = parse_device(node->device());
    if (!parsed.is_ok()) return parsed.status().with_prefix(node->describe());
    const DeviceName& d = *parsed;
    if (!d.job.empty()) {
      if (job_node != nullptr && d.job != job) {
        return invalid_argument(
            "{} is placed on job '{}' and {} on job '{}': graphrun maps the tasks of one job to "
            "ranks",
            job_node->describe(), job, node->describe(), d.job);
      }
      job = d.job;
      job_node = node;
    }
    if (d.rank >= num_ranks) {
      return invalid_argument("{}: device '{}' names rank {}, and the world has {} rank(s)",
                              node->describe(), node->device(), d.rank, num_ranks);
    }
    ranks[static_cast<std::size_t>(id)] = d.rank;
  }
  // Variables and the nodes that name them (attr "var") share one rank.
  std::unordered_map<std::string_view, std::vector<const Node*>> groups;
  for (int id = 0; id < g.num_nodes(); ++id) {
    const Node* node = g.node(id);
    if (const std::string* var = variable_of(*node)) groups[*var].push_back(node);
  }
  std::vector<int> group_rank(n, -2);  // -2: in no group
  for (auto& [name, members] : groups) {
    const Node* fixed = nullptr;
    int rank = -1;
    for (const Node* m : members) {
      const int r = ranks[static_cast<std::size_t>(m->id())];
      if (r < 0) continue;
      if (fixed != nullptr && r != rank) {
        return invalid_argument(
            "{} is placed on rank {} and {} on rank {}, but both use variable '{}': a variable "
            "and the nodes that read or assign it run on one rank",
            fixed->describe(), rank, m->describe(), r, name);
      }
      fixed = m;
      rank = r;
    }
    for (const Node* m : members) group_rank[static_cast<std::size_t>(m->id())] = rank;
  }
  // The rest in id order (data inputs come first): with the first data
  // input, else rank 0. An unplaced variable group takes the rank its
  // first member gets that way.
  for (int id = 0; id < g.num_nodes(); ++id) {
    const auto i = static_cast<std::size_t>(id);
    if (ranks[i] >= 0) continue;
    if (group_rank[i] >= 0) {
      ranks[i] = group_rank[i];
      continue;
    }
    const Node* node = g.node(id);
    int rank = 0;
    if (node->num_inputs() > 0) rank = ranks[static_cast<std::size_t>(node->input(0).node()->id())];
    if (group_rank[i] == -1) {
      // The first member of an unplaced group fixes the whole group.
      for (const Node* m : groups[*variable_of(*node)]) {
        group_rank[static_cast<std::size_t>(m->id())] = rank;
      }
    }
    ranks[i] = rank;
  }
  return ranks;
}

}  // namespace graphrun
