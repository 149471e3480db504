// Philox4x32-10: the counter-based random generator of Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC'11), as used by TensorFlow's random
// ops. A generator is a pure function of (key, 128-bit counter) -> 128 random
// bits, so any block of a stream can be computed independently: a kernel
// reserves a range of block indices with one atomic add and fills its output
// in parallel without a lock.
//
// Layout (as TensorFlow's PhiloxRandom(seed, seed2)): the 64-bit key is
// `seed`; the upper two counter words are `seed2`; the lower two counter
// words are the block index. So (seed, seed2) pick the stream and the block
// index walks it.
//
//   Philox4x32 gen(seed, seed2);
//   Philox4x32::Block bits = gen(block_index);
//   float u = uint32_to_unit_float(bits[0]);  // [0, 1)
//
// Thread safety: a Philox4x32 is an immutable value; thread-safe.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace graphrun::ops_internal {

class Philox4x32 {
 public:
  using Block = std::array<uint32_t, 4>;
  using Key = std::array<uint32_t, 2>;

  Philox4x32(uint64_t seed, uint64_t seed2)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        counter_hi_{static_cast<uint32_t>(seed2), static_cast<uint32_t>(seed2 >> 32)} {}

  // The 128 random bits of block `index` of this stream.
  Block operator()(uint64_t index) const {
    return compute(Block{static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                         counter_hi_[0], counter_hi_[1]},
                   key_);
  }

  // The raw bijection: ten rounds over `counter` keyed by `key`.
  static Block compute(Block counter, Key key) {
    for (int round = 0; round < kRounds; ++round) {
      if (round > 0) {
        key[0] += kWeyl0;
        key[1] += kWeyl1;
      }
      const uint64_t p0 = uint64_t{kMul0} * counter[0];
      const uint64_t p1 = uint64_t{kMul1} * counter[2];
      counter =
          Block{static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
                static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
    }
    return counter;
  }

 private:
  static constexpr int kRounds = 10;
  static constexpr uint32_t kMul0 = 0xD2511F53;
  static constexpr uint32_t kMul1 = 0xCD9E8D57;
  static constexpr uint32_t kWeyl0 = 0x9E3779B9;  // golden ratio
  static constexpr uint32_t kWeyl1 = 0xBB67AE85;  // sqrt(3) - 1

  Key key_;
  std::array<uint32_t, 2> counter_hi_;
};

// Uniform in [0, 1) from 23 random mantissa bits: 1.m - 1.
inline float uint32_to_unit_float(uint32_t x) {
  const uint32_t bits = (uint32_t{127} << 23) | (x & 0x7fffffu);
  return std::bit_cast<float>(bits) - 1.0f;
}

// Uniform in [0, 1) from 52 random mantissa bits taken from two words.
inline double uint64_to_unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t mantissa = ((uint64_t{hi} << 32) | lo) & ((uint64_t{1} << 52) - 1);
  const uint64_t bits = (uint64_t{1023} << 52) | mantissa;
  return std::bit_cast<double>(bits) - 1.0;
}

// Box-Muller: two independent standard normals from two uniforms in [0, 1).
// `u1` is mapped to (0, 1] so that the logarithm stays finite.
template <typename T>
inline std::array<T, 2> box_muller(T u1, T u2) {
  const T radius = std::sqrt(T{-2} * std::log(T{1} - u1));
  const T theta = T{2} * std::numbers::pi_v<T> * u2;
  return {radius * std::sin(theta), radius * std::cos(theta)};
}

}  // namespace graphrun::ops_internal
