// libFuzzer target: the distributed session's control-message payloads, the
// bytes one rank reads from another (scheduler/mpi/src/control.h, ship.h).
// The first byte picks the reader, the rest is the payload:
//   0  decode_part(payload, rank 1, session 42): a worker's part of the
//      graph (a binary GraphDef with the step placeholder and the seed);
//      a part it accepts exports again as a GraphDef.
//   1  decode_delta: an extend's delta and its stubs; a delta it accepts
//      encodes again, and that decodes to the same nodes and stubs.
//   2  Reader: the fields the second byte's bits pick, in turn (u64,
//      string, tensor, status) until one is refused; every field read
//      writes back through Writer and reads back the same.
//   3  read_arrival: a message on a Recv's tag (wire.h). Bytes 1-2 pick the
//      Recv's dtype and declared shape (packet_recv() says how), the next
//      16 its key hash and invocation; the rest is the message, received
//      into a Packet as a Recv receives it. A value read has the Recv's
//      dtype and a shape its own accepts, and the message's bytes; a
//      refusal names the peer; bytes to drain are the header's.
// No MPI is initialised: the payloads are plain bytes. A part or delta
// whose GraphDef would expand a tensor past 16 MiB is skipped, as in the
// GraphDef targets.
#include <graphrun/graph_def.h>
#include <graphrun/mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/ship.h"
#include "scheduler/mpi/src/wire.h"
#include "tests/fuzz/fuzz_support.h"

namespace graphrun::fuzz {
namespace {

using mpi::internal::Reader;
using mpi::internal::Stub;
using mpi::internal::Writer;

// True when the GraphDef a part or delta payload carries after its leading
// fields (ship.cc's layout, read up to it by the caller) expands past
// kLargestFuzzedTensorBytes: such inputs are skipped, as the GraphDef
// targets skip them (a Const's typed value may ask for up to 2 GiB).
bool graph_expands_too_far(Reader& r) {
  Result<std::string> bytes = r.str();
  if (!bytes.is_ok()) return false;
  v1::GraphDef def;
  return def.ParseFromString(*bytes) && expands_too_far_to_fuzz(def);
}

bool part_too_large(std::string_view payload) {
  Reader r(payload);
  if (!r.str().is_ok() || !r.u64().is_ok() || !r.i64().is_ok()) return false;
  return graph_expands_too_far(r);
}

bool delta_too_large(std::string_view payload) {
  Reader r(payload);
  Result<uint64_t> n = r.u64();
  if (!n.is_ok()) return false;
  for (uint64_t k = 0; k < *n; ++k) {
    if (!r.str().is_ok() || !r.u64().is_ok() || !r.str().is_ok() || !r.i64().is_ok()) {
      return false;
    }
  }
  return graph_expands_too_far(r);
}

void part(std::string_view payload) {
  if (part_too_large(payload)) return verbose_rejection("size", Status::ok());
  auto decoded = mpi::internal::decode_part(payload, 1, 42);
  if (!decoded.is_ok()) return verbose_rejection("decode_part", decoded.status());
  Result<v1::GraphDef> exported = graph_to_graph_def((*decoded)->local());
  GRAPHRUN_FUZZ_CHECK(exported.is_ok(), exported.status());
}

bool same_stubs(const std::vector<Stub>& a, const std::vector<Stub>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].kind != b[i].kind || a[i].ref != b[i].ref ||
        a[i].edge != b[i].edge) {
      return false;
    }
  }
  return true;
}

