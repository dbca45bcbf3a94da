// ScheMoE (Shi et al., EuroSys '24; docs/spec/schemoe.md): the 7-task layer model, OptSche's
// optimal order and its makespan, and the compressors. The policy itself is in schemoe.cpp; the
// ops are built by schedule/pipelined.cpp.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

/// A compressor as the model sees it: bits per value on the wire, and each kernel's cost as the
/// memory traffic of the released kernels (bytes read and written per payload value, at the
/// platform's elementwise memory bandwidth), or a throughput the spec gives instead.
struct Compressor {
  std::string name = "none";
  double bits = 0;               // 0: no compression
  double compress_bytes = 0;     // memory traffic per value to compress
  double decompress_bytes = 0;   // ... and to decompress
  int side_all_to_alls = 0;      // all-to-alls besides the payload's (INT8: bias and scale)
  double bytes_per_s = 0;        // given (gbytes_per_s): payload bytes per second, not the traffic
};
/// The compressor a spec names, for payload values of `value_bytes` bytes (the model's dtype);
/// FieldError "policy.schemoe.compressor.*" for a bad one. The defaults are in proto/moesim.proto
/// (CompressorSpec) and schemoe.cpp.
Compressor make_compressor(const spec::CompressorSpec& spec, const std::string& default_name, double value_bytes);

/// Per-part task times of one layer (forward): compress c, all-to-all a, decompress d, expert e;
/// the two compressions take the same time, and so do the two all-to-alls and decompressions, as
/// the paper assumes (§4.1).
struct TaskTimes {
  double c = 0, a = 0, d = 0, e = 0;
};

/// OptSche's makespan for r parts (the extract's recurrence, §3 "[derived]"): x_i ends A1ⁱ, s_i
/// ends C2ⁱ, z_i ends A2ⁱ, w_i ends D2ⁱ. r = 1 gives Eq. 10, 2c + 2a + 2d + e.
double optsche_makespan(int r, const TaskTimes& t);

/// One of ScheMoE's tasks: kind (0 C1, 1 A1, 2 D1, 3 E, 4 C2, 5 A2, 6 D2) and part.
struct Task {
  int kind = 0, part = 0;
};
/// The makespan of a given order on one serial compute and one serial comm resource (§4.1's
/// resource model): each task starts when its chain predecessor has ended and its resource is
/// free, in the order given for its resource. For checking OptSche against other orders.
double order_makespan(const std::vector<Task>& compute_order, const std::vector<Task>& comm_order, const TaskTimes& t);
/// Eq. 12 (compute) and Eqs. 13-14 (comm) for r parts.
std::pair<std::vector<Task>, std::vector<Task>> optsche_order(int r);

}  // namespace moesim
