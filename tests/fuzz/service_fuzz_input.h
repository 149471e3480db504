// The input format of the service fuzzer (service_fuzz.cc), shared with its
// seed generator (make_service_seeds.cc). An input is a sequence of calls,
// each:
//
//   1 byte   selector: bits 0-2 the method (service_internal::Method, the
//            order of session_service.proto), then the flags below
//   2 bytes  n, little-endian; 0xffff: the rest of the input
//   n bytes  the serialized request (fewer if the input ends first)
//
// Unless kRaw is set, a request that parses as its method's message gets
// its empty handle fields filled from earlier responses (so that mutated
// inputs reach real sessions): an empty session_handle becomes a session
// the sequence created (bits 4-5: 0 the newest, 1 the one before, ...), an
// empty partial_run_handle one of that session's partial runs (bit 6: 0
// the newest, 1 the one before), and an ExtendSession's zero
// current_graph_version that session's version. kStopped makes the call's
// stop token already stopped (a client that went away).
//
// Thread safety: functions without state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace graphrun::fuzz {

inline constexpr uint8_t kMethodMask = 0x07;
inline constexpr uint8_t kRaw = 0x08;
inline constexpr int kSessionShift = 4;  // 2 bits
inline constexpr uint8_t kOlderPartialRun = 0x40;
inline constexpr uint8_t kStopped = 0x80;

// Calls one input runs at most; the rest of the input is ignored.
inline constexpr std::size_t kMaxCallsPerInput = 32;
// This length means "the rest of the input" (a request of 64 KiB or more,
// such as a deeply nested one, as the last call).
inline constexpr std::size_t kRestOfInput = 0xffff;

struct FuzzCall {
  uint8_t selector = 0;
  std::string request;
};

// Splits an input into its calls (at most kMaxCallsPerInput).
inline std::vector<FuzzCall> decode_calls(std::string_view input) {
  std::vector<FuzzCall> calls;
  std::size_t at = 0;
  while (at < input.size() && calls.size() < kMaxCallsPerInput) {
    FuzzCall call;
    call.selector = static_cast<uint8_t>(input[at++]);
    std::size_t n = 0;
    for (int i = 0; i < 2 && at < input.size(); ++i, ++at) {
      n |= std::size_t{static_cast<uint8_t>(input[at])} << (8 * i);
    }
    n = n == kRestOfInput ? input.size() - at : std::min(n, input.size() - at);
    call.request.assign(input.substr(at, n));
    at += n;
    calls.push_back(std::move(call));
  }
  return calls;
}

// The bytes of `calls`. A request of kRestOfInput bytes or more ends the
// input: the calls after it are dropped.
inline std::string encode_calls(const std::vector<FuzzCall>& calls) {
  std::string out;
  for (const FuzzCall& call : calls) {
    const std::size_t n = std::min(call.request.size(), kRestOfInput);
    out += static_cast<char>(call.selector);
    out += static_cast<char>(n & 0xff);
    out += static_cast<char>(n >> 8);
    out += call.request;
    if (n == kRestOfInput) break;
  }
  return out;
}

}  // namespace graphrun::fuzz
