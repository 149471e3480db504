#include "tools/graphrun/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>
#include <vector>

namespace graphrun::npy {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kAlign = 64;

// A descriptor's dtype and byte order.
struct Descr {
  DType dtype = DType::kInvalid;
  bool big_endian = false;
};

// What NumPy calls the common unsupported descriptors, for messages.
std::string_view numpy_name(char kind, std::string_view size) {
  if (kind == 'f' && size == "2") return "float16";
  if (kind == 'u') return "an unsigned integer";
  if (kind == 'i') return "a signed integer of this size";
  if (kind == 'c') return "complex";
  if (kind == 'U' || kind == 'S' || kind == 'a') return "a string";
  if (kind == 'O') return "Python objects";
  if (kind == 'V') return "a structured or void type";
  if (kind == 'M' || kind == 'm') return "a datetime";
  return "not a supported type";
}

Result<Descr> parse_descr(std::string_view d, std::string_view source) {
  auto unsupported = [&](std::string_view what) {
    return invalid_argument(
        "{}: dtype '{}' ({}) is not supported; graphrun reads float32 ('<f4'), float64 ('<f8'), "
        "int32 ('<i4'), int64 ('<i8') and bool ('|b1')",
        source, d, what);
  };
  if (d == "?") return Descr{DType::kBool, false};
  if (d.size() < 2) return unsupported("not a NumPy descriptor");
  Descr out;
  std::string_view rest = d;
  switch (rest.front()) {
    case '<':
    case '|': rest.remove_prefix(1); break;
    case '=':
      out.big_endian = std::endian::native == std::endian::big;
      rest.remove_prefix(1);
      break;
    case '>':
      out.big_endian = true;
      rest.remove_prefix(1);
      break;
    default: break;
  }
  if (rest.empty()) return unsupported("not a NumPy descriptor");
  const char kind = rest.front();
  const std::string_view size = rest.substr(1);
  if (kind == 'f' && size == "4") {
    out.dtype = DType::kFloat32;
  } else if (kind == 'f' && size == "8") {
    out.dtype = DType::kFloat64;
  } else if (kind == 'i' && size == "4") {
    out.dtype = DType::kInt32;
  } else if (kind == 'i' && size == "8") {
    out.dtype = DType::kInt64;
  } else if ((kind == 'b' && size == "1") || (kind == '?' && size.empty())) {
    out.dtype = DType::kBool;
    out.big_endian = false;
  } else {
    return unsupported(numpy_name(kind, size));
  }
  return out;
}

// The header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct Header {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// Thread safety: one parse, one thread.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  Result<Header> parse() {
    Header h;
    skip_ws();
    if (!eat('{')) return error("expected '{'");
    while (true) {
      skip_ws();
      if (eat('}')) break;
      auto key = string();
      if (!key.is_ok()) return key.status();
      skip_ws();
      if (!eat(':')) return error("expected ':' after a key");
      skip_ws();
      if (*key == "descr") {
        auto v = string();
        if (!v.is_ok()) return v.status();
        h.descr = std::move(*v);
      } else if (*key == "fortran_order") {
        if (s_.substr(pos_).starts_with("True")) {
          h.fortran_order = true;
          pos_ += 4;
        } else if (s_.substr(pos_).starts_with("False")) {
          h.fortran_order = false;
          pos_ += 5;
        } else {
          return error("'fortran_order' must be True or False");
        }
      } else if (*key == "shape") {
        auto v = tuple();
        if (!v.is_ok()) return v.status();
        h.shape = std::move(*v);
      } else {
        return error(fmt::format("unexpected key '{}'", *key));
      }
      skip_ws();
      if (eat(',')) continue;
      if (eat('}')) break;
      return error("expected ',' or '}'");
    }
    skip_ws();
    if (pos_ != s_.size()) return error("unexpected text after the dict");
    if (!h.descr || !h.fortran_order || !h.shape) {
      return error("the dict needs 'descr', 'fortran_order' and 'shape'");
    }
    return h;
  }

 private:
  Status error(std::string_view what) const {
    return invalid_argument("{}: malformed .npy header at byte {}: {}", source_, pos_, what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Result<std::string> string() {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) {
      return error("expected a quoted string");
    }
    const char quote = s_[pos_++];
    const std::size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return error("unterminated string");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  Result<std::vector<int64_t>> tuple() {
    if (!eat('(')) return error("'shape' must be a tuple");
    std::vector<int64_t> dims;
    while (true) {
      skip_ws();
      if (eat(')')) break;
      int64_t v = 0;
      std::size_t digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (v > (INT64_MAX - 9) / 10) return error("dimension too large");
        v = v * 10 + (s_[pos_] - '0');
        ++pos_;
        ++digits;
      }
      if (digits == 0) return error("expected a dimension");
      // NumPy 1.x on some platforms writes "3L".
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;
      dims.push_back(v);
      skip_ws();
      if (eat(',')) continue;
      if (eat(')')) break;
      return error("expected ',' or ')' in 'shape'");
    }
    return dims;
  }

  std::string_view s_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

uint32_t read_le(std::string_view bytes, std::size_t at, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<uint8_t>(bytes[at + static_cast<std::size_t>(i)]);
  }
  return v;
}

void byte_swap(char* data, std::size_t count, std::size_t item) {
  for (std::size_t i = 0; i < count; ++i) std::reverse(data + i * item, data + (i + 1) * item);
}

