// The CUDA Engine with sampling controls (server/engine/cuda_controlled_runner.h)
// against the CPU Engine on the same demo LM head: same seeds give the same
// tokens on >= 99.9% of rows with random controls, plain and controlled rows
// mixed, batches above the fused limit and the controlled chunk size; a row
// with every token masked fails the batch with the CPU's FailedPrecondition
// while the engine stays healthy and serves the next batch; details (samples,
// ranks, top lists) agree. The same with the fused controlled path
// (batches of rows it serves), including a batch it hands back to the
// materialized path (a tile holds more of a row's top-k than it keeps).
// Needs a GPU: FAILS (does not skip) without one.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/fused_sample.h"
#include "server/engine/cuda_controlled_runner.h"
#include "server/engine/engine.h"
#include "server/model/safetensors_writer.h"
#include "tests/common/scoped_temp_dir.h"
#include "tests/gpu/engine_test_batches.h"

namespace flashsampler {
namespace {

constexpr int64_t kVocab = 5000;
constexpr int64_t kValid = kVocab - 7;
constexpr int64_t kHidden = 256;

SampleBatch RandomControlledBatch(int64_t rows, uint64_t seed) {
  return testing::RandomControlledEngineBatch(rows, kHidden, kVocab, kValid, seed);
}

struct Engines {
  std::unique_ptr<Engine> cuda, cpu;
};

Engines MakeEngines(int64_t max_rows, int64_t fused_max_rows = 4) {
  EngineOptions options;
  options.valid_vocab = kValid;
  options.max_batch_rows = max_rows;
  options.cuda.fused_max_rows = fused_max_rows;
  Engines e;
  absl::StatusOr<std::unique_ptr<Engine>> cuda = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  EXPECT_TRUE(cuda.ok()) << cuda.status();
  absl::StatusOr<std::unique_ptr<Engine>> cpu = MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 9), options);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (cuda.ok()) e.cuda = std::move(*cuda);
  if (cpu.ok()) e.cpu = std::move(*cpu);
  return e;
}

// The CUDA engine on the demo head under the default options (the fused
// kernel for every batch size), with CudaEngineOptions::batch_invariant.
absl::StatusOr<std::unique_ptr<Engine>> DefaultCudaEngine(int64_t max_rows, bool batch_invariant = false) {
  EngineOptions options;
  options.valid_vocab = kValid;
  options.max_batch_rows = max_rows;
  options.cuda.batch_invariant = batch_invariant;
  return MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
}

// Row i of x and row j of y are the same bit for bit: token, log Z, logprob,
// draft log-probability (when both have one), samples, ranks, top lists.
void ExpectSameRow(const SampleResult& x, int64_t i, const SampleResult& y, int64_t j) {
  EXPECT_EQ(x.token_ids[i], y.token_ids[j]);
  EXPECT_EQ(0, std::memcmp(&x.logz[i], &y.logz[j], sizeof(float)));
  EXPECT_EQ(0, std::memcmp(&x.logprobs[i], &y.logprobs[j], sizeof(float)));
  ASSERT_EQ(x.draft_logprobs.empty(), y.draft_logprobs.empty());
  if (!x.draft_logprobs.empty()) {
    EXPECT_EQ(0, std::memcmp(&x.draft_logprobs[i], &y.draft_logprobs[j], sizeof(float)));
  }
  EXPECT_EQ(x.details[i].token_ids, y.details[j].token_ids);
  EXPECT_EQ(x.details[i].ranks, y.details[j].ranks);
  ASSERT_EQ(x.details[i].logprobs.size(), y.details[j].logprobs.size());
  EXPECT_EQ(0, std::memcmp(x.details[i].logprobs.data(), y.details[j].logprobs.data(),
                           sizeof(float) * x.details[i].logprobs.size()));
  ASSERT_EQ(x.details[i].top.size(), y.details[j].top.size());
  for (size_t t = 0; t < x.details[i].top.size(); ++t) {
    EXPECT_EQ(x.details[i].top[t].token_id, y.details[j].top[t].token_id);
    EXPECT_EQ(0, std::memcmp(&x.details[i].top[t].logprob, &y.details[j].top[t].logprob, sizeof(float)));
  }
}

