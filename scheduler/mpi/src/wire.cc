#include "scheduler/mpi/src/wire.h"

#include <mutex>
#include <span>
#include <unordered_map>

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

}  // namespace graphrun::mpi::internal
