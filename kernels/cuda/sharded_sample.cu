// Sharded sampling over the local GPUs: per-shard samplers, the exchange of
// per-row summaries (one NCCL all-gather, or peer stores into shard 0's
// buffer), the merge on shard 0; and for controlled rows the gathered-logits
// and gathered-tile paths. Contract: sharded_sample.h. Reads top to bottom:
// exchange layout, the merge kernel, the launch events, the launcher, the
// controlled launchers, the bounded wait.
#include "kernels/cuda/sharded_sample.h"

#include <cuda_runtime.h>

#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/cuda/logits_gemm.h"
#include "kernels/cuda/materialized_sample.h"

namespace flashsampler::kernels {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// ---- Exchange buffer of one shard ----------------------------------------------
// [gathered: num_shards * batch SampleSummary, shard-major (NCCL's all-gather
// layout: rank k's batch summaries at k * batch)][shard log Z: batch floats],
// the second part from a 256-byte boundary.
size_t GatheredBytes(int64_t batch, int32_t num_shards) {
  const size_t bytes = static_cast<size_t>(batch) * static_cast<size_t>(num_shards) *
                       sizeof(SampleSummary);
  return (bytes + 255) / 256 * 256;
}

// ---- Merge on shard 0 ---------------------------------------------------------
// One thread per row; 20 * num_shards bytes per row, a few microseconds even
// at thousands of rows.
constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    MergeShardSummariesKernel(const SampleSummary* __restrict__ gathered, int64_t batch,
                              int32_t num_shards, const RowParams* __restrict__ params,
                              ShardMergeMode mode, int32_t* __restrict__ token_ids,
                              float* __restrict__ logz, float* __restrict__ logprobs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
  if (row >= batch) return;
  const SampleSummary s = MergeShardSummaries(gathered + row, batch, num_shards, params[row], mode);
  token_ids[row] = s.best_index;
  if (logz != nullptr || logprobs != nullptr) {
    const float row_logz = SummaryLogZ(s);
    if (logz != nullptr) logz[row] = row_logz;
    if (logprobs != nullptr) logprobs[row] = s.best_logit - row_logz;
  }
}

KernelStatus FromCuda(cudaError_t err) {
  return err == cudaSuccess ? KernelStatus::kOk : KernelStatus::kDeviceError;
}

// Events of one launch: done[k] on device k (shard k's sampler, or its GEMM
// of the current chunk, or its stage 1), copied on device 0 (shard 0's
// stream has read every slice of the current chunk, so the shards may
// overwrite their logits). Each is created on first record, on the current
// device, which the caller has set to the stream's. Destroying an event whose
// record is still pending is allowed: it is released once done.
class LaunchEvents {
 public:
  explicit LaunchEvents(int32_t n) : done_(static_cast<size_t>(n), nullptr) {}
  ~LaunchEvents() {
    for (cudaEvent_t e : done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (copied_ != nullptr) cudaEventDestroy(copied_);
  }
  LaunchEvents(const LaunchEvents&) = delete;
  LaunchEvents& operator=(const LaunchEvents&) = delete;

  cudaError_t RecordDone(int32_t k, cudaStream_t stream) {
    return Record(&done_[static_cast<size_t>(k)], stream);
  }
  cudaError_t RecordCopied(cudaStream_t stream) { return Record(&copied_, stream); }
  cudaEvent_t done(int32_t k) const { return done_[static_cast<size_t>(k)]; }
  cudaEvent_t copied() const { return copied_; }

 private:
  static cudaError_t Record(cudaEvent_t* event, cudaStream_t stream) {
    if (*event == nullptr) {
      if (const cudaError_t err = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
          err != cudaSuccess) {
        return err;
      }
    }
    return cudaEventRecord(*event, stream);
  }

  std::vector<cudaEvent_t> done_;
  cudaEvent_t copied_ = nullptr;
};

}  // namespace

size_t ShardExchangeBytes(int64_t batch, int32_t num_shards) {
  if (batch < 1 || batch > kMaxInt32 || num_shards < 1 || num_shards > 1024) return 0;
  return GatheredBytes(batch, num_shards) + static_cast<size_t>(batch) * sizeof(float);
}

cudaError_t LaunchMergeShardSummaries(const SampleSummary* gathered, int64_t batch,
                                      int32_t num_shards, const RowParams* params,
                                      ShardMergeMode mode, int32_t* token_ids, float* logz,
                                      float* logprobs, cudaStream_t stream) {
  const int64_t blocks = (batch + kMergeThreads - 1) / kMergeThreads;
  MergeShardSummariesKernel<<<static_cast<unsigned>(blocks), kMergeThreads, 0, stream>>>(
      gathered, batch, num_shards, params, mode, token_ids, logz, logprobs);
  return cudaGetLastError();
}

KernelStatus LaunchShardedSample(const ShardedSampleArgs& args) {
  // ---- Arguments (nothing is enqueued when they are wrong).
  if (args.num_shards < 1 || args.shard_args == nullptr || args.exchange == nullptr ||
      args.devices == nullptr || args.token_ids == nullptr) {
    return KernelStatus::kInvalidArgument;
  }
  const int32_t n = args.num_shards;
  const int64_t batch = args.shard_args[0].batch;
  if (ShardExchangeBytes(batch, n) == 0) return KernelStatus::kInvalidArgument;
  for (int32_t k = 0; k < n; ++k) {
    const FusedSampleArgs& a = args.shard_args[k];
    if (a.batch != batch || args.exchange[k] == nullptr ||
        reinterpret_cast<uintptr_t>(args.exchange[k]) % 256 != 0 ||
        (n > 1 && args.exchange_mode == ShardExchange::kNcclAllGather &&
         args.devices[k].comm == nullptr) ||
        (args.materialized && args.devices[k].cublas == nullptr)) {
      return KernelStatus::kInvalidArgument;
    }
  }
  // The shard log-masses are needed for log Z / log-probs and for choosing a
  // shard in kGroupGumbel mode; otherwise the shards skip the exponentials.
  const bool want_lse =
      args.logz != nullptr || args.logprobs != nullptr || args.mode == ShardMergeMode::kGroupGumbel;
  const size_t slot_bytes = static_cast<size_t>(batch) * sizeof(SampleSummary);

  // kPeerWrite: one event per shard k >= 1, made right after its launch, so
  // nothing but the launch itself precedes shard 0's kernel on the host.
  const bool peer_write = args.exchange_mode == ShardExchange::kPeerWrite;
  LaunchEvents events(n);

  // ---- 1. Every shard's sampler; its row summaries go to slot k of its own
  // gathered buffer (the in-place all-gather's send buffer) or, with
  // kPeerWrite, of shard 0's (a peer store; the merge reads them in place).
  for (int32_t k = 0; k < n; ++k) {
    char* exchange = static_cast<char*>(args.exchange[k]);
    char* gathered = static_cast<char*>(args.exchange[peer_write ? 0 : k]);
    FusedSampleArgs a = args.shard_args[k];
    a.token_ids = nullptr;
    a.logprobs = nullptr;
    a.row_summaries = reinterpret_cast<SampleSummary*>(gathered) + static_cast<int64_t>(k) * batch;
    a.logz = want_lse ? reinterpret_cast<float*>(exchange + GatheredBytes(batch, n)) : nullptr;
    if (cudaSetDevice(args.devices[k].device) != cudaSuccess) return KernelStatus::kDeviceError;
    const KernelStatus s = args.materialized
                               ? LaunchMaterializedSample(a, args.devices[k].cublas,
                                                          args.devices[k].stream)
                               : LaunchFusedSample(a, args.devices[k].stream);
    if (s != KernelStatus::kOk) return s;
    if (peer_write && k > 0 && events.RecordDone(k, args.devices[k].stream) != cudaSuccess) {
      return KernelStatus::kDeviceError;
    }
  }

  // ---- 2a. kPeerWrite: shard 0's stream waits until every shard's kernel has
  // finished, and with it its stores into shard 0's memory (a kernel's writes
  // are visible to work ordered after its completion, peer memory included).
  if (peer_write) {
    if (cudaSetDevice(args.devices[0].device) != cudaSuccess) return KernelStatus::kDeviceError;
    for (int32_t k = 1; k < n; ++k) {
      if (cudaStreamWaitEvent(args.devices[0].stream, events.done(k), 0) != cudaSuccess) {
        return KernelStatus::kDeviceError;
      }
    }
  }

  // ---- 2b. Otherwise one all-gather of the summaries (bytes: batch * n * 20).
  // A group, because one thread drives every communicator.
  if (n > 1 && !peer_write) {
    if (ncclGroupStart() != ncclSuccess) return KernelStatus::kDeviceError;
    ncclResult_t result = ncclSuccess;
    for (int32_t k = 0; k < n && result == ncclSuccess; ++k) {
      char* gathered = static_cast<char*>(args.exchange[k]);
      result = ncclAllGather(gathered + k * slot_bytes, gathered, slot_bytes, ncclUint8,
                             args.devices[k].comm, args.devices[k].stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (result != ncclSuccess || end != ncclSuccess) return KernelStatus::kDeviceError;
  }

  // ---- 3. The merge on shard 0, after the exchange in stream order.
  if (cudaSetDevice(args.devices[0].device) != cudaSuccess) return KernelStatus::kDeviceError;
  return FromCuda(LaunchMergeShardSummaries(
      static_cast<const SampleSummary*>(args.exchange[0]), batch, n, args.shard_args[0].params,
      args.mode, args.token_ids, args.logz, args.logprobs, args.devices[0].stream));
}

// ---- Controlled rows: gathered logits ------------------------------------------
namespace {

size_t AlignUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t ChunkRows(int64_t batch) {
  return batch < kControlledChunkRows ? batch : kControlledChunkRows;
}

// `rows` rows of `width` bytes from (src, src_pitch) on src_device to (dst,
// dst_pitch) on dst_device, on `stream` (dst_device's): one strided copy, over
// NVLink / PCIe peer access where the GPUs have it, staged by the driver
// otherwise; src_device == dst_device is an ordinary device copy.
cudaError_t CopyRows(void* dst, size_t dst_pitch, int dst_device, const void* src, size_t src_pitch,
                     int src_device, size_t width, size_t rows, cudaStream_t stream) {
  cudaMemcpy3DPeerParms copy{};
  copy.srcPtr = make_cudaPitchedPtr(const_cast<void*>(src), src_pitch, width, rows);
  copy.srcDevice = src_device;
  copy.dstPtr = make_cudaPitchedPtr(dst, dst_pitch, width, rows);
  copy.dstDevice = dst_device;
  copy.extent = make_cudaExtent(width, rows, 1);
  return cudaMemcpy3DPeerAsync(&copy, stream);
}

// The checks both controlled launchers make of the batch: shards and GPUs
// given, shard 0's params / controls / outputs complete, a gather scratch of
// `gather_need` bytes (0: the sizes are out of range), 256-byte aligned.
bool ValidControlledBatch(const ShardedControlledBatch& b, const void* shards, size_t gather_need) {
  return b.num_shards >= 1 && b.num_shards <= 1024 && shards != nullptr && b.devices != nullptr &&
         b.params != nullptr && ControlledBuffersValid(b.controls, b.outputs) &&
         b.gather_scratch != nullptr && reinterpret_cast<uintptr_t>(b.gather_scratch) % 256 == 0 &&
         gather_need != 0 && b.gather_scratch_bytes >= gather_need;
}

// Stage 1's arguments for shard s of a fused launch (its outputs unused).
ControlledSampleArgs Stage1Args(const ShardedFusedControlledArgs& args,
                                const ShardedFusedControlledShard& s) {
  ControlledSampleArgs a;
  a.weight = s.weight;
  a.weight_dtype = args.weight_dtype;
  a.hidden = s.hidden;
  a.params = s.params;
  a.batch = args.batch;
  a.vocab = a.valid_vocab = s.end - s.begin;
  a.hidden_dim = args.hidden_dim;
  a.controls = s.controls;
  a.workspace = s.workspace;
  a.workspace_bytes = s.workspace_bytes;
  return a;
}

// Where the fused launcher's gathered [batch, tiles] summaries and
// candidates lie in its gather scratch, and its size.
struct FusedGatherLayout {
  int64_t tiles = 0;
  size_t candidates_offset = 0;
  size_t total = 0;
};
FusedGatherLayout FusedGather(int64_t batch, int64_t valid_vocab) {
  FusedGatherLayout l;
  if (batch < 1 || batch > kMaxInt32 || valid_vocab < 1 || valid_vocab > kFusedMaxVocab) return l;
  l.tiles = (valid_vocab + 127) / 128;
  const size_t cells = static_cast<size_t>(batch) * static_cast<size_t>(l.tiles);
  l.candidates_offset = AlignUp256(cells * FusedControlledTileSummaryBytes());
  l.total = l.candidates_offset + AlignUp256(cells * FusedControlledTileCandidateBytes());
  return l;
}

}  // namespace

size_t ShardedControlledShardBytes(int64_t batch, int64_t shard_vocab, int64_t hidden_dim,
                                   CudaWeightDType weight_dtype) {
  if (batch < 1 || batch > kMaxInt32 || shard_vocab < 1 || shard_vocab > kMaxInt32 ||
      hidden_dim < 1 || hidden_dim > kMaxInt32 || CudaWeightDTypeBytes(weight_dtype) == 0) {
    return 0;
  }
  const int64_t chunk = ChunkRows(batch);
  return AlignUp256(static_cast<size_t>(chunk) * static_cast<size_t>(shard_vocab) * sizeof(float)) +
         AlignUp256(LogitsGemmCastBytes(chunk, hidden_dim, weight_dtype));
}

size_t ShardedControlledGatherBytes(int64_t batch, int64_t valid_vocab) {
  if (batch < 1 || batch > kMaxInt32 || valid_vocab < 1 || valid_vocab > kMaxInt32) return 0;
  return 2 * AlignUp256(static_cast<size_t>(ChunkRows(batch)) * static_cast<size_t>(valid_vocab) *
                        sizeof(float));
}

KernelStatus LaunchShardedControlledSample(const ShardedControlledArgs& args) {
  // ---- Arguments (nothing is enqueued when they are wrong).
  const int32_t n = args.num_shards;
  if (!ValidControlledBatch(args, args.shards,
                            ShardedControlledGatherBytes(args.batch, args.valid_vocab))) {
    return KernelStatus::kInvalidArgument;
  }
  int64_t expected_begin = 0;
  for (int32_t k = 0; k < n; ++k) {
    const ShardedControlledShard& s = args.shards[k];
    const size_t need =
        ShardedControlledShardBytes(args.batch, s.end - s.begin, args.hidden_dim, args.weight_dtype);
    if (s.begin != expected_begin || s.end <= s.begin || s.weight == nullptr ||
        s.hidden == nullptr || s.scratch == nullptr || need == 0 || s.scratch_bytes < need ||
        reinterpret_cast<uintptr_t>(s.scratch) % 256 != 0 || args.devices[k].cublas == nullptr ||
        args.devices[k].stream == nullptr) {
      return KernelStatus::kInvalidArgument;
    }
    expected_begin = s.end;
  }
  if (expected_begin != args.valid_vocab) return KernelStatus::kInvalidArgument;

  LaunchEvents events(n);
  const int64_t chunk = ChunkRows(args.batch);
  const size_t gathered_bytes =
      AlignUp256(static_cast<size_t>(chunk) * static_cast<size_t>(args.valid_vocab) * sizeof(float));
  float* gathered = static_cast<float*>(args.gather_scratch);
  float* lp = reinterpret_cast<float*>(static_cast<char*>(args.gather_scratch) + gathered_bytes);
  const ShardDevice& d0 = args.devices[0];

  for (int64_t row0 = 0; row0 < args.batch; row0 += chunk) {
    const int64_t rows = args.batch - row0 < chunk ? args.batch - row0 : chunk;
    // ---- 1. Each shard's logits of the chunk, on its stream; after the
    // previous chunk's copies out of its buffer.
    for (int32_t k = 0; k < n; ++k) {
      const ShardedControlledShard& s = args.shards[k];
      const ShardDevice& d = args.devices[k];
      const int64_t shard_vocab = s.end - s.begin;
      if (cudaSetDevice(d.device) != cudaSuccess) return KernelStatus::kDeviceError;
      if (row0 > 0 && cudaStreamWaitEvent(d.stream, events.copied(), 0) != cudaSuccess) {
        return KernelStatus::kDeviceError;
      }
      LogitsGemmArgs gemm;
      gemm.weight = s.weight;
      gemm.weight_dtype = args.weight_dtype;
      gemm.hidden = s.hidden + row0 * args.hidden_dim;
      gemm.batch = rows;
      gemm.valid_vocab = shard_vocab;
      gemm.hidden_dim = args.hidden_dim;
      gemm.logits = static_cast<float*>(s.scratch);
      gemm.cast_hidden = static_cast<char*>(s.scratch) +
                         AlignUp256(static_cast<size_t>(chunk) * static_cast<size_t>(shard_vocab) *
                                    sizeof(float));
      if (const KernelStatus st = LaunchLogitsGemm(gemm, d.cublas, d.stream); st != KernelStatus::kOk) {
        return st;
      }
      if (events.RecordDone(k, d.stream) != cudaSuccess) return KernelStatus::kDeviceError;
    }

    // ---- 2. Shard 0's stream gathers the slices into [rows, valid_vocab]:
    // slice k's rows (pitch shard_vocab) land at column begin_k (pitch
    // valid_vocab). One strided peer copy per shard.
    if (cudaSetDevice(d0.device) != cudaSuccess) return KernelStatus::kDeviceError;
    for (int32_t k = 0; k < n; ++k) {
      const ShardedControlledShard& s = args.shards[k];
      const int64_t shard_vocab = s.end - s.begin;
      if (cudaStreamWaitEvent(d0.stream, events.done(k), 0) != cudaSuccess) {
        return KernelStatus::kDeviceError;
      }
      const size_t width = static_cast<size_t>(shard_vocab) * sizeof(float);
      if (CopyRows(gathered + s.begin, static_cast<size_t>(args.valid_vocab) * sizeof(float),
                   d0.device, s.scratch, width, args.devices[k].device, width,
                   static_cast<size_t>(rows), d0.stream) != cudaSuccess) {
        return KernelStatus::kDeviceError;
      }
    }
    if (events.RecordCopied(d0.stream) != cudaSuccess) return KernelStatus::kDeviceError;

    // ---- 3. The chunk's controlled sampling on GPU 0, global token ids.
    if (const KernelStatus st = LaunchControlledChunkFromLogits(
            gathered, lp, rows, row0, args.valid_vocab, args.params, args.controls, args.outputs,
            d0.stream);
        st != KernelStatus::kOk) {
      return st;
    }
  }
  // The next launch's GEMMs must not overwrite the scratch before the last
  // copies: the caller waits for every stream (WaitForShards) in between.
  return KernelStatus::kOk;
}

// ---- Controlled rows: gathered tile candidates -----------------------------------
size_t ShardedFusedControlledGatherBytes(int64_t batch, int64_t valid_vocab) {
  return FusedGather(batch, valid_vocab).total;
}

KernelStatus LaunchShardedFusedControlledSample(const ShardedFusedControlledArgs& args) {
  // ---- Arguments (nothing is enqueued when they are wrong: what stage 1
  // would refuse is checked here for every shard first).
  const int32_t n = args.num_shards;
  const FusedGatherLayout layout = FusedGather(args.batch, args.valid_vocab);
  if (!ValidControlledBatch(args, args.shards, layout.total) ||
      args.controls.draft_tokens != nullptr) {
    return KernelStatus::kInvalidArgument;
  }
  int64_t expected_begin = 0;
  for (int32_t k = 0; k < n; ++k) {
    const ShardedFusedControlledShard& s = args.shards[k];
    if (s.begin != expected_begin || s.end <= s.begin ||
        !FusedControlledStage1Valid(Stage1Args(args, s), s.begin) ||
        args.devices[k].stream == nullptr) {
      return KernelStatus::kInvalidArgument;
    }
    expected_begin = s.end;
  }
  if (expected_begin != args.valid_vocab) return KernelStatus::kInvalidArgument;

  LaunchEvents events(n);
  const int64_t tiles = layout.tiles;
  const size_t summary_bytes = FusedControlledTileSummaryBytes();
  const size_t candidate_bytes = FusedControlledTileCandidateBytes();
  char* gathered_summaries = static_cast<char*>(args.gather_scratch);
  char* gathered_candidates = gathered_summaries + layout.candidates_offset;

  // ---- 1. Stage 1 on every shard, on its stream.
  for (int32_t k = 0; k < n; ++k) {
    const ShardedFusedControlledShard& s = args.shards[k];
    const ShardDevice& d = args.devices[k];
    if (cudaSetDevice(d.device) != cudaSuccess) return KernelStatus::kDeviceError;
    if (const KernelStatus st = LaunchFusedControlledStage1(Stage1Args(args, s), s.begin, d.stream);
        st != KernelStatus::kOk) {
      return st;
    }
    if (events.RecordDone(k, d.stream) != cudaSuccess) return KernelStatus::kDeviceError;
  }

  // ---- 2. Shard 0's stream puts every shard's tiles in tile order: shard k's
  // [batch, tiles_k] cells land at tile column begin_k / 128 of [batch, tiles]
  // (stage 2 relies on ascending tile order: its selections give tied
  // logits to the earlier input, fused_controlled_sample.cu's LogitKey).
  const ShardDevice& d0 = args.devices[0];
  if (cudaSetDevice(d0.device) != cudaSuccess) return KernelStatus::kDeviceError;
  for (int32_t k = 0; k < n; ++k) {
    const ShardedFusedControlledShard& s = args.shards[k];
    const FusedControlledTiles t = FusedControlledTilesIn(s.workspace, args.batch, s.end - s.begin);
    const size_t tile0 = static_cast<size_t>(s.begin / 128);
    const size_t shard_tiles = static_cast<size_t>(t.tiles);
    if (cudaStreamWaitEvent(d0.stream, events.done(k), 0) != cudaSuccess ||
        CopyRows(gathered_summaries + tile0 * summary_bytes, static_cast<size_t>(tiles) * summary_bytes,
                 d0.device, t.summaries, shard_tiles * summary_bytes, args.devices[k].device,
                 shard_tiles * summary_bytes, static_cast<size_t>(args.batch), d0.stream) != cudaSuccess ||
        CopyRows(gathered_candidates + tile0 * candidate_bytes,
                 static_cast<size_t>(tiles) * candidate_bytes, d0.device, t.candidates,
                 shard_tiles * candidate_bytes, args.devices[k].device,
                 shard_tiles * candidate_bytes, static_cast<size_t>(args.batch), d0.stream) != cudaSuccess) {
      return KernelStatus::kDeviceError;
    }
  }

  // ---- 3. Stage 2 on GPU 0 over every tile.
  return LaunchFusedControlledStage2(gathered_summaries, gathered_candidates, tiles, args.batch,
                                     args.params, args.controls, args.outputs, d0.stream);
}

KernelStatus WaitForShards(ShardDevice* devices, int32_t num_shards, double timeout_seconds,
                           std::string* error) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  std::string what;
  for (int64_t spin = 0;; ++spin) {
    bool all_done = true;
    for (int32_t k = 0; k < num_shards && what.empty(); ++k) {
      const cudaError_t err = cudaStreamQuery(devices[k].stream);
      if (err == cudaErrorNotReady) {
        all_done = false;
      } else if (err != cudaSuccess) {
        what = std::string("GPU ") + std::to_string(devices[k].device) + ": " +
               cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
      }
      if (devices[k].comm != nullptr) {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(devices[k].comm, &async);
        if (r != ncclSuccess || async != ncclSuccess) {
          what = std::string("NCCL on GPU ") + std::to_string(devices[k].device) + ": " +
                 ncclGetErrorString(r != ncclSuccess ? r : async);
        }
      }
    }
    if (what.empty() && all_done) return KernelStatus::kOk;
    if (what.empty() && Clock::now() > deadline) {
      what = "the shards did not finish within " + std::to_string(timeout_seconds) +
             " s (a GPU or the NCCL exchange hung)";
    }
    if (!what.empty()) break;
    // A step takes tens to hundreds of microseconds: spin first, then yield.
    if (spin > 1000) std::this_thread::yield();
  }
  // Abort every communicator: frees peers blocked in the all-gather.
  for (int32_t k = 0; k < num_shards; ++k) {
    if (devices[k].comm != nullptr) {
      ncclCommAbort(devices[k].comm);
      devices[k].comm = nullptr;
    }
  }
  if (error != nullptr) *error = what;
  return KernelStatus::kDeviceError;
}

}  // namespace flashsampler::kernels