// Row r of `from` (hidden state, params, controls, draft) into row `slot` of `into`.
void CopyRow(const SampleBatch& from, int64_t r, SampleBatch* into, int64_t slot) {
  std::copy(from.hidden.begin() + r * kHidden, from.hidden.begin() + (r + 1) * kHidden,
            into->hidden.begin() + slot * kHidden);
  into->params[slot] = from.params[r];
  into->controls[slot] = from.controls[r];
  if (!from.draft_tokens.empty()) into->draft_tokens[slot] = from.draft_tokens[r];
}

// Samples each row of `test` alone, then inside batches of each size in
// `batches` made by `companions` (rows of the same form: controls, and drafts
// when `test` has them), at random places: at most half a batch's rows are
// test rows, and every test row goes into one batch of each size. Every output
// of every row is the same as alone, bit for bit. Returns the results alone,
// for the caller's checks of their paths.
std::vector<SampleResult> ExpectRowsKeepTheirBitsInEveryBatch(
    Engine& engine, const SampleBatch& test, const std::vector<int64_t>& batches,
    const std::function<SampleBatch(int64_t rows)>& companions, std::mt19937& gen) {
  std::vector<SampleResult> alone;
  for (int64_t r = 0; r < test.rows; ++r) {
    SampleBatch one = companions(1);
    CopyRow(test, r, &one, 0);
    absl::StatusOr<SampleResult> got = engine.Sample(one);
    EXPECT_TRUE(got.ok()) << "row " << r << ": " << got.status();
    if (!got.ok()) return alone;
    alone.push_back(*std::move(got));
  }
  int64_t compared = 0;
  for (int64_t batch : batches) {
    SCOPED_TRACE(::testing::Message() << "batch of " << batch);
    const int64_t per_batch = std::min(test.rows, std::max<int64_t>(1, batch / 2));
    for (int64_t first = 0; first < test.rows; first += per_batch) {
      const int64_t count = std::min(per_batch, test.rows - first);
      SampleBatch b = companions(batch);
      std::vector<int64_t> slots(static_cast<size_t>(batch));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), gen);
      for (int64_t i = 0; i < count; ++i) CopyRow(test, first + i, &b, slots[i]);
      absl::StatusOr<SampleResult> got = engine.Sample(b);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) return alone;
      for (int64_t i = 0; i < count; ++i) {
        SCOPED_TRACE(::testing::Message() << "test row " << first + i << " at slot " << slots[i]);
        ExpectSameRow(*got, slots[i], alone[first + i], 0);
        if (::testing::Test::HasFatalFailure()) return alone;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int64_t>(batches.size()) * test.rows);
  return alone;
}

// The planner needs no device: controls anywhere in the batch pick the
// controlled path; neutral controls and plain batches keep the size rule.
TEST(CudaPlanner, ControlsPickTheControlledPath) {
  SampleBatch batch;
  batch.rows = 8;
  EXPECT_EQ(PlanCudaSamplerPath(batch, 4), CudaSamplerPath::kMaterialized);
  batch.rows = 4;
  EXPECT_EQ(PlanCudaSamplerPath(batch, 4), CudaSamplerPath::kFused);
  batch.controls.assign(4, RowControls{});
  EXPECT_EQ(PlanCudaSamplerPath(batch, 4), CudaSamplerPath::kFused);
  batch.controls[3].num_samples = 2;
  EXPECT_EQ(PlanCudaSamplerPath(batch, 4), CudaSamplerPath::kControlled);
  batch.controls[3] = RowControls{};
  batch.controls[1].top_p = 0.5f;
  EXPECT_EQ(PlanCudaSamplerPath(batch, 4), CudaSamplerPath::kControlled);
}

