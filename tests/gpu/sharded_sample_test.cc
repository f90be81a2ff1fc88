// Tests of vocabulary sharding (kernels/cuda/sharded_sample.h; ctest labels
// `gpu` and `multi_gpu`).
//
// - SimulatedShards* (any GPU count): the shards of W run one after another on
//   GPU 0 with FusedSampleArgs::token_offset / row_summaries, and
//   LaunchMergeShardSummaries merges them: the single-GPU kernel pieces of
//   sharding, without NCCL.
// - PeerExchangeOnOneGpu* (any GPU count): LaunchShardedSample with the
//   kPeerWrite exchange and every shard on GPU 0, against the hand merge
//   above (bit for bit) and the whole head.
// - TwoGpus* (need 2 GPUs; skipped with one, fail with none like every GPU
//   test): LaunchShardedSample over GPUs 0 and 1, with NCCL and with peer
//   writes, against the single-GPU sampler on GPU 0, same seeds: the tokens
//   are identical and log Z / log-probs agree to fp32 rounding, for even and
//   uneven splits and every stage-1 path; and the chi-square exactness of
//   both merge modes against the float64 softmax
//   (tests/common/goodness_of_fit.h).
// - Controlled rows: LaunchShardedControlledSample (gathered logits) against
//   its 1-shard launch and the CPU backend, LaunchShardedFusedControlledSample
//   (gathered tile candidates) against LaunchFusedControlledSample on the
//   whole head; both bit-identical, simulated on GPU 0 and on GPUs 0 and 1.
//
// Shard boundaries at multiples of 128 (what the server plans) give each shard
// the single-GPU tiles (or 64-token halves of them where the CUDA-core path
// picks a different tile size for the shard, stage1_shape.h), so every
// token's score is bit-identical and the tokens must match exactly.
// Boundaries at other multiples of 4 are allowed by the kernels; there only
// the tile (and, on the tensor-core path, the block shape) changes, so a
// mismatch is accepted only at a near-tie of the two best scores
// (CountTokenMismatches).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/shard_merge.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/materialized_sample.h"
#include "kernels/cuda/sharded_sample.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/gpu/controls_test_problems.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::GpuTest;
using gpu_test::HostWeights;
using gpu_test::SampleOutputs;

// log Z of different merge trees: fp32 rounding of sums over up to ~10^5 terms.
void ExpectLseClose(const SampleOutputs& a, const SampleOutputs& b) {
  ASSERT_EQ(a.logz.size(), b.logz.size());
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  for (size_t r = 0; r < a.logz.size(); ++r) {
    EXPECT_NEAR(a.logz[r], b.logz[r], 2e-5 * std::max(1.0f, std::fabs(a.logz[r]))) << "row " << r;
  }
  for (size_t r = 0; r < a.logprobs.size(); ++r) {
    EXPECT_NEAR(a.logprobs[r], b.logprobs[r], 2e-5 * std::max(1.0f, std::fabs(a.logz[r])))
        << "row " << r;
  }
}

// The rows [begin, end) of w as their own weights (a shard's slice of W).
HostWeights Slice(const HostWeights& w, int64_t begin, int64_t end) {
  HostWeights s = w;
  const size_t row_bytes = w.bytes.size() / static_cast<size_t>(w.vocab);
  s.vocab = end - begin;
  s.bytes.assign(w.bytes.begin() + begin * row_bytes, w.bytes.begin() + end * row_bytes);
  s.values.assign(w.values.begin() + begin * w.hidden, w.values.begin() + end * w.hidden);
  return s;
}

// The whole head on GPU 0 (the reference): fused, or materialized with cublas.
SampleOutputs RunWhole(const HostWeights& w, int64_t valid_vocab, const std::vector<float>& hidden,
                       const std::vector<RowParams>& params, bool want_lse,
                       cublasHandle_t cublas = nullptr) {
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  gpu_test::Problem problem{dw.ptr, w.dtype, w.vocab, valid_vocab, w.hidden};
  SampleOutputs out;
  EXPECT_EQ(gpu_test::RunSampler(problem, hidden, params, want_lse, &out, cublas), KernelStatus::kOk);
  return out;
}

