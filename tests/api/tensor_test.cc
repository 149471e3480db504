#include <graphrun/tensor.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

namespace graphrun {
namespace {

TEST(DTypeTest, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(dtype_name(DType::kInt64), "int64");
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_from_name("float"), DType::kFloat32);
  EXPECT_EQ(dtype_from_name("double"), DType::kFloat64);
  EXPECT_EQ(dtype_from_name("int32"), DType::kInt32);
  EXPECT_EQ(dtype_from_name("complex64"), DType::kInvalid);
  EXPECT_EQ(dtype_of<int64_t>(), DType::kInt64);
  // TensorFlow's DataType numbers.
  EXPECT_EQ(static_cast<int>(DType::kFloat32), 1);
  EXPECT_EQ(static_cast<int>(DType::kInt64), 9);
  EXPECT_EQ(static_cast<int>(DType::kBool), 10);
}

TEST(ShapeTest, ElementsRankAndPrinting) {
  EXPECT_EQ(Shape().rank(), 0);
  EXPECT_EQ(Shape().num_elements(), 1);
  EXPECT_EQ(Shape().to_string(), "[]");
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.num_elements(), 24);
  EXPECT_EQ(s.to_string(), "[2,3,4]");
  Shape partial{-1, 3};
  EXPECT_FALSE(partial.is_fully_defined());
  EXPECT_EQ(partial.num_elements(), -1);
  EXPECT_EQ(partial.to_string(), "[?,3]");
  EXPECT_EQ(Shape::unknown().to_string(), "<unknown>");
  EXPECT_EQ(Shape::unknown().rank(), -1);
}

TEST(ShapeTest, Compatibility) {
  EXPECT_TRUE((Shape{-1, 3}).is_compatible_with(Shape{5, 3}));
  EXPECT_FALSE((Shape{-1, 3}).is_compatible_with(Shape{5, 4}));
  EXPECT_FALSE((Shape{3}).is_compatible_with(Shape{3, 1}));
  EXPECT_TRUE(Shape::unknown().is_compatible_with(Shape{1, 2, 3}));
}

TEST(ShapeTest, MakeValidatesUntrustedDims) {
  std::vector<int64_t> negative{2, -5};
  EXPECT_EQ(Shape::make(negative).status().code(), StatusCode::kInvalidArgument);
  std::vector<int64_t> huge{std::numeric_limits<int64_t>::max(), 4};
  EXPECT_EQ(Shape::make(huge).status().code(), StatusCode::kInvalidArgument);
  std::vector<int64_t> too_deep(9, 1);
  EXPECT_EQ(Shape::make(too_deep).status().code(), StatusCode::kInvalidArgument);
  std::vector<int64_t> ok{2, -1};
  EXPECT_EQ(Shape::make(ok)->to_string(), "[2,?]");
}

// A 0 does not hide an overflowing product, wherever it stands, and a shape
// holding a 0 counts 0 elements (not INT64_MAX).
TEST(ShapeTest, ZeroDimensionIsTreatedAlikeWhereverItStands) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{kMax, kMax, 0}, {0, kMax, kMax}, {kMax, 0, kMax}}) {
    auto made = Shape::make(dims);
    ASSERT_FALSE(made.is_ok()) << Shape(dims);
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  }
  std::vector<int64_t> fits{0, kMax};
  EXPECT_TRUE(Shape::make(fits).is_ok());
  EXPECT_EQ((Shape{kMax, kMax, 0}).num_elements(), 0);
  EXPECT_EQ((Shape{0, kMax, kMax}).num_elements(), 0);
  EXPECT_EQ((Shape{kMax, 2}).num_elements(), kMax);  // saturates
}

// The shared counting rule: dimensions of 0 or unknown are skipped, the
// product is refused past the limit, the unit counts towards it.
TEST(ShapeTest, ProductOfPositiveDimsSkipsZerosAndStopsAtTheLimit) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> dims{3, 0, 5, -1};
  EXPECT_EQ(product_of_positive_dims(4, dims, 60), 60);
  EXPECT_EQ(product_of_positive_dims(4, dims, 59), std::nullopt);
  EXPECT_EQ(product_of_positive_dims(1, {}, 0), std::nullopt);
  EXPECT_EQ(product_of_positive_dims(1, {}, 1), 1);
  const std::vector<int64_t> wide{kMax, 1};
  EXPECT_EQ(product_of_positive_dims(1, wide, kMax), kMax);
  EXPECT_EQ(product_of_positive_dims(2, wide, kMax), std::nullopt);
  const std::vector<int64_t> square{int64_t{1} << 32, int64_t{1} << 31};
  EXPECT_EQ(product_of_positive_dims(1, square, kMax), std::nullopt);
}

