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
// No MPI is initialised: the payloads are plain bytes. A part or delta
// whose GraphDef would expand a tensor past 16 MiB is skipped, as in the
// GraphDef targets.
#include <graphrun/graph_def.h>
#include <graphrun/mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/mpi/src/control.h"
#include "scheduler/mpi/src/ship.h"
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
  switch (data[0] % 3) {
    case 0: graphrun::fuzz::part(rest); break;
    case 1: graphrun::fuzz::delta(rest); break;
    default:
      if (!rest.empty()) graphrun::fuzz::fields(static_cast<uint8_t>(rest[0]), rest.substr(1));
      break;
  }
  return 0;
}
