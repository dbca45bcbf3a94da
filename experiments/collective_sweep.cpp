#include "collective_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "textproto.hpp"

#include "cluster.hpp"
#include "collectives/collectives.hpp"
#include "cost_model.hpp"
#include "errors.hpp"
#include "gpu.hpp"
#include "policy.hpp"
#include "routing.hpp"
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
  if (!(value * scale >= 1 && value * scale <= kMaxCollectiveBytes))
    throw InputError("size '" + text + "': must be from 1 byte to 1024G (nccl-tests' sizes are far below)");
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
  if (!f.name.empty())
    if (const auto problem = path_name_problem(f.name); !problem.empty()) throw InputError(file.describe("name", problem));
  f.description = s.description();
  if (!s.platform().empty()) f.sweep.platform = s.platform();
  if (s.gpus_size()) f.sweep.gpus.clear();
  for (int i = 0; i < s.gpus_size(); ++i) {
    if (s.gpus(i) < 1 || s.gpus(i) > kMaxCollectiveGpus)
      throw InputError(file.describe(fmt::format("gpus[{}]", i), fmt::format("must be in [1, {}]", kMaxCollectiveGpus)));
    f.sweep.gpus.push_back(int(s.gpus(i)));
  }
  if (s.algorithms_size()) f.sweep.algorithms.assign(s.algorithms().begin(), s.algorithms().end());
  for (int i = 0; i < s.collectives_size(); ++i) try {
      f.sweep.collectives.push_back(parse_collective_type(s.collectives(i)));
    } catch (const InputError& e) {
      throw InputError(file.describe(fmt::format("collectives[{}]", i), e.what()));
    }
  if (s.has_routed()) {
    const auto& r = s.routed();
    auto need = [&](bool ok, const char* field, const char* what) {
      if (!ok) throw InputError(file.describe(std::string("routed.") + field, what));
    };
    need(r.tokens() >= 1 && r.tokens() <= (1u << 20), "tokens", "must be in [1, 1048576] (tokens per GPU)");
    need(r.hidden() >= 1 && r.hidden() <= (1u << 20), "hidden", "must be in [1, 1048576] (elements per token)");
    need(r.experts() >= 1 && r.experts() <= (1u << 16), "experts", "must be in [1, 65536]");
    need(r.top_k() >= 1 && r.top_k() <= r.experts(), "top_k", "must be in [1, experts]");
    need(r.dispatch_bytes_per_element() > 0 && r.dispatch_bytes_per_element() <= 16, "dispatch_bytes_per_element",
         "must be in (0, 16] (FP8 with a scale per 128: 1.03125)");
    need(r.combine_bytes_per_element() > 0 && r.combine_bytes_per_element() <= 16, "combine_bytes_per_element",
         "must be in (0, 16] (BF16: 2)");
    if (s.sizes_size()) throw InputError(file.describe("sizes", "a routed sweep takes its bytes from the routing: leave it out"));
    for (int i = 0; i < s.collectives_size(); ++i)
      if (s.collectives(i) != "all_to_all")
        throw InputError(file.describe(fmt::format("collectives[{}]", i), "a routed sweep times all-to-alls only"));
    need(!r.has_sms() || (r.sms() >= 1 && r.sms() <= 1024), "sms", "must be in [1, 1024] (DeepEP's SMs; default 20)");
    f.sweep.routed = RoutedExchange{int(r.tokens()), int(r.hidden()), int(r.experts()), int(r.top_k()), int(r.node_limit()),
                                    r.dispatch_bytes_per_element(), r.combine_bytes_per_element(), r.seed(),
                                    r.has_sms() ? std::optional(r.sms()) : std::nullopt};
    f.sweep.collectives = {CollectiveType::all_to_all};
    f.sweep.sizes.clear();
  }
  if (s.sizes_size()) f.sweep.sizes.clear();
  for (int i = 0; i < s.sizes_size(); ++i) try {
      f.sweep.sizes.push_back(parse_size(s.sizes(i)));
    } catch (const InputError& e) {
      throw InputError(file.describe(fmt::format("sizes[{}]", i), e.what()));
    }
  for (int i = 0; i < s.paper_size(); ++i) {
    const auto& c = s.paper(i);
    const std::string where = fmt::format("paper[{}]", i);
    auto runs = [&](const std::string& algorithm) {
      return std::count(f.sweep.algorithms.begin(), f.sweep.algorithms.end(), algorithm) > 0;
    };
    const bool gpus = std::count(f.sweep.gpus.begin(), f.sweep.gpus.end(), int(c.gpus())) > 0;
    double bytes = 0;
    if (f.sweep.routed) {
      if (c.exchange() != "dispatch" && c.exchange() != "combine")
        throw InputError(file.describe(where + ".exchange", "a routed sweep's claim is of the \"dispatch\" or the \"combine\""));
      if (!c.size().empty() || !c.baseline().empty())
        throw InputError(file.describe(where, "a routed sweep's claim is a bandwidth in GB/s: give no size or baseline"));
      if (!gpus || !runs(c.algorithm()))
        throw InputError(file.describe(where, "names a GPU count or algorithm the sweep does not run"));
      if (!(c.value() > 0 && c.value() <= 1e6)) throw InputError(file.describe(where + ".value", "must be in (0, 1e6]: GB/s"));
    } else {
      if (!c.exchange().empty()) throw InputError(file.describe(where + ".exchange", "only a routed sweep's claims have one"));
      try {
        bytes = parse_size(c.size());
      } catch (const InputError& e) {
        throw InputError(file.describe(where + ".size", e.what()));
      }
      if (!gpus || !std::count(f.sweep.sizes.begin(), f.sweep.sizes.end(), bytes) || !runs(c.algorithm()) || !runs(c.baseline()))
        throw InputError(file.describe(where, "names a GPU count, size or algorithm the sweep does not run"));
      if (!(c.value() > 0 && c.value() <= 1e6)) throw InputError(file.describe(where + ".value", "must be in (0, 1e6]: a ratio"));
    }
    if (!(c.tolerance() >= 0 && c.tolerance() <= 10))
      throw InputError(file.describe(where + ".tolerance", "must be in [0, 10] (a relative tolerance; 0 means 0.15)"));
    CollectiveClaim claim{int(c.gpus()), bytes, c.algorithm(), c.baseline(), c.exchange(), {}};
    claim.paper.set_claim(c.claim());
    claim.paper.set_value(c.value());
    claim.paper.set_source(c.source());
    claim.paper.set_tolerance(c.tolerance());
    if (f.sweep.routed) claim.paper.set_quantity(spec::PaperValue::BANDWIDTH);
    f.paper.push_back(std::move(claim));
  }
  return f;
}