// One batch's CUDA result against the CPU engine's: details for every row,
// sample 0 = the row's token, tokens in range; rows whose samples differ are
// counted in *mismatches (near-ties of the GEMM rounding), the others must
// agree on logz, logprobs, per-sample logprobs, top-list sizes and logprobs
// (and ranks when check_ranks).
void CompareWithCpu(const SampleResult& g, const SampleResult& c, int64_t batch_rows,
                    bool check_ranks, int64_t* rows, int64_t* mismatches) {
  ASSERT_EQ(g.details.size(), static_cast<size_t>(batch_rows));
  ASSERT_EQ(c.details.size(), static_cast<size_t>(batch_rows));
  for (int64_t r = 0; r < batch_rows; ++r) {
    ++*rows;
    const RowSampleDetail& gd = g.details[r];
    const RowSampleDetail& cd = c.details[r];
    ASSERT_EQ(gd.token_ids.size(), cd.token_ids.size());
    EXPECT_EQ(gd.token_ids[0], g.token_ids[r]);
    for (int32_t t : gd.token_ids) EXPECT_TRUE(t >= 0 && t < kValid) << t;
    if (gd.token_ids != cd.token_ids) {
      ++*mismatches;
      continue;
    }
    const float tol = 1e-4f * std::max(1.0f, std::abs(c.logz[r]));
    EXPECT_NEAR(g.logz[r], c.logz[r], tol) << "row " << r;
    EXPECT_NEAR(g.logprobs[r], c.logprobs[r], tol) << "row " << r;
    if (check_ranks) {
      EXPECT_EQ(gd.ranks, cd.ranks) << "row " << r;
    }
    ASSERT_EQ(gd.logprobs.size(), cd.logprobs.size()) << "row " << r;
    for (size_t j = 0; j < gd.logprobs.size(); ++j) {
      EXPECT_NEAR(gd.logprobs[j], cd.logprobs[j], tol) << "row " << r;
    }
    ASSERT_EQ(gd.top.size(), cd.top.size()) << "row " << r;
    for (size_t i = 0; i < gd.top.size(); ++i) {
      // Ids may swap only between near-equal logits (GEMM rounding).
      EXPECT_NEAR(gd.top[i].logprob, cd.top[i].logprob, tol) << "row " << r << " top " << i;
    }
  }
}

TEST(CudaEngineControls, MatchesTheCpuEngine) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(600);
  ASSERT_TRUE(e.cuda && e.cpu);
  int64_t rows = 0, mismatches = 0;
  uint64_t seed = 1;
  for (int64_t batch_rows : {1, 3, 64, 300, 600}) {  // 300, 600: several controlled chunks
    for (int rep = 0; rep < 3; ++rep) {
      const SampleBatch batch = RandomControlledBatch(batch_rows, seed++);
      absl::StatusOr<SampleResult> g = e.cuda->Sample(batch);
      absl::StatusOr<SampleResult> c = e.cpu->Sample(batch);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_NO_FATAL_FAILURE(CompareWithCpu(*g, *c, batch_rows, /*check_ranks=*/false, &rows, &mismatches));
    }
  }
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows << " rows differ";
}

// Verify rows with controls (draft tokens in a controlled batch) take the
// materialized controlled path and match the CPU engine: the same criteria,
// plus the drafts' log-probabilities (NaN without a draft, -inf when a
// control removed it).
TEST(CudaEngineControls, DraftRowsWithControlsMatchTheCpuEngine) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(300, /*fused_max_rows=*/128);
  ASSERT_TRUE(e.cuda && e.cpu);
  ASSERT_TRUE(e.cuda->serves_draft_rows(true));
  int64_t rows = 0, mismatches = 0;
  uint64_t seed = 500;
  for (int64_t batch_rows : {1, 17, 64, 300}) {
    SampleBatch batch = RandomControlledBatch(batch_rows, seed++);
    const absl::StatusOr<SampleResult> plain = e.cpu->Sample(batch);
    ASSERT_TRUE(plain.ok()) << plain.status();
    std::mt19937 gen(static_cast<uint32_t>(seed));
    batch.draft_tokens.resize(batch_rows);
    for (int64_t r = 0; r < batch_rows; ++r) {
      batch.draft_tokens[r] = r % 3 == 0   ? -1
                              : r % 3 == 1 ? plain->token_ids[r]
                                           : static_cast<int32_t>(gen() % kValid);
    }
    absl::StatusOr<SampleResult> g = e.cuda->Sample(batch);
    absl::StatusOr<SampleResult> c = e.cpu->Sample(batch);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(g->path, LaunchPath::kControlled) << LaunchPathName(g->path);
    ASSERT_NO_FATAL_FAILURE(CompareWithCpu(*g, *c, batch_rows, /*check_ranks=*/false, &rows, &mismatches));
    ASSERT_EQ(g->draft_logprobs.size(), static_cast<size_t>(batch_rows));
    ASSERT_EQ(c->draft_logprobs.size(), static_cast<size_t>(batch_rows));
    for (int64_t r = 0; r < batch_rows; ++r) {
      if (g->token_ids[r] != c->token_ids[r]) continue;  // counted above
      const float gd = g->draft_logprobs[r], cd = c->draft_logprobs[r];
      if (std::isnan(cd)) {
        EXPECT_TRUE(std::isnan(gd)) << "row " << r << ": " << gd;
      } else if (std::isinf(cd)) {
        EXPECT_EQ(gd, cd) << "row " << r;  // -inf: a control removed the draft
      } else {
        EXPECT_NEAR(gd, cd, 1e-4f * std::max(1.0f, std::abs(c->logz[r]))) << "row " << r;
      }
    }
  }
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows << " rows differ";
}

