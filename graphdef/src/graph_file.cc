// GraphDef bytes and files: binary and text format, sniffing, and the
// load/save helpers.
#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <graphrun/graph_def.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "api/src/posix_file.h"

namespace graphrun {
namespace {

// Keeps the text parser's first error with its position.
class FirstError final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    // The parser counts from 0; editors from 1.
    message_ = fmt::format("line {}, column {}: {}", line + 1, column + 1, message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// Text format uses printable characters and whitespace only; a binary
// GraphDef has tag and length bytes below 0x20 (every NodeDef's op field is
// tagged 0x12).
bool looks_like_text(std::string_view bytes) {
  return std::none_of(bytes.begin(), bytes.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && u != '\t' && u != '\n' && u != '\r') || u == 0x7f;
  });
}

std::string lowercase_extension(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

GraphDefFormat format_for_path(const std::filesystem::path& path, GraphDefFormat otherwise) {
  const std::string ext = lowercase_extension(path);
  if (ext == ".pb") return GraphDefFormat::kBinary;
  if (ext == ".pbtxt" || ext == ".txt") return GraphDefFormat::kText;
  return otherwise;
}

// An errno as a canonical status: "<what>: <reason>".
Status io_error(int err, std::string_view what) {
  const std::string reason = std::generic_category().message(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR: return not_found("{}: {}", what, reason);
    case EACCES:
    case EPERM: return permission_denied("{}: {}", what, reason);
    default: return unknown_error("{}: {}", what, reason);
  }
}

using internal::FdCloser;
using internal::file_kind;

// The bytes of the regular file `path`: the size stat reports when it is
// opened, then any more up to its end (a /proc file reports 0), refused
// past kMaxGraphFileBytes. Every message starts with
// "graph file '<path>': ".
Result<std::string> read_graph_bytes(const std::filesystem::path& path) {
  const std::string name = fmt::format("graph file '{}'", path.string());
  // stat first: a device or pipe is refused without being opened.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error(errno, name + ": cannot open");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("{}: is {}, not a regular file", name, file_kind(st.st_mode));
  }
  // O_NONBLOCK: should the path turn into a pipe before open, open does not
  // wait for a writer (fstat below refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error(errno, name + ": cannot open");
  const FdCloser closer(fd);
  if (::fstat(fd, &st) != 0) return io_error(errno, name + ": cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument("{}: is {}, not a regular file", name, file_kind(st.st_mode));
  }
  if (st.st_size > kMaxGraphFileBytes) {
    return invalid_argument("{}: {} bytes exceed the limit of {} bytes (protobuf's 2 GiB)", name,
                            static_cast<int64_t>(st.st_size), kMaxGraphFileBytes);
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  std::string bytes;
  try {
    bytes.resize(size);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("{}: cannot allocate {} bytes to read it", name, size);
  }
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, name + ": cannot read");
    }
    if (n == 0) {
      return unknown_error("{}: the file shrank while being read ({} of {} bytes)", name, done,
                           size);
    }
    done += static_cast<std::size_t>(n);
  }
  // Then on to the end: a file whose stat size is not its length (/proc and
  // /sys report 0 bytes) is read whole, within the same limit.
  for (;;) {
    std::array<char, 4096> chunk{};
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(errno, name + ": cannot read");
    }
    if (n == 0) break;
    const auto got = static_cast<std::size_t>(n);
    if (bytes.size() + got > static_cast<std::size_t>(kMaxGraphFileBytes)) {
      return invalid_argument("{}: more than the limit of {} bytes (protobuf's 2 GiB)", name,
                              kMaxGraphFileBytes);
    }
    bytes.append(chunk.data(), got);
  }
  return bytes;
}

// Whether the wire-format `bytes` of a `type` message nest messages deeper
// than `limit`, counted as protobuf's parser counts (the outer message is
// level 0; each embedded message, map entry or group one level more).
// Iterative, so any depth is safe. Stops at the first byte that is not
// well-formed wire format: false, and the parser's failure stands
// unexplained.
bool nests_deeper_than(std::string_view bytes, const google::protobuf::Descriptor* type,
                       int limit) {
  using google::protobuf::FieldDescriptor;
  struct Frame {
    std::size_t end;                           // one past the message's last byte
    const google::protobuf::Descriptor* type;  // nullptr inside an unknown group
    uint64_t group;                            // field number of an open group, else 0
  };
  std::vector<Frame> stack{{bytes.size(), type, 0}};
  std::size_t pos = 0;
  auto varint = [&](std::size_t end, uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && pos < end; shift += 7) {
      const auto b = static_cast<uint8_t>(bytes[pos++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80u) == 0) return true;
    }
    return false;
  };
  auto field_type = [](const google::protobuf::Descriptor* t, uint64_t number,
                       FieldDescriptor::Type want) -> const google::protobuf::Descriptor* {
    if (t == nullptr || number > static_cast<uint64_t>(FieldDescriptor::kMaxNumber)) {
      return nullptr;
    }
    const FieldDescriptor* f = t->FindFieldByNumber(static_cast<int>(number));
    return f != nullptr && f->type() == want ? f->message_type() : nullptr;
  };
  while (true) {
    const Frame f = stack.back();
    if (pos == f.end) {
      if (f.group != 0 || stack.size() == 1) return false;  // an unclosed group, or the end
      stack.pop_back();
      continue;
    }
    uint64_t tag = 0;
    if (!varint(f.end, tag)) return false;
    const uint64_t number = tag >> 3;
    if (number == 0) return false;
    uint64_t skip = 0;
    switch (tag & 7) {
      case 0:
        if (!varint(f.end, skip)) return false;
        skip = 0;
        break;
      case 1: skip = 8; break;
      case 5: skip = 4; break;
      case 2: {
        if (!varint(f.end, skip) || skip > f.end - pos) return false;
        // Unknown length-delimited fields stay bytes; only known message
        // fields are parsed (and counted).
        if (const auto* sub = field_type(f.type, number, FieldDescriptor::TYPE_MESSAGE)) {
          if (stack.size() > static_cast<std::size_t>(limit)) return true;
          stack.push_back({pos + skip, sub, 0});
          skip = 0;
        }
        break;
      }
      case 3:  // start group: known or not, parsed and counted
        if (stack.size() > static_cast<std::size_t>(limit)) return true;
        stack.push_back({f.end, field_type(f.type, number, FieldDescriptor::TYPE_GROUP), number});
        break;
      case 4:  // end group
        if (f.group != number) return false;
        stack.pop_back();
        break;
      default: return false;
    }
    if (skip > f.end - pos) return false;
    pos += skip;
  }
}

}  // namespace

