// The platform catalog (platforms/*.textproto) and the example experiments
// (experiments/*.textproto), embedded in the binary at build time so moesim runs from any directory.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace moesim {

/// Embedded files keyed by their path in the source tree ("platforms/dgx-a100.textproto").
const std::map<std::string, std::string>& embedded_files();

/// Names of the catalog's platforms ("dgx-a100", ...).
std::vector<std::string> platform_names();

/// Text of an embedded file by source-tree path, if there is one.
std::optional<std::string> embedded_file(const std::string& path);

}  // namespace moesim
