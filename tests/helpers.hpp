// Small helpers shared by the tests.
#pragma once
#include <string>

#include "cluster.hpp"
#include "spec.hpp"

namespace moesim::test {

/// The tests' base experiment: EP on 64 DGX-A100 GPUs, Zipf routing, no variants.
inline const std::string kBaseSpec = std::string(MOESIM_SOURCE_DIR) + "/experiments/gpt-moe-s.textproto";

/// A catalog platform with its node count set.
inline spec::ClusterSpec platform(const std::string& name, int nodes) {
  auto s = load_platform(name);
  s.set_nodes(nodes);
  return s;
}

/// Runs a shell command; returns its exit status and puts stdout+stderr in `output`.
int run_command(const std::string& command, std::string& output);

/// A fresh empty directory under the build tree's temp area.
std::string temp_dir(const std::string& name);

void write_file(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);

}  // namespace moesim::test
