#include "cuda_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>
#if MOESIM_HAVE_MPI
#include <mpi.h>
#endif

#include "cuda_kernels.hpp"
#include "errors.hpp"
#include "host_kernels.hpp"
#include "hw_info.hpp"
#include "op_work.hpp"

namespace moesim::hw {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw MachineError(fmt::format("CUDA: {}: {}", what, cudaGetErrorString(e)));
}
void check(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw MachineError(fmt::format("NCCL: {}: {}", what, ncclGetErrorString(e)));
}
void check(cublasStatus_t e, const char* what) {
  if (e != CUBLAS_STATUS_SUCCESS) throw MachineError(fmt::format("cuBLAS: {}: status {}", what, int(e)));
}
#define MOESIM_CHECK(call) check((call), #call)

/// A row-major GEMM C[m×n] = op(A)·op(B) as cuBLAS (column-major) runs it: Cᵀ = op(B)ᵀ·op(A)ᵀ, so
/// cuBLAS sees each row-major operand as its transpose and a transposed one (ta/tb: stored k×m,
/// n×k) is passed as OP_T. Call cuBLAS with (opb, opa, n, m, k, B, ldb, A, lda, C, n).
struct ColumnMajor {
  ColumnMajor(bool ta, bool tb, int m, int n, int k)
      : opa(ta ? CUBLAS_OP_T : CUBLAS_OP_N), opb(tb ? CUBLAS_OP_T : CUBLAS_OP_N), lda(ta ? m : k), ldb(tb ? k : n) {}
  cublasOperation_t opa, opb;
  int lda, ldb;
};

/// One rank on its GPU: streams, handles, communicators, buffers, the iteration's events.
struct Rank {
  int rank = 0, device = 0;
  cudaStream_t stream[kNumStreams] = {};
  cublasHandle_t blas = nullptr;
  ncclComm_t comm[2] = {};  // Stream::comm (and compute) / Stream::comm2: one communicator per stream
  void* buf[kBuffers] = {};
  std::size_t cap[kBuffers] = {};
  cudaEvent_t t0 = nullptr;
  void* host_read = nullptr;  // pinned: where a host sync reads its 8 bytes
  std::vector<cudaEvent_t> start, end;  // per op of the graph (null where the rank takes no part)
};

