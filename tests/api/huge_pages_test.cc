// api/src/huge_pages.h: buffers of a million nodes' entries ask Linux for
// transparent huge pages (madvise MADV_HUGEPAGE) before they are filled.
#include "api/src/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace graphrun::internal {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

bool thp_available() { return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good(); }

// The VmFlags line of the mapping holding `p` in /proc/self/smaps ("" when
// none holds it).
std::string vm_flags_of(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    // A mapping's header: "start-end perms offset dev inode path".
    const std::size_t dash = line.find('-');
    const std::size_t space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find(':') > space) {
      const std::uintptr_t start = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t end = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = start <= at && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

bool advised(const void* p) {
  std::istringstream flags(vm_flags_of(p));
  std::string flag;
  while (flags >> flag) {
    if (flag == "hg") return true;
  }
  return false;
}

TEST(HugePagesTest, BigBufferIsAlignedUsableAndAdvisedSkippedWithoutThp) {
  if (!thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::size_t bytes = kHugePageMinBytes + 12345;  // not a whole number of pages
  void* p = allocate_maybe_huge(bytes, 64);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kHugePage, 0u);
  std::memset(p, 0x5a, bytes);
  EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0x5a);
  EXPECT_TRUE(advised(p)) << vm_flags_of(p);
  free_maybe_huge(p, bytes, 64);
}

TEST(HugePagesTest, SmallBufferKeepsItsAlignment) {
  const std::size_t bytes = kHugePageMinBytes - 1;
  void* p = allocate_maybe_huge(bytes, 256);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  std::memset(p, 1, bytes);
  free_maybe_huge(p, bytes, 256);
  void* tiny = allocate_maybe_huge(24, 8);
  ASSERT_NE(tiny, nullptr);
  free_maybe_huge(tiny, 24, 8);
}

TEST(HugePagesTest, ReservedVectorIsAdvisedBeforeItIsFilledSkippedWithoutThp) {
  if (!thp_available()) GTEST_SKIP() << "this kernel has no transparent huge pages";
  std::vector<int64_t> v;
  const std::size_t n = 3 * kHugePageMinBytes / sizeof(int64_t);
  reserve_maybe_huge(v, n);
  ASSERT_GE(v.capacity(), n);
  const int64_t* data = v.data();
  // The first whole 2 MiB page inside the buffer carries the advice.
  const auto first = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  EXPECT_TRUE(advised(reinterpret_cast<const void*>(first)));
  v.assign(n, 7);  // no reallocation: the advised buffer is the one filled
  EXPECT_EQ(v.data(), data);
  EXPECT_EQ(v[n - 1], 7);
  // A capacity already enough: nothing changes.
  reserve_maybe_huge(v, n / 2);
  EXPECT_EQ(v.data(), data);
}

}  // namespace
}  // namespace graphrun::internal