// ---- Shards of one head on GPU 0, merged without NCCL ------------------------------
SampleOutputs RunSimulatedShards(const HostWeights& w, const std::vector<int64_t>& bounds,
                                 const std::vector<float>& hidden,
                                 const std::vector<RowParams>& params, bool want_lse,
                                 ShardMergeMode mode, cublasHandle_t cublas = nullptr) {
  SampleOutputs out;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  const int64_t batch = static_cast<int64_t>(params.size());
  const int32_t n = static_cast<int32_t>(bounds.size()) - 1;
  DeviceBuffer<float> d_hidden(hidden.size());
  DeviceBuffer<RowParams> d_params(params.size());
  DeviceBuffer<SampleSummary> d_gathered(static_cast<size_t>(batch * n));
  DeviceBuffer<float> d_shard_logz(static_cast<size_t>(batch));
  DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(batch));
  DeviceBuffer<float> d_logz(static_cast<size_t>(batch));
  DeviceBuffer<float> d_logprobs(static_cast<size_t>(batch));
  d_hidden.Upload(hidden);
  d_params.Upload(params);
  EXPECT_EQ(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), cudaSuccess);
  for (int32_t k = 0; k < n; ++k) {
    const HostWeights slice = Slice(w, bounds[k], bounds[k + 1]);
    DeviceWeights dw;
    gpu_test::UploadWeights(slice, 0, &dw);
    const size_t ws_bytes =
        cublas != nullptr
            ? MaterializedSampleWorkspaceBytes(batch, slice.vocab, w.hidden, w.dtype)
            : FusedSampleWorkspaceBytes(batch, slice.vocab, w.hidden);
    DeviceBuffer<uint8_t> d_workspace(ws_bytes);
    FusedSampleArgs a;
    a.weight = dw.ptr;
    a.weight_dtype = w.dtype;
    a.hidden = d_hidden.data();
    a.params = d_params.data();
    a.batch = batch;
    a.vocab = slice.vocab;
    a.valid_vocab = slice.vocab;
    a.hidden_dim = w.hidden;
    a.token_offset = bounds[k];
    a.row_summaries = d_gathered.data() + k * batch;
    a.logz = (want_lse || mode == ShardMergeMode::kGroupGumbel) ? d_shard_logz.data() : nullptr;
    a.workspace = d_workspace.data();
    a.workspace_bytes = ws_bytes;
    const KernelStatus s =
        cublas != nullptr ? LaunchMaterializedSample(a, cublas, nullptr) : LaunchFusedSample(a, nullptr);
    EXPECT_EQ(s, KernelStatus::kOk);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // before the slice's buffers go
  }
  EXPECT_EQ(LaunchMergeShardSummaries(d_gathered.data(), batch, n, d_params.data(), mode,
                                      d_tokens.data(), want_lse ? d_logz.data() : nullptr,
                                      want_lse ? d_logprobs.data() : nullptr, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.tokens = d_tokens.Download(static_cast<size_t>(batch));
  if (want_lse) {
    out.logz = d_logz.Download(static_cast<size_t>(batch));
    out.logprobs = d_logprobs.Download(static_cast<size_t>(batch));
  }
  return out;
}

class ShardedSampleTest : public GpuTest {};

// V = 20000 of which 19990 valid (the shards cover [0, 19990)), D = 256, random
// weights and inputs, 20% greedy rows. bf16 weights take the tensor-core
// stage 1 at every batch (1, 2, 5, 40), fp32 the CUDA-core one.
TEST_F(ShardedSampleTest, SimulatedShardsMatchTheWholeHead) {
  constexpr int64_t kVocab = 20000, kValid = 19990, kHidden = 256;
  for (CudaWeightDType dtype : {CudaWeightDType::kBFloat16, CudaWeightDType::kFloat32}) {
    const HostWeights w = gpu_test::RandomWeights(dtype, kVocab, kHidden, 0.05f, 17);
    for (int64_t batch : {1, 2, 5, 40}) {
      std::vector<float> hidden = gpu_test::RandomMatrix(batch, kHidden, 1.0f, 100 + batch, dtype);
      const std::vector<RowParams> params = gpu_test::RandomParams(batch, 0.2, 200 + batch);
      const SampleOutputs whole = RunWhole(w, kValid, hidden, params, true);
      // Aligned to 128 (even and uneven, three shards): identical scores.
      for (const std::vector<int64_t>& bounds :
           {std::vector<int64_t>{0, 9984, kValid}, std::vector<int64_t>{0, 128, kValid},
            std::vector<int64_t>{0, 4992, 15104, kValid}}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " batch "
                                          << batch << " first cut " << bounds[1]);
        const SampleOutputs sharded =
            RunSimulatedShards(w, bounds, hidden, params, true, ShardMergeMode::kExact);
        EXPECT_EQ(sharded.tokens, whole.tokens);
        ExpectLseClose(sharded, whole);
      }
      // Aligned to 4 only: different tiles; near-ties may flip.
      const SampleOutputs odd =
          RunSimulatedShards(w, {0, 4444, kValid}, hidden, params, true, ShardMergeMode::kExact);
      EXPECT_LE(gpu_test::CountTokenMismatches(odd.tokens, whole.tokens, w, hidden, params, 1e-3),
                batch / 10 + 1);
      ExpectLseClose(odd, whole);
    }
  }
}

// The materialized path per shard: its own GEMM per slice (cuBLAS may pick
// another algorithm for another shape), so near-ties may flip.
TEST_F(ShardedSampleTest, SimulatedMaterializedShardsMatchTheWholeHead) {
  constexpr int64_t kVocab = 20000, kHidden = 256, kBatch = 64;
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, 0.05f, 5);
  std::vector<float> hidden =
      gpu_test::RandomMatrix(kBatch, kHidden, 1.0f, 6, CudaWeightDType::kBFloat16);
  const std::vector<RowParams> params = gpu_test::RandomParams(kBatch, 0.2, 7);
  const SampleOutputs whole = RunWhole(w, kVocab, hidden, params, true, cublas);
  const SampleOutputs sharded = RunSimulatedShards(w, {0, 6016, kVocab}, hidden, params, true,
                                                   ShardMergeMode::kExact, cublas);
  EXPECT_LE(gpu_test::CountTokenMismatches(sharded.tokens, whole.tokens, w, hidden, params, 1e-3), 2);
  ExpectLseClose(sharded, whole);
  cublasDestroy(cublas);
}

// Group-Gumbel mode: greedy rows are the argmax, log Z is the exact mode's,
// and sampled rows take one of the shards' own winners.
TEST_F(ShardedSampleTest, SimulatedGroupGumbelKeepsGreedyRowsAndLogZ) {
  constexpr int64_t kVocab = 4096, kHidden = 64, kBatch = 64;
  const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, 0.1f, 8);
  std::vector<float> hidden = gpu_test::RandomMatrix(kBatch, kHidden, 1.0f, 9, CudaWeightDType::kBFloat16);
  const std::vector<RowParams> params = gpu_test::RandomParams(kBatch, 0.3, 10);
  const std::vector<int64_t> bounds = {0, 1024, kVocab};
  const SampleOutputs exact = RunSimulatedShards(w, bounds, hidden, params, true, ShardMergeMode::kExact);
  const SampleOutputs grouped =
      RunSimulatedShards(w, bounds, hidden, params, true, ShardMergeMode::kGroupGumbel);
  for (int64_t r = 0; r < kBatch; ++r) {
    if (params[r].temperature == 0.0f) {
      EXPECT_EQ(grouped.tokens[r], exact.tokens[r]) << "row " << r;
    }
    EXPECT_EQ(grouped.logz[r], exact.logz[r]) << "row " << r;
    EXPECT_GE(grouped.tokens[r], 0);
    EXPECT_LT(grouped.tokens[r], kVocab);
  }
}

