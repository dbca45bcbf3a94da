#include "sweep.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "errors.hpp"
#include "results.hpp"
#include "results_db.hpp"
#include "runner.hpp"
#include "spec.hpp"
#include "textproto.hpp"
#include "worker.hpp"

namespace moesim {
namespace fs = std::filesystem;
using nlohmann::json;

std::vector<SweepPoint> expand_sweep(const spec::SweepSpec& s) {
  // Each dimension of the product: one or more axes that take their values together.
  struct Dimension {
    std::vector<const spec::SweepSpec::Axis*> axes;
    int size = 0;
  };
  std::vector<Dimension> dims;
  auto check = [](const spec::SweepSpec::Axis& a, const std::string& where) {
    if (a.field().empty()) throw FieldError(where + ".field", "is empty; name a spec field as --set does, e.g. cluster.nodes");
    if (a.values().empty()) throw FieldError(where + ".values", "axis '" + a.field() + "' has no values");
  };
  for (int i = 0; i < s.axis_size(); ++i) {
    check(s.axis(i), fmt::format("axis[{}]", i));
    dims.push_back({{&s.axis(i)}, s.axis(i).values_size()});
  }
  for (int z = 0; z < s.zip_size(); ++z) {
    Dimension d;
    for (int i = 0; i < s.zip(z).axis_size(); ++i) {
      const auto& a = s.zip(z).axis(i);
      check(a, fmt::format("zip[{}].axis[{}]", z, i));
      if (d.size && a.values_size() != d.size)
        throw FieldError(fmt::format("zip[{}].axis[{}].values", z, i),
                         fmt::format("zipped axes vary together and need as many values each: '{}' has {}, '{}' has {}",
                                     a.field(), a.values_size(), d.axes.front()->field(), d.size));
      d.axes.push_back(&a);
      d.size = a.values_size();
    }
    if (d.size) dims.push_back(d);
  }
  constexpr int kMaxPoints = 1'000'000;  // each point is a whole experiment; far beyond a useful grid
  int total = 1;
  for (const auto& d : dims) {
    if (std::int64_t(total) * d.size > kMaxPoints)
      throw FieldError("axis", fmt::format("the grid has more than {} points; split it into several sweeps", kMaxPoints));
    total *= d.size;
  }
  std::vector<SweepPoint> points;
  for (int index = 0; index < total; ++index) {
    SweepPoint p;
    p.index = index;
    p.overrides.assign(s.set().begin(), s.set().end());
    std::vector<int> at(dims.size());
    for (int k = int(dims.size()) - 1, rest = index; k >= 0; --k) {  // the last dimension fastest
      at[std::size_t(k)] = rest % dims[std::size_t(k)].size;
      rest /= dims[std::size_t(k)].size;
    }
    for (std::size_t k = 0; k < dims.size(); ++k)
      for (const auto* a : dims[k].axes) {
        const std::string& v = a->values(at[k]);
        p.values.emplace_back(a->field(), v);
        p.overrides.push_back(a->field() + "=" + v);
        p.label += (p.label.empty() ? "" : " ") + a->field() + "=" + v;
      }
    points.push_back(std::move(p));
  }
  return points;
}

std::vector<SweepPoint> shard_points(const std::vector<SweepPoint>& points, int i, int n) {
  if (n < 1 || i < 0 || i >= n) throw InputError(fmt::format("--shard {}/{}: use i/n with 0 <= i < n", i, n));
  std::vector<SweepPoint> out;
  for (const auto& p : points)
    if (p.index % n == i) out.push_back(p);
  return out;
}

Sweep load_sweep(const std::string& path) {
  Sweep sw;
  sw.path = path;
  const ParsedFile file = parse_file(path, sw.spec);
  try {
    sw.points = expand_sweep(sw.spec);
  } catch (const FieldError& e) {
    throw InputError(file.describe(e.field(), e.message()));
  }
  if (sw.spec.base().empty()) throw InputError(file.describe("base", "is not set; name the experiment spec to vary"));
  if (const auto problem = path_name_problem(sw.spec.name()); !problem.empty())
    throw InputError(file.describe("name", sw.spec.name().empty() ? "is not set; it names the sweep's databases" : problem));
  sw.base = (fs::path(path).parent_path() / sw.spec.base()).lexically_normal().string();
  if (!fs::exists(sw.base)) throw InputError(file.describe("base", sw.base + ": no such file"));
  for (const auto& a : sw.spec.axis()) sw.fields.push_back(a.field());
  for (const auto& z : sw.spec.zip())
    for (const auto& a : z.axis()) sw.fields.push_back(a.field());
  // Every point must make a valid experiment before anything runs.
  for (const auto& p : sw.points) {
    try {
      load_experiment(sw.base, p.overrides, fs::path(path).parent_path().string());
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: point {} ({}): {}", path, p.index, p.label, e.what()));
    }
  }
  return sw;
}

namespace {

// What identifies a sweep in its database: its spec and its base spec's text.
std::string sweep_identity(const Sweep& sw) {
  std::ifstream base(sw.base);
  std::stringstream text;
  text << base.rdbuf();
  return to_text(sw.spec) + "\n# base " + sw.base + "\n" + text.str();
}

// In a worker process: run one point and leave its result in DIR/point-N.json.
void run_point(const Sweep& sw, const SweepPoint& p, const fs::path& work) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto ex = load_experiment(sw.base, p.overrides, fs::path(sw.path).parent_path().string());
  const auto result = run_experiment(ex);
  const json out = {{"summary", summary_json(ex, result)},
                    {"spec", to_text(ex.spec)},
                    {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  const fs::path file = work / fmt::format("point-{}.json", p.index);
  write_atomically(file.string(), out.dump());
}

}  // namespace

int run_sweep(const Sweep& sw, const SweepOptions& o, const std::function<void(const SweepProgress&)>& progress) {
  const auto mine = shard_points(sw.points, o.shard, o.shards);
  if (fs::exists(o.db) && !o.resume)
    throw InputError(o.db + ": exists; add --resume to continue that sweep, or remove it (or --db another file)");
  ResultsDb db(o.db, true);
  // One sweep writes a database at a time: a second one on it (two --resume, or two shards given
  // one --db) stops at once, exit 2, instead of running every point again and failing at the end.
  struct Lock {
    int fd = -1;
    ~Lock() {
      if (fd >= 0) ::close(fd);
    }
  } lock{::open(o.db.c_str(), O_RDONLY | O_CLOEXEC)};
  if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX | LOCK_NB) != 0)
    throw InputError(o.db + ": another sweep is writing this database; wait for it to finish, or --db another file");
  const std::string identity = sweep_identity(sw);
  if (const auto stored = db.meta("sweep_spec"); !stored.empty() && stored != identity)
    throw InputError(o.db + ": holds another sweep ('" + db.meta("sweep") +
                     "', or this sweep's spec or base spec changed since); --db another file");
  db.set_meta("sweep", sw.spec.name());
  db.set_meta("sweep_spec", identity);
  db.set_meta("fields", json(sw.fields).dump());
  db.set_meta("points", std::to_string(sw.points.size()));

