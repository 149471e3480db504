#include "tools/graphrun/cli.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <graphrun/graph_def.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "tools/graphrun/npy.h"

namespace graphrun::cli {
namespace {

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\n\r");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\n\r");
  return s.substr(first, last - first + 1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? s.size() - start : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

// from_chars over the whole token (a leading '+' allowed): std::errc() when
// it is a number of T, result_out_of_range when it is a number T cannot
// hold, invalid_argument when it is not a number.
template <typename T>
std::errc parse_number_ec(std::string_view token, T& value) {
  if (token.starts_with('+')) {
    token.remove_prefix(1);
    // One sign: "+-1" is not a number (from_chars would read "-1").
    if (token.starts_with('-') || token.starts_with('+')) return std::errc::invalid_argument;
  }
  if (token.empty()) return std::errc::invalid_argument;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (end != token.data() + token.size()) return std::errc::invalid_argument;
  return ec;
}

template <typename T>
bool parse_number(std::string_view token, T& value) {
  return parse_number_ec(token, value) == std::errc();
}

// A floating-point token as T. from_chars reports underflow (1e-50 for
// float32) and overflow (1e39) alike as out of range; strtod tells them
// apart. Underflow rounds to a denormal or a signed 0, as NumPy and C do;
// overflow is an error. Returns false when `token` is not a number,
// `out_of_range` set when it is one past T's largest finite value.
template <typename T>
bool parse_float(const std::string& token, T& value, bool& out_of_range) {
  out_of_range = false;
  const std::errc ec = parse_number_ec(std::string_view(token), value);
  if (ec == std::errc()) return true;
  if (ec != std::errc::result_out_of_range) return false;
  // The token is a well-formed number (from_chars matched all of it).
  const long double wide = std::strtold(token.c_str(), nullptr);
  if (std::isinf(wide) || std::fabs(wide) > std::numeric_limits<T>::max()) {
    out_of_range = true;
    return false;
  }
  value = static_cast<T>(wide);  // below T's smallest normal: a denormal or 0
  return true;
}

bool is_bool_token(std::string_view t) { return t == "true" || t == "false"; }

// Syntax only: a number (also one no dtype can hold, such as 1e400: the
// dtype decides later, with an "out of range" error) or true/false.
bool looks_like_value(std::string_view token) {
  double d = 0;
  const std::errc ec = parse_number_ec(token, d);
  return is_bool_token(token) || ec == std::errc() || ec == std::errc::result_out_of_range;
}

// Recursive descent over nested brackets.
// Thread safety: one parse, one thread.
class BracketParser {
 public:
  explicit BracketParser(std::string_view s) : s_(s) {}

  Result<ValueLiteral> parse() {
    GRAPHRUN_RETURN_IF_ERROR(list(0));
    skip_ws();
    if (pos_ != s_.size()) return error("unexpected text after the closing ']'");
    ValueLiteral lit;
    lit.bracketed = true;
    GRAPHRUN_ASSIGN_OR_RETURN(lit.shape, Shape::make(dims_));
    lit.tokens = std::move(tokens_);
    return lit;
  }

 private:
  Status error(std::string_view what) const {
    return invalid_argument("bad value '{}' at character {}: {}", s_, pos_ + 1, what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  // The rank is fixed by the first element token (its depth) or empty list.
  Status set_rank(std::size_t rank) {
    if (!rank_) {
      if (rank > static_cast<std::size_t>(Shape::kMaxRank)) {
        return error(fmt::format("more than {} nested levels", Shape::kMaxRank));
      }
      rank_ = rank;
    }
    if (*rank_ != rank) return error("ragged nesting (elements at different depths)");
    return Status::ok();
  }
  Status list(std::size_t depth) {
    skip_ws();
    if (pos_ >= s_.size() || s_[pos_] != '[') return error("expected '['");
    ++pos_;
    if (depth >= static_cast<std::size_t>(Shape::kMaxRank)) {
      return error(fmt::format("more than {} nested levels", Shape::kMaxRank));
    }
    int64_t n = 0;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      GRAPHRUN_RETURN_IF_ERROR(set_rank(depth + 1));
    } else {
      while (true) {
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '[') {
          GRAPHRUN_RETURN_IF_ERROR(list(depth + 1));
        } else {
          const std::size_t start = pos_;
          while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != ']' && s_[pos_] != '[') ++pos_;
          const std::string_view token = trim(s_.substr(start, pos_ - start));
          pos_ = start;
          if (token.empty()) return error("empty element");
          if (!looks_like_value(token)) {
            return error(fmt::format("'{}' is not a number or true/false", token));
          }
          GRAPHRUN_RETURN_IF_ERROR(set_rank(depth + 1));
          tokens_.emplace_back(token);
          while (pos_ < s_.size() && s_[pos_] != ',' && s_[pos_] != ']' && s_[pos_] != '[') ++pos_;
        }
        ++n;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          break;
        }
        return error("expected ',' or ']'");
      }
    }
    if (dims_.size() <= depth) {
      dims_.resize(depth + 1, -1);
    }
    if (dims_[depth] == -1) {
      dims_[depth] = n;
    } else if (dims_[depth] != n) {
      return error(
          fmt::format("ragged brackets (a list of {} beside a list of {})", n, dims_[depth]));
    }
    return Status::ok();
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::vector<int64_t> dims_;
  std::optional<std::size_t> rank_;
  std::vector<std::string> tokens_;
};

template <typename T>
Status convert_tokens(const ValueLiteral& lit, Tensor& t, std::string_view feed) {
  std::span<T> out = t.flat<T>();
  for (std::size_t i = 0; i < lit.tokens.size(); ++i) {
    const std::string& tok = lit.tokens[i];
    const DType dtype = dtype_of<T>();
    auto bad = [&] {
      return invalid_argument(
          "feed '{}': '{}' is not a valid {} value (the dtype declared for '{}')", feed, tok, dtype,
          feed);
    };
    auto range = [&] {
      return invalid_argument("feed '{}': '{}' is out of {} range (the dtype declared for '{}')",
                              feed, tok, dtype, feed);
    };
    if constexpr (std::is_same_v<T, bool>) {
      if (tok == "true" || tok == "1") {
        out[i] = true;
      } else if (tok == "false" || tok == "0") {
        out[i] = false;
      } else {
        return bad();
      }
    } else if constexpr (std::is_floating_point_v<T>) {
      bool out_of_range = false;
      if (!parse_float(tok, out[i], out_of_range)) return out_of_range ? range() : bad();
    } else {
      T v{};
      const std::errc ec = parse_number_ec(std::string_view(tok), v);
      if (ec == std::errc::result_out_of_range) return range();
      if (ec != std::errc()) return bad();
      out[i] = v;
    }
  }
  return Status::ok();
}

// Prints and optionally writes the fetches of one call.
Status emit_fetches(const std::vector<std::string>& names, const std::vector<Tensor>& values,
                    const RunArgs& args, std::FILE* out) {
  for (std::size_t i = 0; i < names.size() && i < values.size(); ++i) {
    fmt::print(out, "{}\n", format_fetch(names[i], values[i], args.print_limit));
    if (!args.out_dir.empty()) {
      const std::filesystem::path path =
          std::filesystem::path(args.out_dir) / output_file_name(names[i]);
      GRAPHRUN_RETURN_IF_ERROR(npy::write_file(values[i], path));
    }
  }
  return Status::ok();
}

template <typename T>
void append_unique(std::vector<T>& to, const T& v) {
  if (std::find(to.begin(), to.end(), v) == to.end()) to.push_back(v);
}

}  // namespace

