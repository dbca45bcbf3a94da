// The MoE layer's data path with real numbers on the host device: a policy's plan for one layer
// (where each source's tokens for each expert are computed, which GPUs get copies, who owns each
// expert) replayed on threads-as-ranks with tagged messages, forward and backward:
//
//   gate (x·W_g, softmax, top-k)  ->  the policy plans from the gate's counts
//   copies:    owner --W1,W2--> every GPU that computes the expert (shadows, spAG, ZeRO gathers,
//              Tutel's 1/r slices); a migrated expert travels from its old owner first
//   dispatch:  each source sends its tokens for e to the plan's target (expert_target())
//   experts:   y = relu(x·W1)·W2 on the copy;          combine: out[t] += g_t · y
//   backward:  dy = g_t · dout[t] back to the target;  dW1, dW2, dx there; dx to the source
//   reduce:    every copy's dW1, dW2 summed at the owner (FasterMoE's reduce, spRS, ZeRO's
//              reduce-scatter, FlexMoE's all-reduce: the owner's sum is the same number)
//
// A policy changes where this work runs, never its result: the outputs, input gradients and the
// owners' expert gradients must equal reference_layer()'s (one thread, no distribution) within
// floating-point tolerance (docs/architecture.md §4). The gate's own backward is left out (no policy
// changes it); the routing of the policy's plan must be the gate's (a gate policy that reroutes
// tokens changes the model by design and is refused).
#pragma once
#include <cstdint>
#include <vector>

#include "cluster.hpp"
#include "gpu.hpp"
#include "host_kernels.hpp"
#include "model.hpp"
#include "moesim.pb.h"
#include "routing.hpp"

namespace moesim::hw {

/// One MoE layer's inputs on every rank (seeded), the same for every policy.
struct LayerProblem {
  LayerProblem(const MoeModel& model, int gpus, std::uint64_t seed, int iteration, double skew);
  int G, T, d, h, E, k;
  std::vector<std::vector<float>> x, dout;  // per rank, T × d
  std::vector<float> w_gate;                // d × E (+ a bias towards the first experts: `skew`)
  std::vector<float> bias;                  // E
  std::vector<std::vector<float>> w1, w2;   // per expert, d × h and h × d
};

/// What a layer computed: per rank its output and input gradient (T × d), per expert the gradients
/// at its owner (d × h, h × d).
struct LayerNumbers {
  std::vector<std::vector<float>> out, dx;
  std::vector<std::vector<float>> dw1, dw2;
  RoutingMatrix routing;          // the gate's token counts, [rank][expert]
  int copies = 0;                 // expert copies on GPUs other than the owner (all kinds)
  int migrations = 0;             // experts that changed owner before the layer (their old owner sent them)
  std::vector<int> owner;         // per expert, where its gradients were reduced
  double bytes_moved = 0;         // bytes of all messages between ranks
};

/// The layer with no distribution: every token through its experts in one thread.
LayerNumbers reference_layer(const LayerProblem& p);

/// Runs `iterations` iterations of `policy` (the model's first MoE layer replayed with real numbers
/// on cluster.num_gpus() host ranks); one LayerNumbers per iteration, each checked against the same
/// problem's reference by the caller. Every layer of the model gets the gate's routing of layer 0.
struct DataPathRun {
  std::vector<LayerProblem> problems;
  std::vector<LayerNumbers> numbers;
};
/// The experts' GEMMs (forward and backward) run on `expert_gemm`: the host's by default, cuBLAS's
/// on a GPU (cuda_backend.hpp's cublas_gemm); the gate and the reference stay on the host, so that
/// the routing is the reference's bit for bit.
using GemmFn = decltype(&host::gemm);
DataPathRun run_data_path(const Cluster& cluster, const MoeModel& model, const GpuModel& gpu,
                          const spec::PolicySpec& policy, int iterations, std::uint64_t seed, double skew,
                          GemmFn expert_gemm = host::gemm);

/// Largest |a − b| / max(1, |b|) over every number of two layers' results.
double max_relative_difference(const LayerNumbers& a, const LayerNumbers& b);

}  // namespace moesim::hw
