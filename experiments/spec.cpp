#include "spec.hpp"

#include <cstdlib>
#include <filesystem>

#include "catalog.hpp"
#include "gating.hpp"
#include "gpu.hpp"
#include "parallel_layout.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <fmt/format.h>
#include <functional>
#include <set>

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

std::string demo_trace_path() {
  const char* rel = "traces/smartmoe-gpt-e32-k2-r16/trace.csv";
  std::vector<fs::path> roots;
  if (const char* shared = std::getenv("MOESIM_SHARED")) roots.emplace_back(shared);
  roots.emplace_back("../shared");
  roots.emplace_back(fs::path(MOESIM_SOURCE_DIR) / ".." / "shared");
  for (const auto& root : roots)
    if (fs::exists(root / rel)) return (root / rel).lexically_normal().string();
  return "";
}

namespace {

// A name for an error message: control characters as '?', at most 60 characters.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 60)) out += std::iscntrl(static_cast<unsigned char>(c)) ? '?' : c;
  return s.size() > 60 ? out + "..." : out;
}

// Whether `s` is text that results (JSON) can hold: the JSON library's own check.
bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

}  // namespace

std::string shell_word(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string path_name_problem(const std::string& name) {
  if (name.size() > 100) return "is longer than 100 characters";
  const bool ok = !name.empty() && std::isalnum(static_cast<unsigned char>(name[0])) &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '+' || c == '-';
                  });
  return ok ? "" : "'" + printable(name) + "' cannot name a results folder: use letters, digits and . _ + - (starting "
                                          "with a letter or digit)";
}