// Error messages stay on one line, and a bounded one: past
// kMaxErrorMessageBytes the message is cut at a list separator (" <- " of a
// cycle, ", ") and says how much was left out.
std::string one_line(std::string in) {
  // Line breaks and tabs become spaces; any other control byte (an ANSI
  // escape in a node name, say) is shown as \xNN rather than sent to the
  // terminal.
  std::string s;
  s.reserve(in.size());
  for (const char c : in) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r' || c == '\t') {
      s += ' ';
    } else if (u < 0x20 || u == 0x7f) {
      s += fmt::format("\\x{:02x}", u);
    } else {
      s += c;
    }
  }
  if (s.size() <= kMaxErrorMessageBytes) return s;
  const std::string_view all(s);
  const std::string_view head = all.substr(0, kMaxErrorMessageBytes);
  std::string_view separator = " <- ";
  std::size_t cut = head.rfind(separator);
  if (cut == std::string_view::npos || cut < kMaxErrorMessageBytes / 2) {
    separator = ", ";
    cut = head.rfind(separator);
  }
  if (cut == std::string_view::npos || cut < kMaxErrorMessageBytes / 2) {
    separator = {};
    cut = kMaxErrorMessageBytes;
    // Not inside a UTF-8 sequence.
    while (cut > 0 && (static_cast<unsigned char>(all[cut]) & 0xC0) == 0x80) --cut;
  }
  const std::string_view rest = all.substr(cut);
  std::size_t items = 0;
  if (!separator.empty()) {
    for (std::size_t at = rest.find(separator); at != std::string_view::npos;
         at = rest.find(separator, at + separator.size())) {
      ++items;
    }
  }
  std::string out(all.substr(0, cut));
  if (items > 0) {
    out += fmt::format("{}... and {} more ({} bytes of the message left out)", separator, items,
                       rest.size());
  } else {
    out += fmt::format(" ... ({} bytes of the message left out)", rest.size());
  }
  return out;
}