// ---- LaunchShardedSample over a group of shards ------------------------------------
// One shard per entry of device_ids (GPU ordinals; repeats allowed with
// kPeerWrite, which uses no communicator): weights, inputs, buffers, stream,
// cuBLAS handle; the NCCL communicators for kNcclAllGather; peer access to
// device_ids[0] for kPeerWrite.
class ShardGroup {
 public:
  // bounds: {0, cut, ..., valid_vocab}; shard k on device_ids[k].
  ShardGroup(const HostWeights& w, const std::vector<int64_t>& bounds, int64_t max_batch,
             const std::vector<int>& device_ids, ShardExchange exchange)
      : w_(w), bounds_(bounds), max_batch_(max_batch), exchange_(exchange),
        shards_(device_ids.size()) {
    const int n = static_cast<int>(device_ids.size());
    EXPECT_EQ(static_cast<size_t>(n) + 1, bounds.size());
    std::vector<ncclComm_t> comms(device_ids.size(), nullptr);
    if (exchange == ShardExchange::kNcclAllGather && n > 1) {
      EXPECT_EQ(ncclCommInitAll(comms.data(), n, device_ids.data()), ncclSuccess);
    }
    for (int k = 0; k < n; ++k) {
      const int device = device_ids[static_cast<size_t>(k)];
      EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
      if (exchange == ShardExchange::kPeerWrite && device != device_ids[0]) {
        const cudaError_t err = cudaDeviceEnablePeerAccess(device_ids[0], 0);
        EXPECT_TRUE(err == cudaSuccess || err == cudaErrorPeerAccessAlreadyEnabled)
            << cudaGetErrorString(err);
        cudaGetLastError();  // AlreadyEnabled is not sticky; clear it
      }
      Shard& s = shards_[static_cast<size_t>(k)];
      s.device.device = device;
      s.device.comm = comms[static_cast<size_t>(k)];
      EXPECT_EQ(cudaStreamCreateWithFlags(&s.device.stream, cudaStreamNonBlocking), cudaSuccess);
      EXPECT_EQ(cublasCreate(&s.device.cublas), CUBLAS_STATUS_SUCCESS);
      // UploadWeights copies on the legacy stream; Run synchronizes the device
      // before its first launch.
      gpu_test::UploadWeights(Slice(w, bounds[k], bounds[k + 1]), 0, &s.weights);
      const int64_t rows = bounds[k + 1] - bounds[k];
      s.workspace_bytes =
          std::max(FusedSampleWorkspaceBytes(max_batch, rows, w.hidden),
                   MaterializedSampleWorkspaceBytes(max_batch, rows, w.hidden, w.dtype));
      s.workspace.Allocate(s.workspace_bytes);
      s.exchange.Allocate(ShardExchangeBytes(max_batch, n));
      s.hidden.Allocate(static_cast<size_t>(max_batch * w.hidden));
      s.params.Allocate(static_cast<size_t>(max_batch));
    }
    EXPECT_EQ(cudaSetDevice(device_ids[0]), cudaSuccess);
    tokens_.Allocate(static_cast<size_t>(max_batch));
    logz_.Allocate(static_cast<size_t>(max_batch));
    logprobs_.Allocate(static_cast<size_t>(max_batch));
  }
  ~ShardGroup() {
    for (Shard& s : shards_) {
      cudaSetDevice(s.device.device);
      if (s.device.stream != nullptr) cudaStreamSynchronize(s.device.stream);
      if (s.device.comm != nullptr) ncclCommDestroy(s.device.comm);
      if (s.device.cublas != nullptr) cublasDestroy(s.device.cublas);
      if (s.device.stream != nullptr) cudaStreamDestroy(s.device.stream);
    }
    cudaSetDevice(shards_[0].device.device);
  }