// Plain draft rows on the sharded engine take the controlled kernel with
// neutral controls (server/engine/sharded_cuda_engine.cc). That is sound only if the
// controlled kernel verifies a draft on a row with neutral controls exactly
// as the plain kernels do. Here row 0 has a control (top_k = 5), which sends
// the batch to the controlled path, and every other row has neutral controls
// (RowControls{}); against the same rows as a plain batch on the plain
// materialized path of the same engine. Up to 256 rows both paths run one
// LaunchLogitsGemm of the same shape (identical logits), so the neutral rows'
// tokens must be identical and their draft log-probabilities equal to
// rounding (fp32 vs float64 log-sum-exp).
TEST(CudaEngineControls, NeutralControlledRowsVerifyDraftsAsThePlainPath) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(256, /*fused_max_rows=*/0);
  ASSERT_TRUE(e.cuda);
  for (int64_t batch_rows : {2, 7, 256}) {
    SampleBatch plain = testing::RandomEngineBatch(batch_rows, kHidden, 400 + batch_rows);
    plain.draft_tokens.resize(static_cast<size_t>(batch_rows));
    for (int64_t r = 0; r < batch_rows; ++r) {
      plain.draft_tokens[r] = r % 4 == 0 ? -1 : static_cast<int32_t>((r * 7919) % kValid);
    }
    SampleBatch mixed = plain;
    mixed.controls.assign(static_cast<size_t>(batch_rows), RowControls{});
    mixed.controls[0].top_k = 5;
    absl::StatusOr<SampleResult> a = e.cuda->Sample(plain);
    absl::StatusOr<SampleResult> b = e.cuda->Sample(mixed);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->path, LaunchPath::kMaterialized);
    EXPECT_EQ(b->path, LaunchPath::kControlled);
    ASSERT_EQ(b->draft_logprobs.size(), a->draft_logprobs.size());
    for (int64_t r = 1; r < batch_rows; ++r) {
      EXPECT_EQ(b->token_ids[r], a->token_ids[r]) << "batch " << batch_rows << " row " << r;
      const float x = a->draft_logprobs[r], y = b->draft_logprobs[r];
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(y)) << "row " << r;
      } else {
        EXPECT_NEAR(y, x, 1e-4f * std::max(1.0f, std::abs(a->logz[r]))) << "row " << r;
      }
    }
  }
}

// Rows the fused controlled path serves: top_k 1..64 with anything but
// raw-mode top lists, or no filter at all (bitmask, bans, bias, penalties).
SampleBatch FusedServedBatch(int64_t rows, uint64_t seed) {
  SampleBatch b = RandomControlledBatch(rows, seed);
  for (int64_t r = 0; r < rows; ++r) {
    RowControls& c = b.controls[r];
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
  return b;
}

// Same criteria as MatchesTheCpuEngine (tokens on >= 99.9% of rows; the GEMM
// summation order differs between the tensor-core stage 1 and the CPU).
TEST(CudaEngineControls, FusedControlledPathMatchesTheCpuEngine) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(128, /*fused_max_rows=*/128);
  ASSERT_TRUE(e.cuda && e.cpu);
  int64_t rows = 0, mismatches = 0;
  uint64_t seed = 100;
  for (int64_t batch_rows : {1, 2, 3, 17, 64, 128}) {
    for (int rep = 0; rep < 3; ++rep) {
      const SampleBatch batch = FusedServedBatch(batch_rows, seed++);
      absl::StatusOr<SampleResult> g = e.cuda->Sample(batch);
      absl::StatusOr<SampleResult> c = e.cpu->Sample(batch);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(c.ok()) << c.status();
      // The fused path served it (a fallback would say kFusedControlledFallback).
      EXPECT_EQ(g->path, LaunchPath::kFusedControlled) << LaunchPathName(g->path);
      ASSERT_NO_FATAL_FAILURE(CompareWithCpu(*g, *c, batch_rows, /*check_ranks=*/true, &rows, &mismatches));
    }
  }
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows << " rows differ";
}

