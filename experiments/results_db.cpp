#include "results_db.hpp"

#include <fmt/format.h>
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "errors.hpp"
#include "results.hpp"
#include "taskgraph.hpp"

namespace moesim {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The critical path's seconds per phase: a column each, "<phase>_s" (taskgraph.hpp: Phase).
std::vector<std::string> phase_columns() {
  std::vector<std::string> c;
  for (int p = 0; p < kNumPhases; ++p) c.push_back(std::string(phase_name(Phase(p))) + "_s");
  return c;
}

std::string make_schema() {
  const std::string phases = fmt::format("{} REAL", fmt::join(phase_columns(), " REAL, "));
  return fmt::format(R"(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points(
  id INTEGER PRIMARY KEY, label TEXT NOT NULL, overrides TEXT NOT NULL, spec TEXT NOT NULL,
  summary TEXT NOT NULL, wall_s REAL, finished TEXT NOT NULL DEFAULT (datetime('now')));
CREATE TABLE IF NOT EXISTS runs(
  point INTEGER NOT NULL REFERENCES points(id), variant TEXT NOT NULL, policy TEXT NOT NULL,
  gpus INTEGER NOT NULL, iteration_time_s REAL NOT NULL, {}, PRIMARY KEY(point, variant));
CREATE TABLE IF NOT EXISTS iterations(
  point INTEGER NOT NULL REFERENCES points(id), variant TEXT NOT NULL, iteration INTEGER NOT NULL,
  warmup INTEGER NOT NULL, time_s REAL NOT NULL, {}, max_mean_load REAL, dropped_tokens INTEGER,
  PRIMARY KEY(point, variant, iteration));
)",
                     phases, phases);
}
const std::string kSchema = make_schema();

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The columns export_csv() reads, which an existing database must have.
const std::vector<std::string> kRunColumns =
    concat({"point", "variant", "policy", "gpus", "iteration_time_s"}, phase_columns());
const std::vector<std::string> kIterationColumns =
    concat(concat({"point", "variant", "iteration", "warmup", "time_s"}, phase_columns()), {"max_mean_load", "dropped_tokens"});

// SQLite's failure as moesim's error: a damaged file is bad input (exit 2); a full disk, an I/O
// error or a lock held too long is the machine's (exit 1, SQLite's own words); anything else a bug.
[[noreturn]] void sqlite_failed(sqlite3* db, int rc, const std::string& what) {
  const int base = rc & 0xff;
  const std::string why = fmt::format("sqlite: {}{}", what.empty() ? "" : what + ": ", sqlite3_errmsg(db));
  if (base == SQLITE_CORRUPT || base == SQLITE_NOTADB) throw InputError(why + " (a damaged results database)");
  if (base == SQLITE_FULL || base == SQLITE_IOERR || base == SQLITE_BUSY || base == SQLITE_LOCKED ||
      base == SQLITE_READONLY || base == SQLITE_CANTOPEN || base == SQLITE_PERM)
    throw MachineError(why);
  throw std::runtime_error(why);
}

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr) != SQLITE_OK)
      sqlite_failed(db, sqlite3_errcode(db), sql);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement& bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Statement& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  bool step() {  // true while there is a row
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) sqlite_failed(db_, rc, "");
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return false;
  }
  std::string text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// The breakdown columns in Phase order.
std::vector<double> breakdown_values(const json& b) {
  std::vector<double> v;
  for (int p = 0; p < kNumPhases; ++p) v.push_back(b.value(phase_name(Phase(p)), 0.0));
  return v;
}

}  // namespace