namespace {
// The length of the well-formed UTF-8 sequence at the start of `s` (RFC
// 3629: no overlong forms, surrogates or code points past U+10FFFF), or 0.
std::size_t utf8_sequence(std::string_view s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(0);
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || byte(1) < lo || byte(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return n;
}
}  // namespace

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
    } else if (u >= 0x80) {
      // JSON is UTF-8: a byte that starts no well-formed sequence (a path
      // is any bytes) becomes U+FFFD, as a decoder would show it.
      const std::size_t n = utf8_sequence(s.substr(i));
      if (n == 0) {
        out += "\\ufffd";
        ++i;
        continue;
      }
      out.append(s.substr(i, n));
      i += n;
      continue;
    } else {
      out += c;
    }
    ++i;
  }
  out += '"';
  return out;
}

// A feed argument resolved against the graph: the value with the declared
// dtype, checked against the declared shape.
Result<Feed> resolve_feed(const Graph& graph, const FeedArg& arg) {
  auto output = graph.find_output(arg.name);
  if (!output.is_ok()) return output.status().with_prefix(fmt::format("feed '{}'", arg.name));
  const DType dtype = output->dtype();
  const Shape& declared = output->shape();
  Tensor value;
  if (!arg.file.empty()) {
    auto read = npy::read_file(arg.file);
    if (!read.is_ok()) return read.status().with_prefix(fmt::format("feed '{}'", arg.name));
    value = std::move(*read);
    if (value.dtype() != dtype) {
      std::string hint;
      if (dtype != DType::kBool) hint = fmt::format(" (convert with a.astype('{}'))", dtype);
      return invalid_argument("feed '{}': {} holds {} but '{}' is {}{}", arg.name, arg.file,
                              value.dtype(), arg.name, dtype, hint);
    }
  } else {
    GRAPHRUN_ASSIGN_OR_RETURN(value, literal_to_tensor(arg.values, dtype, declared, arg.name));
  }
  if (!declared.is_compatible_with(value.shape())) {
    return invalid_argument("feed '{}': the value has shape {} but '{}' is declared {} {}",
                            arg.name, value.shape(), arg.name, dtype, declared);
  }
  return Feed{TensorRef(arg.name), std::move(value)};
}

Status check_fetch(const Graph& graph, const std::string& name) {
  auto output = graph.find_output(name);
  if (!output.is_ok()) return output.status().with_prefix(fmt::format("fetch '{}'", name));
  return Status::ok();
}

Status check_target(const Graph& graph, const std::string& name) {
  auto parsed = parse_tensor_name(name);
  if (!parsed.is_ok()) return parsed.status().with_prefix(fmt::format("target '{}'", name));
  if (graph.find_node(parsed->node) == nullptr) {
    return not_found("target '{}': the graph has no node '{}'", name, parsed->node);
  }
  // "node:k" names an output: it must be one (as for --fetch).
  if (name.find(':') != std::string::npos) {
    auto output = graph.find_output(name);
    if (!output.is_ok()) return output.status().with_prefix(fmt::format("target '{}'", name));
  }
  return Status::ok();
}