void delta(std::string_view payload) {
  if (delta_too_large(payload)) return verbose_rejection("size", Status::ok());
  auto decoded = mpi::internal::decode_delta(payload);
  if (!decoded.is_ok()) return verbose_rejection("decode_delta", decoded.status());
  const auto& [graph, stubs] = *decoded;
  Result<std::string> again = mpi::internal::encode_delta(graph, stubs);
  GRAPHRUN_FUZZ_CHECK(again.is_ok(), again.status());
  auto redecoded = mpi::internal::decode_delta(*again);
  GRAPHRUN_FUZZ_CHECK(redecoded.is_ok(), redecoded.status());
  GRAPHRUN_FUZZ_CHECK(redecoded->first.num_nodes() == graph.num_nodes());
  GRAPHRUN_FUZZ_CHECK(same_stubs(redecoded->second, stubs), "the stubs changed on a round trip");
}

// Field `kind` (0 u64, 1 string, 2 tensor, 3 status) read from `r`; false
// once refused. What is read is written again and read back unchanged.
bool field(Reader& r, int kind) {
  switch (kind) {
    case 0: {
      Result<uint64_t> v = r.u64();
      if (!v.is_ok()) return false;
      const std::string bytes = Writer().u64(*v).take();
      GRAPHRUN_FUZZ_CHECK(*Reader(bytes).u64() == *v);
      return true;
    }
    case 1: {
      Result<std::string> s = r.str();
      if (!s.is_ok()) return false;
      const std::string bytes = Writer().str(*s).take();
      GRAPHRUN_FUZZ_CHECK(*Reader(bytes).str() == *s);
      return true;
    }
    case 2: {
      Result<Tensor> t = r.tensor();
      if (!t.is_ok()) return false;
      const std::string bytes = Writer().tensor(*t).take();
      Result<Tensor> back = Reader(bytes).tensor();
      GRAPHRUN_FUZZ_CHECK(back.is_ok(), back.status());
      GRAPHRUN_FUZZ_CHECK(back->dtype() == t->dtype() && back->shape() == t->shape());
      GRAPHRUN_FUZZ_CHECK(same_bytes(*back, *t), "a tensor's bytes changed on a round trip");
      return true;
    }
    default: {
      // A malformed status reads as Internal; either way it writes back.
      const Status s = r.status();
      const std::string bytes = Writer().status(s).take();
      const Status back = Reader(bytes).status();
      GRAPHRUN_FUZZ_CHECK(back.code() == s.code() && back.message() == s.message(), back);
      return s.code() != StatusCode::kInternal;
    }
  }
}

void fields(uint8_t program, std::string_view payload) {
  Reader r(payload);
  for (int i = 0; i < 4; ++i) {
    if (!field(r, (program >> (2 * i)) & 3)) return;
  }
}

// The Recv's declared shape from `code` and the dimension bytes after it:
// code % 10 == 9 is an unknown shape, else a rank of code % 10 (up to
// kMaxRank), each dimension a byte: 0xff unknown, else byte % 9.
Shape declared_shape(uint8_t code, std::string_view& rest) {
  const int rank = code % 10;
  if (rank == 9) return Shape::unknown();
  Shape shape;
  for (int i = 0; i < rank && !rest.empty(); ++i) {
    const auto b = static_cast<uint8_t>(rest[0]);
    rest.remove_prefix(1);
    shape.add_dim(b == 0xff ? Shape::kUnknownDim : b % 9);
  }
  return shape;
}

uint64_t take_u64(std::string_view& rest) {
  uint64_t v = 0;
  const std::size_t n = std::min(rest.size(), sizeof v);
  std::memcpy(&v, rest.data(), n);
  rest.remove_prefix(n);
  return v;
}

