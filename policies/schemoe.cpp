// ScheMoE as a policy: plain expert placement; each MoE layer's input split into r parts (default
// 2) whose 7-task chains run in OptSche's order with a compressor (default ZFP at 8 bits) on the
// all-to-all payloads. `policy.all_to_all: "pipe"` adds Pipe-A2A, the paper's third ingredient.
//
// Choices where the paper is unclear: "no scheduling" in the ablation (Table 10) is r = 1 (fully
// sequential chains); the backward pass has the forward's chain shape (the released code's
// autograd: Compress.backward decompresses, Comm.backward runs another all-to-all).
#include "schemoe.hpp"

#include <algorithm>

#include "errors.hpp"
#include "moe_iteration.hpp"
#include "policy_factories.hpp"

namespace moesim {

// Each compressor's kernels as Fragile-azalea/ScheMoE (402975e) releases them, counted in memory
// traffic per payload value of b bytes:
//  int8  schemoe/custom/compressor/int8.cpp, ten ATen passes. Compress: min and max over each row
//        (read b each), input − bias, ÷ scale, × 255 (read b, write b each), to uint8 (read b,
//        write 1), a device copy (read 1, write 1): 9b + 3. Decompress: the copy (2), to the dtype
//        (read 1, write b), ÷ 255, × scale, + bias (read b, write b each): 7b + 3. Its all_to_all
//        sends the payload, then the bias and the scale (one value per row: a token's).
//  zfp   schemoe/custom/compressor/zfpc.cpp: zfp_type_float, fixed rate, the CUDA kernels: fp32
//        only, so a 16-bit payload is cast to fp32 first (read b, write 4) and back after; then
//        read 4, write bits/8 (compress) and the reverse. This is ZFP at memory speed, a lower
//        bound: its block transform and bit-plane coding (global atomics) are compute-bound, 10-20x
//        slower on an H100 (docs/hardware.md); `gbytes_per_s` sets a measured rate, as ScheMoE's
//        specs do.
//  fp16  not a released ScheMoE compressor: a cast to 16 bits and back (read b, write 2; the
//        reverse).
Compressor make_compressor(const spec::CompressorSpec& s, const std::string& default_name, double b) {
  const std::string name = s.name().empty() ? default_name : s.name();
  Compressor c;
  c.name = name;
  // Checked whatever the name, so that a value a spec holds is never silently NaN.
  if (s.has_bits() && !(s.bits() > 0 && s.bits() <= 64))
    throw FieldError("policy.schemoe.compressor.bits", "must be in (0, 64]: bits on the wire per value");
  if (s.has_gbytes_per_s() && !(s.gbytes_per_s() >= 1e-3 && s.gbytes_per_s() <= 1e6))
    throw FieldError("policy.schemoe.compressor.gbytes_per_s", "must be in [0.001, 1e6] GB/s");
  if (name == "none") return c;
  c.bits = s.has_bits() ? s.bits() : name == "fp16" ? 16 : 8;
  const double wire = c.bits / 8;  // bytes per value on the wire
  if (name == "fp16") {
    c.compress_bytes = c.decompress_bytes = b + wire;
  } else if (name == "int8") {
    c.compress_bytes = 9 * b + 3 * wire;  // the uint8 steps move `wire` bytes a value (1 at 8 bits)
    c.decompress_bytes = 7 * b + 3 * wire;
    c.side_all_to_alls = 2;
  } else if (name == "zfp") {
    const double cast = b == 4 ? 0 : b + 4;
    c.compress_bytes = c.decompress_bytes = cast + 4 + wire;
  } else {
    throw FieldError("policy.schemoe.compressor.name", "unknown compressor '" + name + "'; known: none, fp16, int8, zfp");
  }
  if (s.has_gbytes_per_s()) c.bytes_per_s = s.gbytes_per_s() * 1e9;
  return c;
}

double optsche_makespan(int r, const TaskTimes& t) {
  // x_1 = c + a;  x_i = max(i·c, x_{i−1}) + a                      (Eq. 13; all C1 first)
  std::vector<double> x(std::size_t(r) + 1, 0.0);
  for (int i = 1; i <= r; ++i) x[std::size_t(i)] = std::max(i * t.c, x[std::size_t(i - 1)]) + t.a;
  // s_0 = r·c;  s_i = max(s_{i−1}, x_i) + d + e + c                  (the D1 E C2 blocks)
  std::vector<double> s(std::size_t(r) + 1, r * t.c);
  for (int i = 1; i <= r; ++i) s[std::size_t(i)] = std::max(s[std::size_t(i - 1)], x[std::size_t(i)]) + t.d + t.e + t.c;
  // z_1 = max(s_1, x_r) + a;  z_i = max(s_i, z_{i−1}) + a            (Eq. 14; dispatches first)
  std::vector<double> z(std::size_t(r) + 1, x[std::size_t(r)]);
  for (int i = 1; i <= r; ++i) z[std::size_t(i)] = std::max(s[std::size_t(i)], z[std::size_t(i - 1)]) + t.a;
  // w_0 = s_r;  w_i = max(w_{i−1}, z_i) + d;  T_r = w_r               (all D2 last)
  double w = s[std::size_t(r)];
  for (int i = 1; i <= r; ++i) w = std::max(w, z[std::size_t(i)]) + t.d;
  return w;
}

double order_makespan(const std::vector<Task>& compute, const std::vector<Task>& comm, const TaskTimes& t) {
  const double duration[7] = {t.c, t.a, t.d, t.e, t.c, t.a, t.d};
  int parts = 0;
  for (const auto& k : compute) parts = std::max(parts, k.part + 1);
  std::vector<std::array<double, 7>> end(static_cast<std::size_t>(parts));
  for (auto& e : end) e.fill(-1);
  std::size_t ci = 0, mi = 0;
  double compute_free = 0, comm_free = 0;
  // Run whichever resource's next task is ready (its predecessor in the chain has ended); both
  // lists are fixed orders, so this only decides the interleaving, never the order on a resource.
  while (ci < compute.size() || mi < comm.size()) {
    auto ready = [&](const Task& k) { return k.kind == 0 || end[std::size_t(k.part)][std::size_t(k.kind - 1)] >= 0; };
    bool progressed = false;
    for (int pass = 0; pass < 2; ++pass) {
      auto& list = pass == 0 ? compute : comm;
      auto& i = pass == 0 ? ci : mi;
      auto& free = pass == 0 ? compute_free : comm_free;
      if (i < list.size() && ready(list[i])) {
        const Task& k = list[i];
        const double start = std::max(free, k.kind == 0 ? 0.0 : end[std::size_t(k.part)][std::size_t(k.kind - 1)]);
        free = end[std::size_t(k.part)][std::size_t(k.kind)] = start + duration[k.kind];
        ++i;
        progressed = true;
      }
    }
    if (!progressed) return -1;  // the orders deadlock (a task waits for one behind it elsewhere)
  }
  double makespan = 0;
  for (const auto& e : end) makespan = std::max(makespan, e[6]);
  return makespan;
}

std::pair<std::vector<Task>, std::vector<Task>> optsche_order(int r) {
  std::vector<Task> compute, comm;
  for (int i = 0; i < r; ++i) compute.push_back({0, i});  // C1¹..C1ʳ
  for (int i = 0; i < r; ++i) compute.insert(compute.end(), {{2, i}, {3, i}, {4, i}});  // D1ⁱ Eⁱ C2ⁱ
  for (int i = 0; i < r; ++i) compute.push_back({6, i});  // D2¹..D2ʳ
  for (int i = 0; i < r; ++i) comm.push_back({1, i});     // A1¹..A1ʳ
  for (int i = 0; i < r; ++i) comm.push_back({5, i});     // A2¹..A2ʳ
  return {compute, comm};
}

namespace {

// `schemoe`: the paper's ScheMoE (ZFP, r = 2, OptSche). `schemoe-released`: the same layer with the
// defaults of Fragile-azalea/ScheMoE's MOELayer (402975e, schemoe/impls/moe_layer.py:53-62):
// a2a_ffn_overlap_degree=1 (r = 1), compress_name='no' (no compressor), comm_name='naive' (the
// linear all-to-all; 'pipe' is policy.all_to_all "pipe"). Each is an option of the spec.
class Schemoe final : public Policy {
 public:
  explicit Schemoe(bool released) : released_(released) {}

