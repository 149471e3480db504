#include "tools/graphrun/dot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <graphrun/session.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>

#include "tools/graphrun/cli.h"

extern char** environ;

namespace graphrun::cli {
namespace {

// Fill colours of the partial-run calls, cycled.
constexpr std::array<std::string_view, 6> kStepColors = {"#a6cee3", "#b2df8a", "#fdbf6f",
                                                         "#cab2d6", "#fb9a99", "#ffff99"};
constexpr std::string_view kNeededColor = "#d7e8fa";
constexpr std::string_view kFeedColor = "#fde9a9";

// A DOT double-quoted string.
std::string dot_quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

bool contains(const std::vector<Output>& list, const Output& o) {
  return std::find(list.begin(), list.end(), o) != list.end();
}

std::string_view shape_of_op(std::string_view op) {
  if (op == "Placeholder" || op == "PlaceholderWithDefault") return "ellipse";
  if (op == "Variable" || op == "VariableV2" || op == "VarHandleOp") return "cylinder";
  if (op == "Const") return "note";
  return "box";
}

std::string edge_label(const Output& o) {
  std::string label = fmt::format("{}{}", o.dtype(), o.shape());
  if (o.index() != 0) label = fmt::format(":{} {}", o.index(), label);
  return label;
}

std::string feed_id(const Output& o) { return "feed " + o.name(); }

// The directory of PATH holding an executable `name`, or "".
std::string find_on_path(std::string_view name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string_view rest(path);
  while (true) {
    const std::size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
    if (colon == std::string_view::npos) return "";
    rest.remove_prefix(colon + 1);
  }
}

// Renders `dot_text` to `svg_path` with `dot_binary -Tsvg`.
Status render_svg(const std::string& dot_binary, const std::string& dot_text,
                  const std::string& svg_path) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "graphrun-dot-XXXXXX").string();
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) return internal_error("--svg: cannot create a temporary file");
  const std::string input = tmpl;
  ::close(fd);
  const std::string errors = input + ".err";
  if (Status s = write_output_file(input, dot_text, "--svg: temporary file"); !s.is_ok()) {
    std::error_code ec;
    std::filesystem::remove(input, ec);
    return s;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errors.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::string a0 = dot_binary;
  std::string a1 = "-Tsvg";
  std::string a2 = "-o";
  std::string a3 = svg_path;
  std::string a4 = input;
  std::array<char*, 6> argv = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, dot_binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc == 0) ::waitpid(pid, &status, 0);
  std::string message;
  {
    std::ifstream e(errors);
    std::getline(e, message);
  }
  std::error_code ec;
  std::filesystem::remove(input, ec);
  std::filesystem::remove(errors, ec);
  if (rc != 0) return internal_error("--svg: cannot start '{}'", dot_binary);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return internal_error("--svg '{}': Graphviz dot failed: {}", svg_path,
                          message.empty() ? "no message" : message);
  }
  return Status::ok();
}

}  // namespace

std::vector<bool> needed_nodes(const Graph& graph, const DotSignature& sig) {
  std::vector<bool> needed(static_cast<std::size_t>(graph.num_nodes()), false);
  std::vector<const Node*> stack;
  auto want = [&](const Node* n) {
    if (!needed[static_cast<std::size_t>(n->id())]) {
      needed[static_cast<std::size_t>(n->id())] = true;
      stack.push_back(n);
    }
  };
  for (const Output& f : sig.fetches) {
    if (!contains(sig.feeds, f)) want(f.node());
  }
  for (const Node* t : sig.targets) want(t);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Output& in : n->inputs()) {
      if (!contains(sig.feeds, in)) want(in.node());
    }
    for (const Node* dep : n->control_inputs()) want(dep);
  }
  return needed;
}

