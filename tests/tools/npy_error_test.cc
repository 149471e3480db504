// graphrun_npy's error paths: every malformed file is an InvalidArgument
// (NotFound for a missing one) naming the file and the problem.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/graphrun/npy.h"

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

TEST(NpyErrorTest, RejectsBadMagic) {
  auto t = npy::parse("PK\x03\x04 not numpy", "x.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("x.npy: not a NumPy .npy file"));
}

TEST(NpyErrorTest, RejectsTruncatedHeader) {
  std::string bytes = npy::serialize(Tensor{1.0f, 2.0f});
  auto t = npy::parse(bytes.substr(0, 30), "t.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("t.npy: truncated .npy header"));
  t = npy::parse(bytes.substr(0, 9), "t.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated"));
}

TEST(NpyErrorTest, RejectsTruncatedData) {
  std::string bytes = npy::serialize(Tensor{1.0f, 2.0f});
  auto t = npy::parse(bytes.substr(0, bytes.size() - 1), "t.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("t.npy: truncated .npy data: float32[2] needs 8 bytes, 7 present"));
  t = npy::parse(bytes + "x", "t.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("1 unexpected bytes after the data"));
}

TEST(NpyErrorTest, RejectsFortranOrder) {
  const float v[4] = {1, 2, 3, 4};
  auto t = npy::parse(
      npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", raw(v, sizeof v)),
      "f.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("f.npy: Fortran-order arrays are not supported"));
}

TEST(NpyErrorTest, RejectsUnsupportedDtypeNamingIt) {
  for (const char* d : {"<f2", "<u4", "|u1", "<c8", "<U5", "|O", "<i2"}) {
    auto t = npy::parse(
        npy_bytes(fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': (1,), }}", d),
                  std::string(16, '\0')),
        "d.npy");
    ASSERT_FALSE(t.is_ok()) << d;
    EXPECT_THAT(t.status().message(), HasSubstr(fmt::format("d.npy: dtype '{}'", d)));
    EXPECT_THAT(t.status().message(), HasSubstr("is not supported"));
  }
}

TEST(NpyErrorTest, RejectsMalformedHeader) {
  for (const char* dict : {"{'descr': '<f4', 'shape': (1,)}", "{'descr': '<f4' 'x'}", "['descr']",
                           "{'descr': '<f4', 'fortran_order': False, 'shape': (a,)}",
                           "{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,)}"}) {
    auto t = npy::parse(npy_bytes(dict, std::string(4, '\0')), "m.npy");
    ASSERT_FALSE(t.is_ok()) << dict;
    EXPECT_THAT(t.status().message(), HasSubstr("m.npy: malformed .npy header")) << dict;
  }
  auto t = npy::parse(std::string("\x93NUMPY\x04\x00", 8) + "xx", "v.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("unsupported .npy format version 4.0"));
}

// Dimensions up to INT64_MAX are read; Shape::make then judges the product,
// wherever a 0 stands (before, INT64_MAX itself was "dimension too large",
// so graphrun could not read a shape it wrote). Allocation errors name the
// file.
TEST(NpyErrorTest, ShapesAreJudgedWhereverTheZeroStands) {
  auto t = npy::parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (0, "
                                "9223372036854775807, 9223372036854775807), }",
                                ""),
                      "z.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("z.npy: shape [0,9223372036854775807,"
                                              "9223372036854775807] has more elements than int64"));
  t = npy::parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                           "(9223372036854775808,), }",
                           ""),
                 "o.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("o.npy: malformed .npy header at byte"));
  EXPECT_THAT(t.status().message(), HasSubstr("dimension too large"));
  t = npy::parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                           "(4611686018427387904, 1, 0), }",
                           ""),
                 "l.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("l.npy: tensor float32[4611686018427387904,1,0] is too large"));
  t = npy::parse(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (0, "
                           "536870912, 1073741824), }",
                           ""),
                 "e.npy");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->shape(), (Shape{0, 536870912, 1073741824}));
  EXPECT_EQ(npy::parse(npy::serialize(*t))->shape(), t->shape());
}

// read_file checks the file before reading it: a regular file whose size is
// the header plus exactly the data the header declares.
TEST(NpyErrorTest, ReadFileRefusesWhatIsNotARegularFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("graphrun_npy_dir_" + std::to_string(::getpid()) + ".npy");
  std::filesystem::create_directories(dir);
  auto t = npy::read_file(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(),
              HasSubstr(dir.string() + ": is a directory, not a regular .npy file"));
  t = npy::read_file("/dev/zero");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("/dev/zero: is a character device, not a regular .npy file"));
}

TEST(NpyErrorTest, ReadFileChecksTheSizeTheHeaderDeclares) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("graphrun_npy_size_" + std::to_string(::getpid()) + ".npy");
  const std::string good = npy::serialize(Tensor{1.0f, 2.0f, 3.0f});
  auto read = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return npy::read_file(path);
  };
  auto t = read(good);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->flat<float>()[2], 3.0f);
  t = read(good.substr(0, good.size() - 4));
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated .npy data: float32[3] needs 12 bytes, 8"));
  t = read(good + "xy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("2 unexpected bytes after the data"));
  t = read(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }",
                     std::string(8, '\0')));
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("needs 8000000000000 bytes, 8 present"));
  t = read(good.substr(0, 20));
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated .npy header"));
  t = read(good.substr(0, 7));
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("truncated .npy file (no version)"));
  t = read("");
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("not a NumPy .npy file"));
  // A 1.0 file with an empty header dict (10-byte prefix, less than the 12
  // read first) and a bool array whose bytes are not 0 or 1.
  t = read(npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                     std::string("\x00\x02\x01", 3)));
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->flat<bool>()[1], true);
  t = read(npy_bytes("", ""));
  ASSERT_FALSE(t.is_ok());
  EXPECT_THAT(t.status().message(), HasSubstr("malformed .npy header"));
  std::filesystem::remove(path);
}

TEST(NpyErrorTest, ReadFileNamesAMissingFile) {
  auto t = npy::read_file("/nonexistent/dir/a.npy");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("/nonexistent/dir/a.npy"));
}

}  // namespace
}  // namespace graphrun
