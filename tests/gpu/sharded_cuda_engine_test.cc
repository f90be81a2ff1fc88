// The sharded CUDA Engine (server/engine/sharded_cuda_engine.cc), picked by MakeEngine
// for several devices, against the single-GPU engine on the same demo LM head
// (ctest labels `gpu`, `multi_gpu`): same seeds give the same tokens (the
// noise is keyed by the global token id and the shards' tiles are the
// single-GPU tiles or their halves), log Z and log-probs agree to fp32 rounding, through the
// fused and the materialized paths, for an even and an uneven split, and
// --shard_exchange=peer gives the nccl exchange's bits; rows
// with sampling controls and draft rows through the gathered-logits path. Needs 2
// GPUs: skipped with one, fails with none (like every GPU test).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "server/engine/engine.h"
#include "tests/gpu/engine_test_batches.h"

namespace flashsampler {
namespace {

constexpr int64_t kVocab = 32000;
constexpr int64_t kHidden = 512;

SampleBatch RandomBatch(int64_t rows, uint64_t seed) {
  return testing::RandomEngineBatch(rows, kHidden, seed);
}

class ShardedCudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
    ASSERT_TRUE(CudaShardingAvailable()) << "built without NCCL: this test should not exist";
    if (VisibleCudaDeviceCount() < 2) {
      GTEST_SKIP() << "needs 2 GPUs (ctest label multi_gpu), found " << VisibleCudaDeviceCount();
    }
  }
};

TEST_F(ShardedCudaEngineTest, SameTokensAsOneGpuOnBothPaths) {
  EngineOptions options;
  options.valid_vocab = kVocab - 13;
  options.max_batch_rows = 96;
  options.cuda.fused_max_rows = 32;  // larger batches: the materialized path
  options.cuda.devices = {0};
  absl::StatusOr<std::unique_ptr<Engine>> one = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const std::vector<double>& split : {std::vector<double>{}, std::vector<double>{1.0, 3.0}}) {
    SCOPED_TRACE(split.empty() ? "even split" : "split 1:3");
    options.cuda.devices = {0, 1};
    options.cuda.shard_split = split;
    absl::StatusOr<std::unique_ptr<Engine>> two =
        MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ((*two)->backend_name(), "cuda");
    EXPECT_EQ((*two)->shape().valid_vocab, kVocab - 13);
    EXPECT_EQ((*two)->DeviceMemory().size(), 2u);
    int64_t rows = 0, materialized_mismatches = 0;
    uint64_t seed = 1;
    for (int64_t batch_rows : {1, 2, 3, 16, 32, 33, 96}) {
      for (int rep = 0; rep < 4; ++rep) {
        SampleBatch batch = RandomBatch(batch_rows, seed++);
        absl::StatusOr<SampleResult> a = (*one)->Sample(batch);
        absl::StatusOr<SampleResult> b = (*two)->Sample(batch);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        for (int64_t r = 0; r < batch_rows; ++r) {
          ++rows;
          if (batch_rows <= options.cuda.fused_max_rows) {
            EXPECT_EQ(b->token_ids[r], a->token_ids[r]) << "batch " << batch_rows << " row " << r;
          } else if (b->token_ids[r] != a->token_ids[r]) {
            ++materialized_mismatches;  // cuBLAS per shard shape: near-ties may flip
          }
          EXPECT_NEAR(b->logz[r], a->logz[r], 2e-5f * std::max(1.0f, std::abs(a->logz[r])));
          EXPECT_NEAR(b->logprobs[r], a->logprobs[r], 2e-5f * std::max(1.0f, std::abs(a->logz[r])));
        }
      }
    }
    EXPECT_LE(materialized_mismatches * 1000, rows);
    EXPECT_TRUE((*two)->healthy());

    // --shard_exchange=peer moves the same summaries: the same bits as nccl.
    options.cuda.shard_exchange = ShardExchange::kPeerWrite;
    absl::StatusOr<std::unique_ptr<Engine>> peer =
        MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
    options.cuda.shard_exchange = ShardExchange::kNcclAllGather;
    ASSERT_TRUE(peer.ok()) << peer.status();
    for (int64_t batch_rows : {1, 16, 96}) {
      SampleBatch batch = RandomBatch(batch_rows, seed++);
      absl::StatusOr<SampleResult> a = (*two)->Sample(batch);
      absl::StatusOr<SampleResult> b = (*peer)->Sample(batch);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(b->token_ids, a->token_ids) << "batch " << batch_rows;
      EXPECT_EQ(b->logz, a->logz) << "batch " << batch_rows;
      EXPECT_EQ(b->logprobs, a->logprobs) << "batch " << batch_rows;
    }
    EXPECT_TRUE((*peer)->healthy());
  }
}

