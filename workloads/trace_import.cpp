#include "trace_import.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>
#include <tuple>

#include "errors.hpp"
#include "trace.hpp"

namespace moesim {
namespace fs = std::filesystem;

namespace {

std::vector<std::string_view> split(std::string_view line, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const auto at = line.find(sep, start);
    out.push_back(line.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// An integer from 0 to 2^31 - 1 (a routing cell's range), written as an integer or as a float
// with no fraction ("702.0").
bool parse_count(std::string_view s, std::int64_t& out) {
  constexpr std::int64_t most = std::numeric_limits<std::int32_t>::max();
  s = trim(s);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  if (ec == std::errc() && p == end) return out >= 0 && out <= most;
  double d = 0;
  auto [q, ec2] = std::from_chars(s.data(), end, d);
  if (ec2 != std::errc() || q != end || !(d >= 0 && d <= double(most)) || d != double(std::int64_t(d))) return false;
  out = std::int64_t(d);
  return true;
}

// `key=value` integers in metadata comments ("top_k=2, num_experts=32"), scanned by hand (a regex
// over a comment line of some 30,000 letters overflowed the stack). A value beyond 64 bits is an
// input error.
std::map<std::string, std::int64_t> metadata_numbers(const std::vector<std::string>& comments, const std::string& name) {
  auto key_char = [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_'; };
  std::map<std::string, std::int64_t> out;
  for (const auto& c : comments)
    for (std::size_t eq = c.find('='); eq != std::string::npos; eq = c.find('=', eq + 1)) {
      std::size_t k = eq, v = eq + 1;
      while (k > 0 && key_char(c[k - 1])) --k;
      while (v < c.size() && std::isdigit(static_cast<unsigned char>(c[v]))) ++v;
      if (k == eq || v == eq + 1) continue;
      const std::string key = c.substr(k, eq - k);
      std::int64_t value = 0;
      if (std::from_chars(c.data() + eq + 1, c.data() + v, value).ec != std::errc())
        throw InputError(name + ": metadata " + key + "=" + c.substr(eq + 1, std::min<std::size_t>(v - eq - 1, 30)) +
                         "...: the number is beyond 64 bits");
      out.emplace(key, value);
    }
  return out;
}

// Text for the trace's header, whose strings protobuf reads back only as UTF-8: each byte that does
// not start a well-formed UTF-8 character (no overlong forms, no surrogates, at most U+10FFFF)
// becomes '?'.
std::string utf8_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    const int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    bool ok = n >= 0 && i + std::size_t(n) < s.size();
    for (int k = 1; ok && k <= n; ++k) ok = (b(i + std::size_t(k)) & 0xC0) == 0x80;
    if (ok && n == 2) ok = !(c == 0xE0 && b(i + 1) < 0xA0) && !(c == 0xED && b(i + 1) > 0x9F);  // overlong, surrogate
    if (ok && n == 3) ok = !(c == 0xF0 && b(i + 1) < 0x90) && !(c == 0xF4 && b(i + 1) > 0x8F);  // overlong, > U+10FFFF
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    out.append(s.substr(i, std::size_t(n) + 1));
    i += std::size_t(n) + 1;
  }
  return out;
}

// Iteration stride: the gcd of the gaps between consecutive recorded iterations (1 if one).
// Iterations more than 2^32 - 1 apart cannot be described by one stride: an input error.
std::uint32_t stride_of(const std::vector<std::uint64_t>& iterations, const std::string& name) {
  std::uint64_t g = 0;
  for (std::size_t i = 1; i < iterations.size(); ++i) g = std::gcd(g, iterations[i] - iterations[i - 1]);
  if (g > std::numeric_limits<std::uint32_t>::max())
    throw InputError(name + ": the recorded iterations are more than 2^32 - 1 apart; a trace's stride is 32 bits");
  return std::uint32_t(g ? g : 1);
}

int resolve_top_k(const ImportOptions& options, const std::map<std::string, std::int64_t>& meta, const std::string& name) {
  constexpr std::int64_t kMaxTopK = 1024;
  if (options.top_k > 0) return options.top_k;
  if (auto it = meta.find("top_k"); it != meta.end() && it->second > 0) {
    if (it->second > kMaxTopK)
      throw InputError(fmt::format("{}: top_k={} in the metadata; a top-k is at most {}", name, it->second, kMaxTopK));
    return int(it->second);
  }
  throw InputError(name + ": top_k is not in the file's metadata (`# ... top_k=2`); pass --top-k K");
}

// Completes a header from what a first pass saw: sources, tokens, row-sum regularity.
void finish_header(spec::TraceHeader& h, std::int64_t min_row, std::int64_t max_row, const std::string& name) {
  const std::int64_t k = h.top_k();
  h.set_rows_sum_to_tokens_times_k(min_row == max_row && max_row % k == 0 && max_row > 0);
  h.set_tokens_per_source(std::uint64_t((max_row + k - 1) / k));
  validate_trace_header(h, name);
}

struct CsvLayout {
  int iter = -1, layer = -1, src = -1, mb = -1, loss = -1, first_expert = -1, experts = 0;
  std::string key_columns;
};

CsvLayout parse_columns(const std::string& line, const std::string& where) {
  CsvLayout c;
  const auto cols = split(line, ',');
  for (int i = 0; i < int(cols.size()); ++i) {
    const auto name = trim(cols[i]);
    if (name.size() > 1 && name[0] == 'e' && std::all_of(name.begin() + 1, name.end(), ::isdigit)) {
      if (c.first_expert < 0) c.first_expert = i;
      if (name != "e" + std::to_string(c.experts) || i != c.first_expert + c.experts)
        throw InputError(fmt::format("{}: column '{}': expert columns must be e0, e1, ... in order and last", where, name));
      ++c.experts;
      continue;
    }
    if (c.first_expert >= 0) throw InputError(fmt::format("{}: column '{}' after the expert columns", where, name));
    int* slot = name == "iter" ? &c.iter : name == "layer" ? &c.layer : name == "src" ? &c.src
              : name == "mb" ? &c.mb : name == "loss" ? &c.loss : nullptr;
    if (!slot) throw InputError(fmt::format("{}: unknown column '{}' (expected iter, layer, src, mb, loss, e0..eN)", where, name));
    *slot = i;
    c.key_columns += (c.key_columns.empty() ? "" : ",") + std::string(name);
  }
  if (c.iter < 0 || c.layer < 0 || c.experts == 0)
    throw InputError(where + ": the header needs at least iter, layer and e0..eN columns");
  return c;
}

struct CsvRow {
  std::uint64_t iter = 0;
  std::uint32_t layer = 0, src = 0, mb = 0;
  double loss = 0;
};

// Parses one data row's keys and counts. Errors name the line and the column.
CsvRow parse_row(std::string_view line, const CsvLayout& c, std::vector<std::int64_t>& counts, const std::string& where) {
  const auto cells = split(line, ',');
  if (int(cells.size()) != c.first_expert + c.experts)
    throw InputError(fmt::format("{}: {} fields, the header has {}", where, cells.size(), c.first_expert + c.experts));
  auto key = [&](int col, const char* name) -> std::int64_t {
    std::int64_t v = 0;
    if (col < 0) return 0;
    if (!parse_count(cells[col], v))
      throw InputError(fmt::format("{}: column '{}': '{}' is not a non-negative integer", where, name, cells[col]));
    return v;
  };
  // Bounds that every trace moesim writes can be read back within (a model has at most 10,000
  // layers; 2^20 sources; 2^16 micro-batches).
  auto bounded = [&](int col, const char* name, std::int64_t most) {
    const std::int64_t v = key(col, name);
    if (v > most) throw InputError(fmt::format("{}: column '{}': {} is beyond {}", where, name, v, most));
    return v;
  };
  CsvRow r;
  r.iter = std::uint64_t(key(c.iter, "iter"));
  r.layer = std::uint32_t(bounded(c.layer, "layer", 9'999));
  r.src = std::uint32_t(bounded(c.src, "src", (1 << 20) - 1));
  r.mb = std::uint32_t(bounded(c.mb, "mb", (1 << 16) - 1));
  if (c.loss >= 0) {
    const auto s = trim(cells[c.loss]);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), r.loss);
    if (ec != std::errc() || p != s.data() + s.size())
      throw InputError(fmt::format("{}: column 'loss': '{}' is not a number", where, s));
  }
  counts.resize(c.experts);
  for (int e = 0; e < c.experts; ++e)
    if (!parse_count(cells[c.first_expert + e], counts[e]))
      throw InputError(fmt::format("{}: column 'e{}': '{}' is not a count from 0 to 2^31 - 1 (counts are token-slots)", where,
                                   e, trim(cells[c.first_expert + e])));
  return r;
}

// Reads a CSV: calls on_comment for `#` lines, on_header once, on_row for each data row.
template <class Comment, class Header, class Row>
void read_csv(const std::string& path, Comment on_comment, Header on_header, Row on_row) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open (check the path)");
  std::string line;
  int n = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    if (line[0] == '#') {
      if (!header) on_comment(line);
      continue;
    }
    if (!header) {
      on_header(line, where);
      header = true;
    } else {
      on_row(line, where);
    }
  }
  if (!header) throw InputError(path + ": no header line (iter,layer,src,...,e0..eN)");
}

}  // namespace