cudaDataType_t cuda_type(spec::DType d) {
  switch (d) {
    case spec::FP16: return CUDA_R_16F;
    case spec::BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
cublasComputeType_t compute_type(spec::DType d) {
  return d == spec::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Cluster& cluster, const MoeModel& model, CudaOptions options)
      : cluster_(cluster), model_(model), options_(options), G_(options.ranks > 0 ? options.ranks : cluster.num_gpus()) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      throw InputError("--backend hw: no CUDA GPU is visible (cudaGetDeviceCount found none); "
                       "use --backend host to run the same graphs on the CPU");
    const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
    mpi_ = world != nullptr;
    ncclUniqueId id;
    if (mpi_) {
#if MOESIM_HAVE_MPI
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS)
        throw MachineError("MPI_Init failed: is this process started by mpirun?");
      int size = 0, me = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      MPI_Comm_rank(MPI_COMM_WORLD, &me);
      if (size != G_)
        throw InputError(fmt::format("--backend hw: mpirun started {} processes but the cluster has {} GPUs "
                                     "(one process per GPU: mpirun -np {})", size, G_, G_));
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
      Rank r;
      r.rank = me;
      r.device = (local ? std::atoi(local) : me) % devices;
      ranks_.push_back(r);
      if (me == 0) MOESIM_CHECK(ncclGetUniqueId(&id));
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#else
      throw InputError("--backend hw under mpirun: this build has no MPI (install libopenmpi-dev and rebuild), or "
                       "run one process for all GPUs of this machine");
#endif
    } else {
      if (G_ > devices)
        throw InputError(fmt::format("--backend hw: the cluster has {} GPUs but this machine has {}; shrink it "
                                     "(--set cluster.nodes=1 and a platform with {} GPUs per node) or run under "
                                     "mpirun -np {} on enough machines", G_, devices, devices, G_));
      MOESIM_CHECK(ncclGetUniqueId(&id));
      for (int r = 0; r < G_; ++r) {
        Rank rank;
        rank.rank = rank.device = r;
        ranks_.push_back(rank);
      }
    }
    for (Rank& r : ranks_) {
      MOESIM_CHECK(cudaSetDevice(r.device));
      for (auto& s : r.stream) MOESIM_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      MOESIM_CHECK(cublasCreate(&r.blas));
      MOESIM_CHECK(cublasSetStream(r.blas, r.stream[int(Stream::compute)]));
      MOESIM_CHECK(cudaEventCreate(&r.t0));
      MOESIM_CHECK(cudaMallocHost(&r.host_read, 8));
    }
    // Two communicators per rank (a second one for the comm2 stream), from two unique ids.
    for (int c = 0; c < 2; ++c) {
      ncclUniqueId cid = id;
      if (c == 1) {
        if (!mpi_ || ranks_.front().rank == 0) MOESIM_CHECK(ncclGetUniqueId(&cid));
#if MOESIM_HAVE_MPI
        if (mpi_) MPI_Bcast(&cid, sizeof cid, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
      }
      MOESIM_CHECK(ncclGroupStart());
      for (Rank& r : ranks_) {
        MOESIM_CHECK(cudaSetDevice(r.device));
        MOESIM_CHECK(ncclCommInitRank(&r.comm[c], G_, cid, r.rank));
      }
      MOESIM_CHECK(ncclGroupEnd());
    }
  }

  ~CudaBackend() override {
    for (Rank& r : ranks_) {
      cudaSetDevice(r.device);
      for (auto* c : r.comm)
        if (c) broken_ ? ncclCommAbort(c) : ncclCommDestroy(c);
      release_events(r);
      for (void* b : r.buf) cudaFree(b);
      cublasDestroy(r.blas);
      for (auto s : r.stream) cudaStreamDestroy(s);
      cudaEventDestroy(r.t0);
      cudaFreeHost(r.host_read);
    }
#if MOESIM_HAVE_MPI
    if (mpi_) MPI_Finalize();
#endif
  }

  std::string name() const override { return "hw"; }
  double now() const override { return clock_; }

  void check_memory(double bytes) override {
    for (Rank& r : ranks_) {
      std::size_t free = 0, total = 0;
      MOESIM_CHECK(cudaSetDevice(r.device));
      MOESIM_CHECK(cudaMemGetInfo(&free, &total));
      if (bytes > double(total))
        throw InputError(fmt::format("--backend hw: the model needs {:.2f} GiB on the fullest GPU (parameters, "
                                     "gradients, optimizer states, activations: the memory model) but GPU {} has {:.2f} GiB; "
                                     "nothing was allocated. Use fewer layers or tokens, or more GPUs",
                                     bytes / double(1ull << 30), r.device, double(total) / double(1ull << 30)));
    }
  }

  Timing execute(const TaskGraph& graph) override {
    if (broken_) throw MachineError("hw backend: the communicators were aborted by an earlier failure");
    if (graph.num_ranks() != G_) throw std::logic_error("hw backend: graph for another cluster size");
    const std::size_t n = graph.size();
    std::vector<std::vector<int>> who(n);
    std::vector<Lowering> steps(n);
    for (const Op& op : graph.ops()) {
      who[op.id] = participants(op);
      steps[op.id] = communication_steps(op, cluster_);
    }
    reserve(graph, who, steps);
    warm_new_shapes(graph);
    for (Rank& r : ranks_) {
      release_events(r);
      r.start.assign(n, nullptr);
      r.end.assign(n, nullptr);
      MOESIM_CHECK(cudaSetDevice(r.device));
      MOESIM_CHECK(cudaDeviceSynchronize());
    }
#if MOESIM_HAVE_MPI
    if (mpi_) MPI_Barrier(MPI_COMM_WORLD);
#endif
    for (Rank& r : ranks_) {  // t0 on every stream of every rank, as close together as the host can
      MOESIM_CHECK(cudaSetDevice(r.device));
      MOESIM_CHECK(cudaEventRecord(r.t0, r.stream[0]));
      for (int s = 1; s < kNumStreams; ++s) MOESIM_CHECK(cudaStreamWaitEvent(r.stream[s], r.t0, 0));
    }
    for (const Op& op : graph.ops()) enqueue(graph, op, who, steps[op.id]);
    wait_all(graph, who);
    return collect(graph, who);
  }

 private:
  Rank* local(int rank) {
    for (Rank& r : ranks_)
      if (r.rank == rank) return &r;
    return nullptr;
  }
  static void release_events(Rank& r) {
    for (auto* v : {&r.start, &r.end})
      for (cudaEvent_t e : *v)
        if (e) cudaEventDestroy(e);
    r.start.clear();
    r.end.clear();
  }

  /// Sizes every rank's buffers for the graph (largest GEMM operands, largest message and step),
  /// refusing what does not fit before allocating anything.
  void reserve(const TaskGraph& graph, const std::vector<std::vector<int>>& who, const std::vector<Lowering>& steps) {
    const std::size_t es = std::size_t(model_.dtype_bytes());
    for (Rank& r : ranks_) {
      std::size_t need[kBuffers] = {};
      for (const Op& op : graph.ops()) {
        if (std::find(who[op.id].begin(), who[op.id].end(), r.rank) == who[op.id].end()) continue;
        if (const Compute* c = rank_compute(op, r.rank)) {
          for (const Gemm& g : c->gemms) {
            const std::size_t b = std::max<std::uint64_t>(1, g.batch);
            need[kA] = std::max(need[kA], b * g.m * g.k * es);
            need[kB] = std::max(need[kB], b * g.k * g.n * es);
            need[kC] = std::max(need[kC], b * g.m * g.n * es);
          }
          need[kState] = std::max(need[kState], std::size_t(c->memory_bytes) + 64);
        }
        for (const Lane& lane : steps[op.id])
          for (const Step& step : lane) {
            std::size_t in = 0;
            for (const Transfer& t : step.transfers) {
              if (t.src == r.rank) need[kSend] = std::max(need[kSend], wire_bytes(t, step));
              if (t.dst == r.rank) in += wire_bytes(t, step);
            }
            need[kRecv] = std::max(need[kRecv], in);
            for (const Copy& c : step.copies)
              if (c.rank == r.rank) need[kC] = need[kA] = std::max({need[kA], need[kC], std::size_t(c.bytes / 2)});
          }
      }
      std::size_t more = 0;
      for (int b = 0; b < kBuffers; ++b) more += need[b] > r.cap[b] ? need[b] : 0;
      MOESIM_CHECK(cudaSetDevice(r.device));
      std::size_t free = 0, total = 0;
      MOESIM_CHECK(cudaMemGetInfo(&free, &total));
      if (more > free)
        throw InputError(fmt::format("--backend hw: rank {} needs {:.2f} GiB more device memory for this graph's "
                                     "GEMM operands and message buffers but GPU {} has {:.2f} GiB free; nothing was "
                                     "allocated", r.rank, double(more) / double(1ull << 30), r.device,
                                     double(free) / double(1ull << 30)));
      for (int b = 0; b < kBuffers; ++b)
        if (need[b] > r.cap[b]) {
          cudaFree(r.buf[b]);
          MOESIM_CHECK(cudaMalloc(&r.buf[b], need[b]));
          MOESIM_CHECK(cudaMemset(r.buf[b], 0, need[b]));
          r.cap[b] = need[b];
        }
      std::size_t used = 0;
      for (std::size_t c : r.cap) used += c;
      peak_[r.rank] = std::max(peak_[r.rank], double(used));
    }
  }

  /// A GEMM shape's first call pays for cuBLAS's choice of kernel and for CUDA loading that
  /// kernel's module (lazy loading, CUDA's default): on an H200 the demo layer's first iterations ran
  /// 4-7x slower than its fifth, while the experts' token counts (hence shapes) kept changing
  /// (docs/hardware.md). A training step in steady state has paid that long before, so each new shape
  /// and each memory kernel runs once here, untimed, before the graph's clock starts.
  void warm_new_shapes(const TaskGraph& graph) {
    for (const Op& op : graph.ops())
      for (Rank& r : ranks_)
        if (const Compute* c = rank_compute(op, r.rank)) warm(r, *c);
  }
  void warm(Rank& r, const Compute& c) {
    Compute once = c;
    once.gemms.clear();
    for (Gemm g : c.gemms) {
      g.repeat = 1;
      if (warm_gemms_.insert({r.rank, g.m, g.n, g.k, std::max<std::uint64_t>(1, g.batch), g.ta, g.tb}).second)
        once.gemms.push_back(g);
    }
    const MemoryKernel k = memory_kernel(c.kind, c.memory_bytes, model_);
    if (k.rows == 0 || !warm_kernels_.insert({r.rank, int(k.kind)}).second) once.memory_bytes = 0;
    if (!once.gemms.empty() || once.memory_bytes > 0) compute(r, once, r.stream[int(Stream::compute)]);
  }

  cudaStream_t stream_of(Rank& r, const Op& op) { return r.stream[int(op.stream)]; }
  ncclComm_t comm_of(Rank& r, const Op& op) { return r.comm[op.stream == Stream::comm2 ? 1 : 0]; }

  /// `all`: every op's participants (execute() computed them once).
  void enqueue(const TaskGraph& graph, const Op& op, const std::vector<std::vector<int>>& all, const Lowering& steps) {
    const std::vector<int>& who = all[op.id];
    // Dependencies and the start event on every local participant.
    for (int q : who) {
      Rank* r = local(q);
      if (!r) continue;
      MOESIM_CHECK(cudaSetDevice(r->device));
      cudaStream_t s = stream_of(*r, op);
      for (OpId d : op.deps) {
        if (std::holds_alternative<Computes>(graph.op(d).body)) {  // every part (one process: each GPU's event)
          for (int p : all[d])
            if (Rank* o = local(p); o && o->end[d] && (o == r || !mpi_)) MOESIM_CHECK(cudaStreamWaitEvent(s, o->end[d], 0));
          continue;
        }
        cudaEvent_t e = r->end[d];
        if (!e && !mpi_)  // another GPU's op: wait on its first participant's event (one process)
          for (int p : all[d])
            if (Rank* o = local(p); o && o->end[d]) {
              e = o->end[d];
              break;
            }
        if (e) MOESIM_CHECK(cudaStreamWaitEvent(s, e, 0));
      }
      MOESIM_CHECK(cudaEventCreate(&r->start[op.id]));
      MOESIM_CHECK(cudaEventCreate(&r->end[op.id]));
      MOESIM_CHECK(cudaEventRecord(r->start[op.id], s));
    }
    if (std::holds_alternative<Compute>(op.body) || std::holds_alternative<Computes>(op.body)) {
      for (int q : who)
        if (Rank* r = local(q)) compute(*r, *rank_compute(op, q), stream_of(*r, op));
    } else {
      for (const Lane& lane : steps)
        for (const Step& step : lane) {
          MOESIM_CHECK(ncclGroupStart());
          for (const Transfer& t : step.transfers) {
            const std::size_t bytes = wire_bytes(t, step);
            if (bytes == 0) continue;
            if (t.src == t.dst) {
              if (Rank* r = local(t.src)) {
                MOESIM_CHECK(cudaSetDevice(r->device));
                MOESIM_CHECK(cudaMemcpyAsync(r->buf[kRecv], r->buf[kSend], bytes, cudaMemcpyDeviceToDevice, stream_of(*r, op)));
              }
              continue;
            }
            if (Rank* r = local(t.src)) {
              MOESIM_CHECK(cudaSetDevice(r->device));
              MOESIM_CHECK(ncclSend(r->buf[kSend], bytes, ncclInt8, t.dst, comm_of(*r, op), stream_of(*r, op)));
            }
            if (Rank* r = local(t.dst)) {
              MOESIM_CHECK(cudaSetDevice(r->device));
              MOESIM_CHECK(ncclRecv(static_cast<char*>(r->buf[kRecv]) + offset(step, t, r->rank), bytes, ncclInt8, t.src,
                                    comm_of(*r, op), stream_of(*r, op)));
            }
          }
          MOESIM_CHECK(ncclGroupEnd());
          for (const Copy& c : step.copies)
            if (Rank* r = local(c.rank); r && c.bytes >= 2) {
              MOESIM_CHECK(cudaSetDevice(r->device));
              MOESIM_CHECK(cudaMemcpyAsync(r->buf[kC], r->buf[kA], std::size_t(c.bytes / 2), cudaMemcpyDeviceToDevice,
                                           stream_of(*r, op)));
            }
        }
    }
    for (int q : who)
      if (Rank* r = local(q)) {
        MOESIM_CHECK(cudaSetDevice(r->device));
        MOESIM_CHECK(cudaEventRecord(r->end[op.id], stream_of(*r, op)));
      }
    // A host sync (Compute::blocks_host: FastMoE's count read, FasterMoE's shadowing decision): the
    // host enqueues nothing more until the GPU has reached it and its read has landed, as .cpu()
    // makes PyTorch wait (compute() queued the read).
    for (int q : who)
      if (Rank* r = local(q); r)
        if (const Compute* c = rank_compute(op, q); c && c->blocks_host)
          MOESIM_CHECK(cudaEventSynchronize(r->end[op.id]));
  }

  /// Where transfer t lands in its receiver's buffer: after the step's earlier messages to it.
  static std::size_t offset(const Step& step, const Transfer& t, int rank) {
    std::size_t off = 0;
    for (const Transfer& u : step.transfers) {
      if (&u == &t) break;
      if (u.dst == rank && u.src != rank) off += wire_bytes(u, step);
    }
    return off;
  }

  void compute(Rank& r, const Compute& c, cudaStream_t s) {
    MOESIM_CHECK(cudaSetDevice(r.device));
    const cudaDataType_t type = cuda_type(model_.dtype());
    const cublasComputeType_t ctype = compute_type(model_.dtype());
    const float alpha = 1, beta = 0;
    for (const Gemm& g : c.gemms) {
      const int m = int(g.m), n = int(g.n), k = int(g.k);
      const auto [opa, opb, lda, ldb] = ColumnMajor(g.ta, g.tb, m, n, k);
      for (std::uint64_t i = 0; i < std::max<std::uint64_t>(1, g.repeat); ++i) {
        if (g.batch > 1)
          MOESIM_CHECK(cublasGemmStridedBatchedEx(r.blas, opb, opa, n, m, k, &alpha, r.buf[kB], type, ldb,
                                                  (long long)(k) * n, r.buf[kA], type, lda, (long long)(m) * k, &beta,
                                                  r.buf[kC], type, n, (long long)(m) * n, int(g.batch), ctype,
                                                  CUBLAS_GEMM_DEFAULT));
        else
          MOESIM_CHECK(cublasGemmEx(r.blas, opb, opa, n, m, k, &alpha, r.buf[kB], type, ldb, r.buf[kA], type, lda, &beta,
                                    r.buf[kC], type, n, ctype, CUBLAS_GEMM_DEFAULT));
      }
    }
    if (c.blocks_host)  // .cpu() of a few counts: 8 bytes to the host (enqueue() then waits for them)
      MOESIM_CHECK(cudaMemcpyAsync(r.host_read, r.buf[kState], 8, cudaMemcpyDeviceToHost, s));
    const MemoryKernel k = memory_kernel(c.kind, c.memory_bytes, model_);  // op_work.hpp's sizing
    if (k.rows == 0) return;
    const std::size_t n = k.rows * k.width;
    auto* state = static_cast<float*>(r.buf[kState]);
    switch (k.kind) {
      case MemoryKernel::permute: cuda::permute_rows(state, state + n, k.rows, k.width * sizeof(float), s); break;
      case MemoryKernel::gate: {
        const auto top = std::size_t(model_.top_k());
        auto* index = reinterpret_cast<std::int32_t*>(state + n);
        cuda::gate_top_k(state, k.rows, int(k.width), int(top), index, state + n + k.rows * top, s);
        break;
      }
      case MemoryKernel::adam: cuda::adam(state, n, s); break;
      case MemoryKernel::axpy: cuda::axpy(state, n, s); break;
    }
  }

  /// Waits for every rank's streams, polling NCCL's asynchronous errors; past the timeout, aborts.
  void wait_all(const TaskGraph& graph, const std::vector<std::vector<int>>& who) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      bool done = true;
      for (Rank& r : ranks_) {
        MOESIM_CHECK(cudaSetDevice(r.device));
        for (auto s : r.stream) {
          const cudaError_t q = cudaStreamQuery(s);
          if (q == cudaErrorNotReady) done = false;
          else MOESIM_CHECK(q);
        }
        for (auto* c : r.comm) {
          ncclResult_t async = ncclSuccess;
          MOESIM_CHECK(ncclCommGetAsyncError(c, &async));
          if (async != ncclSuccess) fail(graph, who, fmt::format("NCCL reported {}", ncclGetErrorString(async)));
        }
      }
      if (done) return;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > options_.timeout_s)
        fail(graph, who, fmt::format("it did not finish within {} s", options_.timeout_s));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  [[noreturn]] void fail(const TaskGraph& graph, const std::vector<std::vector<int>>& who, const std::string& why) {
    std::string stuck = "no op";
    for (const Op& op : graph.ops()) {
      bool pending = false;
      for (int q : who[op.id])
        if (Rank* r = local(q); r && r->end[op.id] && cudaEventQuery(r->end[op.id]) == cudaErrorNotReady) pending = true;
      if (pending) {
        stuck = fmt::format("op '{}' (#{})", op.label, op.id);
        break;
      }
    }
    broken_ = true;
    for (Rank& r : ranks_)
      for (auto*& c : r.comm) {
        ncclCommAbort(c);
        c = nullptr;
      }
    throw MachineError(fmt::format("hw backend: {} was still running when {}", stuck, why));
  }

  Timing collect(const TaskGraph& graph, const std::vector<std::vector<int>>& who) {
    const std::size_t n = graph.size();
    Timing t;
    t.start.assign(n, std::numeric_limits<double>::infinity());
    t.end.assign(n, -std::numeric_limits<double>::infinity());
    t.part_start.assign(graph.num_parts(), -std::numeric_limits<double>::infinity());
    t.part_end.assign(graph.num_parts(), -std::numeric_limits<double>::infinity());
    for (std::size_t id = 0; id < n; ++id)
      for (int q : who[id])
        if (Rank* r = local(q)) {
          float a = 0, b = 0;
          MOESIM_CHECK(cudaSetDevice(r->device));
          MOESIM_CHECK(cudaEventElapsedTime(&a, r->t0, r->start[id]));
          MOESIM_CHECK(cudaEventElapsedTime(&b, r->t0, r->end[id]));
          t.start[id] = std::min(t.start[id], a * 1e-3);
          t.end[id] = std::max(t.end[id], b * 1e-3);
          if (std::size_t part = 0; std::holds_alternative<Computes>(graph.op(OpId(id)).body) && rank_compute(graph.op(OpId(id)), q, &part))
            t.part_start[part] = a * 1e-3, t.part_end[part] = b * 1e-3;
        }
    t.memory_peak.assign(std::size_t(G_), 0.0);
    for (const auto& [rank, bytes] : peak_) t.memory_peak[std::size_t(rank)] = bytes;
#if MOESIM_HAVE_MPI
    if (mpi_) {  // every rank timed its own part: the op's span over all of them
      MPI_Allreduce(MPI_IN_PLACE, t.start.data(), int(n), MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, t.end.data(), int(n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, t.part_start.data(), int(t.part_start.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, t.part_end.data(), int(t.part_end.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, t.memory_peak.data(), G_, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
#endif
    clock_ += t.makespan();
    return t;
  }

  const Cluster& cluster_;
  MoeModel model_;
  CudaOptions options_;
  int G_;
  bool mpi_ = false, broken_ = false;
  std::vector<Rank> ranks_;
  std::map<int, double> peak_;
  std::set<std::tuple<int, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, bool, bool>> warm_gemms_;  // rank, m, n, k, batch, ta, tb
  std::set<std::pair<int, int>> warm_kernels_;  // rank, MemoryKernel::Kind
  double clock_ = 0;
};

/// Device memory freed on every path out.
struct DeviceFloats {
  explicit DeviceFloats(std::size_t n) { MOESIM_CHECK(cudaMalloc(&p, std::max<std::size_t>(1, n) * sizeof(float))); }
  ~DeviceFloats() { cudaFree(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* p = nullptr;
};

}  // namespace

void cublas_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B, float* C,
                 float beta) {
  if (m == 0 || n == 0 || k == 0) return host::gemm(ta, tb, m, n, k, A, B, C, beta);  // no product: C = beta·C
  static std::mutex mutex;
  static cublasHandle_t blas = nullptr;  // kept for the process, as cuBLAS's own handles are
  const std::lock_guard lock(mutex);
  if (!blas) {
    MOESIM_CHECK(cublasCreate(&blas));
    MOESIM_CHECK(cublasSetMathMode(blas, CUBLAS_PEDANTIC_MATH));  // fp32 as the host computes it
  }
  DeviceFloats a(m * k), b(k * n), c(m * n);
  MOESIM_CHECK(cudaMemcpy(a.p, A, m * k * sizeof(float), cudaMemcpyHostToDevice));
  MOESIM_CHECK(cudaMemcpy(b.p, B, k * n * sizeof(float), cudaMemcpyHostToDevice));
  if (beta != 0) MOESIM_CHECK(cudaMemcpy(c.p, C, m * n * sizeof(float), cudaMemcpyHostToDevice));
  const float alpha = 1;
  const auto [opa, opb, lda, ldb] = ColumnMajor(ta, tb, int(m), int(n), int(k));
  MOESIM_CHECK(cublasSgemm(blas, opb, opa, int(n), int(m), int(k), &alpha, b.p, ldb, a.p, lda, &beta, c.p, int(n)));
  MOESIM_CHECK(cudaMemcpy(C, c.p, m * n * sizeof(float), cudaMemcpyDeviceToHost));
}

std::unique_ptr<Backend> make_cuda_backend(const Cluster& cluster, const MoeModel& model, CudaOptions options) {
  return std::make_unique<CudaBackend>(cluster, model, options);
}

}  // namespace moesim::hw
