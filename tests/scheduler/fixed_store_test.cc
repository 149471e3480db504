// FixedStore: a plan's flow-graph nodes, made in place in one allocation.
#include "scheduler/fixed_store.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api/src/huge_pages.h"

namespace graphrun::sched {
namespace {

// Records its construction and destruction in `log`; not movable, like a
// oneTBB node.
struct Tracked {
  Tracked(std::vector<std::string>& log, int id) : log_(log), id_(id) {
    log_.push_back("make " + std::to_string(id_));
  }
  Tracked(const Tracked&) = delete;
  Tracked& operator=(const Tracked&) = delete;
  ~Tracked() { log_.push_back("end " + std::to_string(id_)); }
  std::vector<std::string>& log_;
  int id_;
};

TEST(FixedStoreTest, MakesInPlaceAndEndsInTheOrderMade) {
  std::vector<std::string> log;
  std::vector<const Tracked*> made;
  {
    FixedStore<Tracked> store;
    store.reserve(3);
    for (int i = 0; i < 3; ++i) made.push_back(&store.emplace_back(log, i));
    EXPECT_EQ(store.size(), 3u);
    // One block: the objects sit next to each other and never move.
    EXPECT_EQ(made[1], made[0] + 1);
    EXPECT_EQ(made[2], made[0] + 2);
    EXPECT_EQ(made[2]->id_, 2);
  }
  EXPECT_EQ(log,
            (std::vector<std::string>{"make 0", "make 1", "make 2", "end 0", "end 1", "end 2"}));
}

TEST(FixedStoreTest, EndsOnlyWhatWasMadeAndMayBeEmpty) {
  std::vector<std::string> log;
  {
    FixedStore<Tracked> store;
    store.reserve(5);
    store.emplace_back(log, 7);
  }
  EXPECT_EQ(log, (std::vector<std::string>{"make 7", "end 7"}));
  FixedStore<Tracked> empty;
  empty.reserve(0);
  EXPECT_EQ(empty.size(), 0u);
}

struct alignas(64) Wide {
  char bytes[64];
};

TEST(FixedStoreTest, KeepsTheTypesAlignmentSmallAndBig) {
  for (const std::size_t n : {std::size_t{3}, internal::kHugePageMinBytes / sizeof(Wide) + 1}) {
    FixedStore<Wide> store;
    store.reserve(n);
    Wide& first = store.emplace_back();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(&first) % alignof(Wide), 0u) << n;
    Wide& second = store.emplace_back();
    EXPECT_EQ(&second, &first + 1);
    store.reset();
    EXPECT_EQ(store.size(), 0u);
  }
}

}  // namespace
}  // namespace graphrun::sched