std::string descr_of(DType dtype) {
  if (dtype == DType::kBool) return "|b1";
  const char order = std::endian::native == std::endian::big ? '>' : '<';
  switch (dtype) {
    case DType::kFloat32: return fmt::format("{}f4", order);
    case DType::kFloat64: return fmt::format("{}f8", order);
    case DType::kInt32: return fmt::format("{}i4", order);
    case DType::kInt64: return fmt::format("{}i8", order);
    default: break;
  }
  internal::check_failed(__FILE__, __LINE__, "descr_of", "invalid dtype");
}

}  // namespace

Result<Tensor> parse(std::string_view bytes, std::string_view source) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    return invalid_argument("{}: not a NumPy .npy file (bad magic; expected \\x93NUMPY)", source);
  }
  if (bytes.size() < 8) return invalid_argument("{}: truncated .npy file (no version)", source);
  const auto major = static_cast<uint8_t>(bytes[6]);
  const auto minor = static_cast<uint8_t>(bytes[7]);
  std::size_t len_bytes = 0;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return invalid_argument("{}: unsupported .npy format version {}.{} (1.0, 2.0, 3.0 are read)",
                            source, major, minor);
  }
  const std::size_t prefix = 8 + len_bytes;
  if (bytes.size() < prefix) {
    return invalid_argument("{}: truncated .npy file (no header length)", source);
  }
  const std::size_t header_len = read_le(bytes, 8, static_cast<int>(len_bytes));
  if (bytes.size() - prefix < header_len) {
    return invalid_argument("{}: truncated .npy header: {} bytes declared, {} present", source,
                            header_len, bytes.size() - prefix);
  }
  auto header = HeaderParser(bytes.substr(prefix, header_len), source).parse();
  if (!header.is_ok()) return header.status();
  GRAPHRUN_ASSIGN_OR_RETURN(const Descr descr, parse_descr(*header->descr, source));
  if (*header->fortran_order) {
    return invalid_argument(
        "{}: Fortran-order arrays are not supported; save a C-order array "
        "(np.save(f, np.ascontiguousarray(a)))",
        source);
  }
  const std::vector<int64_t>& dims = *header->shape;
  if (dims.size() > static_cast<std::size_t>(Shape::kMaxRank)) {
    return invalid_argument("{}: rank {} exceeds graphrun's maximum of {}", source, dims.size(),
                            Shape::kMaxRank);
  }
  auto shape = Shape::make(dims);
  if (!shape.is_ok()) return shape.status().with_prefix(source);
  const std::size_t item = dtype_size(descr.dtype);
  const auto count = static_cast<std::size_t>(shape->num_elements());
  if (count != 0 && count > (SIZE_MAX / item)) {
    return invalid_argument("{}: shape {} is too large", source, *shape);
  }
  const std::size_t data_bytes = count * item;
  const std::size_t available = bytes.size() - prefix - header_len;
  if (available < data_bytes) {
    return invalid_argument("{}: truncated .npy data: {}{} needs {} bytes, {} present", source,
                            descr.dtype, *shape, data_bytes, available);
  }
  if (available > data_bytes) {
    return invalid_argument("{}: {} unexpected bytes after the data of {}{}", source,
                            available - data_bytes, descr.dtype, *shape);
  }
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, Tensor::allocate_uninitialized(descr.dtype, *shape));
  const char* data = bytes.data() + prefix + header_len;
  if (descr.dtype == DType::kBool) {
    // Any nonzero byte is true; a bool holds only 0 or 1.
    auto* out = static_cast<uint8_t*>(t.raw_data());
    for (std::size_t i = 0; i < count; ++i) out[i] = data[i] != 0 ? 1 : 0;
  } else if (data_bytes > 0) {
    std::memcpy(t.raw_data(), data, data_bytes);
    if (descr.big_endian != (std::endian::native == std::endian::big)) {
      byte_swap(static_cast<char*>(t.raw_data()), count, item);
    }
  }
  return t;
}

Result<Tensor> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found("{}: cannot open: {}", path.string(), std::generic_category().message(errno));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return internal_error("{}: read failed: {}", path.string(),
                          std::generic_category().message(errno));
  }
  return parse(bytes, path.string());
}

std::string serialize(const Tensor& tensor) {
  GRAPHRUN_CHECK_MSG(tensor.is_initialized(), "npy::serialize of an uninitialized tensor");
  std::string shape = "(";
  for (int i = 0; i < tensor.shape().rank(); ++i) {
    shape += fmt::format("{}{}", i == 0 ? "" : ", ", tensor.shape().dim(i));
  }
  shape += tensor.shape().rank() == 1 ? ",)" : ")";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 descr_of(tensor.dtype()), shape);
  // Pad so that magic + version + length + dict + '\n' is a multiple of 64.
  std::size_t len_bytes = 2;
  auto padded = [&](std::size_t lb) {
    const std::size_t unpadded = kMagic.size() + 2 + lb + dict.size() + 1;
    return dict.size() + (kAlign - unpadded % kAlign) % kAlign + 1;
  };
  std::size_t header_len = padded(len_bytes);
  if (header_len > 0xFFFF) {
    len_bytes = 4;
    header_len = padded(len_bytes);
  }
  std::string out(kMagic);
  out += static_cast<char>(len_bytes == 2 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) {
    out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  }
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  out.append(static_cast<const char*>(tensor.raw_data()), tensor.byte_size());
  return out;
}

Status write_file(const Tensor& tensor, const std::filesystem::path& path) {
  const std::string bytes = serialize(tensor);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return internal_error("{}: cannot create: {}", path.string(),
                          std::generic_category().message(errno));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    return internal_error("{}: write failed: {}", path.string(),
                          std::generic_category().message(errno));
  }
  return Status::ok();
}

}  // namespace graphrun::npy
