#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tools/graphrun/cli.h"

namespace graphrun::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Result<Tensor> value(std::string_view text, DType dtype, const Shape& declared = Shape::unknown()) {
  GRAPHRUN_ASSIGN_OR_RETURN(ValueLiteral lit, parse_value_literal(text));
  return literal_to_tensor(lit, dtype, declared, "x");
}

TEST(CliValuesTest, ScalarsListsAndNestedBrackets) {
  EXPECT_EQ(*value("3", DType::kFloat32), Tensor(3.0f));
  EXPECT_EQ(*value(" 1, 2 ,3", DType::kInt64), (Tensor{int64_t{1}, int64_t{2}, int64_t{3}}));
  EXPECT_EQ(*value("[[1,2],[3,4]]", DType::kFloat64), Tensor::matrix<double>({{1, 2}, {3, 4}}));
  EXPECT_EQ(value("[]", DType::kFloat32)->debug_type(), "float32[0]");
  EXPECT_EQ(value("[[],[]]", DType::kInt32)->debug_type(), "int32[2,0]");
  EXPECT_EQ(value("[[[1]],[[2]]]", DType::kInt32)->debug_type(), "int32[2,1,1]");
  EXPECT_EQ(*value("true,false,1,0", DType::kBool), (Tensor{true, false, true, false}));
  EXPECT_EQ(*value("-1.5e3", DType::kFloat32), Tensor(-1500.0f));
  EXPECT_TRUE(std::isinf(value("-inf", DType::kFloat64)->scalar<double>()));
}

TEST(CliValuesTest, FlatListTakesTheDeclaredShape) {
  EXPECT_EQ(*value("1,2,3,4", DType::kFloat32, Shape{2, 2}),
            Tensor::matrix<float>({{1, 2}, {3, 4}}));
  // Brackets fix the shape: no reshape.
  EXPECT_EQ(value("[1,2,3,4]", DType::kFloat32, Shape{2, 2})->debug_type(), "float32[4]");
  // Not fully defined: stays a vector.
  EXPECT_EQ(value("1,2,3,4", DType::kFloat32, Shape{-1, 2})->debug_type(), "float32[4]");
}

TEST(CliValuesTest, DtypeErrorsNameTheFeedAndDtype) {
  auto r = value("1.5", DType::kInt32);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(), HasSubstr("feed 'x': '1.5' is not a valid int32 value"));
  r = value("3000000000", DType::kInt32);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'3000000000' is not a valid int32"));
  r = value("true", DType::kFloat32);
  ASSERT_FALSE(r.is_ok());
  r = value("2", DType::kBool);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'2' is not a valid bool value"));
}

TEST(CliValuesTest, SyntaxErrorsArePositional) {
  for (const char* bad :
       {"", "1,,2", "1,", "[1,2", "[[1,2],[3]]", "[1,[2]]", "abc", "[1] 2", "[1;2]", "[[1],2]"}) {
    auto r = parse_value_literal(bad);
    EXPECT_FALSE(r.is_ok()) << "'" << bad << "'";
  }
  EXPECT_THAT(parse_value_literal("[[1,2],[3]]").status().message(), HasSubstr("ragged"));
  EXPECT_THAT(parse_value_literal("1,x").status().message(),
              HasSubstr("'x' is not a number or true/false"));
}

TEST(CliFeedArgTest, ParsesInlineAndFile) {
  auto f = parse_feed_arg("layer/x:0=1,2");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->name, "layer/x:0");
  EXPECT_THAT(f->values.tokens, ElementsAre("1", "2"));
  f = parse_feed_arg("x=@/tmp/a b.npy");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->file, "/tmp/a b.npy");
  EXPECT_FALSE(parse_feed_arg("x").is_ok());
  EXPECT_FALSE(parse_feed_arg("=1").is_ok());
  EXPECT_FALSE(parse_feed_arg("x=@").is_ok());
  EXPECT_THAT(parse_feed_arg("x=1,,2").status().message(), HasSubstr("feed 'x': bad value"));
}

TEST(CliStepTest, ParsesClauses) {
  auto s = parse_step(" feed x=1,2; feed:y=[[1]] ;fetch r1, r2:0; target init ;");
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  ASSERT_EQ(s->feeds.size(), 2u);
  EXPECT_EQ(s->feeds[1].name, "y");
  EXPECT_THAT(s->fetches, ElementsAre("r1", "r2:0"));
  EXPECT_THAT(s->targets, ElementsAre("init"));
  s = parse_step("fetch:add:0");
  ASSERT_TRUE(s.is_ok());
  EXPECT_THAT(s->fetches, ElementsAre("add:0"));
  EXPECT_THAT(parse_step("run x").status().message(), HasSubstr("unknown keyword 'run'"));
  EXPECT_FALSE(parse_step("fetch a,,b").is_ok());
  EXPECT_FALSE(parse_step(" ; ").is_ok());
  EXPECT_FALSE(parse_step("fetchr1").is_ok());
}

TEST(CliOutputTest, FileNamesAreEscaped) {
  EXPECT_EQ(output_file_name("add"), "add.npy");
  EXPECT_EQ(output_file_name("layer1/add:1"), "layer1%2Fadd%3A1.npy");
  EXPECT_EQ(output_file_name("../x%"), "..%2Fx%25.npy");
}

TEST(CliOutputTest, LongTensorsAreElidedWithACount) {
  EXPECT_EQ(format_fetch("add", Tensor{11.0f, 22.0f, 33.0f}, 32), "add: float32[3] [11, 22, 33]");
  const std::string line = format_fetch("big", Tensor::filled(Shape{100}, int32_t{7}), 4);
  EXPECT_THAT(line, HasSubstr("big: int32[100] [7, 7, 7, 7, ...]"));
  EXPECT_THAT(line, HasSubstr("(4 of 100 elements shown)"));
  EXPECT_THAT(format_fetch("big", Tensor::filled(Shape{100}, int32_t{7}), 0),
              ::testing::Not(HasSubstr("...")));
}

TEST(CliTraceTest, EscapesNamesAndEmitsMetadata) {
  NodeExecStats s;
  s.node = "a\"b\\c";
  s.op = "Add";
  s.start_ns = 5000;
  s.end_ns = 7500;
  s.thread = 3;
  s.output_shapes = {Shape{2}};
  s.output_bytes = 8;
  const TracedCall calls[] = {TracedCall{2, {s}}};
  const std::string json = chrome_trace_json(calls, "p");
  EXPECT_THAT(json, HasSubstr(R"("name": "a\"b\\c", "cat": "Add", "ph": "X", "ts": 0.000, )"
                              R"("dur": 2.500, "pid": 1, "tid": 3)"));
  EXPECT_THAT(json, HasSubstr(R"("output_shapes": ["[2]"], "output_bytes": 8, "step": 2)"));
  EXPECT_THAT(json, HasSubstr(R"("name": "thread_name", "ph": "M", "pid": 1, "tid": 3)"));
}

}  // namespace
}  // namespace graphrun::cli