// A head whose tokens 0..99 share one logit (the rest far below): top_k = 40
// leaves the first tile's 16 candidates all inside the top 40, so the fused
// path cannot finish the row and the runner re-runs the batch materialized.
// The logits are exact (one bf16 product per dot), so the CUDA engine,
// with or without the fused path, gives the CPU engine's tokens exactly.
TEST(CudaEngineControls, FusedPathHandsTiedTopKBackToTheMaterializedPath) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  constexpr int64_t kV = 1000, kD = 16;
  std::vector<uint16_t> w(kV * kD, 0);
  for (int64_t v = 0; v < kV; ++v) w[v * kD] = v < 100 ? 0x3f80 : 0xbf80;  // bf16 +1, -1
  testing::ScopedTempDir dir("fused_fallback");
  const std::string path = dir.Path("head.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"lm_head.weight", "BF16", {kV, kD}, w.data(),
                                       w.size() * sizeof(uint16_t)}})
                  .ok());
  SampleBatch b;
  b.rows = 8;
  b.hidden.assign(b.rows * kD, 0.0f);
  b.params.resize(b.rows);
  b.controls.resize(b.rows);
  for (int64_t r = 0; r < b.rows; ++r) {
    b.hidden[r * kD] = 2.0f;
    b.params[r] = RowParams{1.0f, 7, 0, static_cast<uint32_t>(r)};
    b.controls[r].top_k = r % 2 == 0 ? 40 : 16;
    b.controls[r].top_logprobs = 5;
    b.controls[r].num_samples = 4;
  }
  b.want_logz = b.want_logprobs = true;
  std::vector<SampleResult> results;
  for (const char* backend : {"cuda", "cuda-no-fused-controls", "cpu"}) {
    SCOPED_TRACE(backend);
    absl::StatusOr<LmHead> head = LmHead::Load(path, "");
    ASSERT_TRUE(head.ok()) << head.status();
    EngineOptions options;
    options.max_batch_rows = 8;
    options.cuda.fused_controls = std::string(backend) == "cuda";
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        MakeEngine(std::string(backend) == "cpu" ? "cpu" : "cuda", *std::move(head), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    absl::StatusOr<SampleResult> result = (*engine)->Sample(b);
    ASSERT_TRUE(result.ok()) << result.status();
    results.push_back(*std::move(result));
  }
  EXPECT_EQ(results[0].path, LaunchPath::kFusedControlledFallback) << LaunchPathName(results[0].path);
  EXPECT_EQ(results[1].path, LaunchPath::kControlled) << LaunchPathName(results[1].path);
  EXPECT_EQ(results[2].path, LaunchPath::kCpu) << LaunchPathName(results[2].path);
  for (const SampleResult& r : results) {
    ASSERT_EQ(r.details.size(), static_cast<size_t>(b.rows));
    EXPECT_EQ(r.token_ids, results[2].token_ids);
    for (int64_t row = 0; row < b.rows; ++row) {
      EXPECT_EQ(r.details[row].token_ids, results[2].details[row].token_ids) << row;
      EXPECT_EQ(r.details[row].ranks, results[2].details[row].ranks) << row;
      for (int32_t t : r.details[row].token_ids) EXPECT_LT(t, b.controls[row].top_k) << row;
    }
  }
}

TEST(CudaEngineControls, EveryTokenMaskedFailsPreconditionAndTheEngineStaysUp) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(16);
  ASSERT_TRUE(e.cuda && e.cpu);
  SampleBatch batch = RandomControlledBatch(4, 77);
  batch.controls[2] = RowControls{};
  batch.controls[2].allowed_bitmask.assign((kVocab + 31) / 32, 0u);
  absl::StatusOr<SampleResult> g = e.cuda->Sample(batch);
  absl::StatusOr<SampleResult> c = e.cpu->Sample(batch);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition) << g.status();
  EXPECT_EQ(g.status().message().substr(0, 23), std::string("cuda controlled sampler"));
  EXPECT_TRUE(e.cuda->healthy());
  const SampleBatch next = RandomControlledBatch(4, 78);
  absl::StatusOr<SampleResult> again = e.cuda->Sample(next);
  EXPECT_TRUE(again.ok()) << again.status();
}

