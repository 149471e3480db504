// GraphDef bytes and files: binary and text format, sniffing, and the
// load/save helpers.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <graphrun/graph_def.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

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

// An errno as a canonical status about `path`.
Status io_error(int err, std::string_view what, const std::filesystem::path& path) {
  const std::string reason = std::generic_category().message(err);
  switch (err) {
    case ENOENT: return not_found("{} '{}': {}", what, path.string(), reason);
    case EACCES:
    case EPERM: return permission_denied("{} '{}': {}", what, path.string(), reason);
    default: return unknown_error("{} '{}': {}", what, path.string(), reason);
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
    if (!def.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return invalid_argument("the {} bytes are not a binary GraphDef", bytes.size());
    }
    return def;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(errno, "cannot open graph file", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error(errno, "cannot read graph file", path);
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
    if (!out) return io_error(errno, "cannot create", tmp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const int err = errno;
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return io_error(err, "cannot write", tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return io_error(ec.value(), "cannot replace", path);
  }
  return Status::ok();
}

}  // namespace graphrun