Result<v1::GraphDef> parse_graph_def(std::string_view bytes, GraphDefFormat format) {
  if (format == GraphDefFormat::kAuto) {
    format = looks_like_text(bytes) ? GraphDefFormat::kText : GraphDefFormat::kBinary;
  }
  v1::GraphDef def;
  if (format == GraphDefFormat::kBinary) {
    if (bytes.size() > static_cast<std::size_t>(INT_MAX)) {
      return invalid_argument("a binary GraphDef of {} bytes exceeds protobuf's 2 GiB limit",
                              bytes.size());
    }
    google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                 static_cast<int>(bytes.size()));
    input.SetRecursionLimit(kMaxGraphDefNesting);
    if (!def.ParseFromCodedStream(&input) || !input.ConsumedEntireMessage()) {
      if (nests_deeper_than(bytes, v1::GraphDef::descriptor(), kMaxGraphDefNesting)) {
        return invalid_argument(
            "the {} bytes are not a binary GraphDef graphrun reads: messages nest more than {} "
            "levels deep (graphrun's limit)",
            bytes.size(), kMaxGraphDefNesting);
      }
      return invalid_argument("the {} bytes are not a binary GraphDef", bytes.size());
    }
    return def;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  // The text parser recurses once per nested message; protobuf's default
  // limit is INT_MAX, which a deep enough file turns into a stack overflow.
  // Past the limit: "Message is too deep, the parser exceeded the
  // configured recursion limit of 100."
  parser.SetRecursionLimit(kMaxGraphDefNesting);
  google::protobuf::io::ArrayInputStream input(
      bytes.data(), static_cast<int>(std::min<std::size_t>(bytes.size(), INT_MAX)));
  if (bytes.size() > static_cast<std::size_t>(INT_MAX) || !parser.Parse(&input, &def)) {
    return invalid_argument("not a text-format GraphDef: {}",
                            errors.message().empty() ? "input too large" : errors.message());
  }
  return def;
}

Result<std::string> serialize_graph_def(const v1::GraphDef& def, GraphDefFormat format) {
  std::string out;
  if (format == GraphDefFormat::kText) {
    if (!google::protobuf::TextFormat::PrintToString(def, &out)) {
      return internal_error("could not print the GraphDef as text");
    }
    return out;
  }
  const std::size_t size = def.ByteSizeLong();
  if (size > static_cast<std::size_t>(INT_MAX)) {
    return invalid_argument("the GraphDef has {} bytes; protobuf's limit is 2 GiB", size);
  }
  {
    // Deterministic: attribute maps in key order, so equal graphs give
    // equal files.
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!def.SerializeToCodedStream(&coded)) {
      return internal_error("could not serialize the GraphDef ({} bytes)", size);
    }
  }
  return out;
}

Result<Graph> load_graph_file(const std::filesystem::path& path) {
  GRAPHRUN_ASSIGN_OR_RETURN(const std::string bytes, read_graph_bytes(path));
  Result<v1::GraphDef> def = parse_graph_def(bytes, format_for_path(path, GraphDefFormat::kAuto));
  if (!def.is_ok()) return def.status().with_prefix(fmt::format("graph file '{}'", path.string()));
  return graph_from_graph_def(*def);
}

Status save_graph_file(const Graph& graph, const std::filesystem::path& path) {
  GRAPHRUN_ASSIGN_OR_RETURN(v1::GraphDef def, graph_to_graph_def(graph));
  GRAPHRUN_ASSIGN_OR_RETURN(
      std::string bytes, serialize_graph_def(def, format_for_path(path, GraphDefFormat::kBinary)));
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return io_error(errno, fmt::format("cannot create '{}'", tmp.string()));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const int err = errno;
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return io_error(err, fmt::format("cannot write '{}'", tmp.string()));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return io_error(ec.value(), fmt::format("cannot replace '{}'", path.string()));
  }
  return Status::ok();
}

}  // namespace graphrun