Experiment load_experiment(const std::optional<std::string>& path, const std::vector<std::string>& overrides,
                           const std::string& overrides_dir) {
  Experiment ex;
  ex.overrides = overrides;
  ParsedFile file;
  if (path) {
    ex.spec_path = *path;
    file = parse_file(*path, ex.spec);
  } else {
    ex.spec_path = kDemoSpec;
    file = parse_text(kDemoSpec, *embedded_file(kDemoSpec), ex.spec);
    if (const auto trace = demo_trace_path(); !trace.empty()) {  // the real routing, as the demo's header says
      auto* t = ex.spec.mutable_gating()->mutable_trace();
      t->set_path(trace);
      t->set_first_iteration(1001);
      t->set_split_experts(true);
    }
  }
  const auto file_source = ex.spec.gating().source_case();
  for (const auto& o : overrides) apply_override(ex.spec, o);
  if (file_source != spec::GatingSpec::SOURCE_NOT_SET && ex.spec.gating().source_case() != file_source) {
    const auto o = override_of(overrides, "gating");
    ex.notes.push_back(fmt::format("--set {}: replaces the spec's gating source ({}) by another; the spec's is not used",
                                   o ? printable(*o) : "gating", file_source == spec::GatingSpec::kTrace ? "a trace replay"
                                   : file_source == spec::GatingSpec::kGenerator ? "the generator"
                                   : file_source == spec::GatingSpec::kZipf ? "Zipf" : "uniform"));
  }

  // An error in the experiment spec: name the --set that caused it, else the file and line.
  auto in_spec = [&](const std::string& field, const std::string& message) -> InputError {
    if (auto o = override_of(overrides, field)) return InputError("--set " + *o + ": field '" + field + "': " + message);
    return InputError(file.describe(field, message));
  };

  auto& s = ex.spec;
  if (!s.name().empty())
    if (const auto problem = path_name_problem(s.name()); !problem.empty()) throw in_spec("name", problem);
  if (!valid_utf8(s.description())) throw in_spec("description", "is not valid UTF-8");
  // Paths written in a spec file are relative to it; paths given with --set to overrides_dir (a
  // sweep's directory) if the file is there, else to the current directory.
  auto resolve_in = [](std::string* value, const fs::path& dir) {  // a relative path that exists there
    if (value->empty() || fs::path(*value).is_absolute()) return;
    if (const auto candidate = dir / *value; fs::exists(candidate)) *value = candidate.lexically_normal().string();
  };
  auto relative_to_spec = [&](std::string* value, const std::string& field) {
    const bool overridden = bool(override_of(overrides, field));
    if (overridden ? overrides_dir.empty() : !path) return;
    resolve_in(value, overridden ? fs::path(overrides_dir) : fs::path(*path).parent_path());
  };
  if (s.gating().has_trace()) relative_to_spec(s.mutable_gating()->mutable_trace()->mutable_path(), "gating.trace.path");
  if (const auto& p = s.cluster().platform();  // a file, not a catalog name: beside the spec
      p.find('/') != std::string::npos || (p.size() > 10 && p.substr(p.size() - 10) == ".textproto"))
    relative_to_spec(s.mutable_cluster()->mutable_platform(), "cluster.platform");
  if (s.gating().source_case() == spec::GatingSpec::SOURCE_NOT_SET) s.mutable_gating()->mutable_uniform();
  if (s.gate().has_capacity_factor() && !(std::abs(s.gate().capacity_factor()) <= 1e4))
    throw in_spec("gate.capacity_factor", "must be a number in [-1e4, 1e4] (> 0 fixed, 0 dropless, < 0 capped dynamic; "
                                          "a factor of E/k already keeps every token)");
  if (s.cluster().platform().empty()) throw in_spec("cluster.platform", "is not set; the catalog has: " + known_platforms());

  // The cluster: catalog or file, then the experiment's node count.
  ParsedFile cluster_file;
  try {
    ex.cluster_spec = load_platform(s.cluster().platform(), &cluster_file);
  } catch (const InputError& e) {
    throw in_spec("cluster.platform", e.what());
  }
  if (s.cluster().nodes() > 0) ex.cluster_spec.set_nodes(s.cluster().nodes());
  if (s.cluster().gpus_per_node() > 0) {
    try {
      *ex.cluster_spec.mutable_node() = first_gpus(ex.cluster_spec.node(), int(std::min(s.cluster().gpus_per_node(), 1u << 20)));
    } catch (const FieldError& e) {
      throw in_spec("cluster.gpus_per_node", e.message());
    }
  }
  if (const auto channels = s.cluster().nccl_net_channels_per_peer(); channels > 0) {  // the NCCL the experiment ran
    if (channels > 64) throw in_spec("cluster.nccl_net_channels_per_peer", fmt::format("{}: at most 64 (NCCL's MAXCHANNELS)", channels));
    ex.cluster_spec.mutable_node()->set_nccl_net_channels_per_peer(channels);
  }
  if (!s.cluster().gpu_profile().empty()) {  // a measured GPU in place of the catalog's
    relative_to_spec(s.mutable_cluster()->mutable_gpu_profile(), "cluster.gpu_profile");
    try {
      spec::GpuSpec gpu;
      parse_file(s.cluster().gpu_profile(), gpu);
      *ex.cluster_spec.mutable_gpu() = gpu;
    } catch (const InputError& e) {
      throw in_spec("cluster.gpu_profile", e.what());
    }
  }
  if (s.sim().ideal()) {  // without the overheads real systems pay
    ex.cluster_spec.mutable_gpu()->set_host_sync_us(0);
    ex.cluster_spec.mutable_gpu()->set_launch_us(0);
    ex.cluster_spec.mutable_gpu()->set_kernel_us(0);
    for (auto& nic : *ex.cluster_spec.mutable_node()->mutable_nics()) nic.set_message_overhead_us(0);
    ex.cluster_spec.mutable_node()->set_nccl_call_latency_us(0);
  }
  std::optional<Cluster> cluster;
  try {
    cluster.emplace(ex.cluster_spec);
  } catch (const FieldError& e) {
    if (e.field() == "nodes" && s.cluster().nodes() > 0) throw in_spec("cluster.nodes", e.message());
    throw InputError(cluster_file.describe(e.field(), e.message()));
  }

  // The iterations, model, policy and gating of one run (the spec itself, or one of its variants);
  // returns what its routing is (GatingCheck::description).
  auto validate_run = [&](spec::ExperimentSpec& run, const std::function<InputError(std::string, std::string)>& error) {
    std::string routing;
    if (run.iterations() == 0) run.set_iterations(1);
    if (run.iterations() > kMaxIterations)
      throw error("iterations", fmt::format("{} is more than {} (a simulated iteration takes milliseconds to seconds of "
                                            "wall time)", run.iterations(), kMaxIterations));
    if (run.warmup_iterations() >= run.iterations())
      throw error("warmup_iterations", fmt::format("{} warm-up iterations leave none of the {} to measure; use fewer, or "
                                                   "more iterations", run.warmup_iterations(), run.iterations()));
    if (run.seeds() > 1000) throw error("seeds", fmt::format("{} is more than 1000", run.seeds()));
    if (run.seeds() != s.seeds())
      throw error("seeds", "is the experiment's (every variant runs with each seed); set it outside the variants");
    if (run.sim().ideal() != s.sim().ideal())
      throw error("sim.ideal", "is the experiment's (its variants share the cluster); set it outside the variants");
    if (run.sim().timeline_iterations() > run.iterations())
      throw error("sim.timeline_iterations", fmt::format("{} is more than the {} iterations run", run.sim().timeline_iterations(),
                                                         run.iterations()));
    std::optional<MoeModel> model;
    try {
      model.emplace(run.model());
      GpuModel(ex.cluster_spec.gpu(), run.model().dtype());
    } catch (const FieldError& e) {
      if (e.field().rfind("gpu.", 0) == 0) throw error("model.dtype", e.message());
      throw error("model." + e.field(), e.message());
    }
    try {
      // Inside EP groups (parallel.ep) the policy runs on a group's GPUs as if they were the
      // cluster, and on a pipeline stage's blocks (parallel.pp) as if they were the model.
      const ParallelLayout layout = parallel_layout(run.parallel(), *cluster);
      const MoeModel per_gpu = model->tensor_parallel(layout.tp).context_parallel(layout.cp);
      for (const auto& stage : pipeline_stages(per_gpu, layout.model_parts()))
        make_policy(run.policy())->validate(Cluster(ep_group_cluster(ex.cluster_spec, layout.ep)), stage_model(per_gpu, stage), run.policy());
      deepep_sm_share(run.policy(), ex.cluster_spec.gpu());  // policy.deepep.sms within the GPU's
      const auto gating = validate_gating(run.gating(), *model, int(run.iterations()), run.seed());
      routing = gating.description;
      if (&run == &s) {
        ex.gating_source = gating.source;
        ex.gating = gating.description;
      }
      if (!gating.note.empty() && std::find(ex.notes.begin(), ex.notes.end(), gating.note) == ex.notes.end())
        ex.notes.push_back(gating.note);
      // DeepEP sends a token once per node and GPU as the uniform and Zipf sources count them (and
      // the generator under a group limit); otherwise the generator and a trace give token-slot
      // counts only.
      if (collective_algorithm(run.policy(), CollectiveType::all_to_all) == "deepep" &&
          (run.gating().has_trace() || (run.gating().has_generator() && !model->group_limit().on())))
        if (const std::string note = "policy.all_to_all deepep: the " +
                                     std::string(run.gating().has_trace() ? "replayed trace" : "generator") +
                                     " gives token-slot counts only, so each token-slot crosses on its own (the uniform and Zipf "
                                     "sources count each token once per GPU and node, as DeepEP sends it)";
            std::find(ex.notes.begin(), ex.notes.end(), note) == ex.notes.end())
          ex.notes.push_back(note);
    } catch (const FieldError& e) {
      throw error(e.field(), e.message());
    }
    return routing;
  };
  validate_run(s, in_spec);

  // Variants: the spec with their overrides; they share the cluster.
  std::set<std::string> names;
  for (int i = 0; i < s.variants_size(); ++i) {
    const auto& v = s.variants(i);
    const std::string where = fmt::format("variants[{}]", i);
    if (v.name().empty() || !names.insert(v.name()).second)
      throw in_spec(where + ".name", "variants need distinct, non-empty names");
    if (std::any_of(v.name().begin(), v.name().end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); }))
      throw in_spec(where + ".name", "'" + printable(v.name()) + "' holds a control character; a variant's name is a label");
    if (!valid_utf8(v.name())) throw in_spec(where + ".name", "is not valid UTF-8");
    spec::ExperimentSpec run = s;
    run.clear_variants();
    run.clear_paper();
    for (int j = 0; j < v.set_size(); ++j) {
      if (v.set(j).rfind("cluster.", 0) == 0 || v.set(j).rfind("model.dtype", 0) == 0)
        throw in_spec(fmt::format("{}.set[{}]", where, j), "variants share the cluster and the dtype; make another experiment for those");
      try {
        apply_override(run, v.set(j));
      } catch (const InputError& e) {
        throw in_spec(fmt::format("{}.set[{}]", where, j), e.what());
      }
      // A trace a variant names is, as the spec's, relative to the spec file.
      if (v.set(j).rfind("gating.trace.path=", 0) == 0 && path)
        resolve_in(run.mutable_gating()->mutable_trace()->mutable_path(), fs::path(*path).parent_path());
    }
    ex.variant_gating.push_back(validate_run(run, [&](const std::string& field, const std::string& message) {
      return in_spec(where, "variant '" + v.name() + "': field '" + field + "': " + message);
    }));
    ex.variants.emplace_back(v.name(), std::move(run));
  }
  // An override that every variant, or some, sets again: the variant's wins. Said, not silent.
  for (const auto& o : overrides) {
    const std::string field = o.substr(0, o.find('='));
    std::vector<std::string> by;
    for (const auto& v : s.variants())
      for (const auto& set : v.set()) {
        const std::string f = set.substr(0, set.find('='));
        if (f == field || f.rfind(field + ".", 0) == 0 || field.rfind(f + ".", 0) == 0) {
          by.push_back(v.name());
          break;
        }
      }
    if (!by.empty())
      ex.notes.push_back(fmt::format("--set {}: {} of the spec's {} variants set {} themselves, and a variant's own "
                                     "setting wins there ({}{})",
                                     printable(o), by.size(), s.variants_size(), field, printable(by.front()),
                                     by.size() > 1 ? fmt::format(" and {} more", by.size() - 1) : ""));
  }
  for (int i = 0; i < s.paper_size(); ++i) {
    const auto& p = s.paper(i);
    if (p.baseline().empty()) throw in_spec(fmt::format("paper[{}].baseline", i), "name at least one baseline variant");
    std::vector<std::string> groups(p.groups().begin(), p.groups().end());
    if (groups.empty()) groups.emplace_back();
    for (const auto& g : groups) {
      std::vector<std::string> wanted(p.baseline().begin(), p.baseline().end());
      wanted.push_back(p.variant());
      for (const auto& n : wanted) {
        const std::string name = g.empty() ? n : g + "/" + n;
        if (!names.count(name))
          throw in_spec(fmt::format("paper[{}]", i), "names the variant '" + name + "', which the experiment does not have" +
                                                         (g.empty() ? "" : " (with groups, variants are named GROUP/NAME)"));
      }
    }
    if (!(p.value() > 0 && p.value() <= 1e6)) throw in_spec(fmt::format("paper[{}].value", i), "must be in (0, 1e6]: a ratio");
    if (!(p.tolerance() >= 0 && p.tolerance() <= 10))
      throw in_spec(fmt::format("paper[{}].tolerance", i), "must be in [0, 10] (a relative tolerance; 0 means 0.15)");
  }
  return ex;
}

}  // namespace moesim
