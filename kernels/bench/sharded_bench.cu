// flashsampler-kernel-bench --backend=cuda_sharded: one sampling step with W
// split by vocabulary over n local GPUs (kernels/cuda/sharded_sample.h)
// against the same step on one GPU, and against the naive tensor-parallel
// sampler that all-gathers the logits.
//
// Variants, per (shape D x V, batch B), bf16 W, fp32 H exact in bf16, every
// row sampled at --temperature, tokens only (no log Z):
//   one_gpu       LaunchFusedSample on GPU devices[0] with the whole W.
//   sharded       LaunchShardedSample: each GPU's fused kernel on its V/n rows,
//                 one NCCL all-gather of the per-row summaries, the merge on
//                 GPU devices[0].
//   exchange      the summary exchange alone: the all-gather (B * n * 20 bytes)
//                 and the merge kernel.
//   sharded_peer  LaunchShardedSample with ShardExchange::kPeerWrite: each
//                 GPU's kernel stores its summaries into GPU devices[0]'s
//                 buffer, GPU devices[0]'s stream waits for one event per GPU,
//                 then the merge (peer access enabled between the GPUs). Each
//                 step first records an event on GPU devices[0]'s stream that
//                 the other streams wait for, so a step's stores cannot
//                 overtake the previous step's merge (the engine waits for
//                 every stream between steps instead); NCCL's all-gather
//                 orders the steps the same way for `sharded`.
//   exchange_peer that exchange alone: an event recorded on every GPU's
//                 stream, GPU devices[0]'s stream waiting for them, the merge
//                 (events made once; the launcher makes one per GPU per step).
// Without peer access between the GPUs the two peer variants are skipped (NaN).
//   gather_logits the baseline (the paper's "all-gather logits" tensor-parallel
//                 sampler): per GPU a cuBLAS GEMM of its logits [B, V/n]
//                 (fp32), an NCCL all-gather of them (B * V * 4 bytes), then on
//                 GPU devices[0] a Gumbel-max over the gathered logits (blocks
//                 of 1024 tokens, noise keyed by global id, the tiles merged by
//                 MergeShardSummaries): the same sample, through memory.
// Timing: CUDA events on GPU devices[0]'s stream around each step, steps
// enqueued back to back without host synchronisation after --warmup runs;
// medians and minima of --iterations runs. The start event precedes the host's
// launches on every GPU, and the step ends on GPU devices[0] only after the
// all-gather, which waits for every GPU, so the interval covers the whole
// step. H is on every GPU already (its upload is not timed, as for one GPU).
// Check, before timing: one_gpu, sharded and gather_logits run once on the
// same params; the table shows how many rows' sharded tokens equal one_gpu's
// (all of them, by construction: same tiles, global noise) and
// gather_logits' (cuBLAS rounding: near-ties may flip).
#include "kernels/bench/sharded_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/kernel_status.h"
#include "kernels/common/row_params.h"
#include "kernels/common/sample_summary.h"
#include "kernels/common/shard_merge.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/sharded_sample.h"
#include "nlohmann/json.hpp"

