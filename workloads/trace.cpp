#include "trace.hpp"

#include <fmt/format.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/util/delimited_message_util.h>

#include <cstdio>
#include <limits>

#include "errors.hpp"

namespace moesim {
namespace {

constexpr char kMagic[8] = {'M', 'O', 'E', 'S', 'I', 'M', 'G', 'T'};

}  // namespace

void validate_trace_header(const spec::TraceHeader& h, const std::string& name) {
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) throw InputError(name + ": header: " + what);
  };
  require(h.version() == 1, fmt::format("version {} is not supported (this moesim reads version 1)", h.version()));
  require(h.experts() >= 1, "experts must be >= 1");
  require(h.top_k() >= 1 && h.top_k() <= h.experts(),
          fmt::format("top_k {} must be between 1 and experts ({})", h.top_k(), h.experts()));
  require(h.layers() >= 1, "layers must be >= 1");
  require(h.sources() >= 1, "sources must be >= 1");
  require(h.iteration_stride() >= 1, "iteration_stride must be >= 1");
  require(std::uint64_t(h.sources()) * h.experts() <= (1ull << 26),
          "sources × experts is over 2^26 cells (e.g. 8192 × 8192); split the trace");
  require(!h.rows_sum_to_tokens_times_k() || h.tokens_per_source() > 0,
          "rows_sum_to_tokens_times_k needs tokens_per_source");
}

RoutingMatrix record_matrix(const spec::TraceHeader& h, const spec::TraceRecord& r) {
  RoutingMatrix m(int(h.sources()), int(h.experts()));
  if (r.dense_size() > 0) {
    std::copy(r.dense().begin(), r.dense().end(), m.mutable_counts().begin());
  } else {
    auto& counts = m.mutable_counts();
    for (int i = 0; i < r.sparse_cell_size(); ++i) counts[r.sparse_cell(i)] = r.sparse_count(i);
  }
  return m;
}

void set_record_counts(spec::TraceRecord& r, const RoutingMatrix& m) {
  r.clear_dense();
  r.clear_sparse_cell();
  r.clear_sparse_count();
  const auto& counts = m.counts();
  std::size_t nonzero = 0;
  for (auto c : counts) nonzero += c != 0;
  if (nonzero * 3 < counts.size()) {
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (counts[i] != 0) {
        r.add_sparse_cell(std::uint32_t(i));
        r.add_sparse_count(counts[i]);
      }
  } else {
    r.mutable_dense()->Add(counts.begin(), counts.end());
  }
}

TraceWriter::TraceWriter(const std::string& path, const spec::TraceHeader& header) : path_(path) {
  validate_trace_header(header, path);
  out_.open(path + ".tmp", std::ios::binary | std::ios::trunc);
  if (!out_) throw InputError(path + ".tmp: cannot write (check the path and its permissions)");
  out_.write(kMagic, sizeof kMagic);
  google::protobuf::util::SerializeDelimitedToOstream(header, &out_);
}

TraceWriter::~TraceWriter() {
  if (out_.is_open()) {  // not closed: an error unwound us; leave no half-written file behind
    out_.close();
    std::remove((path_ + ".tmp").c_str());
  }
}

void TraceWriter::write(const spec::TraceRecord& record) {
  if (!google::protobuf::util::SerializeDelimitedToOstream(record, &out_))
    throw InputError(path_ + ".tmp: write failed (disk full?)");
  ++records_;
}

void TraceWriter::close() {
  out_.flush();
  const bool ok = bool(out_);
  out_.close();
  if (!ok || std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0)
    throw InputError(path_ + ": cannot finish writing the trace");
}

TraceReader::TraceReader(const std::string& path) : name_(path) {
  auto file = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*file) throw InputError(path + ": cannot open the trace (check the path)");
  in_ = std::move(file);
  open();
}

TraceReader::TraceReader(std::unique_ptr<std::istream> in, const std::string& name) : name_(name), in_(std::move(in)) {
  open();
}

TraceReader::~TraceReader() = default;

void TraceReader::fail(const std::string& what) const {
  throw InputError(fmt::format("{}: record {}: {}", name_, index_, what));
}