  // One sharded step; returns the outputs (tokens -1 / NaN where unwritten).
  SampleOutputs Run(const std::vector<float>& hidden, const std::vector<RowParams>& params,
                    bool want_lse, ShardMergeMode mode, bool materialized) {
    const int64_t batch = static_cast<int64_t>(params.size());
    const int32_t n = static_cast<int32_t>(shards_.size());
    EXPECT_LE(batch, max_batch_);
    std::vector<FusedSampleArgs> args(shards_.size());
    std::vector<void*> exchange(shards_.size());
    std::vector<ShardDevice> devices(shards_.size());
    for (int32_t k = 0; k < n; ++k) {
      Shard& s = shards_[static_cast<size_t>(k)];
      EXPECT_EQ(cudaSetDevice(s.device.device), cudaSuccess);
      s.hidden.Upload(hidden);
      s.params.Upload(params);
      // Stale summaries from an earlier step must not pass for this one's.
      EXPECT_EQ(cudaMemset(s.exchange.data(), 0xff, s.exchange.bytes()), cudaSuccess);
      // cudaMemcpy / cudaMemset order only against the legacy default stream;
      // the shards' streams are non-blocking: settle the device first.
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      FusedSampleArgs& a = args[static_cast<size_t>(k)];
      a.weight = s.weights.ptr;
      a.weight_dtype = w_.dtype;
      a.hidden = s.hidden.data();
      a.params = s.params.data();
      a.batch = batch;
      a.vocab = bounds_[k + 1] - bounds_[k];
      a.valid_vocab = a.vocab;
      a.hidden_dim = w_.hidden;
      a.token_offset = bounds_[k];
      a.workspace = s.workspace.data();
      a.workspace_bytes = s.workspace_bytes;
      exchange[static_cast<size_t>(k)] = s.exchange.data();
      devices[static_cast<size_t>(k)] = s.device;
    }
    EXPECT_EQ(cudaSetDevice(devices[0].device), cudaSuccess);
    EXPECT_EQ(cudaMemset(tokens_.data(), 0xff, tokens_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(logz_.data(), 0xff, logz_.bytes()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ShardedSampleArgs sharded;
    sharded.shard_args = args.data();
    sharded.exchange = exchange.data();
    sharded.devices = devices.data();
    sharded.num_shards = n;
    sharded.mode = mode;
    sharded.exchange_mode = exchange_;
    sharded.materialized = materialized;
    sharded.token_ids = tokens_.data();
    sharded.logz = want_lse ? logz_.data() : nullptr;
    sharded.logprobs = want_lse ? logprobs_.data() : nullptr;
    EXPECT_EQ(LaunchShardedSample(sharded), KernelStatus::kOk);
    std::string error;
    EXPECT_EQ(WaitForShards(devices.data(), n, 60.0, &error), KernelStatus::kOk) << error;
    for (int32_t k = 0; k < n; ++k) {
      shards_[static_cast<size_t>(k)].device.comm = devices[static_cast<size_t>(k)].comm;  // null if aborted
    }
    SampleOutputs out;
    EXPECT_EQ(cudaSetDevice(devices[0].device), cudaSuccess);
    out.tokens = tokens_.Download(static_cast<size_t>(batch));
    if (want_lse) {
      out.logz = logz_.Download(static_cast<size_t>(batch));
      out.logprobs = logprobs_.Download(static_cast<size_t>(batch));
    }
    return out;
  }

 private:
  struct Shard {
    ShardDevice device;
    DeviceWeights weights;
    DeviceBuffer<uint8_t> workspace;
    size_t workspace_bytes = 0;
    DeviceBuffer<uint8_t> exchange;
    DeviceBuffer<float> hidden;
    DeviceBuffer<RowParams> params;
  };
  const HostWeights& w_;
  std::vector<int64_t> bounds_;
  int64_t max_batch_;
  ShardExchange exchange_;
  std::vector<Shard> shards_;
  DeviceBuffer<int32_t> tokens_;
  DeviceBuffer<float> logz_;
  DeviceBuffer<float> logprobs_;
};

// kPeerWrite with every shard on GPU 0 (own streams): the launcher's peer
// exchange (slots of shard 0's buffer, events, the merge) against the whole
// head and against the shards merged by hand (RunSimulatedShards): the
// tokens are the whole head's and every output is the hand merge's, bit for
// bit, in both merge modes, fused and materialized.
TEST_F(ShardedSampleTest, PeerExchangeOnOneGpuMatchesTheWholeHead) {
  constexpr int64_t kVocab = 20000, kValid = 19990, kHidden = 256, kMaxBatch = 64;
  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, 0.05f, 23);
  for (const std::vector<int64_t>& bounds :
       {std::vector<int64_t>{0, 9984, kValid}, std::vector<int64_t>{0, 4992, 15104, kValid}}) {
    ShardGroup group(w, bounds, kMaxBatch, std::vector<int>(bounds.size() - 1, 0),
                     ShardExchange::kPeerWrite);
    for (int64_t batch : {int64_t{1}, int64_t{5}, kMaxBatch}) {
      SCOPED_TRACE(::testing::Message() << bounds.size() - 1 << " shards, batch " << batch);
      std::vector<float> hidden =
          gpu_test::RandomMatrix(batch, kHidden, 1.0f, 300 + batch, CudaWeightDType::kBFloat16);
      const std::vector<RowParams> params = gpu_test::RandomParams(batch, 0.2, 400 + batch);
      const SampleOutputs whole = RunWhole(w, kValid, hidden, params, true);
      for (ShardMergeMode mode : {ShardMergeMode::kExact, ShardMergeMode::kGroupGumbel}) {
        const SampleOutputs by_hand = RunSimulatedShards(w, bounds, hidden, params, true, mode);
        const SampleOutputs peer = group.Run(hidden, params, true, mode, false);
        EXPECT_EQ(peer.tokens, by_hand.tokens);
        EXPECT_EQ(peer.logz, by_hand.logz);
        EXPECT_EQ(peer.logprobs, by_hand.logprobs);
        if (mode == ShardMergeMode::kExact) {
          EXPECT_EQ(peer.tokens, whole.tokens);
          ExpectLseClose(peer, whole);
        }
      }
      EXPECT_EQ(group.Run(hidden, params, false, ShardMergeMode::kExact, false).tokens, whole.tokens);
      const SampleOutputs by_hand_m =
          RunSimulatedShards(w, bounds, hidden, params, true, ShardMergeMode::kExact, cublas);
      const SampleOutputs peer_m = group.Run(hidden, params, true, ShardMergeMode::kExact, true);
      EXPECT_EQ(peer_m.tokens, by_hand_m.tokens);
      EXPECT_EQ(peer_m.logz, by_hand_m.logz);
    }
  }
  cublasDestroy(cublas);
}

// Without communicators only kPeerWrite may run several shards.
TEST_F(ShardedSampleTest, AllGatherWithoutCommunicatorsIsRefused) {
  constexpr int64_t kVocab = 1024, kHidden = 64, kBatch = 4;
  const HostWeights w = gpu_test::RandomWeights(CudaWeightDType::kBFloat16, kVocab, kHidden, 0.1f, 3);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  DeviceBuffer<float> d_hidden(static_cast<size_t>(kBatch * kHidden));
  DeviceBuffer<RowParams> d_params(static_cast<size_t>(kBatch));
  DeviceBuffer<uint8_t> workspace(FusedSampleWorkspaceBytes(kBatch, kVocab / 2, kHidden));
  DeviceBuffer<uint8_t> exchange0(ShardExchangeBytes(kBatch, 2)), exchange1(ShardExchangeBytes(kBatch, 2));
  DeviceBuffer<int32_t> tokens(static_cast<size_t>(kBatch));
  FusedSampleArgs args[2];
  for (int k = 0; k < 2; ++k) {
    args[k].weight = dw.ptr;
    args[k].hidden = d_hidden.data();
    args[k].params = d_params.data();
    args[k].batch = kBatch;
    args[k].vocab = args[k].valid_vocab = kVocab / 2;
    args[k].hidden_dim = kHidden;
    args[k].token_offset = k * kVocab / 2;
    args[k].workspace = workspace.data();
    args[k].workspace_bytes = workspace.bytes();
  }
  void* exchange[2] = {exchange0.data(), exchange1.data()};
  ShardDevice devices[2];  // GPU 0, legacy stream, no communicators
  ShardedSampleArgs sharded;
  sharded.shard_args = args;
  sharded.exchange = exchange;
  sharded.devices = devices;
  sharded.num_shards = 2;
  sharded.token_ids = tokens.data();
  EXPECT_EQ(LaunchShardedSample(sharded), KernelStatus::kInvalidArgument);
  // The same shards with peer writes need no communicator. Greedy rows of
  // zeros: every logit is 0, and the tie goes to the lowest id, token 0.
  ASSERT_EQ(cudaMemset(d_hidden.data(), 0, d_hidden.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_params.data(), 0, d_params.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(tokens.data(), 0xff, tokens.bytes()), cudaSuccess);
  sharded.exchange_mode = ShardExchange::kPeerWrite;
  EXPECT_EQ(LaunchShardedSample(sharded), KernelStatus::kOk);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t t : tokens.Download(static_cast<size_t>(kBatch))) EXPECT_EQ(t, 0);
}

class TwoGpuShardedSampleTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    if (count < 2) GTEST_SKIP() << "needs 2 GPUs (ctest label multi_gpu), found " << count;
  }
};

// The acceptance test: same seeds, 1 vs 2 GPUs, even and uneven
// splits, every stage-1 path (bf16: CUDA cores at B <= 2, tensor cores above;
// fp32: CUDA cores), and the materialized path at B = 200; both exchanges.
TEST_F(TwoGpuShardedSampleTest, SameTokensAndLogZAsOneGpu) {
  constexpr int64_t kVocab = 50000, kValid = 49950, kHidden = 512, kMaxBatch = 200;
  for (CudaWeightDType dtype : {CudaWeightDType::kBFloat16, CudaWeightDType::kFloat32}) {
    const HostWeights w = gpu_test::RandomWeights(dtype, kVocab, kHidden, 0.05f, 31);
    for (const std::vector<int64_t>& bounds :
         {std::vector<int64_t>{0, 25088, kValid}, std::vector<int64_t>{0, 7936, kValid}}) {
      ShardGroup nccl(w, bounds, kMaxBatch, {0, 1}, ShardExchange::kNcclAllGather);
      ShardGroup peer(w, bounds, kMaxBatch, {0, 1}, ShardExchange::kPeerWrite);
      for (int64_t batch : {1, 2, 3, 16, 64}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " cut "
                                          << bounds[1] << " batch " << batch);
        std::vector<float> hidden = gpu_test::RandomMatrix(batch, kHidden, 1.0f, 40 + batch, dtype);
        const std::vector<RowParams> params = gpu_test::RandomParams(batch, 0.2, 50 + batch);
        const SampleOutputs one = RunWhole(w, kValid, hidden, params, true);
        const SampleOutputs two = nccl.Run(hidden, params, true, ShardMergeMode::kExact, false);
        EXPECT_EQ(two.tokens, one.tokens);
        ExpectLseClose(two, one);
        // Without log Z the shards skip the exponentials; tokens are unchanged.
        EXPECT_EQ(nccl.Run(hidden, params, false, ShardMergeMode::kExact, false).tokens, one.tokens);
        // The peer exchange moves the same summaries: the same bits.
        const SampleOutputs two_peer = peer.Run(hidden, params, true, ShardMergeMode::kExact, false);
        EXPECT_EQ(two_peer.tokens, two.tokens);
        EXPECT_EQ(two_peer.logz, two.logz);
        EXPECT_EQ(two_peer.logprobs, two.logprobs);
      }
      // Materialized per shard (the server's path above --cuda_fused_max_rows).
      cublasHandle_t cublas = nullptr;
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
      std::vector<float> hidden = gpu_test::RandomMatrix(kMaxBatch, kHidden, 1.0f, 60, dtype);
      const std::vector<RowParams> params = gpu_test::RandomParams(kMaxBatch, 0.2, 61);
      const SampleOutputs one = RunWhole(w, kValid, hidden, params, true, cublas);
      const SampleOutputs two = nccl.Run(hidden, params, true, ShardMergeMode::kExact, true);
      EXPECT_LE(gpu_test::CountTokenMismatches(two.tokens, one.tokens, w, hidden, params, 1e-3), 2);
      ExpectLseClose(two, one);
      const SampleOutputs two_peer = peer.Run(hidden, params, true, ShardMergeMode::kExact, true);
      EXPECT_EQ(two_peer.tokens, two.tokens);
      EXPECT_EQ(two_peer.logz, two.logz);
      cublasDestroy(cublas);
    }
  }
}

