#include "catalog.hpp"

namespace moesim {

std::vector<std::string> platform_names() {
  std::vector<std::string> names;
  const std::string prefix = "platforms/", suffix = ".textproto";
  for (const auto& [path, text] : embedded_files())
    if (path.rfind(prefix, 0) == 0 && path.size() > prefix.size() + suffix.size())
      names.push_back(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
  return names;
}

std::optional<std::string> embedded_file(const std::string& path) {
  const auto& files = embedded_files();
  auto it = files.find(path);
  if (it == files.end()) return std::nullopt;
  return it->second;
}

}  // namespace moesim