  const auto finished = db.finished();
  std::vector<SweepPoint> pending;
  for (const auto& p : mine)
    if (!finished.count(p.index)) pending.push_back(p);
  const int jobs = o.jobs > 0 ? o.jobs : std::max(1, int(std::thread::hardware_concurrency()));
  const fs::path work = o.db + ".work";
  fs::create_directories(work);

  SweepProgress state;
  state.total = int(pending.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::map<pid_t, SweepPoint> running;
  std::size_t next = 0;
  while (next < pending.size() || !running.empty()) {
    while (next < pending.size() && int(running.size()) < jobs) {
      const SweepPoint& p = pending[next++];
      running.emplace(fork_worker(
                          [&] {
                            ::close(lock.fd);  // the lock is the sweep's: a worker outliving a killed sweep must not hold it
                            run_point(sw, p, work);
                          },
                          (work / fmt::format("point-{}.err", p.index)).string()),
                      p);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("waitpid failed: " + std::string(std::strerror(errno)));
    }
    const auto it = running.find(pid);
    if (it == running.end()) continue;
    const SweepPoint p = it->second;
    running.erase(it);
    const fs::path result = work / fmt::format("point-{}.json", p.index);
    const std::string why = worker_failure(status, (work / fmt::format("point-{}.err", p.index)).string());
    if (why.empty() && fs::exists(result)) {
      json j;
      std::ifstream(result) >> j;
      db.insert({p.index, p.label, json(std::map<std::string, std::string>(p.values.begin(), p.values.end())),
                 j.at("spec").get<std::string>(), j.at("summary"), j.at("wall_s").get<double>()});
      fs::remove(result);
    } else {
      ++state.failed;
      std::fprintf(stderr, "\nmoesim sweep: point %d (%s): %s\n", p.index, p.label.c_str(),
                   why.empty() ? "left no result" : why.c_str());
    }
    ++state.done;
    state.running = int(running.size());
    state.last = p.label;
    state.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.eta_s = state.elapsed_s / state.done * (state.total - state.done);
    if (progress) progress(state);
  }
  std::error_code ec;
  fs::remove(work, ec);  // only when empty
  return state.failed;
}

std::string slurm_script(const Sweep& sw, int shards, int cpus, const std::string& moesim) {
  if (shards < 1) throw InputError("--shards must be >= 1");
  if (cpus < 1) throw InputError("--cpus must be >= 1");
  // The sweep's name is a plain word (load_sweep: path_name_problem()); the paths are quoted for
  // the shell, which reads them as they are whatever they hold.
  const std::string name = sw.spec.name(), spec = shell_word(fs::absolute(sw.path).lexically_normal().string());
  const std::string bin = shell_word(moesim);
  for (const auto& path : {sw.path, moesim})
    if (std::any_of(path.begin(), path.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); }))
      throw InputError("--emit-slurm: a path with a control character cannot go into a job script: " + path);
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# moesim sweep {}: {} points in {} shards, one Slurm array task each.\n", name, sw.points.size(), shards);
  s += "#   sbatch " + name + ".slurm        # submit (from the directory the databases should go to)\n";
  s += fmt::format("#   {} results merge results.db {}-shard-*.db   # when every task has finished\n", bin, name);
  s += "# A task that is requeued or rerun resumes its shard: finished points are kept.\n";
  s += fmt::format("#SBATCH --job-name=moesim-{}\n#SBATCH --array=0-{}\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task={}\n",
                   name, shards - 1, cpus);
  s += fmt::format("#SBATCH --output=moesim-{}-%a.log\n", name);
  s += "set -euo pipefail\n";
  s += fmt::format("{} sweep {} --shard \"${{SLURM_ARRAY_TASK_ID}}/{}\" --jobs \"${{SLURM_CPUS_PER_TASK:-{}}}\" \\\n"
                   "  --db \"{}-shard-${{SLURM_ARRAY_TASK_ID}}.db\" --resume\n",
                   bin, spec, shards, cpus, name);
  return s;
}

}  // namespace moesim