// Chi-square exactness of both merge modes on 2 GPUs. H = e_0, so the logits
// are W's column 0 exactly (bf16 values); hidden_dim 16 takes the tensor-core
// stage 1. V = 300 split 128 | 172 (uneven). Four heavy tokens (logit 2) sit
// on both sides of the cut and at the ends (p ~ 0.13 each at T = 0.8), the
// rest -(v % 50) / 8. 2^21 rows per launch (stream = row), 2 launches (offset
// = launch): 4.2M samples, so a 2% error on a heavy token shifts it by z ~ 15.
TEST_F(TwoGpuShardedSampleTest, BothMergeModesMatchFloat64Softmax) {
  constexpr int64_t kVocab = 300, kHidden = 16, kRows = int64_t{1} << 21, kCalls = 2;
  constexpr float kTemperature = 0.8f;
  const HostWeights w = gpu_test::MakeWeights(
      CudaWeightDType::kBFloat16, kVocab, kHidden, [](int64_t v, int64_t d) {
        if (d != 0) return 0.25f;  // multiplied by H's zeros
        if (v == 0 || v == 127 || v == 128 || v == 299) return 2.0f;
        return -0.125f * static_cast<float>(v % 50);
      });
  std::vector<float> logits(kVocab);
  for (int64_t v = 0; v < kVocab; ++v) logits[v] = w.values[v * kHidden];
  const std::vector<double> probs = flashsampler::testing::SoftmaxOfScaled(
      logits, kVocab, LogitScale(RowParams{kTemperature, 0, 0, 0}));

  ShardGroup shards(w, {0, 128, kVocab}, kRows, {0, 1}, ShardExchange::kNcclAllGather);
  std::vector<float> hidden(static_cast<size_t>(kRows * kHidden), 0.0f);
  for (int64_t r = 0; r < kRows; ++r) hidden[r * kHidden] = 1.0f;
  std::vector<RowParams> params(static_cast<size_t>(kRows));
  for (ShardMergeMode mode : {ShardMergeMode::kExact, ShardMergeMode::kGroupGumbel}) {
    SCOPED_TRACE(mode == ShardMergeMode::kExact ? "exact" : "group_gumbel");
    std::vector<int64_t> counts(kVocab, 0);
    int64_t out_of_range = 0;
    for (int64_t call = 0; call < kCalls; ++call) {
      for (int64_t r = 0; r < kRows; ++r) {
        params[r] = RowParams{kTemperature, 4242, static_cast<uint64_t>(call), static_cast<uint32_t>(r)};
      }
      for (int32_t t : shards.Run(hidden, params, false, mode, false).tokens) {
        if (t >= 0 && t < kVocab) {
          ++counts[t];
        } else {
          ++out_of_range;
        }
      }
    }
    EXPECT_EQ(out_of_range, 0);
    const auto fit = flashsampler::testing::ExpectCountsMatch(counts, probs, 7.0);
    EXPECT_EQ(fit.z_tested, 4);
  }
}

