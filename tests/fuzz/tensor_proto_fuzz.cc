// libFuzzer target: bytes as a binary TensorProto. tensor_from_proto never
// crashes, and a tensor it accepts comes back unchanged through
// tensor_to_proto -> tensor_from_proto: same dtype, shape and bytes, and
// the same proto when written again.
#include <graphrun/graph_def.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_support.h"

namespace graphrun::fuzz {
namespace {

void tensor_round_trip(const uint8_t* data, size_t size) {
  v1::TensorProto proto;
  if (size > INT_MAX || !proto.ParseFromArray(data, static_cast<int>(size))) return;
  if (expands_too_far_to_fuzz(proto)) return;
  Result<Tensor> tensor = tensor_from_proto(proto);
  if (!tensor.is_ok()) return;
  GRAPHRUN_FUZZ_CHECK(tensor->is_initialized());

  // The content, when given, is the tensor's bytes (little-endian host;
  // bools normalised to 0/1).
  const std::string& content = proto.tensor_content();
  if (!content.empty()) {
    GRAPHRUN_FUZZ_CHECK(content.size() == tensor->byte_size());
    const auto* bytes = static_cast<const unsigned char*>(tensor->raw_data());
    for (std::size_t i = 0; i < content.size(); ++i) {
      const auto expected = tensor->dtype() == DType::kBool
                                ? static_cast<unsigned char>(content[i] != 0)
                                : static_cast<unsigned char>(content[i]);
      GRAPHRUN_FUZZ_CHECK(bytes[i] == expected, "a byte differs from tensor_content");
    }
  }

  const v1::TensorProto written = tensor_to_proto(*tensor);
  GRAPHRUN_FUZZ_CHECK(written.dtype() == proto.dtype());
  GRAPHRUN_FUZZ_CHECK(written.tensor_shape().dim_size() == proto.tensor_shape().dim_size());
  for (int i = 0; i < written.tensor_shape().dim_size(); ++i) {
    GRAPHRUN_FUZZ_CHECK(written.tensor_shape().dim(i).size() == proto.tensor_shape().dim(i).size());
  }
  Result<Tensor> again = tensor_from_proto(written);
  GRAPHRUN_FUZZ_CHECK(again.is_ok(), again.status());
  GRAPHRUN_FUZZ_CHECK(again->dtype() == tensor->dtype());
  GRAPHRUN_FUZZ_CHECK(again->shape() == tensor->shape());
  GRAPHRUN_FUZZ_CHECK(same_bytes(*again, *tensor), "the round trip changed the tensor's bytes");
  GRAPHRUN_FUZZ_CHECK(tensor_to_proto(*again).SerializeAsString() == written.SerializeAsString());
}

}  // namespace
}  // namespace graphrun::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  graphrun::fuzz::quiet_protobuf_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  graphrun::fuzz::tensor_round_trip(data, size);
  return 0;
}
