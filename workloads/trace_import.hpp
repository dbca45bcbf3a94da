// Getting gating traces in and out of moesim's format: CSV (the layout of shared/traces:
// `#` metadata lines, then `iter,layer,src[,mb][,loss],e0..eN`), SmartMoE/FastMoE text logs
// (`table_iter{I}_rank{R}.log` files of `L:[[...],[...]]` lines), and CSV export. CSV -> trace ->
// CSV gives back the same file.
#pragma once
#include <string>
#include <vector>

#include "moesim.pb.h"

namespace moesim {

struct ImportOptions {
  int top_k = 0;                 // 0: from the file's metadata (`top_k=K`)
  std::string model;             // header.model; default: from the metadata
  std::string provenance;        // header.provenance; default: the input's name
};

/// Imports a CSV trace into a .trace file. InputError "FILE:LINE: ..." on malformed input.
spec::TraceHeader import_csv(const std::string& csv_path, const std::string& trace_path, const ImportOptions& options);

/// Imports a directory of SmartMoE/FastMoE `table_iter{I}_rank{R}.log` files (one per sampled
/// iteration and source rank; line `L:[[c0,...],[...]]` = layer L, one list per micro-batch).
spec::TraceHeader import_smartmoe_logs(const std::string& dir, const std::string& trace_path,
                                       const ImportOptions& options);

/// Merges the rank files of one recorded run (python/moesim_trace: each a trace of one source, with
/// header.run, .rank and .world_size) into one trace of world_size sources, rank r as source r.
/// InputError naming both files when two come from different runs or recordings, naming the rank
/// when one is missing or given twice, and naming the file and record where their records part.
spec::TraceHeader import_rank_traces(const std::vector<std::string>& rank_paths, const std::string& trace_path,
                                     const ImportOptions& options);

/// Writes a trace as CSV (the importer's layout, the header's comment lines first).
void export_csv(const std::string& trace_path, const std::string& csv_path);

}  // namespace moesim
