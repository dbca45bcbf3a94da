// The results database of sweeps (results.db, SQLite): one row per point with its full spec and
// summary.json, one per run (variant) of a point, one per iteration of a run. A point is written in
// one transaction, so a sweep killed at any moment leaves only whole points behind.
//
//   meta(key, value)              sweep name, the sweep spec's text, the swept fields (JSON)
//   points(id, label, overrides, spec, summary, wall_s, finished)
//   runs(point, variant, policy, gpus, iteration_time_s, compute_s, moe_s, all_to_all_s,
//        all_reduce_s, other_s)
//   iterations(point, variant, iteration, time_s, compute_s, ..., other_s, max_mean_load,
//              dropped_tokens)
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>
#include <vector>

struct sqlite3;

namespace moesim {

/// A finished point as stored.
struct StoredPoint {
  int id = 0;
  std::string label;            // "cluster.nodes=8 policy.name=ep"
  nlohmann::json overrides;     // {"cluster.nodes": "8", "policy.name": "ep"}
  std::string spec;             // the point's experiment spec, text format, overrides applied
  nlohmann::json summary;       // its summary.json
  double wall_s = 0;            // wall time it took (not deterministic)
};

class ResultsDb {
 public:
  /// Opens (creating the tables when `create`) the database at `path`; InputError when it cannot.
  ResultsDb(const std::string& path, bool create);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  void set_meta(const std::string& key, const std::string& value);
  std::string meta(const std::string& key) const;  // "" when unset

  std::set<int> finished() const;  // ids of the points stored
  /// Stores a point, its runs and iterations in one transaction (replacing nothing: a point stored
  /// twice is an error).
  void insert(const StoredPoint& point);
  std::vector<StoredPoint> points() const;

  /// CSV of the runs (one row per point × variant, a column per swept field) or, with
  /// `iterations`, of every iteration.
  void export_csv(std::ostream& out, bool iterations) const;

 private:
  void exec(const std::string& sql) const;
  sqlite3* db_ = nullptr;
  std::string path_;
};

/// Combines shard databases of one sweep into `out` (created): every point of every input once;
/// InputError when the inputs come from different sweeps or disagree on a point.
int merge_results(const std::string& out, const std::vector<std::string>& inputs);

}  // namespace moesim