spec::TraceHeader import_csv(const std::string& csv_path, const std::string& trace_path, const ImportOptions& options) {
  // Pass 1: the layout, dimensions and regularity, so the header can be written first.
  spec::TraceHeader h;
  h.set_version(1);
  std::vector<std::string> comments;
  CsvLayout layout;
  std::vector<std::int64_t> counts;
  std::uint32_t layers = 0, sources = 0, micro_batches = 0;
  std::int64_t min_row = INT64_MAX, max_row = 0, max_cell = 0;
  std::string max_cell_where;
  std::tuple<std::uint64_t, std::uint32_t, std::uint32_t> last_key;
  std::vector<std::uint64_t> iterations;
  read_csv(
      csv_path, [&](const std::string& c) { comments.push_back(c); },
      [&](const std::string& line, const std::string& where) { layout = parse_columns(line, where); },
      [&](const std::string& line, const std::string& where) {
        const CsvRow r = parse_row(line, layout, counts, where);
        layers = std::max(layers, r.layer + 1);
        sources = std::max(sources, r.src + 1);
        micro_batches = std::max(micro_batches, r.mb + 1);
        const std::int64_t sum = std::accumulate(counts.begin(), counts.end(), std::int64_t(0));
        if (const auto most = *std::max_element(counts.begin(), counts.end()); most > max_cell)
          max_cell = most, max_cell_where = where;
        min_row = std::min(min_row, sum);
        max_row = std::max(max_row, sum);
        // Records (iteration, layer, micro-batch) are written as the rows come: in ascending order.
        const auto key = std::tuple(r.iter, r.layer, r.mb);
        if (!iterations.empty() && key < last_key)
          throw InputError(fmt::format("{}: (iter {}, layer {}, mb {}) after (iter {}, layer {}, mb {}); rows must come "
                                       "sorted by iter, layer, mb",
                                       where, r.iter, r.layer, r.mb, std::get<0>(last_key), std::get<1>(last_key),
                                       std::get<2>(last_key)));
        last_key = key;
        if (iterations.empty() || iterations.back() != r.iter) iterations.push_back(r.iter);
      });
  if (iterations.empty()) throw InputError(csv_path + ": no data rows");
  const auto meta = metadata_numbers(comments, csv_path);
  h.set_experts(std::uint32_t(layout.experts));
  h.set_top_k(std::uint32_t(resolve_top_k(options, meta, csv_path)));
  h.set_layers(layers);
  h.set_sources(sources);
  h.set_micro_batches(layout.mb >= 0 ? micro_batches : 0);
  h.set_iteration_stride(stride_of(iterations, csv_path));
  h.set_has_loss(layout.loss >= 0);
  h.set_csv_key_columns(layout.key_columns);
  for (const auto& c : comments) h.add_comments(utf8_text(c));
  h.set_model(utf8_text(options.model));
  for (const auto& c : comments)  // "# model: ..." describes what produced the trace
    if (h.model().empty() && c.rfind("# model:", 0) == 0) h.set_model(utf8_text(trim(c.substr(8))));
  h.set_provenance(utf8_text(options.provenance.empty() ? fs::path(csv_path).filename().string() : options.provenance));
  finish_header(h, min_row, max_row, csv_path);
  if (max_cell > std::int64_t(h.tokens_per_source()))  // what TraceReader checks of every record
    throw InputError(fmt::format("{}: {} token-slots from one source to one expert, more than the {} tokens a source "
                                 "routes (the largest row / top_k): a token picks an expert at most once",
                                 max_cell_where, max_cell, h.tokens_per_source()));

  // Pass 2: rows grouped into records of (iter, layer, mb), sources 0..S-1 each exactly once.
  TraceWriter writer(trace_path, h);
  spec::TraceRecord rec;
  RoutingMatrix m(int(sources), layout.experts);
  std::vector<bool> seen(sources, false);
  bool open = false;
  std::string open_where;
  auto flush = [&]() {
    if (!open) return;
    for (std::uint32_t s = 0; s < sources; ++s)
      if (!seen[s])
        throw InputError(fmt::format("{}: iteration {}, layer {}: no row for source {} (each record needs all {} sources)",
                                     open_where, rec.iteration(), rec.layer(), s, sources));
    set_record_counts(rec, m);
    writer.write(rec);
    open = false;
  };
  read_csv(
      csv_path, [](const std::string&) {}, [](const std::string&, const std::string&) {},
      [&](const std::string& line, const std::string& where) {
        const CsvRow r = parse_row(line, layout, counts, where);
        if (open && (r.iter != rec.iteration() || r.layer != rec.layer() || r.mb != rec.micro_batch())) flush();
        if (!open) {
          rec.Clear();
          rec.set_iteration(r.iter);
          rec.set_layer(r.layer);
          rec.set_micro_batch(r.mb);
          rec.set_loss(r.loss);
          auto& counts_of_record = m.mutable_counts();
          std::fill(counts_of_record.begin(), counts_of_record.end(), 0);
          std::fill(seen.begin(), seen.end(), false);
          open = true;
          open_where = where;
        }
        if (seen[r.src])
          throw InputError(fmt::format("{}: source {} appears twice in iteration {}, layer {} (rows of one record must "
                                       "be contiguous: sort by iter, layer, mb, src)",
                                       where, r.src, r.iter, r.layer));
        if (layout.loss >= 0 && r.loss != rec.loss())
          throw InputError(fmt::format("{}: column 'loss': differs from the record's first row", where));
        seen[r.src] = true;
        std::copy(counts.begin(), counts.end(), m.mutable_counts().begin() + std::ptrdiff_t(r.src) * layout.experts);
      });
  flush();
  writer.close();
  return h;
}