// ---- Controlled rows: the gathered-logits path ------------------------------------
// LaunchShardedControlledSample on [vocab, 1] fp32 heads (controls_test_problems.h):
// the logits are single fp32 products, so every GEMM shape rounds them
// identically and the split may change nothing: n shards must give exactly
// the 1-shard launch's outputs (tokens, log Z, log-probs, samples, ranks, top
// lists, draft log-probs), and both must agree with the CPU backend. Shard k
// runs on devices[k]: all on GPU 0 (own streams and cuBLAS handles) or on
// GPUs 0 and 1.
controls_test::Outputs RunShardedControlled(const controls_test::RandomProblem& p,
                                            const std::vector<int64_t>& bounds,
                                            const std::vector<int>& device_ids,
                                            const std::vector<int32_t>* drafts = nullptr) {
  controls_test::Outputs out;
  const int64_t vocab = static_cast<int64_t>(p.w.size());
  const int64_t rows = static_cast<int64_t>(p.h.size());
  const int32_t n = static_cast<int32_t>(bounds.size()) - 1;
  EXPECT_EQ(static_cast<int32_t>(device_ids.size()), n);
  FlatControls flat;
  EXPECT_EQ(FlattenControls(p.controls.data(), rows, vocab, vocab, &flat), KernelStatus::kOk);
  std::vector<uint8_t> packed(flat.PackedBytes());
  flat.PackTo(packed.data());

  struct Shard {
    DeviceBuffer<float> weight, hidden;
    DeviceBuffer<uint8_t> scratch;
  };
  std::vector<Shard> shards(static_cast<size_t>(n));
  std::vector<ShardDevice> devices(static_cast<size_t>(n));
  std::vector<ShardedControlledShard> slices(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) {
    EXPECT_EQ(cudaSetDevice(device_ids[k]), cudaSuccess);
    ShardDevice& d = devices[k];
    d.device = device_ids[k];
    EXPECT_EQ(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cublasCreate(&d.cublas), CUBLAS_STATUS_SUCCESS);
    Shard& s = shards[k];
    s.weight.Allocate(static_cast<size_t>(bounds[k + 1] - bounds[k]));
    s.weight.Upload(std::vector<float>(p.w.begin() + bounds[k], p.w.begin() + bounds[k + 1]));
    s.hidden.Allocate(p.h.size());
    s.hidden.Upload(p.h);
    const size_t scratch = ShardedControlledShardBytes(rows, bounds[k + 1] - bounds[k], 1,
                                                       CudaWeightDType::kFloat32);
    EXPECT_GT(scratch, 0u);
    s.scratch.Allocate(scratch);
    slices[k] = ShardedControlledShard{s.weight.data(), s.hidden.data(), bounds[k], bounds[k + 1],
                                       s.scratch.data(), scratch};
  }
  EXPECT_EQ(cudaSetDevice(device_ids[0]), cudaSuccess);
  DeviceBuffer<RowParams> dp(p.params.size());
  dp.Upload(p.params);
  DeviceBuffer<uint8_t> dc(packed.size());
  dc.Upload(packed);
  DeviceBuffer<int32_t> dd(static_cast<size_t>(rows));
  if (drafts != nullptr) dd.Upload(*drafts);
  controls_test::DeviceOutputs outputs(rows, flat.total_samples);
  const size_t gather = ShardedControlledGatherBytes(rows, vocab);
  EXPECT_GT(gather, 0u);
  DeviceBuffer<uint8_t> gather_scratch(gather);

  ShardedControlledArgs args;
  args.shards = slices.data();
  args.devices = devices.data();
  args.num_shards = n;
  args.weight_dtype = CudaWeightDType::kFloat32;
  args.batch = rows;
  args.hidden_dim = 1;
  args.valid_vocab = vocab;
  args.params = dp.data();
  args.controls = flat.DeviceView(dc.data());
  if (drafts != nullptr) args.controls.draft_tokens = dd.data();
  args.outputs = outputs.View();
  args.gather_scratch = gather_scratch.data();
  args.gather_scratch_bytes = gather;
  out.launch = LaunchShardedControlledSample(args);
  std::string error;
  EXPECT_EQ(WaitForShards(devices.data(), n, 60.0, &error), KernelStatus::kOk) << error;
  if (out.launch == KernelStatus::kOk) outputs.Download(flat, rows, &out, drafts != nullptr);
  for (ShardDevice& d : devices) {
    cudaSetDevice(d.device);
    cublasDestroy(d.cublas);
    cudaStreamDestroy(d.stream);
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  return out;
}

void ExpectIdentical(const controls_test::Outputs& a, const controls_test::Outputs& b) {
  ASSERT_EQ(a.launch, KernelStatus::kOk);
  ASSERT_EQ(b.launch, KernelStatus::kOk);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.row_status, b.row_status);
  ASSERT_EQ(a.logz.size(), b.logz.size());
  for (size_t r = 0; r < a.logz.size(); ++r) {
    EXPECT_EQ(a.logz[r], b.logz[r]) << "row " << r;  // same logits, same sums: bit-identical
    EXPECT_EQ(a.logprobs[r], b.logprobs[r]) << "row " << r;
  }
  ASSERT_EQ(a.details.size(), b.details.size());
  for (size_t r = 0; r < a.details.size(); ++r) {
    EXPECT_EQ(a.details[r].token_ids, b.details[r].token_ids) << "row " << r;
    EXPECT_EQ(a.details[r].ranks, b.details[r].ranks) << "row " << r;
    EXPECT_EQ(a.details[r].logprobs, b.details[r].logprobs) << "row " << r;
    ASSERT_EQ(a.details[r].top.size(), b.details[r].top.size()) << "row " << r;
    for (size_t i = 0; i < a.details[r].top.size(); ++i) {
      EXPECT_EQ(a.details[r].top[i].token_id, b.details[r].top[i].token_id) << "row " << r;
      EXPECT_EQ(a.details[r].top[i].logprob, b.details[r].top[i].logprob) << "row " << r;
    }
  }
  ASSERT_EQ(a.draft_logprobs.size(), b.draft_logprobs.size());
  for (size_t r = 0; r < a.draft_logprobs.size(); ++r) {
    if (std::isnan(a.draft_logprobs[r])) {
      EXPECT_TRUE(std::isnan(b.draft_logprobs[r])) << "row " << r;
    } else {
      EXPECT_EQ(a.draft_logprobs[r], b.draft_logprobs[r]) << "row " << r;
    }
  }
}

// Random controls of every kind (top-k up to 2000, top-p, min-p, penalties,
// bias, bans, bitmasks, top lists in both modes, several samples), 300 rows
// (two chunks), V = 20000: even, uneven and three-way splits at multiples of
// 128, one at a multiple of 4; with and without draft tokens.
TEST_F(ShardedSampleTest, SimulatedControlledShardsMatchOneShardAndTheCpu) {
  constexpr int64_t kVocab = 20000, kRows = kControlledChunkRows + 44;
  for (uint32_t seed : {71u, 72u}) {
    SCOPED_TRACE(seed);
    const controls_test::RandomProblem p =
        controls_test::MakeRandomProblem(kVocab, kRows, seed == 72u ? 0.25f : 0.0f, seed);
    std::vector<int32_t> drafts(static_cast<size_t>(kRows));
    for (int64_t r = 0; r < kRows; ++r) drafts[r] = r % 3 == 0 ? -1 : static_cast<int32_t>((r * 7919) % kVocab);
    for (const std::vector<int32_t>* d : {static_cast<const std::vector<int32_t>*>(nullptr),
                                          static_cast<const std::vector<int32_t>*>(&drafts)}) {
      SCOPED_TRACE(d == nullptr ? "no drafts" : "drafts");
      const controls_test::Outputs cpu = controls_test::RunCpu(p.w, p.h, p.params, p.controls, d);
      ASSERT_EQ(cpu.launch, KernelStatus::kOk);
      const controls_test::Outputs one = RunShardedControlled(p, {0, kVocab}, {0}, d);
      controls_test::ExpectAgrees(one, cpu, p);
      for (const std::vector<int64_t>& bounds :
           {std::vector<int64_t>{0, 9984, kVocab}, std::vector<int64_t>{0, 128, kVocab},
            std::vector<int64_t>{0, 4992, 15104, kVocab}, std::vector<int64_t>{0, 4444, kVocab}}) {
        SCOPED_TRACE(::testing::Message() << "first cut " << bounds[1]);
        const std::vector<int> on_gpu0(bounds.size() - 1, 0);
        ExpectIdentical(RunShardedControlled(p, bounds, on_gpu0, d), one);
      }
    }
  }
}

