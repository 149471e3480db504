#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

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
  EXPECT_THAT(r.status().message(), HasSubstr("'3000000000' is out of int32 range"));
  r = value("true", DType::kFloat32);
  ASSERT_FALSE(r.is_ok());
  r = value("2", DType::kBool);
  ASSERT_FALSE(r.is_ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'2' is not a valid bool value"));
}

// Underflow rounds (to a denormal or a signed 0), as NumPy does; overflow is
// "out of range", not "not a valid value" or a syntax error.
TEST(CliValuesTest, FloatUnderflowRoundsAndOverflowIsOutOfRange) {
  EXPECT_EQ(value("1e-40", DType::kFloat32)->scalar<float>(), 1e-40f);  // a denormal
  auto tiny = value("1e-50,-1e-50,1", DType::kFloat32);
  ASSERT_TRUE(tiny.is_ok()) << tiny.status().to_string();
  EXPECT_EQ(tiny->flat<float>()[0], 0.0f);
  EXPECT_TRUE(std::signbit(tiny->flat<float>()[1]));
  EXPECT_EQ(value("1e-400", DType::kFloat64)->scalar<double>(), 0.0);
  EXPECT_EQ(value("1e-50", DType::kFloat64)->scalar<double>(), 1e-50);
  for (const auto& [text, dtype] :
       std::vector<std::pair<std::string, DType>>{{"1e39", DType::kFloat32},
                                                  {"-1e39", DType::kFloat32},
                                                  {"1e400", DType::kFloat64},
                                                  {"1e400", DType::kFloat32},
                                                  {"99999999999999999999", DType::kInt64},
                                                  {"3000000000", DType::kInt32}}) {
    auto r = value(text, dtype);
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_THAT(r.status().message(),
                HasSubstr(fmt::format("feed 'x': '{}' is out of {} range", text, dtype)));
  }
  // 1e400 is a number (syntax); only the dtype makes it out of range.
  EXPECT_TRUE(parse_value_literal("1e400,1").is_ok());
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

// Escaped names past NAME_MAX are shortened: a prefix, '~', a hash of the
// whole name; names that fit are kept.
TEST(CliOutputTest, LongFileNamesAreShortenedWithAHash) {
  const std::string fits(kMaxOutputFileNameBytes - 4, 'a');
  EXPECT_EQ(output_file_name(fits), fits + ".npy");
  std::string probe;  // "a/a/.../x", 201 bytes: 399 escaped
  for (int i = 0; i < 100; ++i) probe += "a/";
  probe += 'x';
  const std::string name = output_file_name(probe);
  EXPECT_LE(name.size(), kMaxOutputFileNameBytes);
  EXPECT_TRUE(name.ends_with(".npy")) << name;
  EXPECT_TRUE(name.starts_with("a%2Fa%2F")) << name;
  EXPECT_EQ(name.find('/'), std::string::npos);
  EXPECT_EQ(name.size() - name.rfind('~'), 1 + 16 + 4u) << name;
  EXPECT_EQ(output_file_name(probe), name);  // deterministic
  // Names differing only past the prefix differ.
  std::string other = probe;
  other.back() = 'y';
  EXPECT_NE(output_file_name(other), name);
  const std::string longer = fits + "a";
  EXPECT_LE(output_file_name(longer).size(), kMaxOutputFileNameBytes);
  EXPECT_NE(output_file_name(longer), fits + ".npy");
  // A cut never splits a %XX escape: every '%' is followed by two hex digits.
  for (const int shift : {0, 1, 2}) {
    const std::string mixed = std::string(static_cast<std::size_t>(shift), 'b') + probe;
    const std::string n = output_file_name(mixed);
    const std::string prefix = n.substr(0, n.rfind('~'));
    for (std::size_t at = prefix.find('%'); at != std::string::npos;
         at = prefix.find('%', at + 1)) {
      ASSERT_LE(at + 3, prefix.size()) << n;
    }
  }
}

TEST(CliOutputTest, LongTensorsAreElidedWithACount) {
  EXPECT_EQ(format_fetch("add", Tensor{11.0f, 22.0f, 33.0f}, 32), "add: float32[3] [11, 22, 33]");
  const std::string line = format_fetch("big", Tensor::filled(Shape{100}, int32_t{7}), 4);
  EXPECT_THAT(line, HasSubstr("big: int32[100] [7, 7, 7, 7, ...]"));
  EXPECT_THAT(line, HasSubstr("(4 of 100 elements shown)"));
  EXPECT_THAT(format_fetch("big", Tensor::filled(Shape{100}, int32_t{7}), 0),
              ::testing::Not(HasSubstr("...")));
}

// A zero-element tensor's empty lists count against the limit (before, a
// [10^8,0] Const printed 400 MB with --print-limit 1).
TEST(CliOutputTest, ZeroElementTensorsAreElidedWithACount) {
  const Tensor empty = *Tensor::allocate(DType::kFloat32, Shape{1000000, 0});
  EXPECT_EQ(format_fetch("c", empty, 1),
            "c: float32[1000000,0] [[], ...] (1 of 1000000 "
            "empty lists shown)");
  const Tensor huge = *Tensor::allocate(DType::kFloat32, Shape{3000, 3000, 0});
  EXPECT_LT(format_fetch("c", huge, 32).size(), 400u);
  EXPECT_THAT(format_fetch("c", huge, 32), HasSubstr("(32 of 9000000 empty lists shown)"));
  // 0 ("show all") shows all of its 0 elements, and the default of lists.
  EXPECT_EQ(format_fetch("c", huge, 0), format_fetch("c", huge, kDefaultPrintLimit));
  EXPECT_EQ(format_fetch("c", *Tensor::allocate(DType::kInt32, Shape{2, 0}), 32),
            "c: int32[2,0] [[], []]");
  EXPECT_EQ(format_fetch("c", *Tensor::allocate(DType::kInt32, Shape{0, 5}), 32),
            "c: int32[0,5] []");
}

// Error lines are bounded: a cycle of 200,000 nodes once made a 2.5 MB line.
TEST(CliErrorLineTest, LongMessagesAreCutAtASeparator) {
  EXPECT_EQ(one_line("a\nb"), "a b");
  EXPECT_EQ(one_line("a\r\nb\tc"), "a  b c");
  // Control bytes (an ANSI escape, 0x01, DEL) never reach the terminal.
  EXPECT_EQ(one_line("node 'x\x1b[31m\x01\x7f' (NoOp)"), "node 'x\\x1b[31m\\x01\\x7f' (NoOp)");
  std::string cycle = "node 'n0' (Identity): is on a cycle of inputs: 'n0'";
  for (int i = 199999; i >= 0; --i) cycle += fmt::format(" <- 'n{}'", i);
  const std::string line = one_line(cycle);
  EXPECT_LT(line.size(), kMaxErrorMessageBytes + 100);
  EXPECT_TRUE(line.starts_with("node 'n0' (Identity): is on a cycle of inputs: 'n0' <- 'n199999'"));
  EXPECT_THAT(line, ::testing::MatchesRegex(".*'n[0-9]+' <- \\.\\.\\. and [0-9]+ more \\([0-9]+ "
                                            "bytes of the message left out\\)"));
  const std::string plain(5000, 'x');
  EXPECT_EQ(one_line(plain),
            std::string(kMaxErrorMessageBytes, 'x') + " ... (3000 bytes of the message left out)");
  const std::string short_message(kMaxErrorMessageBytes, 'y');
  EXPECT_EQ(one_line(short_message), short_message);
}

// JSON is UTF-8: well-formed sequences pass, every other byte (a graph
// path is any bytes) becomes U+FFFD, so that the trace always parses.
TEST(CliTraceTest, JsonEscapeKeepsUtf8AndReplacesOtherBytes) {
  EXPECT_EQ(json_escape("a\"b\\c\n"), R"("a\"b\\c\u000a")");
  EXPECT_EQ(json_escape("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  EXPECT_EQ(json_escape("weird\xff\"dir"), R"("weird\ufffd\"dir")");
  EXPECT_EQ(json_escape("\xc0\xaf"), R"("\ufffd\ufffd")");                      // overlong '/'
  EXPECT_EQ(json_escape("\xed\xa0\x80"), R"("\ufffd\ufffd\ufffd")");            // a surrogate
  EXPECT_EQ(json_escape("\xf4\x90\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");  // > U+10FFFF
  EXPECT_EQ(json_escape("\xe2\x82"), R"("\ufffd\ufffd")");                      // cut short
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