spec::TraceHeader import_smartmoe_logs(const std::string& dir, const std::string& trace_path,
                                       const ImportOptions& options) {
  static const std::regex name_re(R"(table_iter(\d+)_rank(\d+)\.log)");
  std::map<std::uint64_t, std::map<std::uint32_t, fs::path>> files;  // iteration -> rank -> file
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, name_re)) continue;
    std::uint64_t iteration = 0, rank = 0;
    const std::string it_text = m[1], rank_text = m[2];
    if (std::from_chars(it_text.data(), it_text.data() + it_text.size(), iteration).ec != std::errc() ||
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank).ec != std::errc() || rank >= (1u << 20))
      throw InputError(entry.path().string() + ": the iteration must fit 64 bits and the rank be below 2^20");
    files[iteration][std::uint32_t(rank)] = entry.path();
  }
  if (ec) throw InputError(dir + ": cannot list the directory (" + ec.message() + ")");
  if (files.empty()) throw InputError(dir + ": no table_iter{I}_rank{R}.log files");
  const std::uint32_t sources = files.begin()->second.rbegin()->first + 1;

  // One file: per layer, per micro-batch, the counts.
  using Table = std::map<std::uint32_t, std::vector<std::vector<std::int64_t>>>;
  auto read_table = [](const fs::path& path) {
    Table t;
    std::ifstream in(path);
    if (!in) throw InputError(path.string() + ": cannot open");
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (trim(line).empty()) continue;
      const std::string where = fmt::format("{}:{}", path.string(), n);
      const auto colon = line.find(':');
      std::int64_t layer = 0;
      if (colon == std::string::npos || !parse_count(std::string_view(line).substr(0, colon), layer))
        throw InputError(where + ": expected `LAYER:[[counts],...]`");
      auto& lists = t[std::uint32_t(layer)];
      std::string body(line.substr(colon + 1));
      body.erase(std::remove(body.begin(), body.end(), ' '), body.end());
      if (body.size() < 4 || body.substr(0, 2) != "[[" || body.substr(body.size() - 2) != "]]")
        throw InputError(where + ": expected `LAYER:[[counts],...]`");
      for (auto list : split(std::string_view(body).substr(2, body.size() - 4), ']')) {
        if (!list.empty() && list.front() == ',') list.remove_prefix(1);
        if (!list.empty() && list.front() == '[') list.remove_prefix(1);
        if (list.empty()) continue;
        auto& counts = lists.emplace_back();
        for (auto cell : split(list, ',')) {
          std::int64_t v = 0;
          if (!parse_count(cell, v))
            throw InputError(fmt::format("{}: '{}' is not a non-negative integral count", where, cell));
          counts.push_back(v);
        }
      }
    }
    return t;
  };

  spec::TraceHeader h;
  h.set_version(1);
  std::vector<std::uint64_t> iterations;
  for (const auto& [it, ranks] : files) iterations.push_back(it);
  const Table first = read_table(files.begin()->second.begin()->second);
  if (first.empty() || first.begin()->second.empty()) throw InputError(dir + ": the first log file holds no counts");
  h.set_experts(std::uint32_t(first.begin()->second.front().size()));
  h.set_top_k(std::uint32_t(resolve_top_k(options, {}, dir)));
  if (first.rbegin()->first > 9'999)
    throw InputError(fmt::format("{}: layer {} in the first log; a model has at most 10,000 layers", dir, first.rbegin()->first));
  h.set_layers(first.rbegin()->first + 1);
  h.set_sources(sources);
  h.set_micro_batches(std::uint32_t(first.begin()->second.size()));
  h.set_iteration_stride(stride_of(iterations, dir));
  h.set_model(utf8_text(options.model.empty() ? "SmartMoE/FastMoE expert-count logs" : options.model));
  h.set_provenance(utf8_text(options.provenance.empty() ? dir : options.provenance));
  h.set_csv_key_columns("iter,layer,src,mb");

  // Two passes like the CSV importer: row sums first (for the header), then the records; one
  // iteration's files are held at a time.
  std::int64_t min_row = INT64_MAX, max_row = 0;
  auto load_iteration = [&](std::uint64_t it, const std::map<std::uint32_t, fs::path>& ranks) {
    std::vector<Table> by_rank(sources);
    for (std::uint32_t r = 0; r < sources; ++r) {
      auto f = ranks.find(r);
      if (f == ranks.end()) throw InputError(fmt::format("{}: iteration {} has no file for rank {}", dir, it, r));
      by_rank[r] = read_table(f->second);
      if (by_rank[r].size() != h.layers())
        throw InputError(fmt::format("{}: {} layers, the first file has {}", f->second.string(), by_rank[r].size(), h.layers()));
      for (const auto& [layer, lists] : by_rank[r]) {
        if (layer >= h.layers() || lists.size() != std::max(1u, h.micro_batches()))
          throw InputError(fmt::format("{}: layer {}: {} micro-batch lists, expected {}", f->second.string(), layer,
                                       lists.size(), h.micro_batches()));
        for (const auto& counts : lists) {
          if (counts.size() != h.experts())
            throw InputError(fmt::format("{}: layer {}: {} counts, expected {} experts", f->second.string(), layer,
                                         counts.size(), h.experts()));
          const std::int64_t sum = std::accumulate(counts.begin(), counts.end(), std::int64_t(0));
          min_row = std::min(min_row, sum);
          max_row = std::max(max_row, sum);
        }
      }
    }
    return by_rank;
  };
  for (const auto& [it, ranks] : files) load_iteration(it, ranks);
  finish_header(h, min_row, max_row, dir);

  TraceWriter writer(trace_path, h);
  for (const auto& [it, ranks] : files) {
    const auto by_rank = load_iteration(it, ranks);
    for (std::uint32_t layer = 0; layer < h.layers(); ++layer)
      for (std::uint32_t mb = 0; mb < std::max(1u, h.micro_batches()); ++mb) {
        RoutingMatrix m(int(sources), int(h.experts()));
        for (std::uint32_t r = 0; r < sources; ++r) {
          const auto& counts = by_rank[r].at(layer)[mb];
          std::copy(counts.begin(), counts.end(), m.mutable_counts().begin() + std::ptrdiff_t(r) * h.experts());
        }
        spec::TraceRecord rec;
        rec.set_iteration(it);
        rec.set_layer(layer);
        rec.set_micro_batch(mb);
        set_record_counts(rec, m);
        writer.write(rec);
      }
  }
  writer.close();
  return h;
}