void packet_recv(std::string_view rest) {
  using mpi::internal::Arrival;
  using mpi::internal::kCompactMarker;
  using mpi::internal::kCompactWord;
  using mpi::internal::kInlineBytes;
  using mpi::internal::Packet;
  if (rest.size() < 2) return;
  static constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                                      DType::kInt64, DType::kBool};
  const DType dtype = kDtypes[static_cast<uint8_t>(rest[0]) % 5];
  const auto shape_code = static_cast<uint8_t>(rest[1]);
  rest.remove_prefix(2);
  const Shape declared = declared_shape(shape_code, rest);
  mpi::internal::RecvExpectation e;
  e.key_hash = take_u64(rest);
  e.invocation = take_u64(rest);
  e.dtype = dtype;
  e.shape = &declared;
  e.peer = 1;
  // Received as a Recv receives: the marker first, then the message over
  // the start of the packet (a longer one is cut, as MPI would refuse it).
  Packet p;
  std::memset(&p, 0, sizeof p);
  p.header.bytes = kCompactMarker;
  const std::size_t n = std::min(rest.size(), sizeof p);
  std::memcpy(&p, rest.data(), n);
  const bool compact = p.header.bytes == kCompactMarker;
  // A header whose byte count agrees with its shape is allocated for: the
  // fuzzer stays within the sizes the GraphDef targets allow.
  if (!compact && p.header.bytes > static_cast<uint64_t>(kLargestFuzzedTensorBytes)) {
    return verbose_rejection("size", Status::ok());
  }
  const Arrival a = mpi::internal::read_arrival(p, e);
  const uint64_t bytes = p.header.bytes;
  switch (a.kind) {
    case Arrival::Kind::kStale:
      GRAPHRUN_FUZZ_CHECK(a.status.is_ok(), a.status);
      GRAPHRUN_FUZZ_CHECK(a.follows == 0 || (!compact && a.follows == bytes &&
                                             bytes > kInlineBytes && bytes < INT32_MAX));
      return;
    case Arrival::Kind::kRefused:
      GRAPHRUN_FUZZ_CHECK(!a.status.is_ok());
      GRAPHRUN_FUZZ_CHECK(a.status.message().find("rank 1") != std::string::npos, a.status);
      GRAPHRUN_FUZZ_CHECK(a.follows <= static_cast<uint64_t>(INT32_MAX));
      GRAPHRUN_FUZZ_CHECK(a.follows == 0 || (!compact && bytes > kInlineBytes));
      return;
    case Arrival::Kind::kValue:
    case Arrival::Kind::kFollows: break;
  }
  GRAPHRUN_FUZZ_CHECK(a.status.is_ok(), a.status);
  const Tensor& v = a.value;
  GRAPHRUN_FUZZ_CHECK(v.dtype() == dtype);
  GRAPHRUN_FUZZ_CHECK(v.shape().is_fully_defined() && v.shape().is_compatible_with(declared),
                      v.shape().to_string());
  if (a.kind == Arrival::Kind::kFollows) {
    GRAPHRUN_FUZZ_CHECK(!compact && bytes > kInlineBytes && v.byte_size() == bytes);
    return;
  }
  // The value's bytes are the message's (a bool's made 0 or 1).
  const char* sent = compact ? reinterpret_cast<const char*>(&p) + kCompactWord : p.payload;
  GRAPHRUN_FUZZ_CHECK(compact ? v.num_elements() == 1 : v.byte_size() == bytes);
  const auto* got = static_cast<const unsigned char*>(v.raw_data());
  for (std::size_t i = 0; i < v.byte_size(); ++i) {
    const auto b = static_cast<unsigned char>(sent[i]);
    GRAPHRUN_FUZZ_CHECK(got[i] == (dtype == DType::kBool ? (b != 0 ? 1 : 0) : b),
                        "a received value's bytes differ from the message's");
  }
}

}  // namespace
}  // namespace graphrun::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  graphrun::fuzz::quiet_protobuf_logs();
  // The partition's Send and Recv ops, as a worker registers them.
  graphrun::mpi::register_ops(graphrun::OpRegistry::global());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: graphrun::fuzz::part(rest); break;
    case 1: graphrun::fuzz::delta(rest); break;
    case 2:
      if (!rest.empty()) graphrun::fuzz::fields(static_cast<uint8_t>(rest[0]), rest.substr(1));
      break;
    default: graphrun::fuzz::packet_recv(rest); break;
  }
  return 0;
}