std::vector<PaperComparison> collective_comparisons(const CollectiveSweepFile& f, const std::vector<CollectivePoint>& points) {
  auto time = [&](int gpus, double bytes, const std::string& a) {
    for (const auto& p : points)
      if (p.collective == CollectiveType::all_to_all && p.gpus == gpus && p.bytes == bytes && p.algorithm == a) return p.seconds;
    return std::numeric_limits<double>::quiet_NaN();  // not run (the command line narrowed the sweep)
  };
  auto bandwidth = [&](int gpus, const std::string& a, const std::string& exchange) {
    for (const auto& p : points)
      if (p.gpus == gpus && p.algorithm == a && p.exchange == exchange) return p.algbw() / 1e9;
    return std::numeric_limits<double>::quiet_NaN();
  };
  std::vector<PaperComparison> out;
  for (const auto& c : f.paper)
    out.push_back({c.paper, c.exchange.empty() ? time(c.gpus, c.bytes, c.baseline) / time(c.gpus, c.bytes, c.algorithm)
                                               : bandwidth(c.gpus, c.algorithm, c.exchange)});
  return out;
}

double CollectivePoint::busbw() const { return algbw() * bus_bandwidth_factor(collective, gpus); }

CollectiveType parse_collective_type(const std::string& name) {
  for (auto t : kCollectiveTypes)
    if (name == collective_type_name(t)) return t;
  std::string names;
  for (auto t : kCollectiveTypes) names += (names.empty() ? "" : ", ") + std::string(collective_type_name(t));
  throw InputError(fmt::format("no collective '{}'; use {}", name, names));
}

std::vector<std::pair<CollectiveType, std::string>> collective_cases(const CollectiveSweep& sweep) {
  const std::vector<CollectiveType> types =
      sweep.collectives.empty() ? std::vector<CollectiveType>(std::begin(kCollectiveTypes), std::end(kCollectiveTypes)) : sweep.collectives;
  auto wanted = [&](const std::string& a) {
    return sweep.algorithms.empty() || std::count(sweep.algorithms.begin(), sweep.algorithms.end(), a) > 0;
  };
  std::vector<std::pair<CollectiveType, std::string>> cases;
  for (auto t : types) {
    bool any = false;
    for (const auto* a : collective_algorithms())
      if (a->type == t && wanted(a->name)) cases.emplace_back(t, a->name), any = true;
    if (!any && !sweep.collectives.empty())
      throw InputError(fmt::format("--collectives {}: none of the --algorithms is one of its algorithms ({})",
                                   collective_type_name(t), collective_algorithm_names(t)));
  }
  for (const auto& a : sweep.algorithms)
    if (std::none_of(cases.begin(), cases.end(), [&](const auto& c) { return c.second == a; })) {
      std::string known;
      for (auto t : types) known += fmt::format("{}{}: {}", known.empty() ? "" : "; ", collective_type_name(t), collective_algorithm_names(t));
      throw InputError(fmt::format("--algorithms: '{}' is no algorithm of the collectives swept ({})", a, known));
    }
  return cases;
}