TEST(TensorTest, ConstructorsAndAccess) {
  Tensor s(3.5f);
  EXPECT_EQ(s.dtype(), DType::kFloat32);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.scalar<float>(), 3.5f);
  Tensor v{1, 2, 3};
  EXPECT_EQ(v.dtype(), DType::kInt32);
  EXPECT_EQ(v.shape(), Shape{3});
  Tensor m = Tensor::matrix<double>({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(m.flat<double>()[4], 5.0);
  Tensor z(DType::kInt64, Shape{2, 2});
  for (int64_t x : z.flat<int64_t>()) EXPECT_EQ(x, 0);
  Tensor f = Tensor::filled<float>(Shape{2}, 7.0f);
  EXPECT_EQ(f.flat<float>()[1], 7.0f);
  Tensor b(true);
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_TRUE(b.scalar<bool>());
  Tensor empty;
  EXPECT_FALSE(empty.is_initialized());
}

TEST(TensorTest, StorageIs64ByteAligned) {
  for (int n : {1, 3, 17, 1000}) {
    Tensor t(DType::kFloat32, Shape{n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64, 0u) << n;
  }
}

TEST(TensorTest, CopiesShareTheBufferDeepCopiesDoNot) {
  Tensor a{1.0f, 2.0f};
  EXPECT_TRUE(a.is_sole_owner());
  Tensor b = a;
  EXPECT_TRUE(a.shares_buffer_with(b));
  EXPECT_FALSE(a.is_sole_owner());
  b.flat<float>()[0] = 9.0f;
  EXPECT_EQ(a.flat<float>()[0], 9.0f);
  Tensor c = a.deep_copy();
  EXPECT_FALSE(c.shares_buffer_with(a));
  c.flat<float>()[0] = 1.0f;
  EXPECT_EQ(a.flat<float>()[0], 9.0f);
  Tensor moved = std::move(b);
  EXPECT_FALSE(b.is_initialized());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_TRUE(moved.shares_buffer_with(a));
}

// Small buffers (up to 64 bytes) are reused from blocks kept per thread:
// a reused block is zeroed for allocate(), aligned, never shared by two
// live tensors, and a block dropped on another thread (which then ends)
// is not lost to this one's tensors.
TEST(TensorTest, SmallBuffersAreReusedZeroedAndNeverShared) {
  for (int round = 0; round < 3; ++round) {
    std::vector<Tensor> live;
    for (int i = 0; i < 24; ++i) {
      const int64_t n = 1 + i % 16;  // 4 to 64 bytes
      Result<Tensor> t = Tensor::allocate(DType::kFloat32, Shape{n});
      ASSERT_TRUE(t.is_ok());
      for (float v : t->flat<float>()) ASSERT_EQ(v, 0.0f) << "round " << round << " tensor " << i;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t->raw_data()) % 64, 0u);
      for (float& v : t->flat<float>()) v = static_cast<float>(round * 100 + i);
      live.push_back(std::move(*t));
    }
    for (std::size_t i = 0; i < live.size(); ++i) {
      for (std::size_t j = i + 1; j < live.size(); ++j) {
        ASSERT_NE(live[i].raw_data(), live[j].raw_data()) << i << " and " << j;
      }
      for (float v : live[i].flat<float>()) {
        ASSERT_EQ(v, static_cast<float>(round * 100 + static_cast<int>(i)));
      }
    }
    // Half are dropped here, half on a thread that ends right after.
    std::vector<Tensor> elsewhere(std::make_move_iterator(live.begin() + 12),
                                  std::make_move_iterator(live.end()));
    live.resize(12);
    std::thread([moved = std::move(elsewhere)]() mutable { moved.clear(); }).join();
    live.clear();
  }
}

