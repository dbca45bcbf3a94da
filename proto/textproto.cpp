#include "textproto.hpp"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <charconv>
#include <sstream>

namespace moesim {
namespace pb = google::protobuf;

namespace {

class CollectErrors : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first.empty()) first = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}
  std::string first;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "node.links[2].gbytes_per_s" -> {("node",-1), ("links",2), ("gbytes_per_s",-1)}
std::vector<std::pair<std::string, int>> split_path(const std::string& path) {
  std::vector<std::pair<std::string, int>> parts;
  std::stringstream ss(path);
  std::string item;
  while (std::getline(ss, item, '.')) {
    int index = -1;
    if (auto open = item.find('['); open != std::string::npos) {
      const char* first = item.data() + open + 1;
      if (std::from_chars(first, item.data() + item.size(), index).ec != std::errc()) index = -1;
      item = item.substr(0, open);
    }
    parts.emplace_back(item, index);
  }
  return parts;
}

}  // namespace

ParsedFile::ParsedFile(std::string path, std::unique_ptr<pb::TextFormat::ParseInfoTree> tree,
                       const pb::Descriptor* root)
    : path_(std::move(path)), tree_(std::move(tree)), root_(root) {}

std::optional<int> ParsedFile::line_of(const std::string& field_path) const {
  if (!tree_ || !root_) return std::nullopt;
  const pb::TextFormat::ParseInfoTree* tree = tree_.get();
  const pb::Descriptor* type = root_;
  std::optional<int> line;
  for (const auto& [name, index] : split_path(field_path)) {
    if (!type || !tree) break;
    const pb::FieldDescriptor* field = type->FindFieldByName(name);
    if (!field) break;
    const int i = field->is_repeated() ? std::max(index, 0) : -1;
    const auto loc = tree->GetLocation(field, i);
    if (loc.line < 0) break;
    line = loc.line + 1;
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) break;
    tree = tree->GetTreeForNested(field, i);
    type = field->message_type();
  }
  return line;
}

std::string ParsedFile::describe(const std::string& field_path, const std::string& message) const {
  std::string where = path_;
  if (auto line = line_of(field_path)) where += ":" + std::to_string(*line);
  return where + ": field '" + field_path + "': " + message;
}

ParsedFile parse_text(const std::string& path, const std::string& text, pb::Message& msg) {
  if (ends_with(path, ".json")) {
    pb::util::JsonParseOptions options;
    const auto status = pb::util::JsonStringToMessage(text, &msg, options);
    if (!status.ok()) throw InputError(path + ": " + std::string(status.message()));
    return ParsedFile(path, nullptr, msg.GetDescriptor());
  }
  auto tree = std::make_unique<pb::TextFormat::ParseInfoTree>();
  CollectErrors errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(tree.get());
  if (!parser.ParseFromString(text, &msg))
    throw InputError(path + ":" + (errors.first.empty() ? std::string(" cannot parse") : errors.first) +
                     " (see the schema in proto/moesim.proto)");
  return ParsedFile(path, std::move(tree), msg.GetDescriptor());
}

ParsedFile parse_file(const std::string& path, pb::Message& msg) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory; name a .textproto file");
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open file (check the path)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_text(path, ss.str(), msg);
}

void apply_override(pb::Message& msg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError("--set " + assignment + ": expected field.path=value, e.g. --set cluster.nodes=4");
  const std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  if (path.find_first_of("[]") != std::string::npos)
    throw InputError("--set " + assignment + ": a field path names fields only, without [index]; set the fields of a "
                     "repeated message in the spec file");

  // Build "a { b { c: value } }" and merge it: the text-format parser then checks names and types.
  const pb::Descriptor* type = msg.GetDescriptor();
  const auto parts = split_path(path);
  std::string open, close;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::FieldDescriptor* field = type ? type->FindFieldByName(parts[i].first) : nullptr;
    if (!field)
      throw InputError("--set " + assignment + ": no field '" + parts[i].first + "' in " +
                       (type ? type->full_name() : std::string("a scalar")) + " (see proto/moesim.proto)");
    const bool last = i + 1 == parts.size();
    if (last) {
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && (value.empty() || value.front() != '"'))
        value = "\"" + value + "\"";
      open += parts[i].first + (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE ? " " : ": ") + value;
    } else {
      if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE)
        throw InputError("--set " + assignment + ": '" + parts[i].first + "' is not a message");
      open += parts[i].first + " { ";
      close = " }" + close;
      type = field->message_type();
    }
  }
  CollectErrors errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.MergeFromString(open + close, &msg)) {
    auto message = errors.first;
    if (auto colon = message.find(": "); colon != std::string::npos) message = message.substr(colon + 2);
    throw InputError("--set " + assignment + ": " + message);
  }
}

std::string to_text(const pb::Message& msg) {
  std::string out;
  pb::TextFormat::PrintToString(msg, &out);
  return out;
}

}  // namespace moesim