std::string graph_to_dot(const Graph& graph, const DotMarks& marks) {
  const DotSignature& sig = marks.signature;
  std::vector<bool> needed;
  if (marks.has_signature) needed = needed_nodes(graph, sig);
  auto is_needed = [&](const Node* n) {
    return !marks.has_signature || needed[static_cast<std::size_t>(n->id())];
  };
  std::string out = "digraph \"graphrun\" {\n";
  out += "  graph [rankdir=TB, fontname=\"Helvetica\"];\n";
  out += "  node [fontname=\"Helvetica\", fontsize=10];\n";
  out += "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  for (int id = 0; id < graph.num_nodes(); ++id) {
    const Node* n = graph.node(id);
    std::string label = n->name() + "\n" + n->op();
    std::string classes = "graph-node";
    std::string style;
    if (marks.has_signature) classes += is_needed(n) ? " needed" : " pruned";
    for (const Output& f : sig.fetches) {
      if (f.node() == n && !contains(sig.feeds, f)) {
        classes += " fetched";
        break;
      }
    }
    if (std::find(sig.targets.begin(), sig.targets.end(), n) != sig.targets.end()) {
      classes += " target";
    }
    if (marks.traced) {
      const auto it = marks.step_of.find(n->name());
      if (it != marks.step_of.end()) {
        classes += fmt::format(" step{}", it->second);
        label += fmt::format("\ncall {}", it->second);
        style =
            fmt::format(", style=filled, fillcolor=\"{}\"",
                        kStepColors[static_cast<std::size_t>(it->second - 1) % kStepColors.size()]);
      } else {
        classes += " unexecuted";
        style = ", color=grey70, fontcolor=grey60";
      }
    } else if (marks.has_signature) {
      style = is_needed(n) ? fmt::format(", style=filled, fillcolor=\"{}\"", kNeededColor)
                           : std::string(", color=grey70, fontcolor=grey60");
    }
    if (classes.find(" fetched") != std::string::npos ||
        classes.find(" target") != std::string::npos) {
      style += ", penwidth=2";
    }
    out += fmt::format("  {} [label={}, shape={}, class={}{}];\n", dot_quoted(n->name()),
                       dot_quoted(label), shape_of_op(n->op()), dot_quoted(classes), style);
  }
  for (const Output& f : sig.feeds) {
    out += fmt::format(
        "  {} [label={}, shape=invhouse, class=\"feed\", style=filled, fillcolor=\"{}\"];\n",
        dot_quoted(feed_id(f)), dot_quoted(feed_id(f)), kFeedColor);
  }
  for (int id = 0; id < graph.num_nodes(); ++id) {
    const Node* n = graph.node(id);
    const bool live = marks.has_signature && is_needed(n);
    for (const Output& in : n->inputs()) {
      const bool fed = contains(sig.feeds, in);
      std::string attrs = fmt::format("label={}", dot_quoted(edge_label(in)));
      if (live && fed) {
        attrs += ", class=\"data fed\", style=dotted, color=grey60, fontcolor=grey60";
      } else if (marks.has_signature && !(live && is_needed(in.node()))) {
        attrs += ", class=\"data pruned\", color=grey70, fontcolor=grey60";
      } else {
        attrs += ", class=\"data\"";
      }
      out += fmt::format("  {} -> {} [{}];\n", dot_quoted(in.node()->name()), dot_quoted(n->name()),
                         attrs);
      if (live && fed) {
        out += fmt::format("  {} -> {} [label={}, class=\"feed\"];\n", dot_quoted(feed_id(in)),
                           dot_quoted(n->name()), dot_quoted(edge_label(in)));
      }
    }
    for (const Node* dep : n->control_inputs()) {
      std::string attrs = "style=dashed, class=\"control\"";
      if (marks.has_signature && !live) {
        attrs = "style=dashed, class=\"control pruned\", color=grey70";
      }
      out +=
          fmt::format("  {} -> {} [{}];\n", dot_quoted(dep->name()), dot_quoted(n->name()), attrs);
    }
  }
  if (marks.traced && marks.num_steps > 0) {
    out += "  subgraph \"cluster_legend\" {\n";
    out += "    label=\"partial_run calls\";\n";
    for (int k = 1; k <= marks.num_steps; ++k) {
      out += fmt::format(
          "    \"legend {}\" [label=\"call {}\", shape=box, class=\"legend\", style=filled, "
          "fillcolor=\"{}\"];\n",
          k, k, kStepColors[static_cast<std::size_t>(k - 1) % kStepColors.size()]);
    }
    // Invisible edges keep the boxes in call order.
    for (int k = 1; k < marks.num_steps; ++k) {
      out += fmt::format("    \"legend {}\" -> \"legend {}\" [style=invis, class=\"legend\"];\n", k,
                         k + 1);
    }
    out += "  }\n";
  }
  out += "}\n";
  return out;
}