// Neutral controls (all defaults) stay on the plain kernels and give the
// same tokens as a batch without controls; details hold one token per row.
TEST(CudaEngineControls, NeutralControlsTakeThePlainPath) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  Engines e = MakeEngines(16);
  ASSERT_TRUE(e.cuda);
  SampleBatch batch = RandomControlledBatch(8, 5);
  batch.controls.assign(8, RowControls{});
  SampleBatch plain = batch;
  plain.controls.clear();
  absl::StatusOr<SampleResult> a = e.cuda->Sample(batch);
  absl::StatusOr<SampleResult> b = e.cuda->Sample(plain);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  ASSERT_EQ(a->details.size(), 8u);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(a->details[r].token_ids, std::vector<int32_t>{a->token_ids[r]});
}

// A plain row beside rows with sampling controls that the fused controlled
// path serves: the batch takes that path, whose summary rows fold and merge
// exactly as the plain kernels do (fused_controls.cuh, the same stage-2
// tree), so the plain row's token, log Z and logprob are the bits it gets
// alone on the plain path; under the default options, in batches of 3 to 512
// (mma.sync and WGMMA stage 1s).
TEST(CudaEngineControls, PlainRowsKeepTheirBitsBesideFusedControlledRows) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  absl::StatusOr<std::unique_ptr<Engine>> engine = DefaultCudaEngine(512);
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kProbes = 4;
  std::mt19937 gen(77);
  const SampleBatch probes = testing::PlainRowsFrom(gen, kProbes, kHidden, 77);
  absl::StatusOr<SampleResult> alone_all = (*engine)->Sample(probes);
  ASSERT_TRUE(alone_all.ok()) << alone_all.status();
  for (int64_t rows : {3, 40, 512}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    SampleBatch b = testing::PlainRowsFrom(gen, rows, kHidden, 1000 + rows);
    b.controls.assign(static_cast<size_t>(rows), RowControls{});
    for (int64_t r = 0; r < rows; ++r) {
      b.controls[r].top_k = 1 + static_cast<int32_t>(r % 64);  // every row one the fused path serves
      b.controls[r].top_p = 0.9f;
    }
    // The probes at the last slots (at most rows - 1 of them: one companion
    // keeps the batch controlled), with neutral controls.
    const int64_t n = std::min<int64_t>(kProbes, rows - 1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = rows - 1 - i;
      std::copy(probes.hidden.begin() + i * kHidden, probes.hidden.begin() + (i + 1) * kHidden,
                b.hidden.begin() + slot * kHidden);
      b.params[slot] = probes.params[i];
      b.controls[slot] = RowControls{};
    }
    absl::StatusOr<SampleResult> mixed = (*engine)->Sample(b);
    ASSERT_TRUE(mixed.ok()) << mixed.status();
    EXPECT_EQ(mixed->path, LaunchPath::kFusedControlled);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = rows - 1 - i;
      EXPECT_EQ(mixed->token_ids[slot], alone_all->token_ids[i]) << "probe " << i;
      EXPECT_EQ(0, std::memcmp(&mixed->logz[slot], &alone_all->logz[i], sizeof(float))) << "probe " << i;
      EXPECT_EQ(0, std::memcmp(&mixed->logprobs[slot], &alone_all->logprobs[i], sizeof(float)))
          << "probe " << i;
    }
  }
}