nlohmann::json collective_json(const std::string& platform, const std::vector<CollectivePoint>& points) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : points) {
    rows.push_back({{"collective", collective_type_name(p.collective)},
                    {"algorithm", p.algorithm},
                    {"gpus", p.gpus},
                    {"bytes", p.bytes},
                    {"time_us", p.seconds * 1e6},
                    {"algbw_gbps", p.algbw() / 1e9},
                    {"busbw_gbps", p.busbw() / 1e9}});
    if (!p.exchange.empty()) rows.back()["exchange"] = p.exchange;
  }
  return {{"platform", platform}, {"points", rows}};
}

std::vector<CollectivePoint> collective_points(const nlohmann::json& j) {
  std::vector<CollectivePoint> points;
  for (const auto& p : j.at("points"))
    points.push_back({parse_collective_type(p.at("collective").get<std::string>()), p.at("gpus").get<int>(),
                      p.at("bytes").get<double>(), p.at("algorithm").get<std::string>(), p.at("time_us").get<double>() * 1e-6, "",
                      p.value("exchange", std::string())});
  return points;
}

// The collective of one point: S as nccl-tests sizes it, over ranks 0..n-1, rooted at rank 0.
Collective sweep_collective(CollectiveType type, const std::string& algorithm, int n, double S) {
  std::vector<int> group(static_cast<std::size_t>(n), 0);
  std::iota(group.begin(), group.end(), 0);
  if (type == CollectiveType::all_to_all) return {type, std::move(group), std::vector<double>(std::size_t(n) * n, S / n), algorithm};
  return {type, std::move(group), {S}, algorithm};
}

namespace {

// One GPU count's dispatch of a routed sweep: each pair's bytes, as a dispatcher sending every
// token-slot (`slots`) or every token once per GPU (`per_gpu`, and `per_node` over the network, as
// DeepEP does), and what DeepEP's benchmark counts for rank 0.
struct RoutedBytes {
  std::vector<double> slots, per_gpu, per_node;
  double counted_dispatch = 0, counted_combine = 0;
};

RoutedBytes routed_bytes(const RoutedExchange& r, int n, int per_node) {
  if (r.experts % n != 0)
    throw InputError(fmt::format("routed.experts: {} experts do not spread evenly over {} GPUs", r.experts, n));
  const int nodes = n / per_node, per_gpu = r.experts / n;
  GroupLimit limit{nodes, std::min(nodes, r.node_limit)};
  if (limit.on() && r.top_k > limit.per_token * per_gpu * per_node)
    throw InputError(fmt::format("routed.top_k: {} experts do not fit on {} nodes of {} experts", r.top_k, limit.per_token,
                                 per_gpu * per_node));
  std::vector<TokenSpread> spreads = {{per_gpu, 0, {}}, {per_gpu * per_node, 0, {}}};
  Rng rng(derive_seed(r.seed, std::uint64_t(n)));
  const RoutingMatrix slots =
      sample_routing(std::vector<double>(std::size_t(r.experts), 1.0 / r.experts), n, r.tokens, r.top_k, rng, limit, &spreads);
  const double token = double(r.hidden) * r.dispatch_bytes_per_element;
  const auto N = std::size_t(n);
  RoutedBytes b{std::vector<double>(N * N), std::vector<double>(N * N), std::vector<double>(N * N), 0, 0};
  for (int p = 0; p < n; ++p)
    for (int q = 0; q < n; ++q) {
      for (int e = q * per_gpu; e < (q + 1) * per_gpu; ++e) b.slots[std::size_t(p) * N + std::size_t(q)] += double(slots.at(p, e)) * token;
      b.per_gpu[std::size_t(p) * N + std::size_t(q)] = double(spreads[0].at(p, q)) * token;
    }
  // Over the network to the GPU of each other node with the sender's local index.
  for (int p = 0; p < n; ++p)
    for (int node = 0; node < nodes; ++node)
      if (node != p / per_node)
        b.per_node[std::size_t(p) * N + std::size_t(node * per_node + p % per_node)] = double(spreads[1].at(p, node)) * token;
  // DeepEP's counts for rank 0 (test_internode.py: num_rdma_token_sent, its own node too;
  // test_intranode.py: recv_x, from itself too), in the combine's element size for the combine.
  double tokens = 0;
  if (nodes > 1)
    for (int node = 0; node < nodes; ++node) tokens += double(spreads[1].at(0, node));
  else
    for (int p = 0; p < n; ++p) tokens += double(spreads[0].at(p, 0));
  b.counted_dispatch = tokens * token;
  b.counted_combine = tokens * double(r.hidden) * r.combine_bytes_per_element;
  return b;
}

// A routed sweep: per all-to-all algorithm, GPU count, the dispatch and the combine.
std::vector<CollectivePoint> run_routed_sweep(const CollectiveSweep& sweep, const Cluster& cluster, SimBackend& sim,
                                              const std::function<void(int, int)>& progress) {
  const RoutedExchange& r = *sweep.routed;
  std::map<int, RoutedBytes> bytes;
  for (int n : sweep.gpus) bytes.emplace(n, routed_bytes(r, n, cluster.gpus_per_node()));
  const auto cases = collective_cases(sweep);
  std::vector<CollectivePoint> points;
  const int total = int(sweep.gpus.size() * cases.size() * 2);
  const double combine_scale = r.combine_bytes_per_element / r.dispatch_bytes_per_element;
  const double sm_share = deepep_sm_share(r.sms, cluster.spec().gpu(), "routed.sms");
  for (const auto& [type, algorithm] : cases)
    for (int n : sweep.gpus)
      for (const bool combine : {false, true}) {
        const RoutedBytes& b = bytes.at(n);
        std::vector<int> group(static_cast<std::size_t>(n));
        std::iota(group.begin(), group.end(), 0);
        const bool deepep = algorithm == "deepep";
        CollectiveBytes pairs = CollectiveBytes(deepep ? b.per_gpu : b.slots).scaled(combine ? combine_scale : 1.0);
        Collective c{type, std::move(group), combine ? pairs.transposed() : pairs, algorithm};
        if (deepep) {
          const CollectiveBytes network = CollectiveBytes(b.per_node).scaled(combine ? combine_scale : 1.0);
          c.network_bytes = combine ? network.transposed() : network;
          c.combine = combine;
          c.sm_share = sm_share;
        }
        TaskGraph g(cluster.num_gpus());
        g.add_collective(Stream::comm, combine ? "combine" : "dispatch", std::move(c), {});
        points.push_back({type, n, combine ? b.counted_combine : b.counted_dispatch, algorithm, sim.execute(g).makespan(), "",
                          combine ? "combine" : "dispatch"});
        if (progress) progress(int(points.size()), total);
      }
  return points;
}

}  // namespace

