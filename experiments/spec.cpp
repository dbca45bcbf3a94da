#include "spec.hpp"

#include <filesystem>

#include "catalog.hpp"
#include "gating.hpp"
#include "gpu.hpp"

#include <cmath>

namespace moesim {
namespace fs = std::filesystem;

namespace {

std::string known_platforms() {
  std::string s;
  for (const auto& n : platform_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The override (if any) that set this experiment field path or one of its parents.
std::optional<std::string> override_of(const std::vector<std::string>& overrides, const std::string& field) {
  std::optional<std::string> found;
  for (const auto& o : overrides) {
    const std::string path = o.substr(0, o.find('='));
    if (field == path || field.rfind(path + ".", 0) == 0 || path.rfind(field + ".", 0) == 0) found = o;
  }
  return found;
}

}  // namespace

spec::ClusterSpec load_platform(const std::string& name_or_path, ParsedFile* where) {
  spec::ClusterSpec cluster;
  ParsedFile parsed;
  const std::string embedded = "platforms/" + name_or_path + ".textproto";
  if (auto text = embedded_file(embedded)) {
    parsed = parse_text(embedded, *text, cluster);
  } else if (name_or_path.find('/') != std::string::npos || name_or_path.find(".textproto") != std::string::npos ||
             fs::exists(name_or_path)) {
    parsed = parse_file(name_or_path, cluster);
  } else {
    throw InputError("unknown platform '" + name_or_path + "'; the catalog has: " + known_platforms() +
                     " (or give a .textproto path)");
  }
  if (where) *where = parsed;
  return cluster;
}

Experiment load_experiment(const std::optional<std::string>& path, const std::vector<std::string>& overrides) {
  Experiment ex;
  ex.overrides = overrides;
  ParsedFile file;
  if (path) {
    ex.spec_path = *path;
    file = parse_file(*path, ex.spec);
  } else {
    ex.spec_path = kDemoSpec;
    file = parse_text(kDemoSpec, *embedded_file(kDemoSpec), ex.spec);
  }
  for (const auto& o : overrides) apply_override(ex.spec, o);

  // An error in the experiment spec: name the --set that caused it, else the file and line.
  auto in_spec = [&](const std::string& field, const std::string& message) -> InputError {
    if (auto o = override_of(overrides, field)) return InputError("--set " + *o + ": field '" + field + "': " + message);
    return InputError(file.describe(field, message));
  };

  auto& s = ex.spec;
  if (s.iterations() == 0) s.set_iterations(1);
  if (s.gating().source_case() == spec::GatingSpec::SOURCE_NOT_SET) s.mutable_gating()->mutable_uniform();
  if (s.gate().has_capacity_factor() && !std::isfinite(s.gate().capacity_factor()))
    throw in_spec("gate.capacity_factor", "must be a finite number (> 0 fixed, 0 dropless, < 0 capped dynamic)");
  if (s.cluster().platform().empty()) throw in_spec("cluster.platform", "is not set; the catalog has: " + known_platforms());

  // The cluster: catalog or file, then the experiment's node count.
  ParsedFile cluster_file;
  try {
    ex.cluster_spec = load_platform(s.cluster().platform(), &cluster_file);
  } catch (const InputError& e) {
    throw in_spec("cluster.platform", e.what());
  }
  if (s.cluster().nodes() > 0) ex.cluster_spec.set_nodes(s.cluster().nodes());
  std::optional<Cluster> cluster;
  try {
    cluster.emplace(ex.cluster_spec);
  } catch (const FieldError& e) {
    if (e.field() == "nodes" && s.cluster().nodes() > 0) throw in_spec("cluster.nodes", e.message());
    throw InputError(cluster_file.describe(e.field(), e.message()));
  }

  std::optional<MoeModel> model;
  try {
    model.emplace(s.model());
    GpuModel(ex.cluster_spec.gpu(), s.model().dtype());
  } catch (const FieldError& e) {
    if (e.field().rfind("gpu.", 0) == 0) throw in_spec("model.dtype", e.message());
    throw in_spec("model." + e.field(), e.message());
  }
  try {
    make_policy(s.policy())->validate(*cluster, *model, s.policy());
    validate_gating(s.gating(), *model, int(s.iterations()));
  } catch (const FieldError& e) {
    throw in_spec(e.field(), e.message());
  }
  return ex;
}

}  // namespace moesim
