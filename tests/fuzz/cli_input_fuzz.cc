// libFuzzer target: the command line's own parsers of user input (docs/cli.md).
// The first byte picks the parser, the rest is its input:
//   0  .npy bytes: npy::parse; a tensor it accepts prints within a bound and
//      comes back unchanged through npy::serialize -> npy::parse, and
//      serializes to the same bytes again.
//   1  a --feed argument: parse_feed_arg, then literal_to_tensor with the
//      dtype and declared shape the second byte picks; a tensor it makes has
//      that dtype, one element per token, the bracketed shape when brackets
//      were written, and prints within a bound.
//   2  a --partial step: parse_step; every feed, fetch and target it returns
//      has a name.
// Whatever the parser, the input also goes through one_line (no control
// byte, bounded length) and output_file_name (a file name of at most
// NAME_MAX bytes that decodes back to the tensor name when not shortened).
#include <graphrun/tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_support.h"
#include "tools/graphrun/cli.h"
#include "tools/graphrun/npy.h"

namespace graphrun::fuzz {
namespace {

// format_fetch with the default limit: at most 32 elements (or empty lists)
// of at most ~30 bytes each, the brackets of 8 dimensions around each, the
// name and the shape: far below this.
constexpr std::size_t kMaxPrintedBytes = 16 * 1024;

void check_printed(const Tensor& t) {
  const std::string printed = cli::format_fetch("t", t, cli::kDefaultPrintLimit);
  GRAPHRUN_FUZZ_CHECK(printed.starts_with("t: "), printed);
  GRAPHRUN_FUZZ_CHECK(printed.size() <= kMaxPrintedBytes, "format_fetch is past its bound");
}

void npy_round_trip(std::string_view bytes) {
  Result<Tensor> t = npy::parse(bytes);
  if (!t.is_ok()) return verbose_rejection("npy::parse", t.status());
  GRAPHRUN_FUZZ_CHECK(t->is_initialized());
  check_printed(*t);
  const std::string written = npy::serialize(*t);
  Result<Tensor> again = npy::parse(written);
  GRAPHRUN_FUZZ_CHECK(again.is_ok(), again.status());
  GRAPHRUN_FUZZ_CHECK(again->dtype() == t->dtype());
  GRAPHRUN_FUZZ_CHECK(again->shape() == t->shape());
  GRAPHRUN_FUZZ_CHECK(same_bytes(*again, *t), "the round trip changed the tensor's bytes");
  GRAPHRUN_FUZZ_CHECK(npy::serialize(*again) == written, "serialize is not a fixed point");
}

void feed_to_tensor(uint8_t choice, std::string_view arg) {
  Result<cli::FeedArg> feed = cli::parse_feed_arg(arg);
  if (!feed.is_ok()) return verbose_rejection("parse_feed_arg", feed.status());
  GRAPHRUN_FUZZ_CHECK(!feed->name.empty());
  if (!feed->file.empty()) return;
  constexpr DType kDtypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                               DType::kBool};
  const DType dtype = kDtypes[choice % 5];
  // The declared shape: unknown, a scalar, a vector, or a 2x2 matrix.
  Shape declared;
  switch ((choice / 5) % 4) {
    case 0: declared = Shape::unknown(); break;
    case 1: declared = Shape{}; break;
    case 2: declared = Shape{static_cast<int64_t>(feed->values.tokens.size())}; break;
    default: declared = Shape{2, 2}; break;
  }
  Result<Tensor> t = cli::literal_to_tensor(feed->values, dtype, declared, feed->name);
  if (!t.is_ok()) return verbose_rejection("literal_to_tensor", t.status());
  GRAPHRUN_FUZZ_CHECK(t->dtype() == dtype);
  GRAPHRUN_FUZZ_CHECK(t->num_elements() == static_cast<int64_t>(feed->values.tokens.size()),
                      "one element per token");
  if (feed->values.bracketed) {
    GRAPHRUN_FUZZ_CHECK(t->shape() == feed->values.shape, "brackets fix the shape");
  }
  check_printed(*t);
}

void step(std::string_view text) {
  Result<cli::StepSpec> s = cli::parse_step(text);
  if (!s.is_ok()) return verbose_rejection("parse_step", s.status());
  for (const cli::FeedArg& f : s->feeds) GRAPHRUN_FUZZ_CHECK(!f.name.empty());
  for (const std::string& f : s->fetches) GRAPHRUN_FUZZ_CHECK(!f.empty());
  for (const std::string& n : s->targets) GRAPHRUN_FUZZ_CHECK(!n.empty());
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void names_and_lines(std::string_view s) {
  const std::string line = cli::one_line(std::string(s));
  GRAPHRUN_FUZZ_CHECK(line.size() <= cli::kMaxErrorMessageBytes + 128, "one_line is too long");
  for (const char c : line) {
    const auto u = static_cast<unsigned char>(c);
    GRAPHRUN_FUZZ_CHECK(u >= 0x20 && u != 0x7f, "one_line let a control byte through");
  }

  const std::string file = cli::output_file_name(s);
  GRAPHRUN_FUZZ_CHECK(file.size() <= cli::kMaxOutputFileNameBytes, "file name past NAME_MAX");
  GRAPHRUN_FUZZ_CHECK(file.ends_with(".npy"));
  bool shortened = false;
  for (const char c : file) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-' || c == '%';
    shortened = shortened || c == '~';
    GRAPHRUN_FUZZ_CHECK(plain || c == '~', "a byte outside [A-Za-z0-9._%~-] in a file name");
  }
  if (shortened) return;
  // Not shortened: the name is the tensor name, percent-encoded.
  std::string decoded;
  const std::string_view stem(file.data(), file.size() - 4);
  for (std::size_t i = 0; i < stem.size(); ++i) {
    if (stem[i] != '%') {
      decoded += stem[i];
      continue;
    }
    GRAPHRUN_FUZZ_CHECK(i + 2 < stem.size(), "a cut %XX escape");
    const int hi = hex_digit(stem[i + 1]);
    const int lo = hex_digit(stem[i + 2]);
    GRAPHRUN_FUZZ_CHECK(hi >= 0 && lo >= 0, "a bad %XX escape");
    decoded += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  GRAPHRUN_FUZZ_CHECK(decoded == s, "the file name does not decode to the tensor name");
}

}  // namespace
}  // namespace graphrun::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 3) {
    case 0: graphrun::fuzz::npy_round_trip(rest); break;
    case 1: graphrun::fuzz::feed_to_tensor(data[1], rest); break;
    default: graphrun::fuzz::step(rest); break;
  }
  graphrun::fuzz::names_and_lines(rest);
  return 0;
}
