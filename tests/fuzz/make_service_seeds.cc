// Writes the service fuzzer's seed corpus (run at build time by
// tests/fuzz/CMakeLists.txt):
//
//   graphrun_fuzz_make_service_seeds <tf-graphdefs dir> <out dir>
//
// Each seed is a realistic call sequence in service_fuzz_input.h's format
// over the TensorFlow fixtures and small graphs of its own: create, run
// with feeds, variables initialised by a target, a partial run set up and
// fed in two calls, extend (and a stale extend), the session and partial
// run limits, cancellation, close, and requests the service must refuse.
// Handles are left empty for the fuzzer to fill from earlier responses.
#include <graphrun/graph_def.h>
#include <graphrun/graphrun.h>
#include <graphrun/v1/session_service.pb.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "service/src/request_handler.h"
#include "tests/fuzz/service_fuzz_input.h"

namespace graphrun::fuzz {
namespace {

using service_internal::Method;

class Sequence {
 public:
  Sequence& add(Method method, const google::protobuf::Message& request, uint8_t flags = 0) {
    calls_.push_back(FuzzCall{static_cast<uint8_t>(static_cast<uint8_t>(method) | flags),
                              request.SerializeAsString()});
    return *this;
  }
  Sequence& raw(Method method, std::string bytes) {
    calls_.push_back(
        FuzzCall{static_cast<uint8_t>(static_cast<uint8_t>(method) | kRaw), std::move(bytes)});
    return *this;
  }
  std::string bytes() const { return encode_calls(calls_); }

