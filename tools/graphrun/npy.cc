#include "tools/graphrun/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <system_error>
#include <vector>

#include "api/src/posix_file.h"

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
        // Exact: INT64_MAX itself is a dimension (Shape::make judges the
        // product), one more is not.
        const int digit = s_[pos_] - '0';
        if (v > (INT64_MAX - digit) / 10) return error("dimension too large");
        v = v * 10 + digit;
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

// Magic, version and header length: where the header dict starts and how
// long it is.
struct Prefix {
  std::size_t header_offset = 0;
  std::size_t header_len = 0;
};
// Magic (6 bytes), version (2) and header length (2 or 4).
constexpr std::size_t kMaxPrefix = 12;

// `bytes`: the file's first kMaxPrefix bytes (all of them when shorter).
Result<Prefix> parse_prefix(std::string_view bytes, std::string_view source) {
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
  const std::size_t header_offset = 8 + len_bytes;
  if (bytes.size() < header_offset) {
    return invalid_argument("{}: truncated .npy file (no header length)", source);
  }
  return Prefix{header_offset, read_le(bytes, 8, static_cast<int>(len_bytes))};
}

Status check_header_size(const Prefix& prefix, std::size_t file_size, std::string_view source) {
  if (file_size - prefix.header_offset < prefix.header_len) {
    return invalid_argument("{}: truncated .npy header: {} bytes declared, {} present", source,
                            prefix.header_len, file_size - prefix.header_offset);
  }
  return Status::ok();
}

// What the header says about the data that follows it.
struct Layout {
  Descr descr;
  Shape shape;
  std::size_t count = 0;  // elements
  std::size_t data_offset = 0;
  std::size_t data_bytes = 0;
};

// `bytes`: at least the prefix and the header (the data may follow).
Result<Layout> parse_layout(std::string_view bytes, std::string_view source) {
  GRAPHRUN_ASSIGN_OR_RETURN(const Prefix prefix, parse_prefix(bytes.substr(0, kMaxPrefix), source));
  GRAPHRUN_RETURN_IF_ERROR(check_header_size(prefix, bytes.size(), source));
  auto header = HeaderParser(bytes.substr(prefix.header_offset, prefix.header_len), source).parse();
  if (!header.is_ok()) return header.status();
  Layout layout;
  GRAPHRUN_ASSIGN_OR_RETURN(layout.descr, parse_descr(*header->descr, source));
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
  layout.shape = *shape;
  const std::size_t item = dtype_size(layout.descr.dtype);
  layout.count = static_cast<std::size_t>(layout.shape.num_elements());
  if (layout.count != 0 && layout.count > (SIZE_MAX / item)) {
    return invalid_argument("{}: shape {} is too large", source, layout.shape);
  }
  layout.data_offset = prefix.header_offset + prefix.header_len;
  layout.data_bytes = layout.count * item;
  return layout;
}

// The data must be exactly what the header declares.
Status check_data_size(const Layout& layout, std::size_t file_size, std::string_view source) {
  const std::size_t available = file_size - layout.data_offset;
  if (available < layout.data_bytes) {
    return invalid_argument("{}: truncated .npy data: {}{} needs {} bytes, {} present", source,
                            layout.descr.dtype, layout.shape, layout.data_bytes, available);
  }
  if (available > layout.data_bytes) {
    return invalid_argument("{}: {} unexpected bytes after the data of {}{}", source,
                            available - layout.data_bytes, layout.descr.dtype, layout.shape);
  }
  return Status::ok();
}

// `t` holds the file's data bytes; makes them graphrun's: bools 0 or 1,
// native byte order.
void fix_up_data(const Layout& layout, Tensor& t) {
  if (layout.descr.dtype == DType::kBool) {
    // Any nonzero byte is true; a bool holds only 0 or 1.
    auto* data = static_cast<uint8_t*>(t.raw_data());
    for (std::size_t i = 0; i < layout.count; ++i) data[i] = data[i] != 0 ? 1 : 0;
  } else if (layout.data_bytes > 0 &&
             layout.descr.big_endian != (std::endian::native == std::endian::big)) {
    byte_swap(static_cast<char*>(t.raw_data()), layout.count, dtype_size(layout.descr.dtype));
  }
}