spec::TraceHeader import_rank_traces(const std::vector<std::string>& paths, const std::string& trace_path,
                                     const ImportOptions& options) {
  if (paths.empty()) throw InputError("trace import: no rank files given");
  std::vector<std::unique_ptr<TraceReader>> readers;
  for (const auto& p : paths) readers.push_back(std::make_unique<TraceReader>(p));
  const auto& first = readers.front()->header();
  // What every rank file of one recording shares; a file that differs is another run's.
  auto fingerprint = [](const spec::TraceHeader& h) {
    return std::tuple{h.run(), h.world_size(), h.experts(), h.top_k(), h.layers(), h.model(), h.tokens_per_source(),
                      h.iteration_stride(), h.micro_batches(), h.has_loss()};
  };
  const std::size_t W = first.world_size();
  std::vector<int> slot(W, -1);  // rank -> index into paths
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const auto& h = readers[i]->header();
    if (h.run().empty() || h.world_size() == 0 || h.sources() != 1)
      throw InputError(paths[i] + ": not a rank file of a recorded run (header.run, .world_size and one source; "
                       "python/moesim_trace writes them); import a CSV or SmartMoE logs with --from");
    if (fingerprint(h) != fingerprint(first))
      throw InputError(fmt::format("{} and {}: rank files of different recordings (run '{}' of {} ranks, {} experts, {} layers "
                                   "vs run '{}' of {} ranks, {} experts, {} layers); import each run's files on their own",
                                   paths.front(), paths[i], first.run(), first.world_size(), first.experts(), first.layers(),
                                   h.run(), h.world_size(), h.experts(), h.layers()));
    if (h.rank() >= W) throw InputError(fmt::format("{}: rank {} of a run of {} ranks", paths[i], h.rank(), W));
    if (slot[h.rank()] >= 0)
      throw InputError(fmt::format("{} and {}: both rank {}; give each rank's file once", paths[std::size_t(slot[h.rank()])],
                                   paths[i], h.rank()));
    slot[h.rank()] = int(i);
  }
  for (std::size_t r = 0; r < W; ++r)
    if (slot[r] < 0)
      throw InputError(fmt::format("{}: rank {} of run '{}' is missing ({} of {} rank files given)", paths.front(), r,
                                   first.run(), paths.size(), W));
  spec::TraceHeader header = first;
  header.set_sources(std::uint32_t(W));
  header.clear_rank();
  header.clear_world_size();
  if (!options.model.empty()) header.set_model(options.model);
  if (!options.provenance.empty()) header.set_provenance(options.provenance);
  TraceWriter out(trace_path, header);
  const int E = int(header.experts());
  std::vector<spec::TraceRecord> parts(W);
  while (true) {
    std::size_t ended = 0;
    for (std::size_t r = 0; r < W; ++r) ended += !readers[std::size_t(slot[r])]->next(parts[r]) ? 1 : 0;
    if (ended == W) break;
    const auto& lead = parts[0];
    for (std::size_t r = 0; r < W; ++r) {
      const auto& reader = *readers[std::size_t(slot[r])];
      if (ended > 0 || parts[r].iteration() != lead.iteration() || parts[r].layer() != lead.layer() ||
          parts[r].micro_batch() != lead.micro_batch())
        throw InputError(fmt::format("{}: record {}: the rank files part here (rank 0 is at iteration {}, layer {}; this "
                                     "file {}); every rank records the same iterations and layers",
                                     paths[std::size_t(slot[r])], reader.records_read(), lead.iteration(), lead.layer(),
                                     ended > 0 ? "or another has ended" : fmt::format("at iteration {}, layer {}", parts[r].iteration(), parts[r].layer())));
    }
    RoutingMatrix m(int(W), E);
    for (std::size_t r = 0; r < W; ++r) {
      const RoutingMatrix row = record_matrix(readers[std::size_t(slot[r])]->header(), parts[r]);
      std::copy(row.counts().begin(), row.counts().end(), m.mutable_counts().begin() + std::ptrdiff_t(r) * E);
    }
    spec::TraceRecord record = lead;
    set_record_counts(record, m);
    out.write(record);
  }
  out.close();
  return header;
}

