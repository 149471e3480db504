// GraphDefs whose messages nest exactly `depth` levels, as protobuf's
// parsers count them (the GraphDef is level 0): a NodeDef (level 1), then
// attr map entry, AttrValue, NameAttrList (`func`) over and over:
//
//   node { name: "a" op: "NoOp" attr { key: "f" value { func { name: "g"
//     attr { key: "f" value { func { ... } } } } } } }
//
// Built without recursion, so any depth is cheap and safe to build; for the
// recursion-limit tests of parse_graph_def and the CLI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace graphrun::testing {

// Text format, on one line.
inline std::string nested_graph_def_text(int depth) {
  static const char* const kOpen[] = {"attr { key: \"f\" ", "value { ", "func { name: \"g\" "};
  std::string out = "node { name: \"a\" op: \"NoOp\" ";
  for (int level = 2; level <= depth; ++level) out += kOpen[(level - 2) % 3];
  for (int level = 1; level <= depth; ++level) out += "} ";
  out += '\n';
  return out;
}

// Binary wire format, the same message as nested_graph_def_text(depth).
inline std::string nested_graph_def_binary(int depth) {
  auto varint_size = [](uint64_t v) {
    std::size_t n = 1;
    while (v >= 0x80) {
      v >>= 7;
      ++n;
    }
    return n;
  };
  auto put_varint = [](std::string& out, uint64_t v) {
    while (v >= 0x80) {
      out += static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    out += static_cast<char>(v);
  };
  // Level k's own fields (before its child), and the field number that
  // holds level k inside level k - 1. Every field number here is < 16, so
  // each tag is one byte.
  auto own_fields = [](int level) -> std::string {
    if (level == 1)
      return std::string(
          "\x0a\x01"
          "a"
          "\x12\x04"
          "NoOp",
          9);  // name, op
    switch ((level - 2) % 3) {
      case 0:
        return std::string(
            "\x0a\x01"
            "f",
            3);           // entry: key
      case 1: return "";  // AttrValue
      default:
        return std::string(
            "\x0a\x01"
            "g",
            3);  // NameAttrList: name
    }
  };
  auto field_in_parent = [](int level) {
    if (level == 1) return 1;  // GraphDef.node
    switch ((level - 2) % 3) {
      case 0: return level == 2 ? 5 : 2;  // NodeDef.attr, NameAttrList.attr
      case 1: return 2;                   // entry.value
      default: return 10;                 // AttrValue.func
    }
  };
  // Sizes inside out, then the bytes outside in.
  std::vector<std::size_t> size(static_cast<std::size_t>(depth) + 2, 0);
  for (int level = depth; level >= 1; --level) {
    const std::size_t child = size[static_cast<std::size_t>(level) + 1];
    size[static_cast<std::size_t>(level)] =
        own_fields(level).size() + (level < depth ? 1 + varint_size(child) + child : 0);
  }
  std::string out;
  out.reserve(size[1] + 8);
  for (int level = 1; level <= depth; ++level) {
    out += static_cast<char>((field_in_parent(level) << 3) | 2);  // length-delimited
    put_varint(out, size[static_cast<std::size_t>(level)]);
    out += own_fields(level);
  }
  return out;
}

}  // namespace graphrun::testing