// An errno as a status naming the file: "<source>: <what>: <reason>".
Status io_error(int err, std::string_view source, std::string_view what) {
  const std::string reason = std::generic_category().message(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR: return not_found("{}: {}: {}", source, what, reason);
    case EACCES:
    case EPERM: return permission_denied("{}: {}: {}", source, what, reason);
    default: return internal_error("{}: {}: {}", source, what, reason);
  }
}

using internal::FdCloser;
using internal::file_kind;

// Exactly `n` bytes at `offset` of `fd` into `to`.
Status read_at(int fd, void* to, std::size_t n, std::size_t offset, std::string_view source) {
  auto* out = static_cast<char*>(to);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, source, "read failed");
    }
    if (got == 0) {
      return internal_error("{}: the file shrank while being read ({} of {} bytes at offset {})",
                            source, done, n, offset);
    }
    done += static_cast<std::size_t>(got);
  }
  return Status::ok();
}

// The tensor the file's data goes into; errors ("tensor float32[...] is too
// large") name the file.
Result<Tensor> allocate_named(const Layout& layout, std::string_view source) {
  auto t = Tensor::allocate_uninitialized(layout.descr.dtype, layout.shape);
  if (!t.is_ok()) return t.status().with_prefix(source);
  return t;
}

}  // namespace

Result<Tensor> parse(std::string_view bytes, std::string_view source) {
  GRAPHRUN_ASSIGN_OR_RETURN(const Layout layout, parse_layout(bytes, source));
  GRAPHRUN_RETURN_IF_ERROR(check_data_size(layout, bytes.size(), source));
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, allocate_named(layout, source));
  if (layout.data_bytes > 0) {
    std::memcpy(t.raw_data(), bytes.data() + layout.data_offset, layout.data_bytes);
  }
  fix_up_data(layout, t);
  return t;
}

Result<Tensor> read_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  // stat first: a device or pipe is refused without being opened.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error(errno, source, "cannot open");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("{}: is {}, not a regular .npy file", source, file_kind(st.st_mode));
  }
  // O_NONBLOCK: should the path turn into a pipe before open, open does not
  // wait for a writer (fstat below refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error(errno, source, "cannot open");
  const FdCloser closer(fd);
  if (::fstat(fd, &st) != 0) return io_error(errno, source, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("{}: is {}, not a regular .npy file", source, file_kind(st.st_mode));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  // The header first, and only as much as it declares and the file holds;
  // then exactly the data bytes the header declares, when that is the rest
  // of the file.
  std::string head(std::min(size, kMaxPrefix), '\0');
  GRAPHRUN_RETURN_IF_ERROR(read_at(fd, head.data(), head.size(), 0, source));
  GRAPHRUN_ASSIGN_OR_RETURN(const Prefix prefix, parse_prefix(head, source));
  GRAPHRUN_RETURN_IF_ERROR(check_header_size(prefix, size, source));
  head.resize(prefix.header_offset + prefix.header_len);
  GRAPHRUN_RETURN_IF_ERROR(read_at(fd, head.data(), head.size(), 0, source));
  GRAPHRUN_ASSIGN_OR_RETURN(const Layout layout, parse_layout(head, source));
  GRAPHRUN_RETURN_IF_ERROR(check_data_size(layout, size, source));
  GRAPHRUN_ASSIGN_OR_RETURN(Tensor t, allocate_named(layout, source));
  GRAPHRUN_RETURN_IF_ERROR(
      read_at(fd, t.raw_data(), layout.data_bytes, layout.data_offset, source));
  fix_up_data(layout, t);
  return t;
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