void export_csv(const std::string& trace_path, const std::string& csv_path) {
  TraceReader reader(trace_path);
  const auto& h = reader.header();
  std::string keys = h.csv_key_columns();
  if (keys.empty()) keys = std::string("iter,layer,src") + (h.micro_batches() > 1 ? ",mb" : "") + (h.has_loss() ? ",loss" : "");
  const auto key_list = split(keys, ',');
  std::ofstream out(csv_path + ".tmp");
  if (!out) throw InputError(csv_path + ": cannot write");
  for (const auto& c : h.comments()) out << c << '\n';
  out << keys;
  for (std::uint32_t e = 0; e < h.experts(); ++e) out << ",e" << e;
  out << '\n';
  spec::TraceRecord rec;
  std::string line;
  while (reader.next(rec)) {
    const RoutingMatrix m = record_matrix(h, rec);
    const bool has_src = std::find(key_list.begin(), key_list.end(), "src") != key_list.end();
    if (!has_src && m.sources != 1) throw InputError(trace_path + ": several sources but the CSV layout has no src column");
    for (int s = 0; s < m.sources; ++s) {
      line.clear();
      for (const auto& k : key_list) {
        if (!line.empty()) line += ',';
        if (k == "iter") line += std::to_string(rec.iteration());
        else if (k == "layer") line += std::to_string(rec.layer());
        else if (k == "src") line += std::to_string(s);
        else if (k == "mb") line += std::to_string(rec.micro_batch());
        else if (k == "loss") line += fmt::format("{}", rec.loss());
      }
      for (int e = 0; e < m.experts; ++e) fmt::format_to(std::back_inserter(line), ",{}", m.at(s, e));
      out << line << '\n';
    }
  }
  out.close();
  if (!out || std::rename((csv_path + ".tmp").c_str(), csv_path.c_str()) != 0)
    throw InputError(csv_path + ": cannot finish writing");
}

}  // namespace moesim