 private:
  std::vector<FuzzCall> calls_;
};

uint8_t session_back(int n) { return static_cast<uint8_t>(n << kSessionShift); }

v1::GraphDef must(Result<v1::GraphDef> def, std::string_view what) {
  if (!def.is_ok()) {
    std::fprintf(stderr, "make_service_seeds: %.*s: %s\n", static_cast<int>(what.size()),
                 what.data(), def.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(def).value();
}

v1::GraphDef fixture(const std::filesystem::path& dir, const std::string& name) {
  std::ifstream in(dir / (name + ".pbtxt"), std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return must(parse_graph_def(text.str(), GraphDefFormat::kText), name);
}

v1::CreateSessionRequest create(const v1::GraphDef& def, int threads = 1) {
  v1::CreateSessionRequest request;
  *request.mutable_graph_def() = def;
  request.mutable_config()->set_inter_op_threads(threads);
  return request;
}

template <typename Feeds>
void feed(Feeds& feeds, std::string_view name, const Tensor& value) {
  v1::NamedTensorProto* f = feeds.Add();
  f->set_name(std::string(name));
  *f->mutable_tensor() = tensor_to_proto(value);
}

v1::RunRequest run(std::initializer_list<std::string_view> fetches,
                   std::initializer_list<std::string_view> targets = {}) {
  v1::RunRequest request;
  for (std::string_view f : fetches) request.add_fetch(std::string(f));
  for (std::string_view t : targets) request.add_target(std::string(t));
  return request;
}

v1::PartialRunSetupRequest setup(std::initializer_list<std::string_view> feeds,
                                 std::initializer_list<std::string_view> fetches) {
  v1::PartialRunSetupRequest request;
  for (std::string_view f : feeds) request.add_feed(std::string(f));
  for (std::string_view f : fetches) request.add_fetch(std::string(f));
  return request;
}

v1::PartialRunRequest partial_run(std::initializer_list<std::string_view> fetches) {
  v1::PartialRunRequest request;
  for (std::string_view f : fetches) request.add_fetch(std::string(f));
  return request;
}

// A float[2] placeholder x alone.
v1::GraphDef placeholder_only() {
  Graph g;
  ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
  return must(graph_to_graph_def(g), "placeholder graph");
}

// The nodes of `grown` that `base` does not have (an ExtendSession's graph).
v1::GraphDef nodes_after(const v1::GraphDef& base, const Graph& grown) {
  const v1::GraphDef full = must(graph_to_graph_def(grown), "grown graph");
  v1::GraphDef out;
  for (const v1::NodeDef& node : full.node()) {
    bool known = false;
    for (const v1::NodeDef& old : base.node()) known = known || old.name() == node.name();
    if (!known) *out.add_node() = node;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> seeds(const std::filesystem::path& fixtures) {
  std::vector<std::pair<std::string, std::string>> out;
  const v1::CloseSessionRequest close;
  const v1::ListSessionsRequest list;

  {  // Const + Placeholder -> Add, fed; a traced run; a run missing its feed.
    v1::RunRequest fed = run({"add"});
    feed(*fed.mutable_feed(), "x", Tensor{1.0f, 2.0f, 3.0f});
    v1::RunRequest traced = fed;
    traced.mutable_options()->set_trace(true);
    traced.mutable_options()->set_timeout_ms(1000);
    out.emplace_back("add_run", Sequence()
                                    .add(Method::kCreateSession,
                                         create(fixture(fixtures, "const_plus_placeholder_add")))
                                    .add(Method::kRun, fed)
                                    .add(Method::kRun, traced)
                                    .add(Method::kRun, run({"add"}))
                                    .add(Method::kCloseSession, close)
                                    .bytes());
  }
  {  // Sum over axis 1; list; a run after close.
    out.emplace_back("sum_list", Sequence()
                                     .add(Method::kCreateSession,
                                          create(fixture(fixtures, "const_sum_axis1"), 2))
                                     .add(Method::kRun, run({"Sum", "alpha"}))
                                     .add(Method::kListSessions, list)
                                     .add(Method::kCloseSession, close)
                                     .add(Method::kRun, run({"Sum"}))
                                     .add(Method::kListSessions, list)
                                     .bytes());
  }
  {  // A partial run fed in two calls, a second one cancelled.
    v1::PartialRunRequest first = partial_run({});
    feed(*first.mutable_feed(), "placeholder_0", Tensor::filled(Shape{1, 4, 4, 1}, 1.0f));
    v1::PartialRunRequest second = partial_run({"result"});
    feed(*second.mutable_feed(), "placeholder_1", Tensor::filled(Shape{1, 4, 4, 4}, 2.0f));
    const v1::PartialRunSetupRequest both = setup({"placeholder_0", "placeholder_1"}, {"result"});
    out.emplace_back("partial_run",
                     Sequence()
                         .add(Method::kCreateSession,
                              create(fixture(fixtures, "placeholder_with_default_broadcast_add")))
                         .add(Method::kPartialRunSetup, both)
                         .add(Method::kPartialRun, first)
                         .add(Method::kPartialRun, second)
                         .add(Method::kPartialRunSetup, both)
                         .add(Method::kPartialRun, first)
                         .add(Method::kCancelPartialRun, v1::CancelPartialRunRequest())
                         .add(Method::kPartialRun, second)
                         .add(Method::kListSessions, list)
                         .add(Method::kCloseSession, close)
                         .bytes());
  }
  {  // Variables: c before init fails, then init, then c = 30.
    out.emplace_back("variables", Sequence()
                                      .add(Method::kCreateSession,
                                           create(fixture(fixtures, "variables_a_times_b_init")))
                                      .add(Method::kRun, run({"c"}))
                                      .add(Method::kRun, run({}, {"init"}))
                                      .add(Method::kRun, run({"c", "a/read"}))
                                      .add(Method::kCloseSession, close)
                                      .bytes());
  }
  {  // TensorFlow's profiler graph: random initialisers, two Conv2D.
    out.emplace_back("conv2d",
                     Sequence()
                         .add(Method::kCreateSession,
                              create(fixture(fixtures, "tf_profiler_testdata_variables_conv2d"), 2))
                         .add(Method::kRun, run({}, {"init"}))
                         .add(Method::kRun, run({"Conv2D_1", "ScalarW/read"}))
                         .add(Method::kPartialRunSetup, setup({}, {"Conv2D"}))
                         .add(Method::kPartialRun, partial_run({"Conv2D"}))
                         .add(Method::kCloseSession, close)
                         .bytes());
  }
  {  // Extend twice (versions filled in), a stale extend, runs on each version.
    Graph g;
    const Output x = ops::Placeholder(g, DType::kFloat32, Shape{2}, "x");
    const v1::GraphDef v0 = must(graph_to_graph_def(g), "x");
    const Output y = ops::Mul(g, x, x, "y");
    const v1::GraphDef v1_nodes = nodes_after(v0, g);
    const v1::GraphDef v1_def = must(graph_to_graph_def(g), "x, y");
    ops::Add(g, y, ops::Const(g, Tensor{0.5f, 0.25f}, "half"), "z");
    const v1::GraphDef v2_nodes = nodes_after(v1_def, g);
    v1::ExtendSessionRequest first;
    *first.mutable_graph_def() = v1_nodes;
    v1::ExtendSessionRequest second;
    *second.mutable_graph_def() = v2_nodes;
    v1::ExtendSessionRequest stale = second;
    stale.set_current_graph_version(7);
    v1::RunRequest run_y = run({"y"});
    feed(*run_y.mutable_feed(), "x", Tensor{3.0f, 4.0f});
    v1::RunRequest run_z = run({"z", "y"});
    feed(*run_z.mutable_feed(), "x", Tensor{1.0f, -1.0f});
    out.emplace_back("extend", Sequence()
                                   .add(Method::kCreateSession, create(v0))
                                   .add(Method::kRun, run_y)
                                   .add(Method::kExtendSession, first)
                                   .add(Method::kRun, run_y)
                                   .add(Method::kExtendSession, stale)
                                   .add(Method::kExtendSession, second)
                                   .add(Method::kExtendSession, second)
                                   .add(Method::kRun, run_z)
                                   .add(Method::kListSessions, list)
                                   .add(Method::kCloseSession, close)
                                   .bytes());
  }
  {  // The limits: five sessions (four allowed), five partial runs (four).
    Sequence limits;
    const v1::CreateSessionRequest small = create(placeholder_only());
    for (int i = 0; i < 5; ++i) limits.add(Method::kCreateSession, small);
    const v1::PartialRunSetupRequest pr = setup({"x"}, {"x"});
    for (int i = 0; i < 5; ++i) limits.add(Method::kPartialRunSetup, pr);
    limits.add(Method::kListSessions, list)
        .add(Method::kCancelPartialRun, v1::CancelPartialRunRequest(), kOlderPartialRun)
        .add(Method::kPartialRunSetup, pr);
    for (int i = 3; i >= 0; --i) limits.add(Method::kCloseSession, close, session_back(i));
    limits.add(Method::kCreateSession, small).add(Method::kListSessions, list);
    out.emplace_back("limits", limits.bytes());
  }
  {  // Tensors past the fuzzer's memory cap (ResourceExhausted), and small ones.
    Graph g;
    const Output dims = ops::Placeholder(g, DType::kInt64, Shape{2}, "dims");
    ops::Fill(g, dims, ops::Const(g, Tensor(1.0f), "one"), "big");
    const Output col = ops::Placeholder(g, DType::kFloat32, Shape{Shape::kUnknownDim, 1}, "col");
    const Output row = ops::Placeholder(g, DType::kFloat32, Shape{1, Shape::kUnknownDim}, "row");
    ops::Add(g, col, row, "outer");
    ops::MatMul(g, col, row, {}, "mm");
    const auto fill = [](int64_t a, int64_t b) {
      v1::RunRequest request = run({"big"});
      feed(*request.mutable_feed(), "dims", Tensor{a, b});
      return request;
    };
    const auto outer = [](int64_t n) {
      v1::RunRequest request = run({"outer", "mm"});
      feed(*request.mutable_feed(), "col", Tensor::filled(Shape{n, 1}, 0.5f));
      feed(*request.mutable_feed(), "row", Tensor::filled(Shape{1, n}, 2.0f));
      return request;
    };
    // A Const declaring float[1 << 20] with one value (4 MiB once decoded).
    Graph c;
    ops::Const(c, Tensor(1.0f), "wide");
    v1::GraphDef wide = must(graph_to_graph_def(c), "wide");
    v1::TensorProto& value = (*wide.mutable_node(0)->mutable_attr())["value"].mutable_tensor()[0];
    value.clear_tensor_content();
    value.clear_float_val();
    value.add_float_val(1.0f);
    value.mutable_tensor_shape()->clear_dim();
    value.mutable_tensor_shape()->add_dim()->set_size(int64_t{1} << 20);
    out.emplace_back("big_tensors",
                     Sequence()
                         .add(Method::kCreateSession, create(must(graph_to_graph_def(g), "big"), 2))
                         .add(Method::kRun, fill(4096, 4096))
                         .add(Method::kRun, fill(2, 3))
                         .add(Method::kRun, outer(4096))
                         .add(Method::kRun, outer(8))
                         .add(Method::kCreateSession, create(wide))
                         .add(Method::kCloseSession, close)
                         .bytes());
  }
  {  // Requests the service refuses, then one it serves.
    v1::CreateSessionRequest threads = create(placeholder_only(), 3);
    v1::CreateSessionRequest negative = create(placeholder_only());
    negative.mutable_config()->set_plan_cache_capacity(-1);
    v1::CreateSessionRequest idle = create(placeholder_only());
    idle.mutable_config()->set_partial_run_idle_timeout_ms(1);
    idle.mutable_config()->set_max_open_partial_runs(1);
    v1::RunRequest wrong_dtype = run({"x"});
    feed(*wrong_dtype.mutable_feed(), "x", Tensor{1, 2});
    // float[20000] from one repeated value: past max_tensor_bytes_per_request
    // before it is decoded.
    v1::RunRequest too_big = run({"x"});
    v1::NamedTensorProto* big = too_big.add_feed();
    big->set_name("x");
    big->mutable_tensor()->set_dtype(v1::DT_FLOAT);
    big->mutable_tensor()->mutable_tensor_shape()->add_dim()->set_size(20000);
    big->mutable_tensor()->add_float_val(1.0f);
    v1::RunRequest negative_timeout = run({"x"});
    negative_timeout.mutable_options()->set_timeout_ms(-1);
    v1::RunRequest fed = run({"x"});
    feed(*fed.mutable_feed(), "x", Tensor{5.0f, 6.0f});
    v1::CancelPartialRunRequest unknown;
    unknown.set_partial_run_handle("pr-00000000000000000000000000000000");
    out.emplace_back("refused", Sequence()
                                    .add(Method::kCreateSession, threads)
                                    .add(Method::kCreateSession, negative)
                                    .add(Method::kCreateSession, idle)
                                    .add(Method::kRun, wrong_dtype)
                                    .add(Method::kRun, too_big)
                                    .add(Method::kRun, negative_timeout)
                                    .add(Method::kRun, fed, kStopped)
                                    .add(Method::kPartialRun, partial_run({"x"}))
                                    .add(Method::kCancelPartialRun, unknown)
                                    .add(Method::kPartialRunSetup, setup({"x"}, {"x"}))
                                    .add(Method::kPartialRunSetup, setup({"x"}, {"x"}))
                                    .raw(Method::kRun, std::string("\x0a\x05s-abc", 7))
                                    .raw(Method::kExtendSession, std::string("\x0a\xff", 2))
                                    .add(Method::kRun, fed)
                                    .bytes());
  }
  return out;
}

}  // namespace
}  // namespace graphrun::fuzz

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <tf-graphdefs dir> <out dir>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out_dir(argv[2]);
  std::filesystem::remove_all(out_dir);
  std::filesystem::create_directories(out_dir);
  for (const auto& [name, bytes] : graphrun::fuzz::seeds(argv[1])) {
    std::ofstream file(out_dir / (name + ".seq"), std::ios::binary);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file) {
      std::fprintf(stderr, "make_service_seeds: cannot write %s\n", name.c_str());
      return 1;
    }
  }
  return 0;
}