TEST(TensorTest, Reshaped) {
  Tensor a = Tensor::matrix<int32_t>({{1, 2, 3}, {4, 5, 6}});
  Result<Tensor> r = a.reshaped(Shape{3, 2});
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->shares_buffer_with(a));
  EXPECT_EQ(r->shape(), (Shape{3, 2}));
  EXPECT_EQ(a.reshaped(Shape{4}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TensorTest, EqualityAndCloseness) {
  EXPECT_EQ(Tensor({1.0f, 2.0f}), Tensor({1.0f, 2.0f}));
  EXPECT_FALSE(Tensor({1.0f, 2.0f}) == Tensor({1.0, 2.0}));  // dtype differs
  EXPECT_FALSE(Tensor({1.0f, 2.0f}) == Tensor({1.0f, 2.5f}));
  EXPECT_TRUE(Tensor({1.0f}).all_close(Tensor({1.0f + 1e-7f})));
  EXPECT_FALSE(Tensor({1.0f}).all_close(Tensor({1.1f})));
}

TEST(TensorTest, AllocateValidates) {
  EXPECT_EQ(Tensor::allocate(DType::kFloat32, Shape{-1, 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::allocate(DType::kInvalid, Shape{2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::allocate(DType::kFloat64, Shape{int64_t{1} << 61, 4}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(Tensor::allocate(DType::kFloat32, Shape{0, 5}).is_ok());
}

TEST(TensorTest, AllocateTreatsAZeroAlikeWhereverItStands) {
  constexpr int64_t kBig = int64_t{1} << 62;
  for (const Shape& shape : {Shape{kBig, 1, 0}, Shape{0, kBig, 1}, Shape{1, 0, kBig}}) {
    EXPECT_EQ(Tensor::allocate(DType::kFloat32, shape).status().code(),
              StatusCode::kResourceExhausted)
        << shape;
  }
  auto empty = Tensor::allocate(DType::kFloat32, Shape{1 << 20, 1 << 20, 0});
  ASSERT_TRUE(empty.is_ok());
  EXPECT_EQ(empty->num_elements(), 0);
  EXPECT_EQ(empty->byte_size(), 0u);
}

TEST(TensorTest, Printing) {
  EXPECT_EQ(Tensor(2.5f).to_string(), "float32[] 2.5");
  EXPECT_EQ(Tensor::matrix<int32_t>({{1, 2}, {3, 4}}).to_string(), "int32[2,2] [[1, 2], [3, 4]]");
  EXPECT_EQ(Tensor({1, 2, 3, 4}).to_string(2), "int32[4] [1, 2, ...]");
}

// Empty lists count against the limit: the text of a zero-element tensor is
// bounded for any shape (before, [10^5,10^5,0] printed 10^10 "[]"; the shapes
// here are smaller so that the test fails fast without the bound).
TEST(TensorTest, PrintingZeroElementTensorsIsBoundedByTheLimit) {
  EXPECT_EQ(Tensor::allocate(DType::kFloat32, Shape{0})->to_string(), "float32[0] []");
  EXPECT_EQ(Tensor::allocate(DType::kFloat32, Shape{2, 0})->to_string(), "float32[2,0] [[], []]");
  EXPECT_EQ(Tensor::allocate(DType::kInt32, Shape{4, 0})->to_string(2), "int32[4,0] [[], [], ...]");
  EXPECT_EQ(Tensor::allocate(DType::kFloat32, Shape{3, 2, 0})->to_string(3),
            "float32[3,2,0] [[[], []], [[], ...], ...]");
  const Tensor huge = *Tensor::allocate(DType::kFloat32, Shape{3000, 3000, 0});
  EXPECT_LT(huge.to_string(1).size(), 100u) << huge.to_string(1);
  EXPECT_LT(huge.to_string().size(), 400u);  // the default limit, as in operator<<
  const Tensor deep = *Tensor::allocate(DType::kBool, Shape{10, 10, 10, 10, 10, 10, 10, 0});
  EXPECT_LT(deep.to_string(4).size(), 200u) << deep.to_string(4);
  std::ostringstream os;
  os << huge;
  EXPECT_EQ(os.str(), huge.to_string());
}

TEST(TensorDeathTest, WrongElementTypeAborts) {
  Tensor a{1.0f};
  EXPECT_DEATH((void)a.flat<int32_t>(), "accessed a float32 tensor as int32");
}

}  // namespace
}  // namespace graphrun