std::string graph_file_error(std::string_view path, const Status& status) {
  const std::string prefix = fmt::format("graph file '{}': ", path);
  std::string_view message = status.message();
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  return fmt::format("{}{}: {}", prefix, status_code_name(status.code()), message);
}

Status write_output_file(const std::string& path, std::string_view bytes, std::string_view what) {
  auto failed = [&](std::string_view step) {
    return internal_error("{} '{}': cannot {}: {}", what, path, step,
                          std::generic_category().message(errno));
  };
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return failed("create the file");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      Status s = failed("write the file");
      ::close(fd);
      return s;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) return failed("write the file");
  return Status::ok();
}

Result<ValueLiteral> parse_value_literal(std::string_view text) {
  const std::string_view s = trim(text);
  if (s.empty()) return invalid_argument("empty value");
  if (s.front() == '[') return BracketParser(s).parse();
  ValueLiteral lit;
  const auto parts = split(s, ',');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string_view token = trim(parts[i]);
    if (token.empty()) return invalid_argument("bad value '{}': element {} is empty", s, i + 1);
    if (!looks_like_value(token)) {
      return invalid_argument("bad value '{}': '{}' is not a number or true/false", s, token);
    }
    lit.tokens.emplace_back(token);
  }
  if (parts.size() > 1) lit.shape = Shape{static_cast<int64_t>(parts.size())};
  return lit;
}

Result<Tensor> literal_to_tensor(const ValueLiteral& literal, DType dtype, const Shape& declared,
                                 std::string_view feed) {
  if (dtype == DType::kInvalid) return invalid_argument("feed '{}': invalid dtype", feed);
  Shape shape = literal.shape;
  if (!literal.bracketed && shape.rank() == 1 && declared.is_fully_defined() &&
      declared.rank() != 1 && declared.num_elements() == shape.num_elements()) {
    shape = declared;
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, Tensor::allocate(dtype, shape));
  GRAPHRUN_RETURN_IF_ERROR(visit_dtype(
      dtype, [&](auto zero) { return convert_tokens<decltype(zero)>(literal, t, feed); }));
  return t;
}

Result<FeedArg> parse_feed_arg(std::string_view arg) {
  const std::size_t eq = arg.find('=');
  if (eq == std::string_view::npos) {
    return invalid_argument("feed '{}': expected NAME=VALUES or NAME=@FILE.npy", arg);
  }
  FeedArg feed;
  feed.name = std::string(trim(arg.substr(0, eq)));
  if (feed.name.empty()) return invalid_argument("feed '{}': the tensor name is empty", arg);
  const std::string_view rhs = trim(arg.substr(eq + 1));
  if (rhs.starts_with('@')) {
    feed.file = std::string(trim(rhs.substr(1)));
    if (feed.file.empty())
      return invalid_argument("feed '{}': the file name after '@' is empty", arg);
    return feed;
  }
  auto values = parse_value_literal(rhs);
  if (!values.is_ok()) {
    return invalid_argument("feed '{}': {}", feed.name, values.status().message());
  }
  feed.values = std::move(*values);
  return feed;
}

Result<StepSpec> parse_step(std::string_view text) {
  StepSpec step;
  for (const std::string_view raw : split(text, ';')) {
    const std::string_view clause = trim(raw);
    if (clause.empty()) continue;
    std::size_t k = 0;
    while (k < clause.size() && clause[k] >= 'a' && clause[k] <= 'z') ++k;
    const std::string_view keyword = clause.substr(0, k);
    if (k == clause.size() || (clause[k] != ' ' && clause[k] != ':' && clause[k] != '\t')) {
      return invalid_argument(
          "clause '{}': expected 'feed NAME=VALUES', 'fetch NAME[,NAME]' or 'target NODE[,NODE]'",
          clause);
    }
    const std::string_view rest = trim(clause.substr(k + 1));
    if (keyword == "feed") {
      GRAPHRUN_ASSIGN_OR_RETURN(FeedArg feed, parse_feed_arg(rest));
      step.feeds.push_back(std::move(feed));
    } else if (keyword == "fetch" || keyword == "target") {
      auto& list = keyword == "fetch" ? step.fetches : step.targets;
      for (const std::string_view name : split(rest, ',')) {
        const std::string_view n = trim(name);
        if (n.empty()) return invalid_argument("clause '{}': empty {} name", clause, keyword);
        list.emplace_back(n);
      }
    } else {
      return invalid_argument("clause '{}': unknown keyword '{}' (feed, fetch or target)", clause,
                              keyword);
    }
  }
  if (step.feeds.empty() && step.fetches.empty() && step.targets.empty()) {
    return invalid_argument("the step is empty");
  }
  return step;
}

