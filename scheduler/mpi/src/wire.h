// What graphrun's MPI messages share: the header that precedes a tensor's
// bytes, and the tags that keep unrelated messages apart. A message's tag
// is a key's 20-bit id (the collective's key, a Send/Recv pair's tensor
// name) and 10 bits of the invocation number on that key; the header
// repeats the key's full hash and the invocation, checked on receipt.
#pragma once

#include <graphrun/mpi.h>
#include <graphrun/op_kernel.h>
#include <graphrun/status.h>
#include <graphrun/tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace graphrun::mpi::internal {

inline constexpr int kKeyBits = 20;
inline constexpr int kInvocationBits = 10;
// Hashed keys take the lower half of the key ids; the edges of a
// partitioned graph (numbered the same on every rank) the upper half.
inline constexpr int kMaxEdges = 1 << (kKeyBits - 1);

// FNV-1a of `key`.
uint64_t hash_key(std::string_view key);

// A hashed key's id (its tag's upper bits), and an invocation's lower
// bits (the tag's lower bits).
inline int key_id(uint64_t hash) {
  return static_cast<int>((hash ^ (hash >> 32)) & ((uint64_t{1} << (kKeyBits - 1)) - 1));
}
inline int low_bits(uint64_t invocation) {
  return static_cast<int>(invocation & ((uint64_t{1} << kInvocationBits) - 1));
}
// The tag of invocation `invocation` of the key hashed `hash`.
inline int tag_of(uint64_t hash, uint64_t invocation) {
  return key_id(hash) << kInvocationBits | low_bits(invocation);
}

// The tag of cross-rank edge `edge` (< kMaxEdges) in step `step`.
inline int edge_tag(int edge, uint64_t step) {
  return (kMaxEdges + edge) << kInvocationBits | low_bits(step);
}

// Two keys of one process on the same tag bits would mix their messages:
// the second key to claim an id is refused (InvalidArgument naming both).
// `what` says what kind of key it is ("collective key", "tensor name").
Status claim_key_id(const std::string& key, uint64_t hash, std::string_view what);

// What precedes each tensor.
struct Header {
  uint64_t key_hash = 0;
  uint64_t invocation = 0;
  int32_t dtype = 0;
  int32_t rank = 0;
  int64_t dims[Shape::kMaxRank] = {};
  uint64_t bytes = 0;
};

Header header_of(const Tensor& t, uint64_t key_hash, uint64_t invocation);

// A tensor of at most kInlineBytes travels in its header's message, right
// after the header (one message each way instead of two); a larger one
// follows its header as a second message of its raw bytes. Header and
// payload stay within Open MPI's smallest eager limit here (the self
// transport's 1 KiB, its own header included), so a small tensor's send
// completes without waiting for its receive.
inline constexpr std::size_t kInlineBytes = 512;
struct Packet {
  Header header;
  char payload[kInlineBytes];
};
static_assert(offsetof(Packet, payload) == sizeof(Header));

// A one-element tensor (a scalar, or any shape of ones) travels as a
// compact message instead: a 4-byte word, then the value's bytes. Messages
// of at most 8 bytes take Open MPI's shortest path between two processes
// here (a 4-byte ping-pong: 0.84-0.86 us a round trip, against 0.97-0.99
// at 12 bytes and 1.01-1.03 at 100, the full header's size), so a value of
// up to 4 bytes (float, int32, bool) crosses in 8 bytes. The word holds the
// dtype (4 bits), the rank (4 bits), bits 10-17 of the invocation (the
// tag holds bits 0-9) and a 16-bit check of the key's hash.
inline constexpr std::size_t kCompactWord = sizeof(uint32_t);
inline constexpr std::size_t kCompactMax = kCompactWord + 8;
static_assert(static_cast<int>(DType::kBool) < 16 && Shape::kMaxRank < 16);
struct CompactWord {
  int dtype = 0;
  int rank = 0;
  int invocation_bits = 0;  // bits 10-17 of the invocation
  uint32_t key_check = 0;
};
// The 16-bit check of a key's hash, and the invocation's bits the word
// carries.
inline uint32_t key_check(uint64_t key_hash) {
  return static_cast<uint32_t>((key_hash ^ (key_hash >> 16) ^ (key_hash >> 32) ^ (key_hash >> 48)) &
                               0xffffu);
}
inline int compact_invocation_bits(uint64_t invocation) {
  return static_cast<int>((invocation >> kInvocationBits) & 0xffu);
}
inline uint32_t compact_word(DType dtype, int rank, uint64_t key_hash, uint64_t invocation) {
  return (static_cast<uint32_t>(dtype) & 0xfu) | (static_cast<uint32_t>(rank) & 0xfu) << 4 |
         static_cast<uint32_t>(compact_invocation_bits(invocation)) << 8 |
         key_check(key_hash) << 16;
}
inline CompactWord read_compact_word(uint32_t word) {
  return CompactWord{static_cast<int>(word & 0xfu), static_cast<int>((word >> 4) & 0xfu),
                     static_cast<int>((word >> 8) & 0xffu), word >> 16};
}
// A receive's Packet whose header.bytes still holds this after the message
// came received a compact message (MPI leaves the bytes past a message
// untouched; a header's byte count is never this).
inline constexpr uint64_t kCompactMarker = ~uint64_t{0};