namespace flashsampler::kernels::bench {
namespace {

constexpr int64_t kAlign = 128;          // shard boundaries (the fused kernel's tile)
constexpr int kBaselineTile = 1024;      // tokens per block of the baseline's Gumbel-max
constexpr int kBaselineThreads = 256;

// The shared Ok overloads (cuda_bench.h) next to this file's NCCL one.
using bench::Ok;
bool Ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  std::cerr << "flashsampler-kernel-bench: " << what << ": " << ncclGetErrorString(r) << "\n";
  return false;
}
#define SB_CHECK(expr)                 \
  do {                                 \
    if (!Ok((expr), #expr)) return 1;  \
  } while (0)

// ---- The baseline's Gumbel-max over gathered logits ------------------------------
// gathered: [n][batch][vmax] fp32 (rank k's logits of global tokens begin_k + j
// at [k][row][j], j < rows_k). Block (x = k * tiles_per_shard + t, y = row)
// scores tokens [t * 1024, t * 1024 + 1024) of shard k and writes its
// SampleSummary to tile_summaries[x * batch + row]: the [tile][row] layout
// MergeShardSummaries reads with stride = batch.
__global__ void __launch_bounds__(kBaselineThreads)
    GatheredLogitsTileKernel(const float* __restrict__ gathered, int64_t batch, int64_t vmax,
                             const int64_t* __restrict__ begins, const int64_t* __restrict__ rows,
                             int64_t tiles_per_shard, const RowParams* __restrict__ params,
                             SampleSummary* __restrict__ tile_summaries) {
  __shared__ SampleSummary partial[kBaselineThreads];
  const int64_t k = blockIdx.x / tiles_per_shard;
  const int64_t t = blockIdx.x % tiles_per_shard;
  const int64_t row = blockIdx.y;
  const RowParams p = params[row];
  const float scale = p.temperature > 0.0f ? 1.0f / p.temperature : 1.0f;
  const float* logits = gathered + (k * batch + row) * vmax;
  const int64_t tile_end = (t + 1) * kBaselineTile;
  const int64_t end = rows[k] < tile_end ? rows[k] : tile_end;
  SampleSummary s = EmptySampleSummary();
  for (int64_t j = t * kBaselineTile + threadIdx.x; j < end; j += kBaselineThreads) {
    const int32_t token = static_cast<int32_t>(begins[k] + j);
    const float l = __fmul_rn(__ldcs(logits + j), scale);
    const float score = p.temperature > 0.0f
                            ? __fadd_rn(l, GumbelNoise(p.seed, p.offset, p.stream, static_cast<uint32_t>(token)))
                            : l;
    if (score == score && ScoreBeats(score, token, s.best_score, s.best_index)) {
      s.best_score = score;
      s.best_index = token;
      s.best_logit = l;
    }
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kBaselineThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      partial[threadIdx.x] = MergeSummaries(partial[threadIdx.x], partial[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_summaries[blockIdx.x * batch + row] = partial[0];
}

// Everything one GPU holds for one shape.
struct Gpu {
  int device = 0;
  int64_t begin = 0, rows = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  ncclComm_t comm = nullptr;
  void* weight = nullptr;       // bf16 [rows, D]
  float* hidden = nullptr;      // fp32 [Bmax, D], exact in bf16
  void* hidden_bf16 = nullptr;  // bf16 [Bmax, D] (baseline GEMM input)
  RowParams* params = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* exchange = nullptr;
  float* gathered_logits = nullptr;  // [n][Bmax][vmax]
};

struct Row {
  CudaShape shape;
  int64_t batch = 0;
  Stats one_gpu, sharded, exchange, sharded_peer, exchange_peer, gather_logits;
  int64_t agree_one = 0, agree_baseline = 0, agree_peer = 0;
};

int RunShape(const CudaBenchOptions& o, const std::vector<int>& devices, const CudaShape& shape,
             std::vector<Row>* rows_out) {
  const int n = static_cast<int>(devices.size());
  const int64_t D = shape.hidden, V = shape.vocab;
  const int64_t bmax = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t tiles = (V + kAlign - 1) / kAlign;
  std::vector<Gpu> gpus(n);
  int64_t vmax = 0;
  for (int k = 0; k < n; ++k) {
    gpus[k].device = devices[k];
    gpus[k].begin = tiles * k / n * kAlign;
    const int64_t end = k + 1 == n ? V : tiles * (k + 1) / n * kAlign;
    gpus[k].rows = end - gpus[k].begin;
    vmax = std::max(vmax, gpus[k].rows);
  }
  // Peer access to GPU devices[0] for the kPeerWrite exchange (and both ways
  // for the copies); NCCL may have turned some on already.
  bool peer = true;
  for (int k = 1; k < n; ++k) {
    for (const auto& [from, to] : {std::pair<int, int>{devices[k], devices[0]},
                                   std::pair<int, int>{devices[0], devices[k]}}) {
      int can = 0;
      SB_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
      if (can == 0) {
        std::cerr << "flashsampler-kernel-bench: GPU " << from << " cannot access GPU " << to
                  << ": the peer exchange is skipped\n";
        peer = false;
        continue;
      }
      SB_CHECK(cudaSetDevice(from));
      const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        SB_CHECK(err);
      }
    }
  }
  // One communicator per GPU.
  {
    std::vector<ncclComm_t> comms(n);
    SB_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    for (int k = 0; k < n; ++k) gpus[k].comm = comms[k];
  }
  // GPU devices[0] also holds the whole W for one_gpu and the outputs.
  void* whole_weight = nullptr;
  void* whole_workspace = nullptr;
  size_t whole_workspace_bytes = FusedSampleWorkspaceBytes(bmax, V, D);
  int32_t *tokens = nullptr, *check_tokens = nullptr;
  SampleSummary* baseline_tiles = nullptr;
  int64_t* d_begins = nullptr;
  int64_t* d_rows = nullptr;
  const int64_t tiles_per_shard = (vmax + kBaselineTile - 1) / kBaselineTile;
  for (int k = 0; k < n; ++k) {
    Gpu& g = gpus[k];
    SB_CHECK(cudaSetDevice(g.device));
    SB_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    SB_CHECK(cublasCreate(&g.cublas));
    SB_CHECK(cublasSetStream(g.cublas, g.stream));
    SB_CHECK(cudaMalloc(&g.weight, g.rows * D * 2));
    SB_CHECK(cudaMalloc(&g.hidden, bmax * D * sizeof(float)));
    SB_CHECK(cudaMalloc(&g.hidden_bf16, bmax * D * 2));
    SB_CHECK(cudaMalloc(&g.params, bmax * sizeof(RowParams)));
    g.workspace_bytes = FusedSampleWorkspaceBytes(bmax, g.rows, D);
    SB_CHECK(cudaMalloc(&g.workspace, g.workspace_bytes));
    SB_CHECK(cudaMalloc(&g.exchange, ShardExchangeBytes(bmax, n)));
    SB_CHECK(cudaMalloc(&g.gathered_logits, static_cast<size_t>(n) * bmax * vmax * sizeof(float)));
    // W ~ N(0, logit_std^2 / D), each shard its own seed; one_gpu's whole W
    // is then copied together from the shards, so every variant samples the
    // same head.
    const float w_scale = o.logit_std / std::sqrt(static_cast<float>(D));
    if (FillNormalBf16(g.weight, g.rows * D, w_scale, o.seed * 1000003 + k, g.stream) != 0 ||
        FillNormalFloatBf16Exact(g.hidden, bmax * D, 1.0f, o.seed + 7, g.stream) != 0 ||
        CastFloatToBf16(g.hidden, g.hidden_bf16, bmax * D, g.stream) != 0) {
      std::cerr << "flashsampler-kernel-bench: fill kernel failed\n";
      return 1;
    }
  }
  Gpu& g0 = gpus[0];
  SB_CHECK(cudaSetDevice(g0.device));
  SB_CHECK(cudaMalloc(&whole_weight, V * D * 2));
  SB_CHECK(cudaMalloc(&whole_workspace, whole_workspace_bytes));
  SB_CHECK(cudaMalloc(&tokens, bmax * sizeof(int32_t)));
  SB_CHECK(cudaMalloc(&check_tokens, 4 * bmax * sizeof(int32_t)));
  SB_CHECK(cudaMalloc(&baseline_tiles, n * tiles_per_shard * bmax * sizeof(SampleSummary)));
  SB_CHECK(cudaMalloc(&d_begins, n * sizeof(int64_t)));
  SB_CHECK(cudaMalloc(&d_rows, n * sizeof(int64_t)));
  {
    std::vector<int64_t> begins(n), rows(n);
    for (int k = 0; k < n; ++k) {
      begins[k] = gpus[k].begin;
      rows[k] = gpus[k].rows;
    }
    SB_CHECK(cudaMemcpy(d_begins, begins.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
    SB_CHECK(cudaMemcpy(d_rows, rows.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  }
  for (int k = 0; k < n; ++k) {  // the whole W = the shards' rows, in order
    SB_CHECK(cudaSetDevice(gpus[k].device));
    SB_CHECK(cudaStreamSynchronize(gpus[k].stream));
    SB_CHECK(cudaMemcpyPeer(static_cast<char*>(whole_weight) + gpus[k].begin * D * 2, g0.device,
                            gpus[k].weight, gpus[k].device, gpus[k].rows * D * 2));
  }
  // cudaMemcpyPeer and cudaMemcpy order against the legacy default stream
  // only; the work streams are non-blocking: settle every device.
  for (const Gpu& g : gpus) {
    SB_CHECK(cudaSetDevice(g.device));
    SB_CHECK(cudaDeviceSynchronize());
  }

  for (int64_t batch : o.batches) {
    Row row;
    row.shape = shape;
    row.batch = batch;
    std::vector<RowParams> params(batch);
    uint64_t call = 0;
    auto upload_params = [&]() -> int {
      for (int64_t r = 0; r < batch; ++r) {
        params[r] = RowParams{o.temperature, o.seed, call, static_cast<uint32_t>(r)};
      }
      ++call;
      for (Gpu& g : gpus) {
        SB_CHECK(cudaSetDevice(g.device));
        SB_CHECK(cudaMemcpy(g.params, params.data(), batch * sizeof(RowParams), cudaMemcpyHostToDevice));
        SB_CHECK(cudaDeviceSynchronize());
      }
      // Timing events are created on the current device: GPU devices[0].
      SB_CHECK(cudaSetDevice(g0.device));
      return 0;
    };
    // The steps. Each leaves the current device at devices[0].
    auto one_gpu = [&](int32_t* out) -> int {
      SB_CHECK(cudaSetDevice(g0.device));
      FusedSampleArgs a;
      a.weight = whole_weight;
      a.weight_dtype = CudaWeightDType::kBFloat16;
      a.hidden = g0.hidden;
      a.params = g0.params;
      a.batch = batch;
      a.vocab = a.valid_vocab = V;
      a.hidden_dim = D;
      a.token_ids = out;
      a.workspace = whole_workspace;
      a.workspace_bytes = whole_workspace_bytes;
      SB_CHECK(LaunchFusedSample(a, g0.stream));
      return 0;
    };
    std::vector<FusedSampleArgs> shard_args(n);
    std::vector<void*> exchange(n);
    std::vector<ShardDevice> devs(n);
    for (int k = 0; k < n; ++k) {
      FusedSampleArgs& a = shard_args[k];
      a.weight = gpus[k].weight;
      a.weight_dtype = CudaWeightDType::kBFloat16;
      a.hidden = gpus[k].hidden;
      a.params = gpus[k].params;
      a.batch = batch;
      a.vocab = a.valid_vocab = gpus[k].rows;
      a.hidden_dim = D;
      a.token_offset = gpus[k].begin;
      a.workspace = gpus[k].workspace;
      a.workspace_bytes = gpus[k].workspace_bytes;
      exchange[k] = gpus[k].exchange;
      devs[k] = ShardDevice{gpus[k].device, gpus[k].stream, gpus[k].comm, gpus[k].cublas};
    }
    // The peer steps' order guard (see the top of the file).
    cudaEvent_t step_start = nullptr;
    SB_CHECK(cudaSetDevice(g0.device));
    SB_CHECK(cudaEventCreateWithFlags(&step_start, cudaEventDisableTiming));
    auto sharded = [&](int32_t* out, ShardExchange mode) -> int {
      if (mode == ShardExchange::kPeerWrite) {
        SB_CHECK(cudaSetDevice(g0.device));
        SB_CHECK(cudaEventRecord(step_start, g0.stream));
        for (int k = 1; k < n; ++k) {
          SB_CHECK(cudaSetDevice(gpus[k].device));
          SB_CHECK(cudaStreamWaitEvent(gpus[k].stream, step_start, 0));
        }
      }
      ShardedSampleArgs s;
      s.shard_args = shard_args.data();
      s.exchange = exchange.data();
      s.devices = devs.data();
      s.num_shards = n;
      s.exchange_mode = mode;
      s.token_ids = out;
      SB_CHECK(LaunchShardedSample(s));
      return 0;
    };
    // The peer exchange's events, made once (LaunchShardedSample makes its own).
    std::vector<cudaEvent_t> peer_events(n, nullptr);
    for (int k = 0; k < n; ++k) {
      SB_CHECK(cudaSetDevice(gpus[k].device));
      SB_CHECK(cudaEventCreateWithFlags(&peer_events[k], cudaEventDisableTiming));
    }
    auto exchange_peer_only = [&]() -> int {
      for (int k = 1; k < n; ++k) {
        SB_CHECK(cudaSetDevice(gpus[k].device));
        SB_CHECK(cudaEventRecord(peer_events[k], gpus[k].stream));
      }
      SB_CHECK(cudaSetDevice(g0.device));
      for (int k = 1; k < n; ++k) SB_CHECK(cudaStreamWaitEvent(g0.stream, peer_events[k], 0));
      SB_CHECK(LaunchMergeShardSummaries(static_cast<const SampleSummary*>(g0.exchange), batch, n,
                                         g0.params, ShardMergeMode::kExact, tokens, nullptr,
                                         nullptr, g0.stream));
      return 0;
    };
    const size_t slot = static_cast<size_t>(batch) * sizeof(SampleSummary);
    auto exchange_only = [&]() -> int {
      SB_CHECK(ncclGroupStart());
      for (int k = 0; k < n; ++k) {
        char* buf = static_cast<char*>(gpus[k].exchange);
        SB_CHECK(ncclAllGather(buf + k * slot, buf, slot, ncclUint8, gpus[k].comm, gpus[k].stream));
      }
      SB_CHECK(ncclGroupEnd());
      SB_CHECK(cudaSetDevice(g0.device));
      SB_CHECK(LaunchMergeShardSummaries(static_cast<const SampleSummary*>(g0.exchange), batch, n,
                                         g0.params, ShardMergeMode::kExact, tokens, nullptr,
                                         nullptr, g0.stream));
      return 0;
    };
    auto gather_logits = [&](int32_t* out) -> int {
      const float alpha = 1.0f, beta = 0.0f;
      const size_t send = static_cast<size_t>(batch) * vmax;  // floats per rank
      for (int k = 0; k < n; ++k) {
        Gpu& g = gpus[k];
        SB_CHECK(cudaSetDevice(g.device));
        // Rank k's logits [batch][vmax] (first rows_k columns) into its slot.
        SB_CHECK(cublasGemmEx(g.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.rows),
                              static_cast<int>(batch), static_cast<int>(D), &alpha, g.weight,
                              CUDA_R_16BF, static_cast<int>(D), g.hidden_bf16, CUDA_R_16BF,
                              static_cast<int>(D), &beta, g.gathered_logits + k * send,
                              CUDA_R_32F, static_cast<int>(vmax), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
      }
      SB_CHECK(ncclGroupStart());
      for (int k = 0; k < n; ++k) {
        Gpu& g = gpus[k];
        SB_CHECK(ncclAllGather(g.gathered_logits + k * send, g.gathered_logits, send, ncclFloat32,
                               g.comm, g.stream));
      }
      SB_CHECK(ncclGroupEnd());
      SB_CHECK(cudaSetDevice(g0.device));
      GatheredLogitsTileKernel<<<dim3(static_cast<unsigned>(n * tiles_per_shard),
                                      static_cast<unsigned>(batch)),
                                 kBaselineThreads, 0, g0.stream>>>(
          g0.gathered_logits, batch, vmax, d_begins, d_rows, tiles_per_shard, g0.params,
          baseline_tiles);
      SB_CHECK(cudaGetLastError());
      SB_CHECK(LaunchMergeShardSummaries(baseline_tiles, batch,
                                         static_cast<int32_t>(n * tiles_per_shard), g0.params,
                                         ShardMergeMode::kExact, out, nullptr, nullptr, g0.stream));
      return 0;
    };
    auto sync_all = [&] { return WaitForBenchShards(&devs); };

    // Check: the four samplers on the same params.
    if (upload_params() != 0 || one_gpu(check_tokens) != 0 ||
        sharded(check_tokens + bmax, ShardExchange::kNcclAllGather) != 0 ||
        gather_logits(check_tokens + 2 * bmax) != 0 || sync_all() != 0 ||
        (peer && (sharded(check_tokens + 3 * bmax, ShardExchange::kPeerWrite) != 0 ||
                  sync_all() != 0))) {
      return 1;
    }
    std::vector<int32_t> check(4 * bmax);
    SB_CHECK(cudaMemcpy(check.data(), check_tokens, check.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < batch; ++r) {
      row.agree_one += check[bmax + r] == check[r];
      row.agree_baseline += check[bmax + r] == check[2 * bmax + r];
      if (peer) row.agree_peer += check[3 * bmax + r] == check[r];
    }
    if (upload_params() != 0) return 1;
    if (TimeRepeated(g0.stream, o.warmup, o.iterations, [&] { return one_gpu(tokens); }, &row.one_gpu) != 0 ||
        TimeRepeated(g0.stream, o.warmup, o.iterations,
                     [&] { return sharded(tokens, ShardExchange::kNcclAllGather); }, &row.sharded) != 0 ||
        TimeRepeated(g0.stream, o.warmup, o.iterations, exchange_only, &row.exchange) != 0 ||
        (peer && (TimeRepeated(g0.stream, o.warmup, o.iterations,
                               [&] { return sharded(tokens, ShardExchange::kPeerWrite); },
                               &row.sharded_peer) != 0 ||
                  TimeRepeated(g0.stream, o.warmup, o.iterations, exchange_peer_only,
                               &row.exchange_peer) != 0)) ||
        TimeRepeated(g0.stream, o.warmup, o.iterations, [&] { return gather_logits(tokens); },
                     &row.gather_logits) != 0 ||
        sync_all() != 0) {
      return 1;
    }
    std::fprintf(stderr,
                 "  D=%lld V=%lld B=%lld: one_gpu %.3f sharded %.3f exchange %.3f sharded_peer %.3f "
                 "exchange_peer %.3f gather_logits %.3f ms\n",
                 static_cast<long long>(D), static_cast<long long>(V), static_cast<long long>(batch),
                 row.one_gpu.median_ms, row.sharded.median_ms, row.exchange.median_ms,
                 row.sharded_peer.median_ms, row.exchange_peer.median_ms, row.gather_logits.median_ms);
    for (int k = 0; k < n; ++k) {
      cudaSetDevice(gpus[k].device);
      cudaEventDestroy(peer_events[k]);
    }
    cudaSetDevice(g0.device);
    cudaEventDestroy(step_start);
    if (!peer) row.sharded_peer = row.exchange_peer = Stats{NAN, NAN};
    rows_out->push_back(row);
  }

  for (Gpu& g : gpus) {
    cudaSetDevice(g.device);
    cudaStreamSynchronize(g.stream);
    ncclCommDestroy(g.comm);
    cublasDestroy(g.cublas);
    for (void* p : {g.weight, static_cast<void*>(g.hidden), g.hidden_bf16,
                    static_cast<void*>(g.params), g.workspace, g.exchange,
                    static_cast<void*>(g.gathered_logits)}) {
      cudaFree(p);
    }
    cudaStreamDestroy(g.stream);
  }
  cudaSetDevice(g0.device);
  for (void* p : {whole_weight, whole_workspace, static_cast<void*>(tokens),
                  static_cast<void*>(check_tokens), static_cast<void*>(baseline_tiles),
                  static_cast<void*>(d_begins), static_cast<void*>(d_rows)}) {
    cudaFree(p);
  }
  return 0;
}

}  // namespace

int WaitForBenchShards(std::vector<ShardDevice>* devices) {
  std::string error;
  if (WaitForShards(devices->data(), static_cast<int32_t>(devices->size()), 60.0, &error) !=
      KernelStatus::kOk) {
    std::cerr << "flashsampler-kernel-bench: " << error << "\n";
    return 1;
  }
  return 0;
}

int RunShardedBench(const CudaBenchOptions& o, const std::vector<int>& devices) {
  if (devices.size() < 2 || o.iterations < 1 || o.shapes.empty() || o.batches.empty()) {
    std::cerr << "flashsampler-kernel-bench: --backend=cuda_sharded needs >= 2 --devices, shapes "
                 "and batches\n";
    return 2;
  }
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDeviceProperties(&prop, devices[0]), "cudaGetDeviceProperties")) return 1;
  std::vector<Row> rows;
  for (const CudaShape& shape : o.shapes) {
    if (RunShape(o, devices, shape, &rows) != 0) return 1;
  }
  std::string list;
  for (int d : devices) list += (list.empty() ? "" : ",") + std::to_string(d);
  std::printf("flashsampler-kernel-bench backend=cuda_sharded  %zu x %s (GPUs %s)  %s  commit %s\n",
              devices.size(), prop.name, list.c_str(), o.date.c_str(), o.commit.c_str());
  std::printf("T=%g logit_std=%g iterations=%d; medians in ms (CUDA events on GPU %d's stream)\n",
              o.temperature, o.logit_std, o.iterations, devices[0]);
  std::printf("%-12s %4s %9s %9s %7s %9s %9s %7s %9s %13s %8s %9s %9s %9s\n", "DxV", "B",
              "one_gpu", "sharded", "ratio", "exchange", "s_peer", "ratio_p", "exch_peer",
              "gather_logits", "vs_base", "agree1", "agreeB", "agreeP");
  for (const Row& r : rows) {
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(r.shape.hidden),
                  static_cast<long long>(r.shape.vocab));
    std::printf(
        "%-12s %4lld %9.4f %9.4f %7.3f %9.4f %9.4f %7.3f %9.4f %13.4f %8.2f %4lld/%-4lld %4lld/%-4lld "
        "%4lld/%-4lld\n",
        shape, static_cast<long long>(r.batch), r.one_gpu.median_ms, r.sharded.median_ms,
        r.sharded.median_ms / r.one_gpu.median_ms, r.exchange.median_ms, r.sharded_peer.median_ms,
        r.sharded_peer.median_ms / r.one_gpu.median_ms, r.exchange_peer.median_ms,
        r.gather_logits.median_ms,
        r.gather_logits.median_ms / std::min(r.sharded.median_ms, r.sharded_peer.median_ms),
        static_cast<long long>(r.agree_one), static_cast<long long>(r.batch),
        static_cast<long long>(r.agree_baseline), static_cast<long long>(r.batch),
        static_cast<long long>(r.agree_peer), static_cast<long long>(r.batch));
  }
  std::printf("ratio = sharded / one_gpu, ratio_p = sharded_peer (s_peer) / one_gpu (issue target "
              "<= 0.55 at B <= 16); vs_base = gather_logits / the faster sharded (target >= 1.5 at "
              "B = 64); exchange, exch_peer: target <= 0.030 ms. agree1 / agreeB / agreeP: rows "
              "whose sharded token equals one_gpu's / gather_logits' and whose sharded_peer token "
              "equals one_gpu's.\n");
  if (!o.json_path.empty()) {
    nlohmann::json j = BenchJsonHeader(o, "cuda_sharded", prop.name);
    j["devices"] = devices;
    j["timing"] = "CUDA events on the first device's stream, steps enqueued back to back";
    nlohmann::json results = nlohmann::json::array();
    for (const Row& r : rows) {
      results.push_back({{"hidden", r.shape.hidden},
                         {"vocab", r.shape.vocab},
                         {"batch", r.batch},
                         {"one_gpu", StatsJson(r.one_gpu)},
                         {"sharded", StatsJson(r.sharded)},
                         {"exchange", StatsJson(r.exchange)},
                         {"sharded_peer", StatsJson(r.sharded_peer)},
                         {"exchange_peer", StatsJson(r.exchange_peer)},
                         {"tokens_agree_peer_one_gpu", r.agree_peer},
                         {"gather_logits", StatsJson(r.gather_logits)},
                         {"tokens_agree_one_gpu", r.agree_one},
                         {"tokens_agree_gather_logits", r.agree_baseline}});
    }
    j["results"] = results;
    return WriteBenchJson(j, o.json_path);
  }
  return 0;
}

}  // namespace flashsampler::kernels::bench
