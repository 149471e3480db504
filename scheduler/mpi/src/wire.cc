#include "scheduler/mpi/src/wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <mutex>
#include <span>
#include <unordered_map>
#include <utility>

namespace graphrun::mpi::internal {

uint64_t hash_key(std::string_view key) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : key) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

Status claim_key_id(const std::string& key, uint64_t hash, std::string_view what) {
  static std::mutex mu;
  static std::unordered_map<int, std::string> owners;
  const std::lock_guard lock(mu);
  auto [it, inserted] = owners.emplace(key_id(hash), key);
  if (!inserted && it->second != key) {
    return invalid_argument("{}s '{}' and '{}' map to the same MPI tag; rename one of them", what,
                            it->second, key);
  }
  return Status::ok();
}

Result<std::shared_ptr<World>> world_for(const Node& node) {
  std::shared_ptr<World> world = World::current();
  if (world == nullptr) {
    return failed_precondition("{} needs graphrun::mpi::World::init() first", node.describe());
  }
  return world;
}

Header header_of(const Tensor& t, uint64_t key_hash, uint64_t invocation) {
  Header h;
  h.key_hash = key_hash;
  h.invocation = invocation;
  h.dtype = static_cast<int32_t>(t.dtype());
  h.rank = t.shape().rank();
  for (int i = 0; i < h.rank; ++i) h.dims[i] = t.shape().dim(i);
  h.bytes = t.byte_size();
  return h;
}

Result<Shape> shape_of(const Header& h) {
  if (h.rank < 0 || h.rank > Shape::kMaxRank) return internal_error("a header of rank {}", h.rank);
  return Shape::make(std::span<const int64_t>(h.dims, static_cast<std::size_t>(h.rank)));
}

Status check_dtype(const Header& h) { return check_dtype(h.dtype); }

Status check_dtype(int32_t dtype) {
  const auto d = static_cast<DType>(dtype);
  const bool known = d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 ||
                     d == DType::kInt64 || d == DType::kBool;
  if (!known) return internal_error("a header of dtype {}", dtype);
  return Status::ok();
}

Status check_bytes(DType dtype, const Shape& shape, uint64_t bytes) {
  if (!shape.is_fully_defined()) {
    return internal_error("a header of a {} tensor of unknown shape {}", dtype, shape);
  }
  uint64_t expected = dtype_size(dtype);
  if (__builtin_mul_overflow(expected, static_cast<uint64_t>(shape.num_elements()), &expected) ||
      expected != bytes) {
    return internal_error("a header of {} bytes for a {} tensor of shape {}", bytes, dtype, shape);
  }
  return Status::ok();
}

Result<Tensor> tensor_for(DType dtype, const Shape& shape, uint64_t bytes) {
  GRAPHRUN_RETURN_IF_ERROR(check_bytes(dtype, shape, bytes));
  return Tensor::allocate_uninitialized(dtype, shape);
}

Result<Tensor> tensor_for(const Header& h) {
  GRAPHRUN_RETURN_IF_ERROR(check_dtype(h));
  GRAPHRUN_ASSIGN_OR_RETURN(Shape shape, shape_of(h));
  return tensor_for(static_cast<DType>(h.dtype), shape, h.bytes);
}

void settle_bools(Tensor& t) {
  if (t.dtype() != DType::kBool || t.byte_size() == 0) return;
  auto* b = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.byte_size(); ++i) b[i] = b[i] != 0 ? 1 : 0;
}

std::size_t write_packet(Packet& p, const Tensor& t, uint64_t key_hash, uint64_t invocation) {
  const std::size_t bytes = t.byte_size();
  if (t.num_elements() == 1 && kCompactWord + bytes <= kCompactMax) {
    // The word, then the value.
    auto* raw = reinterpret_cast<char*>(&p);
    const uint32_t word = compact_word(t.dtype(), t.shape().rank(), key_hash, invocation);
    std::memcpy(raw, &word, kCompactWord);
    std::memcpy(raw + kCompactWord, t.raw_data(), bytes);
    return kCompactWord + bytes;
  }
  p.header = header_of(t, key_hash, invocation);
  if (bytes > kInlineBytes) return sizeof(Header);
  if (bytes != 0) std::memcpy(p.payload, t.raw_data(), bytes);
  return sizeof(Header) + bytes;
}