// Arguments that launch (checked first), then one field broken at a time:
// each is refused before anything is enqueued.
TEST_F(ShardedSampleTest, ControlledLauncherRejectsInconsistentShards) {
  constexpr int64_t kVocab = 1000, kRows = 4;
  const controls_test::RandomProblem p = controls_test::MakeRandomProblem(kVocab, kRows, 0.0f, 3);
  FlatControls flat;
  ASSERT_EQ(FlattenControls(p.controls.data(), kRows, kVocab, kVocab, &flat), KernelStatus::kOk);
  std::vector<uint8_t> packed(flat.PackedBytes());
  flat.PackTo(packed.data());
  DeviceBuffer<uint8_t> dc(packed.size());
  dc.Upload(packed);
  DeviceBuffer<RowParams> dp(p.params.size());
  dp.Upload(p.params);
  DeviceBuffer<float> weight(kVocab), hidden(kRows);
  weight.Upload(p.w);
  hidden.Upload(p.h);
  const size_t scratch_bytes = ShardedControlledShardBytes(kRows, 500, 1, CudaWeightDType::kFloat32);
  DeviceBuffer<uint8_t> scratch0(scratch_bytes), scratch1(scratch_bytes);
  const size_t gather_bytes = ShardedControlledGatherBytes(kRows, kVocab);
  DeviceBuffer<uint8_t> gather(gather_bytes);
  controls_test::DeviceOutputs outputs(kRows, flat.total_samples);
  ShardDevice devices[2];
  for (ShardDevice& d : devices) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cublasCreate(&d.cublas), CUBLAS_STATUS_SUCCESS);
  }
  ShardedControlledShard shards[2] = {
      {weight.data(), hidden.data(), 0, 500, scratch0.data(), scratch_bytes},
      {weight.data() + 500, hidden.data(), 500, kVocab, scratch1.data(), scratch_bytes}};
  ShardedControlledArgs good;
  good.shards = shards;
  good.devices = devices;
  good.num_shards = 2;
  good.weight_dtype = CudaWeightDType::kFloat32;
  good.batch = kRows;
  good.hidden_dim = 1;
  good.valid_vocab = kVocab;
  good.params = dp.data();
  good.controls = flat.DeviceView(dc.data());
  good.outputs = outputs.View();
  good.gather_scratch = gather.data();
  good.gather_scratch_bytes = gather_bytes;
  EXPECT_EQ(LaunchShardedControlledSample(good), KernelStatus::kOk);
  std::string error;
  EXPECT_EQ(WaitForShards(devices, 2, 60.0, &error), KernelStatus::kOk) << error;

  ShardedControlledArgs bad = good;
  bad.valid_vocab = kVocab + 4;  // the shards stop short of it
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  bad = good;
  bad.gather_scratch_bytes = gather_bytes - 256;
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  DeviceBuffer<int32_t> drafts(kRows);
  bad = good;
  bad.controls.draft_tokens = drafts.data();
  bad.outputs.draft_logprobs = nullptr;  // drafts without their output
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  ShardedControlledShard gap[2] = {shards[0], shards[1]};
  gap[1].begin = 504;  // tokens 500..503 would belong to no shard
  bad = good;
  bad.shards = gap;
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  ShardedControlledShard small[2] = {shards[0], shards[1]};
  small[1].scratch_bytes = scratch_bytes - 256;
  bad = good;
  bad.shards = small;
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  ShardDevice no_cublas[2] = {devices[0], devices[1]};
  no_cublas[1].cublas = nullptr;
  bad = good;
  bad.devices = no_cublas;
  EXPECT_EQ(LaunchShardedControlledSample(bad), KernelStatus::kInvalidArgument);
  EXPECT_EQ(WaitForShards(devices, 2, 60.0, &error), KernelStatus::kOk) << error;
  for (ShardDevice& d : devices) {
    cublasDestroy(d.cublas);
    cudaStreamDestroy(d.stream);
  }
}

// ---- Controlled rows: gathered tile candidates ----------------------------------
// LaunchShardedFusedControlledSample against LaunchFusedControlledSample on
// the whole head. Heads are [vocab, 16] bf16 with the problem's w in column 0
// (as fused_controlled_sample_test.cc): the shards' tiles are the whole
// head's, so every output must be bit-identical, row_status 2 included.
constexpr int64_t kFusedDim = 16;

struct Bf16Problem {
  std::vector<uint16_t> w;  // [vocab, kFusedDim]
  std::vector<float> h;     // [rows, kFusedDim]
};

Bf16Problem ToBf16Head(const controls_test::RandomProblem& p) {
  Bf16Problem b;
  const int64_t vocab = static_cast<int64_t>(p.w.size());
  const int64_t rows = static_cast<int64_t>(p.h.size());
  b.w.assign(static_cast<size_t>(vocab * kFusedDim), 0);
  for (int64_t v = 0; v < vocab; ++v) b.w[v * kFusedDim] = controls_test::Bf16Bits(p.w[v]);
  b.h.assign(static_cast<size_t>(rows * kFusedDim), 0.0f);
  for (int64_t r = 0; r < rows; ++r) b.h[r * kFusedDim] = p.h[r];
  return b;
}

