#include "tools/graphrun/npy.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace graphrun {
namespace {

using ::testing::HasSubstr;

// A .npy file by hand: magic, version, header length, header, data.
std::string npy_bytes(std::string_view dict, std::string_view data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = dict.size();
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) out += static_cast<char>((len >> (8 * i)) & 0xFF);
  out += dict;
  out += data;
  return out;
}

std::string raw(const void* p, std::size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

TEST(NpyTest, RoundTripsEveryDtype) {
  const Tensor tensors[] = {
      Tensor::matrix<float>({{1.5f, -2}, {3, 4e10f}}),
      Tensor{1.0, -0.25, 1e300},
      Tensor{int32_t{-7}, int32_t{2147483647}},
      Tensor{int64_t{-1}, int64_t{9000000000000}},
      Tensor{true, false, true},
  };
  for (const Tensor& t : tensors) {
    auto back = npy::parse(npy::serialize(t));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(*back, t) << t.to_string();
  }
}

TEST(NpyTest, RoundTripsScalarAndZeroLengthShapes) {
  for (const Tensor& t :
       {Tensor(3.0f), Tensor(DType::kFloat64, Shape{0}), Tensor(DType::kInt32, Shape{2, 0, 3}),
        Tensor(int64_t{5}), Tensor(DType::kBool, Shape{0, 1})}) {
    auto back = npy::parse(npy::serialize(t));
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->debug_type(), t.debug_type());
    EXPECT_EQ(*back, t);
  }
  EXPECT_THAT(npy::serialize(Tensor(3.0f)), HasSubstr("'shape': (), }"));
  EXPECT_THAT(npy::serialize(Tensor{1, 2}), HasSubstr("'shape': (2,), }"));
  EXPECT_THAT(npy::serialize(Tensor(DType::kInt32, Shape{2, 0, 3})),
              HasSubstr("'descr': '<i4', 'fortran_order': False, 'shape': (2, 0, 3), }"));
}

TEST(NpyTest, HeaderIsPaddedTo64Bytes) {
  for (const Tensor& t : {Tensor(1.0f), Tensor(DType::kFloat32, Shape{1, 2, 3, 4, 5, 6, 7, 8})}) {
    const std::string bytes = npy::serialize(t);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    const std::size_t header_len = static_cast<uint8_t>(bytes[8]) |
                                   (static_cast<std::size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    const std::size_t data_start = 10 + header_len;
    EXPECT_EQ(data_start % 64, 0u);
    EXPECT_EQ(bytes[data_start - 1], '\n');
    EXPECT_EQ(bytes.size() - data_start, t.byte_size());
  }
}

TEST(NpyTest, ReadsVersion2And3Headers) {
  const float v[2] = {1, 2};
  for (int major : {2, 3}) {
    auto t = npy::parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n",
                                  raw(v, sizeof v), major));
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    EXPECT_EQ(*t, (Tensor{1.0f, 2.0f}));
  }
}

TEST(NpyTest, ReadsBigEndianDescriptorsAndKeysInAnyOrder) {
  const unsigned char be_i4[] = {0, 0, 1, 2, 0xff, 0xff, 0xff, 0xfe};  // 258, -2
  auto t = npy::parse(npy_bytes("{\"shape\": (2,), \"fortran_order\": False, \"descr\": \">i4\"}",
                                raw(be_i4, sizeof be_i4)));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(*t, (Tensor{int32_t{258}, int32_t{-2}}));
  const unsigned char be_f8[] = {0x3f, 0xf8, 0, 0, 0, 0, 0, 0};  // 1.5
  t = npy::parse(
      npy_bytes("{'descr': '>f8', 'fortran_order': False, 'shape': ()}", raw(be_f8, sizeof be_f8)));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(*t, Tensor(1.5));
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "graphrun-npy-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

#if GRAPHRUN_HAVE_NUMPY
int python(const std::string& code) {
  const std::string cmd = fmt::format("{} -c \"{}\"", GRAPHRUN_PYTHON3, code);
  return std::system(cmd.c_str());
}

TEST(NpyNumpyTest, NumpyLoadsOurFiles) {
  TempDir dir;
  ASSERT_TRUE(
      npy::write_file(Tensor::matrix<float>({{1, 2, 3}, {4, 5, 6}}), dir.path() / "f.npy").is_ok());
  ASSERT_TRUE(npy::write_file(Tensor{true, false}, dir.path() / "b.npy").is_ok());
  ASSERT_TRUE(npy::write_file(Tensor(int64_t{-3}), dir.path() / "s.npy").is_ok());
  const std::string d = dir.path().string();
  EXPECT_EQ(python(fmt::format(
                "import numpy as np; a = np.load('{}/f.npy'); "
                "assert a.dtype == np.float32 and a.shape == (2, 3) and a.flags.c_contiguous; "
                "assert (a == np.array([[1, 2, 3], [4, 5, 6]], np.float32)).all(); "
                "b = np.load('{}/b.npy'); assert b.dtype == np.bool_ and list(b) == [True, False]; "
                "s = np.load('{}/s.npy'); assert s.dtype == np.int64 and s.shape == () and s == -3",
                d, d, d)),
            0);
}

TEST(NpyNumpyTest, WeLoadNumpyFiles) {
  TempDir dir;
  const std::string d = dir.path().string();
  ASSERT_EQ(
      python(fmt::format("import numpy as np; "
                         "np.save('{}/f8.npy', np.arange(6, dtype=np.float64).reshape(2, 3) / 4); "
                         "np.save('{}/i4be.npy', np.array([1, -2, 300], dtype='>i4')); "
                         "np.save('{}/b.npy', np.array([[True], [False]])); "
                         "np.save('{}/e.npy', np.zeros((0, 2), np.int64)); "
                         "np.save('{}/fo.npy', np.asfortranarray(np.ones((2, 2), np.float32))); "
                         "np.save('{}/u8.npy', np.ones(2, np.uint8))",
                         d, d, d, d, d, d)),
      0);
  auto f8 = npy::read_file(dir.path() / "f8.npy");
  ASSERT_TRUE(f8.is_ok()) << f8.status().to_string();
  EXPECT_EQ(*f8, Tensor(Shape{2, 3}, {0.0, 0.25, 0.5, 0.75, 1.0, 1.25}));
  auto i4 = npy::read_file(dir.path() / "i4be.npy");
  ASSERT_TRUE(i4.is_ok()) << i4.status().to_string();
  EXPECT_EQ(*i4, (Tensor{int32_t{1}, int32_t{-2}, int32_t{300}}));
  auto b = npy::read_file(dir.path() / "b.npy");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(*b, Tensor(Shape{2, 1}, {true, false}));
  auto e = npy::read_file(dir.path() / "e.npy");
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(e->debug_type(), "int64[0,2]");
  auto fo = npy::read_file(dir.path() / "fo.npy");
  ASSERT_FALSE(fo.is_ok());
  EXPECT_THAT(fo.status().message(), HasSubstr("Fortran-order"));
  auto u8 = npy::read_file(dir.path() / "u8.npy");
  ASSERT_FALSE(u8.is_ok());
  EXPECT_THAT(u8.status().message(), HasSubstr("dtype '|u1'"));
}
#else
TEST(NpyNumpyTest, CrossCheckSkippedBecausePython3NumpyIsNotInstalled) {
  GTEST_SKIP() << "/usr/bin/python3 cannot import numpy (apt-get install python3-numpy)";
}
#endif

}  // namespace
}  // namespace graphrun
