// Gating traces on disk: moesim's own streamed format (proto/moesim.proto, TraceHeader and
// TraceRecord). A writer appends records one by one; a reader hands them back one by one, each
// checked against the header, so a multi-gigabyte trace is never held in memory. Every problem is
// an InputError naming the file and the record index.
#pragma once
#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <string>

#include "moesim.pb.h"
#include "routing.hpp"

namespace google::protobuf::io {
class IstreamInputStream;
}

namespace moesim {

/// Checks a header on its own (InputError "NAME: header: ...").
void validate_trace_header(const spec::TraceHeader& header, const std::string& name);

/// The record's counts as a sources × experts matrix (dense or sparse encoding).
RoutingMatrix record_matrix(const spec::TraceHeader& header, const spec::TraceRecord& record);

/// Fills `record`'s counts from a matrix, sparse when fewer than a third of the cells are non-zero.
void set_record_counts(spec::TraceRecord& record, const RoutingMatrix& m);

class TraceWriter {
 public:
  /// Writes to PATH.tmp; close() renames it to PATH, so a reader never sees half a trace.
  TraceWriter(const std::string& path, const spec::TraceHeader& header);
  ~TraceWriter();
  void write(const spec::TraceRecord& record);
  void close();
  std::uint64_t records() const { return records_; }

 private:
  std::string path_;
  std::ofstream out_;
  std::uint64_t records_ = 0;
};

class TraceReader {
 public:
  /// Opens a .trace file and reads its header.
  explicit TraceReader(const std::string& path);
  /// Reads from a stream (`name` is used in messages).
  TraceReader(std::unique_ptr<std::istream> in, const std::string& name);
  ~TraceReader();

  const spec::TraceHeader& header() const { return header_; }
  /// The next record, validated against the header and the records before it; false at a clean
  /// end. InputError "NAME: record N: ..." when a record is truncated, corrupt or inconsistent.
  bool next(spec::TraceRecord& record);
  std::uint64_t records_read() const { return index_; }

 private:
  void open();
  [[noreturn]] void fail(const std::string& what) const;
  std::string name_;
  std::unique_ptr<std::istream> in_;
  std::unique_ptr<google::protobuf::io::IstreamInputStream> stream_;
  spec::TraceHeader header_;
  std::uint64_t index_ = 0;
  bool have_last_ = false;
  std::uint64_t last_iteration_ = 0;
  std::uint32_t last_layer_ = 0, last_micro_batch_ = 0;
};

}  // namespace moesim