// bounds = {0, vocab}: the whole head through LaunchFusedControlledSample;
// more: LaunchShardedFusedControlledSample with shard k on device_ids[k].
controls_test::Outputs RunFusedControlled(const controls_test::RandomProblem& p,
                                          const std::vector<int64_t>& bounds,
                                          const std::vector<int>& device_ids) {
  controls_test::Outputs out;
  const int64_t vocab = static_cast<int64_t>(p.w.size());
  const int64_t rows = static_cast<int64_t>(p.h.size());
  const int32_t n = static_cast<int32_t>(bounds.size()) - 1;
  const Bf16Problem b = ToBf16Head(p);
  FlatControls flat;
  EXPECT_EQ(FlattenControls(p.controls.data(), rows, vocab, vocab, &flat), KernelStatus::kOk);
  std::vector<uint8_t> packed(flat.PackedBytes());
  flat.PackTo(packed.data());

  struct Shard {
    DeviceBuffer<uint16_t> weight;
    DeviceBuffer<float> hidden;
    DeviceBuffer<RowParams> params;
    DeviceBuffer<uint8_t> controls, workspace;
  };
  std::vector<Shard> shards(static_cast<size_t>(n));
  std::vector<ShardDevice> devices(static_cast<size_t>(n));
  std::vector<ShardedFusedControlledShard> slices(static_cast<size_t>(n));
  for (int32_t k = 0; k < n; ++k) {
    EXPECT_EQ(cudaSetDevice(device_ids[k]), cudaSuccess);
    devices[k].device = device_ids[k];
    EXPECT_EQ(cudaStreamCreateWithFlags(&devices[k].stream, cudaStreamNonBlocking), cudaSuccess);
    Shard& s = shards[k];
    const int64_t shard_vocab = bounds[k + 1] - bounds[k];
    s.weight.Allocate(static_cast<size_t>(shard_vocab * kFusedDim));
    s.weight.Upload(std::vector<uint16_t>(b.w.begin() + bounds[k] * kFusedDim,
                                          b.w.begin() + bounds[k + 1] * kFusedDim));
    s.hidden.Allocate(b.h.size());
    s.hidden.Upload(b.h);
    s.params.Allocate(p.params.size());
    s.params.Upload(p.params);
    s.controls.Allocate(packed.size());
    s.controls.Upload(packed);
    const size_t ws = FusedControlledWorkspaceBytes(rows, shard_vocab, kFusedDim);
    EXPECT_GT(ws, 0u);
    s.workspace.Allocate(ws);
    slices[k] = ShardedFusedControlledShard{s.weight.data(), s.hidden.data(), s.params.data(),
                                            flat.DeviceView(s.controls.data()), bounds[k],
                                            bounds[k + 1], s.workspace.data(), ws};
  }
  EXPECT_EQ(cudaSetDevice(device_ids[0]), cudaSuccess);
  controls_test::DeviceOutputs outputs(rows, flat.total_samples);
  if (n == 1) {
    ControlledSampleArgs a;
    a.weight = shards[0].weight.data();
    a.weight_dtype = CudaWeightDType::kBFloat16;
    a.hidden = shards[0].hidden.data();
    a.params = shards[0].params.data();
    a.batch = rows;
    a.vocab = a.valid_vocab = vocab;
    a.hidden_dim = kFusedDim;
    a.controls = slices[0].controls;
    a.outputs = outputs.View();
    a.workspace = slices[0].workspace;
    a.workspace_bytes = slices[0].workspace_bytes;
    out.launch = LaunchFusedControlledSample(a, devices[0].stream);
  } else {
    const size_t gather = ShardedFusedControlledGatherBytes(rows, vocab);
    EXPECT_GT(gather, 0u);
    DeviceBuffer<uint8_t> gather_scratch(gather);
    ShardedFusedControlledArgs args;
    args.shards = slices.data();
    args.devices = devices.data();
    args.num_shards = n;
    args.weight_dtype = CudaWeightDType::kBFloat16;
    args.batch = rows;
    args.hidden_dim = kFusedDim;
    args.valid_vocab = vocab;
    args.params = shards[0].params.data();
    args.controls = slices[0].controls;
    args.outputs = outputs.View();
    args.gather_scratch = gather_scratch.data();
    args.gather_scratch_bytes = gather;
    out.launch = LaunchShardedFusedControlledSample(args);
    std::string error;
    EXPECT_EQ(WaitForShards(devices.data(), n, 60.0, &error), KernelStatus::kOk) << error;
  }
  EXPECT_EQ(cudaSetDevice(device_ids[0]), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (out.launch == KernelStatus::kOk) outputs.Download(flat, rows, &out);
  for (ShardDevice& d : devices) {
    cudaSetDevice(d.device);
    cudaStreamDestroy(d.stream);
  }
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  return out;
}

// Rows the fused path serves (top_k 1..64 with any other control but raw-mode
// top lists, or no filter), 40 rows, V = 20000 (157 tiles, the last partial):
// even, uneven and three-way splits at multiples of 128. With heavy ties
// (tie_step 0.25) some rows' top-k crowd one tile: both runs hand those
// batches back with row_status 2, in the same rows.
TEST_F(ShardedSampleTest, SimulatedFusedControlledShardsMatchTheWholeHead) {
  constexpr int64_t kVocab = 20000, kRows = 40;
  int64_t served = 0, handed_back = 0;
  for (uint32_t seed : {91u, 92u, 93u, 94u}) {
    SCOPED_TRACE(seed);
    const controls_test::RandomProblem p = controls_test::MakeRandomProblem(
        kVocab, kRows, seed % 2 == 0 ? 0.25f : 0.0f, seed, /*fused_only=*/true);
    const controls_test::Outputs whole = RunFusedControlled(p, {0, kVocab}, {0});
    ASSERT_EQ(whole.launch, KernelStatus::kOk);
    const bool back = std::count(whole.row_status.begin(), whole.row_status.end(),
                                 kFusedRowNotServed) > 0;
    (back ? handed_back : served) += 1;
    if (!back) {
      const controls_test::Outputs cpu = controls_test::RunCpu(p.w, p.h, p.params, p.controls);
      controls_test::ExpectAgrees(whole, cpu, p);
    }
    for (const std::vector<int64_t>& bounds :
         {std::vector<int64_t>{0, 9984, kVocab}, std::vector<int64_t>{0, 128, kVocab},
          std::vector<int64_t>{0, 4992, 15104, kVocab}}) {
      SCOPED_TRACE(::testing::Message() << "first cut " << bounds[1]);
      const controls_test::Outputs sharded =
          RunFusedControlled(p, bounds, std::vector<int>(bounds.size() - 1, 0));
      EXPECT_EQ(sharded.row_status, whole.row_status);
      if (!back) ExpectIdentical(sharded, whole);
    }
  }
  EXPECT_GT(served, 0);
}

TEST_F(TwoGpuShardedSampleTest, FusedControlledRowsMatchOneGpu) {
  constexpr int64_t kVocab = 20000, kRows = 40;
  const controls_test::RandomProblem p =
      controls_test::MakeRandomProblem(kVocab, kRows, 0.0f, 95, /*fused_only=*/true);
  const controls_test::Outputs whole = RunFusedControlled(p, {0, kVocab}, {0});
  ASSERT_EQ(whole.launch, KernelStatus::kOk);
  ExpectIdentical(RunFusedControlled(p, {0, 9984, kVocab}, {0, 1}), whole);
  ExpectIdentical(RunFusedControlled(p, {0, 4992, kVocab}, {1, 0}), whole);
}

TEST_F(TwoGpuShardedSampleTest, ControlledRowsMatchOneGpu) {
  constexpr int64_t kVocab = 20000, kRows = kControlledChunkRows + 44;
  const controls_test::RandomProblem p = controls_test::MakeRandomProblem(kVocab, kRows, 0.0f, 81);
  std::vector<int32_t> drafts(static_cast<size_t>(kRows));
  for (int64_t r = 0; r < kRows; ++r) drafts[r] = r % 3 == 0 ? -1 : static_cast<int32_t>((r * 104729) % kVocab);
  for (const std::vector<int32_t>* d : {static_cast<const std::vector<int32_t>*>(nullptr),
                                        static_cast<const std::vector<int32_t>*>(&drafts)}) {
    SCOPED_TRACE(d == nullptr ? "no drafts" : "drafts");
    const controls_test::Outputs one = RunShardedControlled(p, {0, kVocab}, {0}, d);
    ExpectIdentical(RunShardedControlled(p, {0, 9984, kVocab}, {0, 1}, d), one);
    ExpectIdentical(RunShardedControlled(p, {0, 4992, kVocab}, {1, 0}, d), one);
  }
}

}  // namespace
}  // namespace flashsampler::kernels
