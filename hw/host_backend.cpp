#include "host_backend.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "errors.hpp"

#include "host_kernels.hpp"
#include "op_work.hpp"

namespace moesim::hw {

namespace {

using Clock = std::chrono::steady_clock;

/// Thrown in the ranks that stop because another rank failed (that rank's error is reported).
struct Aborted {};

/// A rank's device memory: named buffers that only grow, with the high-water mark of their sum.
class Scratch {
 public:
  float* get(int slot, std::size_t floats) {
    auto& b = buffers_[std::size_t(slot)];
    if (b.size() < floats) {
      bytes_ += (floats - b.size()) * sizeof(float);
      b.assign(floats, 1e-3f);  // non-zero: host::gemm skips zero entries of A
      peak_ = std::max(peak_, bytes_);
    }
    return b.data();
  }
  /// Another rank's view of a buffer it filled before the step's barrier (read-only).
  const float* data(int slot) const { return buffers_[std::size_t(slot)].data(); }
  double peak() const { return double(peak_); }

 private:
  std::vector<float> buffers_[kBuffers];
  std::size_t bytes_ = 0, peak_ = 0;
};

/// A barrier for an op's participants with a timeout and a shared abort flag.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n) {}
  /// Waits for the others; returns true in the thread whose arrival completed the round.
  bool arrive(const std::atomic<bool>& abort, double timeout_s, const Op& op, int rank) {
    std::unique_lock lock(m_);
    const long gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (generation_ == gen) {
      if (abort) throw Aborted{};
      if (cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(50))) ==
              std::cv_status::timeout &&
          Clock::now() >= deadline)
        throw MachineError(fmt::format("host backend: rank {} waited {} s for the other ranks of op '{}' (#{})",
                                             rank, timeout_s, op.label, op.id));
    }
    return false;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  long generation_ = 0;
};

/// A memory-bound op's kernel (op_work.hpp's sizing, as on GPUs).
void run_memory_kernel(const MemoryKernel& k, const MoeModel& model, Scratch& s) {
  const std::size_t n = k.rows * k.width;
  switch (k.kind) {
    case MemoryKernel::permute: {
      std::vector<std::uint32_t> index(k.rows);
      for (std::size_t i = 0; i < k.rows; ++i) index[i] = std::uint32_t((i * 7919) % k.rows);
      host::gather_rows(s.get(kA, n), index, k.width, s.get(kC, n));
      break;
    }
    case MemoryKernel::gate: {
      const auto top = std::size_t(model.top_k());
      std::vector<std::uint32_t> index(k.rows * top);
      host::top_k_softmax(s.get(kA, n), k.rows, k.width, top, index.data(), s.get(kC, k.rows * top));
      break;
    }
    case MemoryKernel::adam: {
      float* base = s.get(kState, 4 * n);
      host::adam(base, base + n, base + 2 * n, base + 3 * n, n);
      break;
    }
    case MemoryKernel::axpy: {
      float* x = s.get(kA, n);
      float* y = s.get(kC, n);
      for (std::size_t i = 0; i < n; ++i) y[i] += 0.5f * x[i];
    }
  }
}

void run_compute(const Compute& c, const MoeModel& model, Scratch& s) {
  for (const Gemm& g : c.gemms) {
    const std::size_t m = g.m, n = g.n, k = g.k;
    float* A = s.get(kA, m * k);
    float* B = s.get(kB, k * n);
    float* C = s.get(kC, m * n);
    for (std::uint64_t i = 0; i < std::max<std::uint64_t>(1, g.batch) * std::max<std::uint64_t>(1, g.repeat); ++i)
      host::gemm(g.ta, g.tb, m, n, k, A, B, C);
  }
  if (const MemoryKernel k = memory_kernel(c.kind, c.memory_bytes, model); k.rows > 0) run_memory_kernel(k, model, s);
}

}  // namespace

HostBackend::HostBackend(const Cluster& cluster, const MoeModel& model, HostOptions options)
    : cluster_(cluster), model_(model), options_(options) {}
HostBackend::~HostBackend() = default;

