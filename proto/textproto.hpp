// Reading moesim's input files: protobuf text format (or JSON) with the location of every field
// kept, so that a validation error can name the file and line of the offending field.
#pragma once
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"

namespace moesim {

/// A parsed input: where it came from and where each field sits in it.
class ParsedFile {
 public:
  ParsedFile() = default;
  ParsedFile(std::string path, std::unique_ptr<google::protobuf::TextFormat::ParseInfoTree> tree,
             const google::protobuf::Descriptor* root);

  const std::string& path() const { return path_; }
  /// 1-based line of a field path such as "node.links[2].gbytes_per_s" (or of its closest parent
  /// that appears in the file); nullopt when the file does not mention it.
  std::optional<int> line_of(const std::string& field_path) const;
  /// "path:line: field 'x': message", the form every input error takes.
  std::string describe(const std::string& field_path, const std::string& message) const;

 private:
  std::string path_;
  std::shared_ptr<google::protobuf::TextFormat::ParseInfoTree> tree_;
  const google::protobuf::Descriptor* root_ = nullptr;
};

/// Parses `text` into `msg` (text format; JSON when `path` ends in .json). Unknown fields and
/// syntax errors throw InputError("path:line:column: ...").
ParsedFile parse_text(const std::string& path, const std::string& text, google::protobuf::Message& msg);

/// Reads and parses a file. A missing or unreadable file is an InputError.
ParsedFile parse_file(const std::string& path, google::protobuf::Message& msg);

/// Applies one "a.b.c=value" override to `msg` (repeated fields are appended to). Throws
/// InputError naming the override.
void apply_override(google::protobuf::Message& msg, const std::string& assignment);

/// The message in text format, fields in schema order.
std::string to_text(const google::protobuf::Message& msg);

}  // namespace moesim
