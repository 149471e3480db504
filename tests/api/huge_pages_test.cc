// api/src/huge_pages.h: buffers of a million nodes' entries ask Linux for
// transparent huge pages (madvise MADV_HUGEPAGE) before they are filled.
#include "api/src/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
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

// Objects of one size class: 208 bytes, a class nothing else here uses.
constexpr std::size_t kObjectBytes = 200;

TEST(NodeObjectTest,
     PastTheFirstOfAClassObjectsComeFromHugePageSlabsThatGoBackWhenEmptySkippedUnderSanitizers) {
  if (!node_slabs_enabled()) GTEST_SKIP() << "sanitizer build: node objects come from operator new";
  const std::size_t slabs_before = node_slabs_in_use();
  std::vector<char*> objects;
  // The first kNodeSlabAfter of the class come from operator new.
  for (std::size_t i = 0; i < kNodeSlabAfter; ++i) {
    objects.push_back(static_cast<char*>(allocate_node_object(kObjectBytes)));
  }
  const std::size_t first_slab_object = objects.size();
  for (std::size_t i = 0; i < 30'000; ++i) {
    objects.push_back(static_cast<char*>(allocate_node_object(kObjectBytes)));
  }
  for (std::size_t i = 0; i < objects.size(); ++i) {
    EXPECT_EQ(in_node_slab(objects[i]), i >= first_slab_object) << i;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(objects[i]) % 16, 0u) << i;
    std::memset(objects[i], static_cast<int>(i % 251), kObjectBytes);
  }
  // No two objects overlap: every one still holds its own bytes.
  for (std::size_t i = 0; i < objects.size(); ++i) {
    const char want = static_cast<char>(i % 251);
    ASSERT_EQ(objects[i][0], want) << i;
    ASSERT_EQ(objects[i][kObjectBytes - 1], want) << i;
  }
  // 30,000 objects of 208 bytes fill three slabs and part of a fourth.
  const std::size_t slabs_full = node_slabs_in_use();
  EXPECT_GE(slabs_full - slabs_before, 3u);
  if (thp_available()) {
    EXPECT_NE(vm_flags_of(objects.back()).find(" hg"), std::string::npos)
        << vm_flags_of(objects.back());
  }
  // A freed object's place is taken again, in a slab.
  free_node_object(objects.back());
  char* again = static_cast<char*>(allocate_node_object(kObjectBytes));
  EXPECT_EQ(again, objects.back());
  objects.back() = again;
  // Freed, the slabs go back to the system but one.
  for (char* p : objects) free_node_object(p);
  EXPECT_LE(node_slabs_in_use(), slabs_before + 1);
  // Objects too big for a slab come from operator new.
  void* big = allocate_node_object(kNodeSlabMaxBytes + 1);
  EXPECT_FALSE(in_node_slab(big));
  free_node_object(big);
}

TEST(NodeObjectTest, TwoThreadsAllocatingAndFreeingKeepEveryObjectWhole) {
  auto work = [](int seed, bool& ok) {
    std::vector<char*> live;
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < 20'000; ++i) {
        char* p = static_cast<char*>(allocate_node_object(96));
        std::memset(p, seed + i % 7, 96);
        live.push_back(p);
      }
      for (std::size_t i = 0; i < live.size(); ++i) {
        const char want = static_cast<char>(seed + static_cast<int>(i % 20'000) % 7);
        if (live[i][0] != want || live[i][95] != want) ok = false;
      }
      // Free every other one, then the rest: slabs half empty, then empty.
      for (std::size_t i = 0; i < live.size(); i += 2) free_node_object(live[i]);
      for (std::size_t i = 1; i < live.size(); i += 2) free_node_object(live[i]);
      live.clear();
    }
  };
  bool ok_a = true;
  bool ok_b = true;
  std::thread a(work, 10, std::ref(ok_a));
  std::thread b(work, 50, std::ref(ok_b));
  a.join();
  b.join();
  EXPECT_TRUE(ok_a);
  EXPECT_TRUE(ok_b);
}
}  // namespace
}  // namespace graphrun::internal