std::vector<CollectivePoint> run_collective_sweep(const CollectiveSweep& sweep, const std::function<void(int, int)>& progress) {
  spec::ClusterSpec spec = load_platform(sweep.platform);
  const int per_node = int(spec.node().gpus());
  if (sweep.gpus.empty()) throw InputError("--gpus: give at least one GPU count");
  for (int g : sweep.gpus)
    if (g > kMaxCollectiveGpus) throw InputError(fmt::format("--gpus {}: at most {}", g, kMaxCollectiveGpus));
    else if (g < per_node || g % per_node != 0)
      throw InputError(fmt::format("--gpus {}: {} has {} GPUs per node; use whole nodes (a multiple of {})", g,
                                   sweep.platform, per_node, per_node));
  const auto cases = collective_cases(sweep);  // checked before the platform is built
  spec.set_nodes(std::uint32_t(*std::max_element(sweep.gpus.begin(), sweep.gpus.end()) / per_node));
  // nccl-tests and DeepEP's benchmarks time kernels queued back to back (CUDA events over many
  // calls): a framework's time to issue each op is not in their figures.
  spec.mutable_gpu()->set_launch_us(0);
  const Cluster cluster(spec);
  const GpuModel gpu(spec.gpu(), spec::FP16);
  SimBackend sim(cluster, gpu);
  if (sweep.routed) return run_routed_sweep(sweep, cluster, sim, progress);
  const CostModel cost(cluster, gpu);
  std::vector<CollectivePoint> points;
  const int total = int(sweep.gpus.size() * sweep.sizes.size() * cases.size());
  for (const auto& [type, algorithm] : cases)
    for (int n : sweep.gpus)
      for (double S : sweep.sizes) {
        TaskGraph g(cluster.num_gpus());
        Collective c = sweep_collective(type, algorithm, n, S);
        std::string pick;
        if (type == CollectiveType::all_reduce) {
          const NcclChoice choice = nccl_all_reduce_choice(cost.nccl_tuner_input(c.group), S);
          pick = choice.algorithm + "/" + nccl_protocol_name(choice.protocol);
        } else if (type == CollectiveType::broadcast || type == CollectiveType::reduce) {
          pick = std::string("ring/") + nccl_protocol_name(chain_protocol(c, cluster));
        }
        g.add_collective(Stream::comm, collective_type_name(type), std::move(c), {});
        points.push_back({type, n, S, algorithm, sim.execute(g).makespan(), pick});
        if (progress) progress(int(points.size()), total);
      }
  return points;
}

}  // namespace moesim