// --batch_invariant: a row the fused controlled path cannot serve (top_p
// without top_k) runs alone on the materialized path after the fused launch;
// the rows the fused path serves keep the bits they get without it: the same
// token, log Z, logprob and samples as in a batch of their own. The
// materialized row gets what it gets alone too (a one-row cuBLAS launch
// either way). Without the flag the mixed batch runs whole on the
// materialized path.
TEST(CudaEngineControls, FusedRowsKeepTheirBitsBesideARowTheFusedPathCannotServe) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  absl::StatusOr<std::unique_ptr<Engine>> engine = DefaultCudaEngine(64, /*batch_invariant=*/true);
  ASSERT_TRUE(engine.ok()) << engine.status();
  absl::StatusOr<std::unique_ptr<Engine>> one_pass = DefaultCudaEngine(64);
  ASSERT_TRUE(one_pass.ok()) << one_pass.status();
  std::mt19937 gen(91);
  constexpr int64_t kRows = 40;
  SampleBatch served = testing::PlainRowsFrom(gen, kRows, kHidden, 91);
  served.controls.assign(kRows, RowControls{});
  for (int64_t r = 0; r < kRows; ++r) {
    if (r % 4 == 0) continue;  // a plain row
    served.controls[r].top_k = 1 + static_cast<int32_t>((7 * r) % 64);
    served.controls[r].top_p = 0.8f;
    served.controls[r].num_samples = 1 + static_cast<int32_t>(r % 2);
    served.controls[r].top_logprobs = static_cast<int32_t>(r % 3);
  }
  // The unservable row alone, and the mixed batch: the same rows with it at
  // slot 17 (its own row moved to the end).
  SampleBatch lone = testing::PlainRowsFrom(gen, 1, kHidden, 92);
  lone.controls.assign(1, RowControls{});
  lone.controls[0].top_p = 0.9f;
  lone.params[0].temperature = 1.0f;  // row 0 of PlainRowsFrom is greedy
  SampleBatch mixed = served;
  mixed.rows = kRows + 1;
  mixed.hidden.insert(mixed.hidden.begin() + 17 * kHidden, lone.hidden.begin(), lone.hidden.end());
  mixed.params.insert(mixed.params.begin() + 17, lone.params[0]);
  mixed.controls.insert(mixed.controls.begin() + 17, lone.controls[0]);

  absl::StatusOr<SampleResult> a = (*engine)->Sample(served);
  absl::StatusOr<SampleResult> b = (*engine)->Sample(lone);
  absl::StatusOr<SampleResult> m = (*engine)->Sample(mixed);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(a->path, LaunchPath::kFusedControlled) << LaunchPathName(a->path);
  EXPECT_EQ(b->path, LaunchPath::kControlled) << LaunchPathName(b->path);
  EXPECT_EQ(m->path, LaunchPath::kFusedControlledFallback) << LaunchPathName(m->path);
  const auto expect_same_row = ExpectSameRow;
  for (int64_t r = 0; r < kRows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    expect_same_row(*m, r < 17 ? r : r + 1, *a, r);
  }
  {
    SCOPED_TRACE("the materialized row");
    expect_same_row(*m, 17, *b, 0);
  }
  absl::StatusOr<SampleResult> whole = (*one_pass)->Sample(mixed);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->path, LaunchPath::kControlled) << LaunchPathName(whole->path);
}

// --batch_invariant, every path: 64 rows with random controls of every kind
// (rows the fused controlled path serves, rows only the materialized path
// serves, plain rows) each alone and inside batches of 2, 3, 17, 64, 128,
// 255, 256, 512 and 1024 rows at random places among random companions:
// every output of a row is the same bit for bit. Then the same rows as draft
// rows (Verify): alone, a row with controls is verified on the materialized
// controlled path and a row without on the fused kernel, and so it is in
// every batch, where the engine splits the two kinds: there too. The
// materialized path takes its logits from the fused kernels' own GEMM under
// the flag. With cuBLAS's logits instead (the runner's flag forced off, H100,
// 2026-11-28) log Z and logprobs differed already between a row alone and in
// a batch of 2.
TEST(CudaEngineControls, EveryRowKeepsItsBitsInEveryBatchUnderBatchInvariant) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  absl::StatusOr<std::unique_ptr<Engine>> engine = DefaultCudaEngine(1024, /*batch_invariant=*/true);
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kTestRows = 64;
  for (const bool drafts : {false, true}) {
    SCOPED_TRACE(drafts ? "draft rows" : "sample rows");
    SampleBatch test = RandomControlledBatch(kTestRows, drafts ? 606 : 605);
    std::mt19937 gen(drafts ? 16 : 15);
    if (drafts) {
      test.draft_tokens.resize(kTestRows);
      for (int64_t r = 0; r < kTestRows; ++r) {
        test.draft_tokens[r] = r % 4 == 0 ? -1 : static_cast<int32_t>(gen() % kValid);
      }
    }
    const auto companions = [&](int64_t rows) {
      SampleBatch b = RandomControlledBatch(rows, gen());
      if (drafts) {
        b.draft_tokens.resize(static_cast<size_t>(rows));
        for (int32_t& d : b.draft_tokens) d = gen() % 3 == 0 ? -1 : static_cast<int32_t>(gen() % kValid);
      }
      return b;
    };
    const std::vector<SampleResult> alone = ExpectRowsKeepTheirBitsInEveryBatch(
        **engine, test, {2, 3, 17, 64, 128, 255, 256, 512, 1024}, companions, gen);
    ASSERT_EQ(alone.size(), static_cast<size_t>(kTestRows));
    // Rows of each kind: some alone on the materialized path, some not.
    const auto materialized_alone = std::count_if(alone.begin(), alone.end(), [](const SampleResult& a) {
      return a.path == LaunchPath::kControlled;
    });
    EXPECT_GT(materialized_alone, 0);
    EXPECT_LT(materialized_alone, kTestRows);
  }
}

