// How the hardware backends read a TaskGraph op: which ranks take part and, for communication,
// the point-to-point steps to run. One place for both devices (host_backend.cpp, cuda_backend.cpp):
// a Transfer is one step of one message; a Collective is lowered by its algorithm
// (policies/collectives) exactly as the simulator lowers it, so both backends move the same bytes
// in the same steps.
#pragma once
#include <cstddef>
#include <vector>

#include "cluster.hpp"
#include "collectives/collectives.hpp"
#include "model.hpp"
#include "taskgraph.hpp"

namespace moesim::hw {

/// Ranks that execute the op: a compute op's rank (a Computes op's: each part's), a transfer's
/// source and destination, a collective's group. Every participant runs the op at its place in id
/// order.
std::vector<int> participants(const Op& op);

/// What `rank` computes for the op: a Compute op's work on its rank, a Computes op's part on
/// `rank` (with its index among the graph's parts in `part`); null for anything else.
const Compute* rank_compute(const Op& op, int rank, std::size_t* part = nullptr);

/// The steps of a transfer or collective (empty for compute). Lanes run one after another on the
/// host device and on one stream each on GPUs.
Lowering communication_steps(const Op& op, const Cluster& cluster);

/// Bytes a step's transfer really moves: the transfer's bytes times the step's pipelined rounds.
inline std::size_t wire_bytes(const Transfer& t, const Step& step) {
  return std::size_t(t.bytes * double(step.rounds < 1 ? 1 : step.rounds) + 0.5);
}

/// The kernel a memory-bound op runs, on either device, sized so that it moves the op's bytes (read
/// and write, fp32): token encode/decode permutes `rows` rows of d_model floats; the gate takes the
/// softmax and top-k of `rows` rows of E scores; Adam updates `rows` parameters (param, grad, m, v
/// read, three written: 7 floats each); anything else is y += a·x over `rows` floats (3 each).
struct MemoryKernel {
  enum Kind { permute, gate, adam, axpy } kind = axpy;
  std::size_t rows = 0, width = 1;
};
/// The scratch buffers a rank runs its ops in, on either device: a GEMM's A, B and C (a memory-bound
/// kernel's input and output), a transfer's send and receive sides, and optimizer state.
enum Buffer { kA, kB, kC, kSend, kRecv, kState, kBuffers };

/// rows = 0: nothing to run (fewer bytes than one element).
MemoryKernel memory_kernel(ComputeKind kind, double bytes, const MoeModel& model);

}  // namespace moesim::hw
