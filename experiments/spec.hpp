// Loading an experiment: the spec file (or the embedded demo), --set overrides, the cluster from
// the catalog, and validation of everything before any simulation starts. Every problem is an
// InputError naming the file, line and field and what to do.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "model.hpp"
#include "moesim.pb.h"
#include "policy.hpp"
#include "textproto.hpp"

namespace moesim {

/// The most iterations an experiment (or a variant) runs: a simulated iteration takes milliseconds to
/// seconds of wall time.
inline constexpr std::uint32_t kMaxIterations = 100000;

/// The default experiment `moesim run` runs without a SPEC.
inline constexpr const char* kDemoSpec = "experiments/demo.textproto";

struct Experiment {
  spec::ExperimentSpec spec;        // after overrides and defaults
  spec::ClusterSpec cluster_spec;   // from the catalog, node count applied
  std::string spec_path;
  std::vector<std::string> overrides;
  /// The variants to run instead of the spec itself, each the spec with its overrides applied.
  std::vector<std::pair<std::string, spec::ExperimentSpec>> variants;
  /// What the user should know before the run: an override that variants override in turn, a
  /// --set that replaced the spec's gating source, a trace deeper than the model.
  std::vector<std::string> notes;
  /// What the routing is (GatingCheck: "trace PATH: iterations ...", "generator preset ..."); of the
  /// spec itself, and of each variant (variants may set their own: summary.json names it there).
  std::string gating_source, gating;
  std::vector<std::string> variant_gating;
};

/// The real gating trace the demo replays when it is found (shared/traces/smartmoe-gpt-e32-k2-r16,
/// GPL-3.0, never copied into the repository): under $MOESIM_SHARED, else ../shared from the current
/// directory or from the source checkout. "" when it is not there.
std::string demo_trace_path();

/// Reads, overrides and validates. `path` nullopt: the embedded demo. Relative paths (a trace, a
/// platform file, a GPU profile) written in the spec are relative to it; given in `overrides`, to
/// `overrides_dir` if the file is there (a sweep's own directory), else to the current directory.
Experiment load_experiment(const std::optional<std::string>& path, const std::vector<std::string>& overrides,
                           const std::string& overrides_dir = "");

/// What is wrong with `name` as the name of an experiment, sweep or collective sweep, which becomes a
/// folder (results/NAME), file names (NAME-shard-3.db) and a word in Slurm scripts: "" when it is
/// letters, digits and . _ + - only, starting with a letter or digit, at most 100 characters.
std::string path_name_problem(const std::string& name);

/// `s` as one word for a POSIX shell: single-quoted, a quote inside as '\''. Whatever it holds
/// (spaces, $, backquotes, newlines) the shell reads it as it is.
std::string shell_word(const std::string& s);

/// Reads a platform by catalog name or .textproto path (InputError with file:line:field).
spec::ClusterSpec load_platform(const std::string& name_or_path, ParsedFile* where = nullptr);

}  // namespace moesim