// Writes the message that carries `t` (invocation `invocation` of the key
// hashed `key_hash`) into `p` and returns its size: a compact word and the
// value for a one-element tensor of at most 8 bytes, else a header with the
// tensor's bytes when they fit in the payload. Past kInlineBytes the
// message is the header alone: the raw bytes follow as a second message.
std::size_t write_packet(Packet& p, const Tensor& t, uint64_t key_hash, uint64_t invocation);

// What a Recv waits for on its tag: the key's hash, the invocation, the
// dtype and (possibly partial) shape it declares, and the rank it receives
// from (named in its errors).
struct RecvExpectation {
  uint64_t key_hash = 0;
  uint64_t invocation = 0;
  DType dtype = DType::kFloat32;
  const Shape* shape = nullptr;  // never null; owned by the caller
  int peer = 0;
};

// What a message received into a Packet is to the Recv waiting on its tag.
// The receive sets header.bytes to kCompactMarker first: a compact message
// leaves it so.
struct Arrival {
  enum class Kind : uint8_t {
    kStale,    // another key's, or an earlier invocation's: drop it (and the
               // `follows` bytes after it) and wait on
    kValue,    // `value` is the tensor, complete
    kFollows,  // `value` is allocated; its byte_size() bytes are the next message
    kRefused,  // `status` says why (naming the peer); the `follows` bytes
               // after it are to be received and dropped
  };
  Kind kind = Kind::kStale;
  Status status;
  Tensor value;
  uint64_t follows = 0;  // at most INT32_MAX
};

// Reads a message as the Recv `e` (any bytes: a malformed header is
// kRefused, Internal; nothing is allocated past what the header's shape
// and byte count agree on). A bool tensor's bytes read as 0 or 1.
Arrival read_arrival(const Packet& p, const RecvExpectation& e);

// A bool tensor's bytes from a peer, each made 0 or 1 (any other byte
// would be an invalid bool); other dtypes are left as they are.
void settle_bools(Tensor& t);

// The header's dtype and shape, checked (Internal when unreadable).
Result<Shape> shape_of(const Header& h);
Status check_dtype(const Header& h);
Status check_dtype(int32_t dtype);

// Internal unless a fully defined `shape` of `dtype` is exactly `bytes`
// long. Checked before a tensor is allocated for what a peer announced: a
// header of a few bytes for a shape of a terabyte must allocate nothing.
Status check_bytes(DType dtype, const Shape& shape, uint64_t bytes);

// A tensor of `dtype` and `shape` for `bytes` bytes, check_bytes first:
// nothing is allocated for a count that is not the shape's.
Result<Tensor> tensor_for(DType dtype, const Shape& shape, uint64_t bytes);

// The same for a header's checked dtype, shape and byte count.
Result<Tensor> tensor_for(const Header& h);

// The live World for a kernel of `node`, or FailedPrecondition naming the
// node and World::init().
Result<std::shared_ptr<World>> world_for(const Node& node);

// Starts the collectives' bookkeeping of `world` (collectives.cc): its
// receive of the other ranks' notices of given-up invocations. Called by
// World::init once its engine runs.
void open_collective_book(World& world);

// Registers MpiSend and MpiRecv (send_recv.cc).
void register_transfer_ops(OpRegistry& registry);

}  // namespace graphrun::mpi::internal