TEST_F(ShardedCudaEngineTest, GroupGumbelModeAndRefusals) {
  EngineOptions options;
  options.max_batch_rows = 64;
  options.cuda.devices = {0, 1};
  options.cuda.shard_merge = ShardMergeMode::kGroupGumbel;
  absl::StatusOr<std::unique_ptr<Engine>> grouped =
      MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 4), options);
  ASSERT_TRUE(grouped.ok()) << grouped.status();
  options.cuda.shard_merge = ShardMergeMode::kExact;
  absl::StatusOr<std::unique_ptr<Engine>> exact =
      MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 4), options);
  ASSERT_TRUE(exact.ok()) << exact.status();
  SampleBatch batch = RandomBatch(64, 77);
  absl::StatusOr<SampleResult> g = (*grouped)->Sample(batch);
  absl::StatusOr<SampleResult> e = (*exact)->Sample(batch);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(e.ok()) << e.status();
  for (int64_t r = 0; r < batch.rows; ++r) {
    if (batch.params[r].temperature == 0.0f) {
      EXPECT_EQ(g->token_ids[r], e->token_ids[r]);
    }
    EXPECT_EQ(g->logz[r], e->logz[r]);
  }

  SampleBatch big = RandomBatch(65, 7);
  EXPECT_EQ((*exact)->Sample(big).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*exact)->healthy());

  // Bad device lists fail at construction with a clear status.
  options.cuda.devices = {0, 99};
  EXPECT_EQ(MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 4), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.cuda.devices = {1, 1};
  EXPECT_EQ(MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 4), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// True when the fused controlled path serves every row of `b`, decided as
// the engine does, from the flattened controls.
bool FusedServesEveryRow(const SampleBatch& b, int64_t vocab, int64_t valid_vocab) {
  kernels::FlatControls flat;
  if (b.controls.empty() || kernels::FlattenControls(b.controls.data(), b.rows, vocab, valid_vocab,
                                                     &flat) != kernels::KernelStatus::kOk) {
    return false;
  }
  return std::none_of(flat.rows.begin(), flat.rows.end(), [](const kernels::ControlledRowDesc& d) {
    return kernels::FusedRowKindOf(d) == kernels::kFusedUnservedRow;
  });
}

// Rows the fused controlled path serves: top_k 1..64 with anything but
// raw-mode top lists, or no filter and no top list.
void MakeFusedServed(SampleBatch* b) {
  for (int64_t r = 0; r < b->rows; ++r) {
    RowControls& c = b->controls[r];
    c.logprobs_mode = LogprobsMode::kSampled;
    if (c.top_k > 64) c.top_k = 64;
    if (c.top_k == 0 && r % 2 == 0) c.top_k = 1 + static_cast<int32_t>(r % 64);
    if (c.top_k == 0) {
      c.top_p = 1.0f;
      c.min_p = 0.0f;
      c.top_logprobs = 0;
      c.num_samples = 1;
    }
  }
}