std::string output_file_name(std::string_view tensor_name) {
  std::string out;
  out.reserve(tensor_name.size() + 4);
  for (const char c : tensor_name) {
    const auto u = static_cast<unsigned char>(c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out += c;
    } else {
      out += fmt::format("%{:02X}", u);
    }
  }
  if (out.size() + 4 <= kMaxOutputFileNameBytes) return out + ".npy";
  // Too long for a file name (NAME_MAX): a prefix, then '~' (never in an
  // escaped name, so no shortened name equals an unshortened one) and the
  // FNV-1a 64-bit hash of the whole tensor name, in 16 hex digits.
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : tensor_name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  std::size_t keep = kMaxOutputFileNameBytes - 4 - 1 - 16;
  // Not inside a "%XX" escape.
  if (out[keep - 1] == '%') {
    keep -= 1;
  } else if (out[keep - 2] == '%') {
    keep -= 2;
  }
  out.resize(keep);
  return fmt::format("{}~{:016x}.npy", out, hash);
}

std::string format_fetch(std::string_view name, const Tensor& value, int64_t limit) {
  // 0 shows every element; a zero-element tensor has none, and its empty
  // lists (10^10 of them for [10^5,10^5,0]) are shown up to the default.
  const int64_t unlimited =
      value.num_elements() == 0 ? kDefaultPrintLimit : std::numeric_limits<int64_t>::max();
  const int64_t shown_limit = limit <= 0 ? unlimited : limit;
  std::string line = fmt::format("{}: {}", name, value.to_string(shown_limit));
  if (value.num_elements() > shown_limit) {
    line += fmt::format(" ({} of {} elements shown)", shown_limit, value.num_elements());
  } else if (value.num_elements() == 0 && value.shape().rank() > 1) {
    // to_string counts each empty list "[]" as one element: there are as
    // many as the dimensions before the first 0 multiply to (saturated).
    int64_t lists = 1;
    for (const int64_t d : value.shape().dims()) {
      if (d == 0) break;
      if (__builtin_mul_overflow(lists, d, &lists)) lists = std::numeric_limits<int64_t>::max();
    }
    if (lists > shown_limit) {
      line += fmt::format(" ({} of {} empty lists shown)", shown_limit, lists);
    }
  }
  return line;
}

std::string chrome_trace_json(std::span<const TracedCall> calls, std::string_view process_name) {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  std::set<int> threads;
  for (const TracedCall& call : calls) {
    for (const NodeExecStats& s : call.stats) {
      t0 = std::min(t0, s.start_ns);
      threads.insert(s.thread);
    }
  }
  if (t0 == std::numeric_limits<int64_t>::max()) t0 = 0;
  auto micros = [](int64_t ns) { return fmt::format("{:.3f}", static_cast<double>(ns) / 1000.0); };
  std::string out = "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n";
  out += fmt::format(
      "  {{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": "
      "{{\"name\": {}}}}}",
      json_escape(process_name));
  for (const int t : threads) {
    out += fmt::format(
        ",\n  {{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": {}, \"args\": "
        "{{\"name\": \"arena slot {}\"}}}}",
        t, t);
  }
  for (const TracedCall& call : calls) {
    for (const NodeExecStats& s : call.stats) {
      std::string shapes;
      for (std::size_t i = 0; i < s.output_shapes.size(); ++i) {
        shapes +=
            fmt::format("{}{}", i == 0 ? "" : ", ", json_escape(s.output_shapes[i].to_string()));
      }
      std::string step;
      if (call.step > 0) step = fmt::format(", \"step\": {}", call.step);
      out += fmt::format(
          ",\n  {{\"name\": {}, \"cat\": {}, \"ph\": \"X\", \"ts\": {}, \"dur\": {}, \"pid\": 1, "
          "\"tid\": {}, \"args\": {{\"op\": {}, \"output_shapes\": [{}], \"output_bytes\": "
          "{}{}}}}}",
          json_escape(s.node), json_escape(s.op), micros(s.start_ns - t0),
          micros(std::max<int64_t>(0, s.end_ns - s.start_ns)), s.thread, json_escape(s.op), shapes,
          s.output_bytes, step);
    }
  }
  // The kernels' instruction-set level, in the format's free-form field.
  out += fmt::format("\n], \"otherData\": {{\"cpu_isa\": {}}}}}\n",
                     json_escape(cpu_isa_name(cpu_isa())));
  return out;
}