Timing HostBackend::execute(const TaskGraph& graph) {
  const int G = graph.num_ranks();
  const std::size_t n = graph.size();
  std::vector<std::vector<OpId>> mine(static_cast<std::size_t>(G));
  std::vector<std::vector<int>> who(n);
  std::vector<Lowering> steps(n);
  std::vector<std::unique_ptr<Rendezvous>> meet(n);
  for (const Op& op : graph.ops()) {
    who[op.id] = participants(op);
    for (int r : who[op.id]) mine[std::size_t(r)].push_back(op.id);
    steps[op.id] = communication_steps(op, cluster_);
    if (who[op.id].size() > 1 && !std::holds_alternative<Computes>(op.body))
      meet[op.id] = std::make_unique<Rendezvous>(int(who[op.id].size()));
  }
  Timing timing;
  timing.start.assign(n, 0.0);
  timing.end.assign(n, 0.0);
  timing.part_start.assign(graph.num_parts(), 0.0);
  timing.part_end.assign(graph.num_parts(), 0.0);
  std::unique_ptr<std::atomic<int>[]> parts_left(new std::atomic<int>[n]);  // a Computes op's parts not done
  for (const Op& op : graph.ops()) parts_left[op.id] = int(who[op.id].size());
  timing.memory_peak.assign(std::size_t(G), 0.0);
  std::vector<Scratch> scratch(static_cast<std::size_t>(G));
  std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[n]);
  for (std::size_t i = 0; i < n; ++i) done[i] = false;
  std::atomic<bool> abort{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  auto run_rank = [&](int rank) {
    Scratch& s = scratch[std::size_t(rank)];
    for (OpId id : mine[std::size_t(rank)]) {
      const Op& op = graph.op(id);
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s));
      for (OpId d : op.deps)  // a dependency on another rank's op (ours are done: id order)
        while (!done[d].load(std::memory_order_acquire)) {
          if (abort) throw Aborted{};
          if (Clock::now() > deadline)
            throw MachineError(fmt::format("host backend: op '{}' (#{}) waited {} s for op '{}'", op.label, id,
                                                 options_.timeout_s, graph.op(d).label));
          std::this_thread::yield();
        }
      if (const auto* c = std::get_if<Compute>(&op.body)) {
        timing.start[id] = seconds();
        run_compute(*c, model_, s);
        timing.end[id] = seconds();
        done[id].store(true, std::memory_order_release);
        continue;
      }
      if (std::holds_alternative<Computes>(op.body)) {  // this rank's part; the op is done with its last
        std::size_t part = 0;
        const Compute* c = rank_compute(op, rank, &part);
        timing.part_start[part] = seconds();
        run_compute(*c, model_, s);
        timing.part_end[part] = seconds();
        if (parts_left[id].fetch_sub(1, std::memory_order_acq_rel) == 1) done[id].store(true, std::memory_order_release);
        continue;
      }
      Rendezvous* rv = meet[id].get();
      auto sync = [&] { return rv ? rv->arrive(abort, options_.timeout_s, op, rank) : true; };
      if (sync()) timing.start[id] = seconds();
      for (const Lane& lane : steps[id])
        for (const Step& step : lane) {
          // Senders fill their send buffer, then receivers copy out of it (the transport).
          std::size_t out = 0, in = 0;
          for (const Transfer& t : step.transfers) {
            if (t.src == rank) out = std::max(out, wire_bytes(t, step));
            if (t.dst == rank && t.src != rank) in += wire_bytes(t, step);
          }
          s.get(kSend, (out + 3) / 4);
          float* recv = s.get(kRecv, (in + 3) / 4);
          sync();
          std::size_t offset = 0;
          for (const Transfer& t : step.transfers) {
            if (t.dst != rank || t.src == rank) continue;
            const std::size_t bytes = wire_bytes(t, step);
            // The sender's buffer is stable between the two barriers of the step.
            std::memcpy(reinterpret_cast<char*>(recv) + offset, scratch[std::size_t(t.src)].data(kSend), bytes);
            offset += bytes;
          }
          for (const Copy& c : step.copies)
            if (c.rank == rank) {
              const auto floats = std::size_t(c.bytes / 8);
              if (floats > 0) std::memcpy(s.get(kC, floats), s.get(kA, floats), floats * sizeof(float));
            }
          sync();
        }
      if (sync()) {
        timing.end[id] = seconds();
        done[id].store(true, std::memory_order_release);
      }
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < G; ++r)
      threads.emplace_back([&, r] {
        try {
          run_rank(r);
        } catch (const Aborted&) {
        } catch (...) {
          std::lock_guard lock(error_mutex);
          if (!error) error = std::current_exception();
          abort = true;
        }
      });
  }
  if (error) std::rethrow_exception(error);
  for (const Op& op : graph.ops())
    if (const auto* parts = std::get_if<Computes>(&op.body)) {  // from its first part's start to its last part's end
      const auto first = std::ptrdiff_t(parts->first_part), last = first + std::ptrdiff_t(parts->parts());
      timing.start[op.id] = *std::min_element(timing.part_start.begin() + first, timing.part_start.begin() + last);
      timing.end[op.id] = *std::max_element(timing.part_end.begin() + first, timing.part_end.begin() + last);
    }
  for (int r = 0; r < G; ++r) timing.memory_peak[std::size_t(r)] = scratch[std::size_t(r)].peak();
  clock_ += timing.makespan();
  return timing;
}

}  // namespace moesim::hw