// --batch_invariant is refused at start where it could not hold: with
// several devices (the sharded engine neither splits mixed batches nor takes
// the fused GEMM's logits; refused before any device is touched, here even a
// repeated one), and for a head the tensor-core GEMM cannot serve (hidden
// size not a multiple of 16; fp32 heads likewise).
TEST(CudaEngineControls, BatchInvariantIsRefusedWhereItCannotHold) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  EngineOptions options;
  options.valid_vocab = kValid;
  options.max_batch_rows = 8;
  options.cuda.batch_invariant = true;
  options.cuda.devices = {0, 0};
  absl::StatusOr<std::unique_ptr<Engine>> e = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("--batch_invariant"), std::string::npos) << e.status();
  options.cuda.devices = {0};
  EXPECT_TRUE(MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options).ok());
  options.valid_vocab = 0;
  e = MakeEngine("cuda", LmHead::Demo(100, 40, 9), options);  // 40 % 16 != 0
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("hidden size divisible by 16"), std::string::npos) << e.status();
  options.cuda.batch_invariant = false;
  EXPECT_TRUE(MakeEngine("cuda", LmHead::Demo(100, 40, 9), options).ok());
}

// Without --batch_invariant, on Hopper, the materialized path takes the
// fused kernels' GEMM too (LogitsGemmPath::kAuto), so in batches whose rows
// all need that path (top_p or min_p without top_k) every row gets the bits
// it gets alone. (Mixed batches still run whole on one path: the flag's
// split.) Elsewhere the default is cuBLAS's logits: skipped there.
TEST(CudaEngineControls, MaterializedRowsKeepTheirBitsByDefaultOnHopper) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  if (!kernels::WgmmaStage1Available()) GTEST_SKIP() << "the default is cuBLAS's logits off Hopper";
  absl::StatusOr<std::unique_ptr<Engine>> engine = DefaultCudaEngine(300);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::mt19937 gen(31);
  const auto materialized_only = [&](int64_t rows, uint64_t seed) {
    SampleBatch b = testing::PlainRowsFrom(gen, rows, kHidden, seed);
    b.controls.assign(static_cast<size_t>(rows), RowControls{});
    for (int64_t r = 0; r < rows; ++r) {
      if (r % 2 == 0) {
        b.controls[r].top_p = 0.5f + 0.1f * static_cast<float>(r % 5);
      } else {
        b.controls[r].min_p = 0.02f * static_cast<float>(1 + r % 4);
      }
    }
    return b;
  };
  constexpr int64_t kTestRows = 16;
  const SampleBatch test = materialized_only(kTestRows, 7);
  const std::vector<SampleResult> alone = ExpectRowsKeepTheirBitsInEveryBatch(
      **engine, test, {2, 17, 256, 300}, [&](int64_t rows) { return materialized_only(rows, gen()); },
      gen);
  ASSERT_EQ(alone.size(), static_cast<size_t>(kTestRows));
  for (const SampleResult& a : alone) EXPECT_EQ(a.path, LaunchPath::kControlled) << LaunchPathName(a.path);
}

}  // namespace
}  // namespace flashsampler
