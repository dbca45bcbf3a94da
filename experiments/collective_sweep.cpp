#include "collective_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "textproto.hpp"

#include "cluster.hpp"
#include "collectives/collectives.hpp"
#include "errors.hpp"
#include "gpu.hpp"
#include "simgrid_backend.hpp"
#include "spec.hpp"

namespace moesim {

double parse_size(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw InputError("size '" + text + "': expected a number with an optional K, M or G suffix (powers of 1024)");
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1024.0 * 1024 : unit == "G" ? 1024.0 * 1024 * 1024 : -1;
  if (scale < 0 || !(value > 0))
    throw InputError("size '" + text + "': expected a positive number with an optional K, M or G suffix (e.g. 32M)");
  return value * scale;
}

std::string format_size(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && bytes >= 1024 && std::fmod(bytes, 1024) == 0) bytes /= 1024, ++u;
  return fmt::format("{:g} {}", bytes, units[u]);
}

CollectiveSweepFile load_collective_sweep(const std::string& path) {
  spec::CollectiveSweepSpec s;
  const ParsedFile file = parse_file(path, s);
  CollectiveSweepFile f;
  f.name = s.name();
  f.description = s.description();
  if (!s.platform().empty()) f.sweep.platform = s.platform();
  if (s.gpus_size()) f.sweep.gpus.assign(s.gpus().begin(), s.gpus().end());
  if (s.algorithms_size()) f.sweep.algorithms.assign(s.algorithms().begin(), s.algorithms().end());
  if (s.sizes_size()) f.sweep.sizes.clear();
  for (int i = 0; i < s.sizes_size(); ++i) try {
      f.sweep.sizes.push_back(parse_size(s.sizes(i)));
    } catch (const InputError& e) {
      throw InputError(file.describe(fmt::format("sizes[{}]", i), e.what()));
    }
  for (int i = 0; i < s.paper_size(); ++i) {
    const auto& c = s.paper(i);
    const std::string where = fmt::format("paper[{}]", i);
    double bytes = 0;
    try {
      bytes = parse_size(c.size());
    } catch (const InputError& e) {
      throw InputError(file.describe(where + ".size", e.what()));
    }
    const bool has = std::count(f.sweep.gpus.begin(), f.sweep.gpus.end(), int(c.gpus())) &&
                     std::count(f.sweep.sizes.begin(), f.sweep.sizes.end(), bytes) &&
                     std::count(f.sweep.algorithms.begin(), f.sweep.algorithms.end(), c.algorithm()) &&
                     std::count(f.sweep.algorithms.begin(), f.sweep.algorithms.end(), c.baseline());
    if (!has) throw InputError(file.describe(where, "names a GPU count, size or algorithm the sweep does not run"));
    if (!(c.value() > 0)) throw InputError(file.describe(where + ".value", "must be > 0"));
    CollectiveClaim claim{int(c.gpus()), bytes, c.algorithm(), c.baseline(), {}};
    claim.paper.set_claim(c.claim());
    claim.paper.set_value(c.value());
    claim.paper.set_source(c.source());
    claim.paper.set_tolerance(c.tolerance());
    f.paper.push_back(std::move(claim));
  }
  return f;
}

std::vector<PaperComparison> collective_comparisons(const CollectiveSweepFile& f, const std::vector<CollectivePoint>& points) {
  auto time = [&](int gpus, double bytes, const std::string& a) {
    for (const auto& p : points)
      if (p.gpus == gpus && p.bytes == bytes && p.algorithm == a) return p.seconds;
    return std::numeric_limits<double>::quiet_NaN();  // not run (the command line narrowed the sweep)
  };
  std::vector<PaperComparison> out;
  for (const auto& c : f.paper) out.push_back({c.paper, time(c.gpus, c.bytes, c.baseline) / time(c.gpus, c.bytes, c.algorithm)});
  return out;
}

nlohmann::json collective_json(const std::string& platform, const std::vector<CollectivePoint>& points) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : points)
    rows.push_back({{"gpus", p.gpus}, {"bytes", p.bytes}, {"algorithm", p.algorithm}, {"seconds", p.seconds}});
  return {{"platform", platform}, {"points", rows}};
}

std::vector<CollectivePoint> collective_points(const nlohmann::json& j) {
  std::vector<CollectivePoint> points;
  for (const auto& p : j.at("points"))
    points.push_back({p.at("gpus").get<int>(), p.at("bytes").get<double>(), p.at("algorithm").get<std::string>(),
                      p.at("seconds").get<double>()});
  return points;
}

std::vector<CollectivePoint> run_collective_sweep(const CollectiveSweep& sweep, const std::function<void(int, int)>& progress) {
  spec::ClusterSpec spec = load_platform(sweep.platform);
  const int per_node = int(spec.node().gpus());
  if (sweep.gpus.empty()) throw InputError("--gpus: give at least one GPU count");
  for (int g : sweep.gpus)
    if (g < per_node || g % per_node != 0)
      throw InputError(fmt::format("--gpus {}: {} has {} GPUs per node; use whole nodes (a multiple of {})", g,
                                   sweep.platform, per_node, per_node));
  for (const auto& a : sweep.algorithms)
    if (!find_collective_algorithm(CollectiveType::all_to_all, a))
      throw InputError(fmt::format("--algorithms: no all-to-all algorithm '{}'; use {}", a,
                                   collective_algorithm_names(CollectiveType::all_to_all)));
  spec.set_nodes(std::uint32_t(*std::max_element(sweep.gpus.begin(), sweep.gpus.end()) / per_node));
  const Cluster cluster(spec);
  const GpuModel gpu(spec.gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  std::vector<CollectivePoint> points;
  const int total = int(sweep.gpus.size() * sweep.sizes.size() * sweep.algorithms.size());
  for (int n : sweep.gpus)
    for (double S : sweep.sizes)
      for (const auto& a : sweep.algorithms) {
        Collective c{CollectiveType::all_to_all, {}, std::vector<double>(std::size_t(n) * n, S / n), a};
        for (int r = 0; r < n; ++r) c.group.push_back(r);
        TaskGraph g(cluster.num_gpus());
        g.add_collective(Stream::comm, "alltoall", std::move(c), {});
        points.push_back({n, S, a, sim.execute(g).makespan()});
        if (progress) progress(int(points.size()), total);
      }
  return points;
}

}  // namespace moesim
