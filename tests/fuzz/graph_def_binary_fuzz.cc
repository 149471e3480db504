// libFuzzer target: bytes as a binary GraphDef. Import never crashes, and
// a graph that imports survives a binary round trip (fuzz_support.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  graphrun::fuzz::quiet_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  graphrun::fuzz::graph_def_round_trip(std::string_view(reinterpret_cast<const char*>(data), size),
                                       graphrun::GraphDefFormat::kBinary);
  return 0;
}