void TraceReader::open() {
  char magic[sizeof kMagic] = {};
  in_->read(magic, sizeof magic);
  if (in_->gcount() != sizeof magic || !std::equal(magic, magic + sizeof magic, kMagic))
    throw InputError(name_ + ": not a moesim trace (no MOESIMGT signature); import CSV or logs with `moesim trace import`");
  stream_ = std::make_unique<google::protobuf::io::IstreamInputStream>(in_.get());
  bool clean_eof = false;
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&header_, stream_.get(), &clean_eof))
    throw InputError(name_ + ": header: truncated or corrupt");
  validate_trace_header(header_, name_);
}

bool TraceReader::next(spec::TraceRecord& r) {
  bool clean_eof = false;
  r.Clear();  // the delimited parser merges into what is there
  if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&r, stream_.get(), &clean_eof)) {
    if (clean_eof) return false;
    fail("truncated or corrupt (the file may be cut short)");
  }
  const auto& h = header_;
  const std::size_t cells = std::size_t(h.sources()) * h.experts();
  if (r.layer() >= h.layers()) fail(fmt::format("layer {} but the header says {} layers", r.layer(), h.layers()));
  if (r.micro_batch() >= std::max(1u, h.micro_batches()))
    fail(fmt::format("micro-batch {} but the header says {} per iteration", r.micro_batch(), h.micro_batches()));
  if (have_last_) {
    const auto key = std::make_tuple(r.iteration(), r.layer(), r.micro_batch());
    if (key <= std::make_tuple(last_iteration_, last_layer_, last_micro_batch_))
      fail(fmt::format("(iteration {}, layer {}, micro-batch {}) comes after (iteration {}, layer {}, micro-batch {}); "
                       "records must be in ascending order",
                       r.iteration(), r.layer(), r.micro_batch(), last_iteration_, last_layer_, last_micro_batch_));
  }
  if (r.dense_size() > 0) {
    if (std::size_t(r.dense_size()) != cells || r.sparse_cell_size() > 0)
      fail(fmt::format("{} dense counts, expected sources × experts = {}", r.dense_size(), cells));
  } else {
    if (r.sparse_cell_size() != r.sparse_count_size()) fail("sparse cells and counts differ in number");
    for (int i = 0; i < r.sparse_cell_size(); ++i)
      if (r.sparse_cell(i) >= cells || (i > 0 && r.sparse_cell(i) <= r.sparse_cell(i - 1)))
        fail(fmt::format("sparse cell {} out of range or out of order", r.sparse_cell(i)));
  }
  // Counts: non-negative, at most one slot per token per expert, rows summing as the header says.
  // Checked on the encoding itself, so a sparse record never costs a dense matrix here.
  const std::int64_t tokens = std::int64_t(h.tokens_per_source());
  std::vector<std::int64_t> row_sums(h.sources(), 0);
  auto check_cell = [&](std::size_t cell, std::int64_t c) {
    const std::size_t s = cell / h.experts(), e = cell % h.experts();
    if (c < 0) fail(fmt::format("negative count {} (source {}, expert {})", c, s, e));
    if (c > std::numeric_limits<std::int32_t>::max())
      fail(fmt::format("count {} (source {}, expert {}) is over 2^31 - 1 token-slots", c, s, e));
    if (tokens > 0 && c > tokens)
      fail(fmt::format("source {} sends {} tokens to expert {}, more than its {} tokens", s, c, e, tokens));
    row_sums[s] += c;
  };
  if (r.dense_size() > 0)
    for (std::size_t i = 0; i < cells; ++i) check_cell(i, r.dense(int(i)));
  else
    for (int i = 0; i < r.sparse_cell_size(); ++i) check_cell(r.sparse_cell(i), r.sparse_count(i));
  if (h.rows_sum_to_tokens_times_k())
    for (std::size_t s = 0; s < row_sums.size(); ++s)
      if (row_sums[s] != tokens * std::int64_t(h.top_k()))
        fail(fmt::format("source {}'s counts sum to {}, but the header says tokens × k = {}", s, row_sums[s],
                         tokens * std::int64_t(h.top_k())));
  have_last_ = true;
  last_iteration_ = r.iteration();
  last_layer_ = r.layer();
  last_micro_batch_ = r.micro_batch();
  ++index_;
  return true;
}

}  // namespace moesim
