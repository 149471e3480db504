// Deadlines from timeouts (api/src/deadline.h): ordinary timeouts add up;
// past the clock's range they saturate instead of overflowing.
#include "api/src/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

namespace graphrun::internal {
namespace {

using std::chrono::milliseconds;
using Steady = std::chrono::steady_clock;
using System = std::chrono::system_clock;

TEST(DeadlineTest, AnOrdinaryTimeoutIsAddedToNow) {
  const Steady::time_point now = Steady::now();
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds(250)), now + milliseconds(250));
  const System::time_point wall = System::now();
  EXPECT_EQ(deadline_after<System>(wall, std::chrono::hours(24)), wall + std::chrono::hours(24));
}

TEST(DeadlineTest, ATimeoutPastTheClocksRangeSaturates) {
  const Steady::time_point now = Steady::now();
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds::max()), Steady::time_point::max());
  // 2^42 ms (139 years) fits 2^63 ns; 2^44 ms (557 years) does not.
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds(int64_t{1} << 42)),
            now + milliseconds(int64_t{1} << 42));
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds(int64_t{1} << 44)), Steady::time_point::max());
  // From the end of the clock, anything more is the end.
  EXPECT_EQ(deadline_after<Steady>(Steady::time_point::max(), milliseconds(1)),
            Steady::time_point::max());
  EXPECT_EQ(deadline_after<System>(System::now(), milliseconds::max()), System::time_point::max());
  EXPECT_GT(steady_deadline_after(milliseconds::max()), Steady::now() + std::chrono::hours(1));
}

TEST(DeadlineTest, ANegativeOrZeroTimeoutIsDueNow) {
  const Steady::time_point now = Steady::now();
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds(0)), now);
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds(-5)), now);
  EXPECT_EQ(deadline_after<Steady>(now, milliseconds::min()), now);
}

TEST(DeadlineTest, AStepsDeadlineIsNoneOnlyPastTheClocksRange) {
  EXPECT_FALSE(steady_deadline_for(milliseconds::max()).has_value());
  EXPECT_FALSE(steady_deadline_for(milliseconds(int64_t{1} << 44)).has_value());
  const Steady::time_point before = Steady::now();
  const auto soon = steady_deadline_for(milliseconds(250));
  ASSERT_TRUE(soon.has_value());
  EXPECT_GE(*soon, before + milliseconds(250));
  EXPECT_LE(*soon, Steady::now() + milliseconds(250));
  const auto due = steady_deadline_for(milliseconds(0));
  ASSERT_TRUE(due.has_value());
  EXPECT_LE(*due, Steady::now());
}

}  // namespace
}  // namespace graphrun::internal
