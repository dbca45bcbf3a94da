// Pro-Prophet's techniques as functions, for the policy and for tests (see pro_prophet.cpp):
// the performance model (Eqs. 1-8), the balance criterion (Eq. 7), the locality-based greedy
// search (Algorithm 1) and the top-k replication baseline of Fig. 15.
#pragma once
#include <vector>

#include "cost_model.hpp"
#include "moe_iteration.hpp"

namespace moesim {

/// The scalars of the performance model (Table II), taken from the shared cost model.
struct ProphetModel {
  int devices = 1;            // D
  double input_bytes = 0;     // size(input): one token's hidden vector
  double a2a_bandwidth = 0;   // B̄ of Eq. 1 (bytes/s one device receives when all others send to it)
  double xfer_bandwidth = 0;  // B̄ of Eqs. 4-5 (size(params) / a ring broadcast over all GPUs)
  double throughput = 0;      // t: inputs per second of a device's expert GEMMs
  double params_bytes = 0;    // size(e.params)
  double grads_bytes = 0;     // size(e.grads)
  double fnec = 0, bnec = 0;  // T_FNEC, T_BNEC: a layer's non-MoE compute, forward and backward
};

ProphetModel prophet_model(const CostModel& cost, const MoeModel& model, const GpuModel& gpu);

double a2a_time(const ProphetModel& m, const std::vector<double>& R);                    // Eq. 1
double fec_time(const ProphetModel& m, const std::vector<double>& H);                    // Eq. 2
double bec_time(const ProphetModel& m, const std::vector<double>& H);                    // Eq. 3
double trans_time(const ProphetModel& m, double s, double n);                            // Eq. 4
double agg_time(const ProphetModel& m, double s, double n);                              // Eq. 5
double layer_time(double a2a, double fec, double trans, double agg);                     // Eq. 6
double layer_time_overlapped(const ProphetModel& m, double a2a, double fec, double trans, double agg);  // Eq. 8
/// Eq. 7: max(H) − min(H) < α · I / D, I = token-slots of the layer (Σ H).
bool balanced(const std::vector<double>& H, double alpha);

struct SearchOptions {
  double alpha = 0.1;    // Eq. 7
  int n = 0;             // devices besides the home that a selected expert is not sent to
  bool overlap = false;  // score with Eq. 8 (planner + scheduler, "Full") instead of Eq. 6
};

struct ProphetPlan {
  enum class Stop { balanced, relieved };
  std::vector<Replica> replicas;   // the best prefix L[0:cnt]
  Stop stop = Stop::balanced;      // why the search ended: Eq. 7, or the heaviest device already relieved
  int searched = 0;                // experts the search selected (size of L)
  double time_before = 0;          // T' with no replica
  double time_after = 0;           // T' of the chosen prefix
  std::vector<double> H, R;        // per device, under the chosen prefix
};

/// Algorithm 1 on `gating` (the observed D × E routing counts): greedy prefix search.
ProphetPlan greedy_search(const ProphetModel& m, const Cluster& cluster, const RoutingMatrix& gating,
                          const SearchOptions& options);

/// The k experts with the most token-slots (ties: lower index first), the top2/top3 of Fig. 15.
std::vector<int> top_experts(const RoutingMatrix& routing, int k);

}  // namespace moesim
