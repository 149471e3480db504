// Writes mpi_control_fuzz's seed corpus (run at build time by
// tests/fuzz/CMakeLists.txt):
//
//   graphrun_fuzz_make_mpi_seeds <out dir>
//
// Real payloads as a driver writes them, each after the byte that picks its
// reader (mpi_control_fuzz.cc): rank 1's part of two graphs cut across
// ranks, an extend's delta with one stub of each kind, Writer fields
// (numbers, strings, tensors of three dtypes, statuses), and messages on a
// Recv's tag as a Send writes them (compact, inline, followed by their
// bytes, stale, of the wrong dtype).
#include <graphrun/graphrun.h>
#include <graphrun/mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/ship.h"
#include "scheduler/mpi/src/wire.h"
#include "tests/mpi/payload_graphs.h"

namespace graphrun::fuzz {
namespace {

using mpi::internal::Stub;
using mpi::internal::Writer;

[[noreturn]] void fail(const Status& s) {
  std::fprintf(stderr, "graphrun_fuzz_make_mpi_seeds: %s\n", s.to_string().c_str());
  std::exit(1);
}

void write(const std::filesystem::path& dir, const std::string& name, char reader,
           const std::string& payload) {
  std::ofstream out(dir / name, std::ios::binary);
  out << reader << payload;
  if (!out) fail(internal_error("cannot write {}", (dir / name).string()));
}

// A chain that crosses from rank 0 to 1 and on to 2.
Graph chain_across_three() {
  Graph g;
  Output a = ops::Placeholder(g, DType::kInt32, Shape{3}, "a");
  Output b;
  {
    auto scope = g.device("/rank:1");
    b = ops::Add(g, a, ops::Const(g, Tensor{1, 2, 3}, "k"), "b");
  }
  {
    auto scope = g.device("/rank:2");
    ops::Identity(g, b, "c");
  }
  return g;
}

// A message on a Recv's tag (mpi_control_fuzz.cc's reader 3): the Recv's
// dtype (an index into float32, float64, int32, int64, bool), its declared
// shape (a rank, or 9 for unknown, then a byte per dimension), its key
// hash and invocation, then the message as a Send writes it.
void write_packet_seed(const std::filesystem::path& dir, const std::string& name,
                       const Tensor& sent, uint8_t dtype_index, const std::string& declared,
                       uint64_t recv_hash, uint64_t send_hash, uint64_t invocation) {
  mpi::internal::Packet p;
  const std::size_t bytes = mpi::internal::write_packet(p, sent, send_hash, invocation);
  std::string payload(1, static_cast<char>(dtype_index));
  payload += declared;
  payload.append(reinterpret_cast<const char*>(&recv_hash), sizeof recv_hash);
  payload.append(reinterpret_cast<const char*>(&invocation), sizeof invocation);
  payload.append(reinterpret_cast<const char*>(&p), bytes);
  write(dir, name, '\3', payload);
}

void write_packet_seeds(const std::filesystem::path& dir) {
  const uint64_t hash = mpi::internal::hash_key("tensor x");
  const uint64_t other = mpi::internal::hash_key("tensor y");
  // Declared shapes: a scalar, [3], [?, 4] and unknown.
  const std::string scalar(1, '\0');
  const std::string three("\1\3", 2);
  const std::string rows_of_four("\2\xff\4", 3);
  const std::string unknown(1, '\11');
  write_packet_seed(dir, "packet_compact_float", Tensor(2.5f), 0, scalar, hash, hash, 5000);
  write_packet_seed(dir, "packet_compact_bool", Tensor(true), 4, unknown, hash, hash, 7);
  write_packet_seed(dir, "packet_inline_int32", Tensor{1, 2, 3}, 2, three, hash, hash, 3);
  write_packet_seed(dir, "packet_follows_float64", Tensor(DType::kFloat64, Shape{20, 4}), 1,
                    rows_of_four, hash, hash, 9);
  write_packet_seed(dir, "packet_stale_large", Tensor(DType::kInt64, Shape{100}), 3, unknown, hash,
                    other, 2);
  write_packet_seed(dir, "packet_wrong_dtype", Tensor{1.0f, 2.0f, 3.0f}, 2, three, hash, hash, 11);
}

void write_seeds(const std::filesystem::path& dir) {
  mpi::register_ops(OpRegistry::global());
  std::filesystem::create_directories(dir);
  auto write_part = [&](const Graph& graph, int ranks, const std::string& name) {
    if (!graph.status().is_ok()) fail(graph.status());
    Result<std::string> part = mpi::internal::encode_part(graph, ranks, 1, 42);
    if (!part.is_ok()) fail(part.status());
    write(dir, name, '\0', *part);
  };
  write_part(testing::product_across_two_ranks(), 2, "part_of_two_ranks");
  write_part(chain_across_three(), 3, "part_of_three_ranks");

  Graph delta;
  Output a = ops::Const(delta, Tensor(2.0f), "a");
  ops::Identity(delta, a, "b");
  const std::vector<Stub> stubs{{.name = "s0", .kind = Stub::kTensor, .ref = "x:0", .edge = 0},
                                {.name = "s1", .kind = Stub::kNode, .ref = "y", .edge = 0},
                                {.name = "s2", .kind = Stub::kRecv, .ref = "", .edge = 3},
                                {.name = "s3", .kind = Stub::kStep, .ref = "", .edge = 0}};
  Result<std::string> d = mpi::internal::encode_delta(delta, stubs);
  if (!d.is_ok()) fail(d.status());
  write(dir, "delta", '\1', *d);

  // Programs: 2 bits a field, the lowest first (0 u64, 1 string, 2 tensor,
  // 3 status).
  write(dir, "fields_number_string_tensor_status", '\2',
        std::string(1, static_cast<char>(0b11'10'01'00)) +
            Writer()
                .u64(7)
                .str("rank 1")
                .tensor(Tensor{1.0f, 2.0f})
                .status(invalid_argument("node 'x' (Placeholder): no feed"))
                .take());
  write(dir, "fields_tensors_and_ok", '\2',
        std::string(1, static_cast<char>(0b11'10'10'10)) +
            Writer()
                .tensor(Tensor{int64_t{1}, int64_t{-2}, int64_t{3}})
                .tensor(Tensor(DType::kInt32, Shape{2, 0}))
                .tensor(Tensor(true))
                .status(Status::ok())
                .take());
  write_packet_seeds(dir);
}

}  // namespace
}  // namespace graphrun::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: graphrun_fuzz_make_mpi_seeds <out dir>\n");
    return 2;
  }
  graphrun::fuzz::write_seeds(argv[1]);
  return 0;
}