// Rows with sampling controls and draft rows (both controlled paths)
// against the single-GPU engine on its materialized controlled path: the same
// kernel over the same logits up to cuBLAS's rounding for another GEMM shape,
// (or, for batches the fused controlled path serves, the tensor-core GEMM
// against cuBLAS), so identical samples on >= 99.9% of rows and, on those,
// log Z, log-probs and top lists to rounding. Batches of 1 to 300 rows (two chunks), even and
// uneven splits, drafts with and without controls; a row with every token
// masked fails its batch with FailedPrecondition and the engine stays up.
TEST_F(ShardedCudaEngineTest, ControlsAndDraftsMatchOneGpu) {
  constexpr int64_t kValid = kVocab - 13;
  EngineOptions options;
  options.valid_vocab = kValid;
  options.max_batch_rows = 300;
  options.cuda.fused_max_rows = 0;  // one GPU: the materialized controlled path
  options.cuda.devices = {0};
  absl::StatusOr<std::unique_ptr<Engine>> one = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(one.ok()) << one.status();
  for (const std::vector<double>& split : {std::vector<double>{}, std::vector<double>{1.0, 3.0}}) {
    SCOPED_TRACE(split.empty() ? "even split" : "split 1:3");
    options.cuda.devices = {0, 1};
    options.cuda.shard_split = split;
    options.cuda.fused_max_rows = 32;
    absl::StatusOr<std::unique_ptr<Engine>> two =
        MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_TRUE((*two)->serves_draft_rows(true));
    int64_t rows = 0, mismatches = 0;
    uint64_t seed = 100;
    for (int64_t batch_rows : {1, 3, 40, 300}) {
      for (int variant = 0; variant < 4; ++variant) {
        // 0: controls; 1: controls and drafts; 2: plain rows with drafts;
        // 3: controls the fused controlled path serves (gathered candidates
        // up to fused_max_rows rows).
        SampleBatch batch = variant == 2
                                ? RandomBatch(batch_rows, seed++)
                                : testing::RandomControlledEngineBatch(batch_rows, kHidden, kVocab,
                                                                       kValid, seed++);
        if (variant == 3) MakeFusedServed(&batch);
        if (variant == 1 || variant == 2) {
          batch.draft_tokens.resize(static_cast<size_t>(batch_rows));
          for (int64_t r = 0; r < batch_rows; ++r) {
            batch.draft_tokens[r] = r % 4 == 0 ? -1 : static_cast<int32_t>((r * 7919 + seed) % kValid);
          }
        }
        absl::StatusOr<SampleResult> a = (*one)->Sample(batch);
        absl::StatusOr<SampleResult> b = (*two)->Sample(batch);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        // The engine takes the gathered-candidates path for a batch without
        // drafts, of at most fused_max_rows rows, whose every row the fused
        // controlled path serves (variant 3 always; a small variant-0 batch
        // may happen to).
        const bool servable = batch.draft_tokens.empty() && FusedServesEveryRow(batch, kVocab, kValid);
        if (variant == 3) {
          EXPECT_TRUE(servable);
        }
        const bool fused = servable && batch_rows <= options.cuda.fused_max_rows;
        EXPECT_EQ(b->path, fused ? LaunchPath::kShardedFusedControlled : LaunchPath::kShardedControlled)
            << LaunchPathName(b->path);
        // Plain rows (variant 2): one GPU's plain path returns no details;
        // compare the tokens.
        const bool with_details = variant != 2;
        if (with_details) {
          ASSERT_EQ(b->details.size(), static_cast<size_t>(batch_rows));
          ASSERT_EQ(a->details.size(), static_cast<size_t>(batch_rows));
        }
        ASSERT_EQ(b->token_ids.size(), static_cast<size_t>(batch_rows));
        for (int64_t r = 0; r < batch_rows; ++r) {
          ++rows;
          const bool same = with_details ? a->details[r].token_ids == b->details[r].token_ids
                                         : a->token_ids[r] == b->token_ids[r];
          if (!same) {
            ++mismatches;  // a near-tie rounded differently by the other GEMM shape
            continue;
          }
          const float tol = 1e-4f * std::max(1.0f, std::abs(a->logz[r]));
          EXPECT_NEAR(b->logz[r], a->logz[r], tol) << "row " << r;
          EXPECT_NEAR(b->logprobs[r], a->logprobs[r], tol) << "row " << r;
          if (with_details) {
            const RowSampleDetail& ad = a->details[r];
            const RowSampleDetail& bd = b->details[r];
            ASSERT_EQ(bd.top.size(), ad.top.size()) << "row " << r;
            for (size_t i = 0; i < ad.top.size(); ++i) {
              EXPECT_NEAR(bd.top[i].logprob, ad.top[i].logprob, tol) << "row " << r;
            }
          }
          if (variant == 1 || variant == 2) {
            ASSERT_EQ(b->draft_logprobs.size(), static_cast<size_t>(batch_rows));
            const float x = a->draft_logprobs[r], y = b->draft_logprobs[r];
            if (std::isnan(x) || std::isinf(x)) {
              EXPECT_EQ(std::isnan(y), std::isnan(x)) << "row " << r;
              EXPECT_EQ(std::isinf(y), std::isinf(x)) << "row " << r;
            } else {
              EXPECT_NEAR(y, x, tol) << "row " << r;
            }
          }
        }
      }
    }
    EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows;
    EXPECT_GT(rows, 1000);

    // Every token masked on one row: FailedPrecondition, the engine serves on.
    SampleBatch masked = testing::RandomControlledEngineBatch(4, kHidden, kVocab, kValid, 7);
    masked.controls[2].allowed_bitmask.assign((kVocab + 31) / 32, 0u);
    EXPECT_EQ((*two)->Sample(masked).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*two)->healthy());
    EXPECT_TRUE((*two)->Sample(RandomBatch(4, 8)).ok());
  }
}

// A step that outlives --shard_timeout_s is treated as a hang: the NCCL
// communicators are aborted, the batch fails with Internal, the engine turns
// unhealthy (the server reports NOT_SERVING) and refuses later batches instead
// of waiting on a dead group. A 1 us limit makes any real step "hang".
TEST_F(ShardedCudaEngineTest, HungStepIsAbortedAndTheEngineStopsServing) {
  EngineOptions options;
  options.max_batch_rows = 1024;
  options.cuda.devices = {0, 1};
  options.cuda.shard_timeout_s = 1e-6;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 4), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<SampleResult> r = (*engine)->Sample(RandomBatch(1024, 3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("did not finish"), std::string::npos)
      << r.status();
  EXPECT_FALSE((*engine)->healthy());
  EXPECT_EQ((*engine)->Sample(RandomBatch(1, 4)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace flashsampler