  void validate(const Cluster& cluster, const MoeModel& model, const spec::PolicySpec& spec) const override {
    validate_expert_placement(cluster, model, spec);
    make_compressor(spec.schemoe().compressor(), default_compressor(), model.dtype_bytes());
    if (spec.schemoe().partitions() > 64) throw FieldError("policy.schemoe.partitions", "use 1 to 64 parts");
  }

  IterationPlan plan(const IterationInput& in) override {
    IterationPlan plan;
    for (const auto& R : in.routing) plan.layers.push_back({R, {}});
    const auto& s = in.spec.schemoe();
    const double b = in.model.dtype_bytes();
    const Compressor c = make_compressor(s.compressor(), default_compressor(), b);
    Pipelining p;
    p.partitions = s.partitions() ? int(s.partitions()) : released_ ? 1 : 2;
    if (c.bits > 0) {
      p.wire_ratio = std::min(1.0, c.bits / (8.0 * b));
      p.codec = {c.bytes_per_s, c.compress_bytes / b, c.decompress_bytes / b, c.side_all_to_alls};
    }
    // One part and no compressor is plain expert parallelism (schemoe-released's default).
    if (p.partitions > 1 || p.codec.on()) plan.schedule = pipelined_schedule(p);
    return plan;
  }

 private:
  const char* default_compressor() const { return released_ ? "none" : "zfp"; }
  bool released_;
};

}  // namespace

std::unique_ptr<Policy> make_schemoe(Code code) { return std::make_unique<Schemoe>(code == Code::released); }

}  // namespace moesim
