#include <graphrun/status.h>
#include <gtest/gtest.h>

#include <memory>

namespace graphrun {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
}

TEST(StatusTest, FactoriesFormatAndCarryTheCode) {
  Status s = invalid_argument("feed '{}' fed {} times", "x:0", 2);
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "feed 'x:0' fed 2 times");
  EXPECT_EQ(s.to_string(), "InvalidArgument: feed 'x:0' fed 2 times");
  EXPECT_EQ(not_found("a").code(), StatusCode::kNotFound);
  EXPECT_EQ(failed_precondition("a").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(out_of_range("a").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cancelled("a").code(), StatusCode::kCancelled);
  EXPECT_EQ(deadline_exceeded("a").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(resource_exhausted("a").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(unimplemented("a").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(internal_error("a").code(), StatusCode::kInternal);
}

TEST(StatusTest, OkCodeDropsTheMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, UpdateKeepsTheFirstError) {
  Status s;
  s.update(Status::ok());
  EXPECT_TRUE(s.is_ok());
  s.update(not_found("first"));
  s.update(internal_error("second"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "first");
}

TEST(StatusTest, WithPrefix) {
  EXPECT_EQ(not_found("b").with_prefix("a").message(), "a: b");
  EXPECT_TRUE(Status::ok().with_prefix("a").is_ok());
}

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument("{} is odd", x);
  return x / 2;
}

Result<int> quarter(int x) {
  GRAPHRUN_ASSIGN_OR_RETURN(int h, half(x));
  GRAPHRUN_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status check_even(int x) {
  GRAPHRUN_RETURN_IF_ERROR(half(x).status());
  return Status::ok();
}

TEST(ResultTest, ValueOrStatus) {
  Result<int> r = half(8);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 4);
  EXPECT_TRUE(r.status().is_ok());
  Result<int> e = half(3);
  EXPECT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().message(), "3 is odd");
  EXPECT_EQ(e.value_or(-1), -1);
}

TEST(ResultTest, MacrosPropagate) {
  EXPECT_EQ(*quarter(8), 2);
  EXPECT_EQ(quarter(6).status().message(), "3 is odd");
  EXPECT_TRUE(check_even(2).is_ok());
  EXPECT_EQ(check_even(1).code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, HoldsMoveOnlyTypes) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.is_ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  Result<int> e = half(3);
  EXPECT_DEATH((void)e.value(), "3 is odd");
}

}  // namespace
}  // namespace graphrun
