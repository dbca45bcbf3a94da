#include "rescale.hpp"

#include <fmt/format.h>

#include "errors.hpp"
#include "generator.hpp"
#include "trace.hpp"

namespace moesim {

spec::TraceHeader rescale_trace(const std::string& in, const std::string& out, const RescaleOptions& o) {
  TraceReader reader(in);
  const auto& h = reader.header();
  if (o.sources < 1) throw InputError("--sources must be >= 1");
  if (o.experts < int(h.experts()) || o.experts % int(h.experts()) != 0)
    throw InputError(fmt::format("--experts {}: must be a multiple of the trace's {} experts (each expert is split "
                                 "into equal parts)",
                                 o.experts, h.experts()));
  const int m = o.experts / int(h.experts());
  const std::int64_t tokens = o.tokens_per_source > 0 ? o.tokens_per_source : std::int64_t(h.tokens_per_source());
  if (tokens <= 0) throw InputError(in + ": tokens per source unknown; pass --tokens");

  spec::TraceHeader nh = h;
  nh.set_sources(std::uint32_t(o.sources));
  nh.set_experts(std::uint32_t(o.experts));
  nh.set_tokens_per_source(std::uint64_t(tokens));
  nh.set_rows_sum_to_tokens_times_k(true);
  nh.clear_csv_key_columns();
  nh.set_provenance(fmt::format("{} rescaled by moesim from {} sources × {} experts (seed {})", h.provenance(),
                                h.sources(), h.experts(), o.seed));
  nh.add_comments(fmt::format("# rescaled: {} sources x {} experts -> {} x {}, tokens_per_source={}, seed={}",
                              h.sources(), h.experts(), o.sources, o.experts, tokens, o.seed));
  TraceWriter writer(out, nh);

  spec::TraceRecord rec;
  std::vector<double> p(std::size_t(o.experts));
  while (reader.next(rec)) {
    const RoutingMatrix src = record_matrix(h, rec);
    RoutingMatrix dst(o.sources, o.experts);
    Rng rng(derive_seed(o.seed, reader.records_read()));
    for (int s = 0; s < o.sources; ++s) {
      const int parent = s % src.sources;
      for (int e = 0; e < o.experts; ++e) p[e] = double(src.at(parent, e / m)) / m;
      const auto row = sample_capped(rng, tokens, int(h.top_k()), p);
      std::copy(row.begin(), row.end(), dst.mutable_counts().begin() + std::ptrdiff_t(s) * o.experts);
    }
    spec::TraceRecord nr;
    nr.set_iteration(rec.iteration());
    nr.set_layer(rec.layer());
    nr.set_micro_batch(rec.micro_batch());
    nr.set_loss(rec.loss());
    set_record_counts(nr, dst);
    writer.write(nr);
  }
  writer.close();
  return nh;
}

}  // namespace moesim