int dot_command(const DotArgs& args, std::FILE* out, std::FILE* err) {
  auto fail = [&](int code, const std::string& message) {
    std::fflush(out);
    fmt::print(err, "graphrun: {}\n", one_line(message));
    return code;
  };
  const bool traced = !args.trace_partial.empty();
  if (traced && (!args.feeds.empty() || !args.fetches.empty() || !args.targets.empty())) {
    return fail(kExitUsage,
                "--trace-partial cannot be combined with --feed, --fetch or --target (its steps "
                "give the signature: --trace-partial 'feed x=1; fetch y')");
  }
  if (!args.init.empty() && !traced) {
    return fail(kExitUsage, "--init only applies with --trace-partial (which runs the graph)");
  }
  for (const std::string& f : args.feeds) {
    if (f.find('=') != std::string::npos) {
      return fail(kExitUsage, fmt::format("--feed '{}': dot takes tensor names only (no values; "
                                          "--trace-partial steps take values)",
                                          f));
    }
  }
  std::vector<StepSpec> steps;
  for (std::size_t k = 0; k < args.trace_partial.size(); ++k) {
    auto parsed = parse_step(args.trace_partial[k]);
    if (!parsed.is_ok()) {
      return fail(kExitUsage, fmt::format("--trace-partial step {} '{}': {}", k + 1,
                                          args.trace_partial[k], parsed.status().message()));
    }
    steps.push_back(std::move(*parsed));
  }
  std::string dot_binary;
  if (!args.svg.empty()) {
    dot_binary = find_on_path("dot");
    if (dot_binary.empty()) {
      return fail(kExitRuntime,
                  "--svg: Graphviz 'dot' not found on PATH (install graphviz, or write DOT with "
                  "-o OUT.dot)");
    }
  }

  auto graph = load_graph_file(args.graph);
  if (!graph.is_ok()) return fail(kExitRuntime, graph_file_error(args.graph, graph.status()));
  DotMarks marks;
  DotSignature& sig = marks.signature;
  std::vector<std::string> feed_names = args.feeds;
  std::vector<std::string> fetch_names = args.fetches;
  std::vector<std::string> target_names = args.targets;
  for (const StepSpec& step : steps) {
    for (const FeedArg& f : step.feeds) feed_names.push_back(f.name);
    fetch_names.insert(fetch_names.end(), step.fetches.begin(), step.fetches.end());
    target_names.insert(target_names.end(), step.targets.begin(), step.targets.end());
  }
  for (const std::string& f : feed_names) {
    auto o = graph->find_output(f);
    if (!o.is_ok()) {
      return fail(kExitRuntime, o.status().with_prefix(fmt::format("feed '{}'", f)).message());
    }
    if (!contains(sig.feeds, *o)) sig.feeds.push_back(*o);
  }
  for (const std::string& f : fetch_names) {
    Status s = check_fetch(*graph, f);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
    const Output o = *graph->find_output(f);
    if (!contains(sig.fetches, o)) sig.fetches.push_back(o);
  }
  for (const std::string& t : target_names) {
    Status s = check_target(*graph, t);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
    const Node* n = graph->find_node(parse_tensor_name(t)->node);
    if (std::find(sig.targets.begin(), sig.targets.end(), n) == sig.targets.end()) {
      sig.targets.push_back(n);
    }
  }
  marks.has_signature = !sig.feeds.empty() || !sig.fetches.empty() || !sig.targets.empty();

  if (traced) {
    std::vector<FeedList> step_feeds(steps.size());
    for (std::size_t k = 0; k < steps.size(); ++k) {
      for (const FeedArg& a : steps[k].feeds) {
        auto feed = resolve_feed(*graph, a);
        if (!feed.is_ok()) {
          return fail(kExitRuntime,
                      fmt::format("--trace-partial step {}: {}", k + 1, feed.status().message()));
        }
        step_feeds[k].push_back(std::move(*feed));
      }
    }
    for (const std::string& t : args.init) {
      Status s = check_target(*graph, t);
      if (!s.is_ok()) return fail(kExitRuntime, fmt::format("--init: {}", s.message()));
    }
    auto session = Session::create(*graph);
    if (!session.is_ok()) {
      return fail(kExitRuntime, fmt::format("session: {}", session.status().to_string()));
    }
    if (!args.init.empty()) {
      auto init =
          (*session)->run({}, {}, std::vector<TargetRef>(args.init.begin(), args.init.end()));
      if (!init.is_ok()) {
        return fail(kExitRuntime, fmt::format("--init failed: {}", init.status().to_string()));
      }
    }
    std::vector<TensorRef> setup_fetches;
    std::vector<TensorRef> setup_feeds;
    std::vector<TargetRef> setup_targets;
    for (const Output& o : sig.fetches) setup_fetches.emplace_back(o.name());
    for (const Output& o : sig.feeds) setup_feeds.emplace_back(o.name());
    for (const Node* n : sig.targets) setup_targets.emplace_back(n->name());
    RunOptions options;
    options.trace = true;
    auto handle = (*session)->partial_run_setup(setup_fetches, setup_feeds, setup_targets, options);
    if (!handle.is_ok()) {
      return fail(kExitRuntime,
                  fmt::format("partial run setup failed: {}", handle.status().to_string()));
    }
    for (std::size_t k = 0; k < steps.size(); ++k) {
      RunMetadata metadata;
      auto result = (*session)->partial_run(
          *handle, step_feeds[k],
          std::vector<TensorRef>(steps[k].fetches.begin(), steps[k].fetches.end()),
          std::vector<TargetRef>(steps[k].targets.begin(), steps[k].targets.end()), options,
          &metadata);
      if (!result.is_ok()) {
        return fail(kExitRuntime,
                    fmt::format("--trace-partial step {}: {}", k + 1, result.status().to_string()));
      }
      for (const NodeExecStats& s : metadata.step_stats) {
        marks.step_of.emplace(s.node, static_cast<int>(k + 1));
      }
    }
    marks.traced = true;
    marks.num_steps = static_cast<int>(steps.size());
  }

  const std::string text = graph_to_dot(*graph, marks);
  if (!args.out.empty()) {
    Status s = write_output_file(args.out, text, "-o");
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }
  if (!args.svg.empty()) {
    Status s = render_svg(dot_binary, text, args.svg);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }
  if (args.out.empty() && args.svg.empty()) fmt::print(out, "{}", text);
  std::fflush(out);
  return kExitOk;
}

}  // namespace graphrun::cli