int run_command(const RunArgs& args, std::FILE* out, std::FILE* err) {
  auto fail = [&](int code, const std::string& message) {
    std::fflush(out);
    fmt::print(err, "graphrun: {}\n", one_line(message));
    return code;
  };
  // Usage: what the command line alone shows to be wrong.
  const bool partial = !args.partial.empty();
  if (partial && (!args.feeds.empty() || !args.fetches.empty() || !args.targets.empty())) {
    return fail(kExitUsage,
                "--partial cannot be combined with --feed, --fetch or --target (put them in the "
                "steps: --partial 'feed x=1; fetch y')");
  }
  if (!partial && args.fetches.empty() && args.targets.empty()) {
    return fail(kExitUsage, "nothing to run: give at least one --fetch or --target (or --partial)");
  }
  if (args.print_limit < 0) return fail(kExitUsage, "--print-limit must be >= 0");
  std::vector<FeedArg> feed_args;
  for (const std::string& f : args.feeds) {
    auto parsed = parse_feed_arg(f);
    if (!parsed.is_ok()) return fail(kExitUsage, parsed.status().message());
    feed_args.push_back(std::move(*parsed));
  }
  std::vector<StepSpec> steps;
  for (std::size_t k = 0; k < args.partial.size(); ++k) {
    auto parsed = parse_step(args.partial[k]);
    if (!parsed.is_ok()) {
      return fail(kExitUsage, fmt::format("--partial step {} '{}': {}", k + 1, args.partial[k],
                                          parsed.status().message()));
    }
    steps.push_back(std::move(*parsed));
  }

  // Runtime: the graph, the files, the run.
  auto graph = load_graph_file(args.graph);
  if (!graph.is_ok()) return fail(kExitRuntime, graph_file_error(args.graph, graph.status()));
  auto resolve_all = [&](const std::vector<FeedArg>& in, FeedList& feeds) -> Status {
    for (const FeedArg& a : in) {
      GRAPHRUN_ASSIGN_OR_RETURN(Feed feed, resolve_feed(*graph, a));
      feeds.push_back(std::move(feed));
    }
    return Status::ok();
  };
  auto check_names = [&](const std::vector<std::string>& fetches,
                         const std::vector<std::string>& targets) -> Status {
    for (const std::string& f : fetches) GRAPHRUN_RETURN_IF_ERROR(check_fetch(*graph, f));
    for (const std::string& t : targets) GRAPHRUN_RETURN_IF_ERROR(check_target(*graph, t));
    return Status::ok();
  };
  std::vector<FeedList> step_feeds(steps.size());
  FeedList feeds;
  if (partial) {
    for (std::size_t k = 0; k < steps.size(); ++k) {
      Status s = resolve_all(steps[k].feeds, step_feeds[k]);
      s.update(check_names(steps[k].fetches, steps[k].targets));
      if (!s.is_ok()) {
        return fail(kExitRuntime, fmt::format("--partial step {}: {}", k + 1, s.message()));
      }
    }
  } else {
    Status s = resolve_all(feed_args, feeds);
    s.update(check_names(args.fetches, args.targets));
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }

  for (const std::string& t : args.init) {
    Status s = check_target(*graph, t);
    if (!s.is_ok()) return fail(kExitRuntime, fmt::format("--init: {}", s.message()));
  }
  auto session = Session::create(*graph);
  if (!session.is_ok()) {
    return fail(kExitRuntime, fmt::format("session: {}", session.status().to_string()));
  }
  if (!args.init.empty()) {
    auto init = (*session)->run({}, {}, std::vector<TargetRef>(args.init.begin(), args.init.end()));
    if (!init.is_ok()) {
      return fail(kExitRuntime, fmt::format("--init failed: {}", init.status().to_string()));
    }
  }
  if (!args.out_dir.empty()) {
    std::error_code ec;
    const auto status = std::filesystem::status(args.out_dir, ec);
    if (std::filesystem::exists(status) && !std::filesystem::is_directory(status)) {
      return fail(kExitRuntime,
                  fmt::format("--out-dir '{}': exists and is not a directory", args.out_dir));
    }
    // A symbolic link to nothing: "File exists" would be a riddle.
    const auto link = std::filesystem::symlink_status(args.out_dir, ec);
    if (std::filesystem::is_symlink(link) && !std::filesystem::exists(status)) {
      return fail(kExitRuntime,
                  fmt::format("--out-dir '{}': a symbolic link to a missing path", args.out_dir));
    }
    std::filesystem::create_directories(args.out_dir, ec);
    if (ec) {
      return fail(kExitRuntime, fmt::format("--out-dir '{}': {}", args.out_dir, ec.message()));
    }
  }
  RunOptions options;
  options.trace = !args.trace.empty();
  std::vector<TracedCall> traced;

  if (!partial) {
    RunMetadata metadata;
    std::vector<TensorRef> fetches(args.fetches.begin(), args.fetches.end());
    std::vector<TargetRef> targets(args.targets.begin(), args.targets.end());
    auto result = (*session)->run(feeds, fetches, targets, options, &metadata);
    if (!result.is_ok()) {
      return fail(kExitRuntime, fmt::format("run failed: {}", result.status().to_string()));
    }
    Status s = emit_fetches(args.fetches, *result, args, out);
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
    traced.push_back(TracedCall{0, std::move(metadata.step_stats)});
  } else {
    // Setup declares the union of every step's feeds, fetches and targets.
    std::vector<std::string> all_feeds;
    std::vector<std::string> all_fetches;
    std::vector<std::string> all_targets;
    for (const StepSpec& step : steps) {
      for (const FeedArg& f : step.feeds) append_unique(all_feeds, f.name);
      for (const std::string& f : step.fetches) append_unique(all_fetches, f);
      for (const std::string& t : step.targets) append_unique(all_targets, t);
    }
    auto handle = (*session)->partial_run_setup(
        std::vector<TensorRef>(all_fetches.begin(), all_fetches.end()),
        std::vector<TensorRef>(all_feeds.begin(), all_feeds.end()),
        std::vector<TargetRef>(all_targets.begin(), all_targets.end()), options);
    if (!handle.is_ok()) {
      return fail(kExitRuntime,
                  fmt::format("partial run setup failed: {}", handle.status().to_string()));
    }
    for (std::size_t k = 0; k < steps.size(); ++k) {
      RunMetadata metadata;
      auto result = (*session)->partial_run(
          *handle, step_feeds[k],
          std::vector<TensorRef>(steps[k].fetches.begin(), steps[k].fetches.end()),
          std::vector<TargetRef>(steps[k].targets.begin(), steps[k].targets.end()), options,
          &metadata);
      if (!result.is_ok()) {
        return fail(kExitRuntime,
                    fmt::format("--partial step {}: {}", k + 1, result.status().to_string()));
      }
      fmt::print(out, "step {}:\n", k + 1);
      Status s = emit_fetches(steps[k].fetches, *result, args, out);
      if (!s.is_ok()) return fail(kExitRuntime, s.message());
      traced.push_back(TracedCall{static_cast<int>(k + 1), std::move(metadata.step_stats)});
    }
  }

  if (!args.trace.empty()) {
    const std::string json = chrome_trace_json(traced, fmt::format("graphrun run {}", args.graph));
    Status s = write_output_file(args.trace, json, "--trace");
    if (!s.is_ok()) return fail(kExitRuntime, s.message());
  }
  std::fflush(out);
  return kExitOk;
}

}  // namespace graphrun::cli