ResultsDb::ResultsDb(const std::string& path, bool create) : path_(path) {
  std::error_code ec;
  if (create && !fs::exists(path, ec)) {
    // A new database appears whole: made with its tables under another name, then renamed, so that
    // a reader never finds the file without them.
    const std::string tmp = fmt::format("{}.new-{}", path, ::getpid());
    fs::remove(tmp, ec);
    sqlite3* db = nullptr;
    char* err = nullptr;
    const bool ok = sqlite3_open_v2(tmp.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) == SQLITE_OK &&
                    sqlite3_exec(db, ("PRAGMA journal_mode=WAL;" + kSchema).c_str(), nullptr, nullptr, &err) == SQLITE_OK;
    const std::string why = err ? err : db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_free(err);
    sqlite3_close(db);
    if (!ok || (fs::rename(tmp, path, ec), ec)) {
      fs::remove(tmp, ec);
      throw InputError(path + ": cannot create the results database: " + (ok ? ec.message() : why));
    }
  }
  const bool exists = fs::exists(path, ec);
  if (!create && !exists) throw InputError(path + ": no such results database");
  if (exists && !fs::is_regular_file(path, ec)) throw InputError(path + ": not a file; name a results database");
  // Read-only unless writing; an existing file is checked before anything is written to it (another
  // program's SQLite file, an empty file: neither becomes a moesim database).
  const int flags = create ? SQLITE_OPEN_READWRITE : SQLITE_OPEN_READONLY;
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    throw InputError(path + ": cannot open the results database: " + why);
  }
  sqlite3_busy_timeout(db_, 10000);
  try {
    {
      Statement s(db_, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('meta', 'points', 'runs', "
                       "'iterations')");
      if (!s.step() || s.integer(0) != 4) throw std::runtime_error("it lacks moesim's tables");
      // and their columns, as moesim reads them
      for (const std::string& read : {std::string("SELECT key, value FROM meta"),
                                      std::string("SELECT id, label, overrides, spec, summary, wall_s FROM points"),
                                      fmt::format("SELECT {} FROM runs", fmt::join(kRunColumns, ", ")),
                                      fmt::format("SELECT {} FROM iterations", fmt::join(kIterationColumns, ", "))}) {
        sqlite3_stmt* probe = nullptr;
        const bool ok = sqlite3_prepare_v2(db_, (read + " LIMIT 0").c_str(), -1, &probe, nullptr) == SQLITE_OK;
        sqlite3_finalize(probe);
        if (!ok) throw std::runtime_error("its tables are not moesim's, or an older moesim's: sweep into a new --out: " + read);
      }
    }
    if (create) {
      exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");
      exec(kSchema);
    }
  } catch (const std::exception& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw InputError(path + ": not a moesim results database (" + e.what() + "); nothing was written to it");
  }
}

ResultsDb::~ResultsDb() { sqlite3_close(db_); }

void ResultsDb::exec(const std::string& sql) const {
  char* err = nullptr;
  if (const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err); rc != SQLITE_OK) {
    sqlite3_free(err);
    sqlite_failed(db_, rc, "");
  }
}

void ResultsDb::set_meta(const std::string& key, const std::string& value) {
  Statement(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)").bind(1, key).bind(2, value).step();
}

std::string ResultsDb::meta(const std::string& key) const {
  Statement s(db_, "SELECT value FROM meta WHERE key = ?");
  s.bind(1, key);
  return s.step() ? s.text(0) : "";
}

std::set<int> ResultsDb::finished() const {
  std::set<int> ids;
  Statement s(db_, "SELECT id FROM points");
  while (s.step()) ids.insert(int(s.integer(0)));
  return ids;
}