namespace {

// The dtype and shape a message announced (`rank` dimensions `dims`),
// against the Recv's. On success `shape` is the shape of the tensor to
// make: the Recv's own when the message gives exactly that fully defined
// shape (the common case: nothing built), else `announced`.
Status check_announced(const RecvExpectation& e, int32_t dtype, int rank, const int64_t* dims,
                       Shape& announced, const Shape*& shape) {
  if (dtype != static_cast<int32_t>(e.dtype)) {
    if (Status s = check_dtype(dtype); !s.is_ok()) {
      return internal_error("rank {} sent a malformed header: {}", e.peer, s.message());
    }
    return invalid_argument("rank {} sent {} where this Recv expects {}", e.peer,
                            static_cast<DType>(dtype), e.dtype);
  }
  if (rank < 0 || rank > Shape::kMaxRank) {
    return internal_error("rank {} sent a malformed header: a shape of rank {}", e.peer, rank);
  }
  const Shape& own = *e.shape;
  bool same = rank == own.rank();
  for (int i = 0; same && i < rank; ++i) same = dims[i] >= 0 && dims[i] == own.dim(i);
  if (same) {
    shape = &own;
    return Status::ok();
  }
  Result<Shape> made = Shape::make(std::span<const int64_t>(dims, static_cast<std::size_t>(rank)));
  if (!made.is_ok()) {
    return internal_error("rank {} sent a malformed header: {}", e.peer, made.status().message());
  }
  announced = std::move(*made);
  if (!announced.is_compatible_with(own)) {
    return invalid_argument("rank {} sent shape {} where this Recv expects {}", e.peer, announced,
                            own);
  }
  shape = &announced;
  return Status::ok();
}

// The tensor for a checked shape and a byte count the peer announced: a
// count that is not the shape's is a malformed header (nothing allocated);
// memory running out is ResourceExhausted.
Status make_value(const RecvExpectation& e, const Shape& shape, uint64_t bytes, Tensor& value) {
  if (Status s = check_bytes(e.dtype, shape, bytes); !s.is_ok()) {
    return internal_error("rank {} sent a malformed header: {}", e.peer, s.message());
  }
  Result<Tensor> t = Tensor::allocate_uninitialized(e.dtype, shape);
  if (!t.is_ok()) {
    return Status(t.status().code(),
                  fmt::format("a tensor from rank {}: {}", e.peer, t.status().message()));
  }
  value = std::move(*t);
  return Status::ok();
}

Arrival refused(Status why, uint64_t follows) {
  Arrival a;
  a.kind = Arrival::Kind::kRefused;
  a.status = std::move(why);
  a.follows = follows;
  return a;
}

// A one-element tensor's word and value: checked as a header is (one of
// another key or an earlier invocation is stale).
Arrival read_compact(const Packet& p, const RecvExpectation& e) {
  const auto* raw = reinterpret_cast<const char*>(&p);
  uint32_t word = 0;
  std::memcpy(&word, raw, kCompactWord);
  const CompactWord w = read_compact_word(word);
  // Bits 10-17 of the invocation, theirs less this Recv's, as a signed
  // 8-bit difference: the tag already matched bits 0-9.
  const auto later = static_cast<int8_t>(
      static_cast<uint8_t>(w.invocation_bits - compact_invocation_bits(e.invocation)));
  if (w.key_check != key_check(e.key_hash) || later < 0) return Arrival{};  // stale
  if (later != 0) {
    return refused(internal_error("rank {} sent a later invocation of this tensor (bits 10-17: "
                                  "{}) where this Recv waited for invocation {}",
                                  e.peer, w.invocation_bits, e.invocation),
                   0);
  }
  std::array<int64_t, Shape::kMaxRank> ones;
  ones.fill(1);  // a shape of w.rank ones
  Shape announced;
  const Shape* shape = nullptr;
  Arrival a;
  Status s = check_announced(e, w.dtype, w.rank, ones.data(), announced, shape);
  if (s.is_ok()) s = make_value(e, *shape, dtype_size(e.dtype), a.value);
  if (!s.is_ok()) return refused(std::move(s), 0);
  std::memcpy(a.value.raw_data(), raw + kCompactWord, a.value.byte_size());
  settle_bools(a.value);
  a.kind = Arrival::Kind::kValue;
  return a;
}

}  // namespace

Arrival read_arrival(const Packet& p, const RecvExpectation& e) {
  const Header& h = p.header;
  if (h.bytes == kCompactMarker) return read_compact(p, e);
  constexpr auto kMaxFollows = static_cast<uint64_t>(INT32_MAX);
  const bool stale = h.key_hash != e.key_hash || h.invocation < e.invocation;
  if (stale && h.bytes < kMaxFollows) {
    // A transfer no Recv took (its step was stopped after the Send went,
    // or another session's of the same tag).
    Arrival a;
    a.follows = h.bytes > kInlineBytes ? h.bytes : 0;
    return a;
  }
  Arrival a;
  Status s;
  if (h.key_hash != e.key_hash || h.invocation != e.invocation) {
    s = internal_error(
        "rank {} sent invocation {} of another tensor (name hash {:x}) where this Recv waited "
        "for invocation {} (name hash {:x})",
        e.peer, h.invocation, h.key_hash, e.invocation, e.key_hash);
  } else {
    Shape announced;
    const Shape* shape = nullptr;
    s = check_announced(e, h.dtype, h.rank, h.dims, announced, shape);
    if (s.is_ok()) s = make_value(e, *shape, h.bytes, a.value);
  }
  if (h.bytes <= kInlineBytes) {
    // The bytes came with the header.
    if (!s.is_ok()) return refused(std::move(s), 0);
    if (h.bytes != 0) std::memcpy(a.value.raw_data(), p.payload, h.bytes);
    settle_bools(a.value);
    a.kind = Arrival::Kind::kValue;
    return a;
  }
  // The bytes follow: received anyway when refused, so that the sender's
  // send completes.
  if (!s.is_ok()) return refused(std::move(s), std::min(h.bytes, kMaxFollows));
  a.kind = Arrival::Kind::kFollows;
  return a;
}

}  // namespace graphrun::mpi::internal