void ResultsDb::insert(const StoredPoint& p) {
  exec("BEGIN IMMEDIATE");
  try {
    Statement(db_, "INSERT INTO points(id, label, overrides, spec, summary, wall_s) VALUES(?, ?, ?, ?, ?, ?)")
        .bind(1, std::int64_t(p.id))
        .bind(2, p.label)
        .bind(3, p.overrides.dump())
        .bind(4, p.spec)
        .bind(5, p.summary.dump())
        .bind(6, p.wall_s)
        .step();
    // The runs: the variants, or the summary itself for a spec without variants.
    const bool variants = p.summary.contains("variants");
    const json runs = variants ? p.summary["variants"] : json::array({p.summary});
    auto insert = [](const char* table, std::size_t columns) {
      std::string q = fmt::format("INSERT INTO {} VALUES(?", table);
      for (std::size_t c = 1; c < columns; ++c) q += ", ?";
      return q + ")";
    };
    Statement run(db_, insert("runs", kRunColumns.size()));
    Statement it(db_, insert("iterations", kIterationColumns.size()));
    for (const auto& r : runs) {
      const std::string variant = variants ? r.value("name", std::string("")) : "";
      run.bind(1, std::int64_t(p.id)).bind(2, variant).bind(3, r.at("policy").get<std::string>());
      run.bind(4, p.summary.at("gpus").get<std::int64_t>()).bind(5, r.at("iteration_time_s").get<double>());
      const auto b = breakdown_values(r.at("breakdown"));
      for (int p = 0; p < kNumPhases; ++p) run.bind(6 + p, b[std::size_t(p)]);
      run.step();
      for (const auto& row : r.value("per_iteration", json::array())) {
        it.bind(1, std::int64_t(p.id)).bind(2, variant).bind(3, row.at("iteration").get<std::int64_t>());
        it.bind(4, std::int64_t(row.value("warmup", false))).bind(5, row.at("iteration_time_s").get<double>());
        const auto ib = breakdown_values(row.at("breakdown"));
        for (int p = 0; p < kNumPhases; ++p) it.bind(6 + p, ib[std::size_t(p)]);
        it.bind(6 + kNumPhases, row.value("max_mean_load", 0.0)).bind(7 + kNumPhases, row.value("dropped_tokens", std::int64_t(0)));
        it.step();
      }
    }
    exec("COMMIT");
  } catch (...) {
    // SQLite may have rolled back itself (a full disk): the first error is the one to report.
    if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

std::vector<StoredPoint> ResultsDb::points() const {
  std::vector<StoredPoint> out;
  Statement s(db_, "SELECT id, label, overrides, spec, summary, wall_s FROM points ORDER BY id");
  while (s.step()) try {
      out.push_back({int(s.integer(0)), s.text(1), json::parse(s.text(2)), s.text(3), json::parse(s.text(4)), s.real(5)});
    } catch (const json::exception& e) {
      throw InputError(fmt::format("{}: point {}: its stored JSON is corrupt ({})", path_, s.integer(0), e.what()));
    }
  return out;
}

void ResultsDb::export_csv(std::ostream& out, bool iterations) const {
  std::vector<std::string> fields;
  std::map<std::int64_t, json> overrides;
  try {
    if (const auto f = meta("fields"); !f.empty()) fields = json::parse(f).get<std::vector<std::string>>();
    Statement s(db_, "SELECT id, overrides FROM points");
    while (s.step()) {
      json o = json::parse(s.text(1));
      if (!o.is_object()) throw InputError(fmt::format("{}: point {}: its overrides are not a JSON object", path_, s.integer(0)));
      overrides[s.integer(0)] = std::move(o);
    }
  } catch (const json::exception& e) {
    throw InputError(path_ + ": the stored sweep fields or overrides are corrupt JSON (" + e.what() + ")");
  }
  const std::string table = iterations ? "iterations" : "runs";
  const std::vector<std::string>& columns = iterations ? kIterationColumns : kRunColumns;
  std::string header = "point";
  for (const auto& f : fields) header += "," + csv_field(f);
  for (std::size_t c = 1; c < columns.size(); ++c) header += "," + columns[c];
  out << header << "\n";
  Statement s(db_, fmt::format("SELECT {} FROM {} ORDER BY point, variant{}", fmt::join(columns, ", "), table,
                               iterations ? ", iteration" : ""));
  while (s.step()) {
    const auto point = s.integer(0);
    std::string line = std::to_string(point);
    for (const auto& f : fields) {  // a point with no overrides stored (absent): empty cells
      const auto it = overrides.find(point);
      const json* v = it == overrides.end() ? nullptr : &it->second;
      line += "," + csv_field(v && v->contains(f) && (*v)[f].is_string() ? (*v)[f].get<std::string>() : std::string());
    }
    for (std::size_t c = 1; c < columns.size(); ++c) line += "," + csv_field(s.text(int(c)));
    out << line << "\n";
  }
}

int merge_results(const std::string& out, const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw InputError("results merge: give the shard databases to merge");
  if (fs::exists(out)) throw InputError(out + ": exists; merge writes a new database (remove it or choose another name)");
  std::map<int, StoredPoint> points;
  std::string sweep, spec, fields;
  for (const auto& in : inputs) {
    ResultsDb db(in, false);
    if (sweep.empty()) {
      sweep = db.meta("sweep");
      spec = db.meta("sweep_spec");
      fields = db.meta("fields");
    } else if (db.meta("sweep_spec") != spec) {
      throw InputError(fmt::format("{}: from another sweep ('{}', not '{}'); merge shards of one sweep", in, db.meta("sweep"), sweep));
    }
    for (auto& p : db.points()) {
      const auto [at, fresh] = points.emplace(p.id, p);
      if (!fresh && at->second.summary != p.summary)
        throw InputError(fmt::format("{}: point {} ({}) differs from the same point in another input", in, p.id, p.label));
    }
  }
  const std::string tmp = out + ".tmp";
  fs::remove(tmp);
  {
    ResultsDb db(tmp, true);
    db.set_meta("sweep", sweep);
    db.set_meta("sweep_spec", spec);
    db.set_meta("fields", fields);
    for (const auto& [id, p] : points) db.insert(p);
  }
  fs::remove(tmp + "-wal");
  fs::remove(tmp + "-shm");
  fs::rename(tmp, out);
  return int(points.size());
}

}  // namespace moesim
