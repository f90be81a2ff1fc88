// Tests of server/api/verify_chain.h, the speculative-verification finalizer, and
// of the CPU engine's draft rows it consumes (server/engine/engine.h's contract).
//
// The exactness tests drive the real CPU engine with an identity LM head
// (V = D = 8, F32), so a row's hidden state IS its logits and the float64
// reference is the softmax of chosen values. Sequences have γ = 1 (a draft
// position and the bonus position) and distinct seeds; for each draft kind
// (the argmax, a likely and an unlikely token) we check, over many seeds:
//  - the first emitted token has the target distribution p0 (chi-square and
//    z-tests of tests/common/goodness_of_fit.h, which assert enough samples to
//    catch a 2% relative error in any token with p >= 0.05, so every error of
//    1 percentage point too);
//  - the acceptance frequency matches p0(x) (binomial z-test, |z| < 5);
//  - after an accepted argmax draft the bonus token has the bonus position's
//    distribution p1.
// Fixed seeds make every outcome deterministic.
#include "server/api/verify_chain.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "server/batching/batch_assembly.h"
#include "server/engine/engine.h"
#include "server/model/safetensors_writer.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

constexpr int64_t kV = 8;

// Target distributions (T = 1) of the draft position and the bonus position.
// Their z-tested tokens (p >= 0.05) are large, which keeps the sample counts
// that the goodness-of-fit power check demands small.
const std::vector<double> kP0 = {0.42, 0.28, 0.18, 0.045, 0.03, 0.027, 0.015, 0.003};
const std::vector<double> kP1 = {0.02, 0.01, 0.005, 0.005, 0.01, 0.35, 0.58, 0.02};

std::vector<float> LogitsOf(const std::vector<double>& p) {
  std::vector<float> l(p.size());
  for (size_t i = 0; i < p.size(); ++i) l[i] = static_cast<float>(std::log(p[i]));
  return l;
}

// The CPU engine over W = I (F32): logits = hidden.
std::unique_ptr<Engine> IdentityEngine() {
  static testing::ScopedTempDir* dir = new testing::ScopedTempDir("verify_chain_test");
  const std::string path = dir->Path("identity.safetensors");
  std::vector<float> w(kV * kV, 0.0f);
  for (int64_t i = 0; i < kV; ++i) w[i * kV + i] = 1.0f;
  const absl::Status written = WriteSafetensors(
      path, {SafetensorsTensorToWrite{"lm_head.weight", "F32", {kV, kV}, w.data(), w.size() * 4}});
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<LmHead> head = LmHead::Load(path, "");
  EXPECT_TRUE(head.ok()) << head.status();
  CpuEngineOptions options;
  options.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeCpuEngine(*std::move(head), 0, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

struct ChainStats {
  std::vector<int64_t> first_token = std::vector<int64_t>(kV, 0);
  std::vector<int64_t> bonus_token = std::vector<int64_t>(kV, 0);  // after an accepted draft
  int64_t accepted = 0;
  int64_t sequences = 0;
};

// Verifies `n` sequences of γ = 1 (draft `draft` at p0, bonus at p1) with
// seeds seed0, seed0 + 1, ...; `controls` (optional) apply to both positions.
ChainStats RunChains(Engine& engine, int64_t n, int32_t draft, float temperature, uint64_t seed0,
                     const RowControls* controls = nullptr) {
  const std::vector<float> l0 = LogitsOf(kP0), l1 = LogitsOf(kP1);
  ChainStats stats;
  constexpr int64_t kChunk = 1 << 15;  // sequences per engine call
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t seqs = std::min(kChunk, n - first);
    SampleBatch batch;
    batch.rows = 2 * seqs;
    batch.hidden.reserve(static_cast<size_t>(batch.rows * kV));
    for (int64_t s = 0; s < seqs; ++s) {
      batch.hidden.insert(batch.hidden.end(), l0.begin(), l0.end());
      batch.hidden.insert(batch.hidden.end(), l1.begin(), l1.end());
      const uint64_t seed = seed0 + static_cast<uint64_t>(first + s);
      batch.params.push_back(RowParams{temperature, seed, 0, 0});
      batch.params.push_back(RowParams{temperature, seed, 1, 0});
      batch.draft_tokens.push_back(draft);
      batch.draft_tokens.push_back(-1);
    }
    if (controls != nullptr) batch.controls.assign(static_cast<size_t>(batch.rows), *controls);
    absl::StatusOr<SampleResult> result = engine.Sample(batch);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return stats;
    EXPECT_EQ(result->draft_logprobs.size(), static_cast<size_t>(batch.rows));
    for (int64_t s = 0; s < seqs; ++s) {
      const VerifyChainOutcome out =
          WalkVerifyChain(1, &batch.draft_tokens[2 * s], &batch.params[2 * s],
                          &result->token_ids[2 * s], &result->draft_logprobs[2 * s]);
      ++stats.first_token[out.token_ids[0]];
      if (out.num_accepted == 1) {
        ++stats.accepted;
        ++stats.bonus_token[out.token_ids[1]];
      }
      ++stats.sequences;
    }
  }
  return stats;
}

// Binomial z-test of `k` successes out of `n` against probability p.
// The exactness checks below must catch a 1% relative error in any token of
// probability >= 0.05 (goodness_of_fit.h's power check enforces the counts).
constexpr double kOnePercent = 0.01;

void ExpectBinomial(int64_t k, int64_t n, double p) {
  const double z = (static_cast<double>(k) - n * p) / std::sqrt(n * p * (1.0 - p));
  EXPECT_LT(std::fabs(z), 5.0) << k << " of " << n << " accepted, expected p = " << p;
}

TEST(VerifyChain, GreedyAcceptsOnlyTheArgmaxAndOutputsTheBonus) {
  const int32_t drafts[3] = {5, 6, 7};
  const RowParams greedy[4] = {{0.0f, 1, 0, 0}, {0.0f, 1, 1, 0}, {0.0f, 1, 2, 0}, {0.0f, 1, 3, 0}};
  const float logprobs[3] = {NAN, NAN, NAN};  // not read for greedy rows
  const int32_t all_match[4] = {5, 6, 7, 9};
  VerifyChainOutcome out = WalkVerifyChain(3, drafts, greedy, all_match, logprobs);
  EXPECT_EQ(out.num_accepted, 3);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, 6, 7, 9}));
  const int32_t second_differs[4] = {5, 4, 7, 9};
  out = WalkVerifyChain(3, drafts, greedy, second_differs, logprobs);
  EXPECT_EQ(out.num_accepted, 1);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5, 4}));
  // γ = 0: the bonus row's token alone.
  out = WalkVerifyChain(0, nullptr, greedy, all_match, nullptr);
  EXPECT_EQ(out.num_accepted, 0);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{5}));
}

TEST(VerifyChain, SampledRowsAcceptByTheAcceptanceUniform) {
  // p = 1 (log p = 0) always accepts, p = 0 (-inf) and NaN never, whatever u.
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const RowParams p{1.0f, seed, 3, 2};
    EXPECT_TRUE(AcceptDraftToken(p, 4, 1, 0.0f));
    EXPECT_FALSE(AcceptDraftToken(p, 4, 1, -INFINITY));
    EXPECT_FALSE(AcceptDraftToken(p, 4, 1, NAN));
    // Otherwise exactly u < p with the position's (seed, offset, stream).
    const float lp = std::log(0.3f);
    EXPECT_EQ(AcceptDraftToken(p, 4, 1, lp),
              VerifyAcceptUniform(seed, 3, 2) < std::exp(static_cast<double>(lp)));
  }
}

TEST(VerifyChain, RejectionOutputsTheRowTokenAndStops) {
  const int32_t drafts[2] = {3, 3};
  const RowParams rows[3] = {{1.0f, 9, 0, 0}, {1.0f, 9, 1, 0}, {1.0f, 9, 2, 0}};
  const int32_t tokens[3] = {1, 2, 4};
  const float never[2] = {-INFINITY, 0.0f};
  VerifyChainOutcome out = WalkVerifyChain(2, drafts, rows, tokens, never);
  EXPECT_EQ(out.num_accepted, 0);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{1}));
  const float always[2] = {0.0f, 0.0f};
  out = WalkVerifyChain(2, drafts, rows, tokens, always);
  EXPECT_EQ(out.num_accepted, 2);
  EXPECT_EQ(out.token_ids, (std::vector<int32_t>{3, 3, 4}));
}

// The engine side of the contract: log p(x) over all tokens, x excluded from
// the sample of T > 0 rows, greedy rows unchanged.
TEST(VerifyChainEngine, DraftRowsReportLogPAndExcludeTheDraft) {
  std::unique_ptr<Engine> engine = IdentityEngine();
  const std::vector<float> l0 = LogitsOf(kP0);
  SampleBatch batch;
  batch.rows = 400;
  batch.want_logz = true;
  for (int64_t r = 0; r < batch.rows; ++r) {
    batch.hidden.insert(batch.hidden.end(), l0.begin(), l0.end());
    batch.params.push_back(RowParams{r % 4 == 0 ? 0.0f : 1.0f, 100 + static_cast<uint64_t>(r), 0, 0});
    batch.draft_tokens.push_back(r % 5 == 4 ? -1 : 0);  // the argmax, or no draft
  }
  absl::StatusOr<SampleResult> result = engine->Sample(batch);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t r = 0; r < batch.rows; ++r) {
    EXPECT_NEAR(result->logz[r], 0.0, 1e-6);  // the p's sum to 1
    if (batch.draft_tokens[r] < 0) {
      EXPECT_TRUE(std::isnan(result->draft_logprobs[r]));
      continue;
    }
    EXPECT_NEAR(result->draft_logprobs[r], std::log(kP0[0]), 1e-6);
    if (batch.params[r].temperature == 0.0f) {
      EXPECT_EQ(result->token_ids[r], 0);  // greedy: the argmax, draft included
    } else {
      EXPECT_NE(result->token_ids[r], 0);  // the residual never returns x
    }
  }
}

// γ = 0 is a plain Sample: the same rows without draft_tokens give the same tokens.
TEST(VerifyChainEngine, BonusRowsAndPlainRowsAgree) {
  std::unique_ptr<Engine> engine = IdentityEngine();
  const std::vector<float> l1 = LogitsOf(kP1);
  SampleBatch plain;
  plain.rows = 64;
  for (int64_t r = 0; r < plain.rows; ++r) {
    plain.hidden.insert(plain.hidden.end(), l1.begin(), l1.end());
    plain.params.push_back(RowParams{0.7f, 5 + static_cast<uint64_t>(r), 3, 0});
  }
  SampleBatch with_drafts = plain;
  with_drafts.draft_tokens.assign(static_cast<size_t>(plain.rows), -1);
  with_drafts.draft_tokens[0] = 2;  // one real draft row so the draft path runs
  absl::StatusOr<SampleResult> a = engine->Sample(plain);
  absl::StatusOr<SampleResult> b = engine->Sample(with_drafts);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t r = 1; r < plain.rows; ++r) EXPECT_EQ(a->token_ids[r], b->token_ids[r]) << r;
  EXPECT_TRUE(a->draft_logprobs.empty());
}

// Greedy drafts equal to the argmax chain are all accepted and the bonus
// token is the bonus position's argmax; any other draft is rejected in favour
// of the argmax.
TEST(VerifyChainEngine, GreedyArgmaxChainGetsTheBonus) {
  std::unique_ptr<Engine> engine = IdentityEngine();
  ChainStats argmax = RunChains(*engine, 100, 0, 0.0f, 1);
  EXPECT_EQ(argmax.accepted, 100);
  EXPECT_EQ(argmax.bonus_token[6], 100);  // argmax of p1
  ChainStats other = RunChains(*engine, 100, 1, 0.0f, 1);
  EXPECT_EQ(other.accepted, 0);
  EXPECT_EQ(other.first_token[0], 100);
}

// Batch mixing: verification rows concatenated with plain and controlled
// Sample rows (as the dynamic batcher does) get the same tokens, log Z and
// draft log-probabilities as when each request runs alone. With W = I each
// logit is one product plus exact zeros, so it is bit-identical for any sgemm
// row count and the comparison can be exact (README-dev "Batch invariance").
TEST(VerifyChainEngine, VerifyRowsBatchedWithSampleRowsGiveTheSameResults) {
  std::unique_ptr<Engine> engine = IdentityEngine();
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  auto random_batch = [&](int64_t rows, uint64_t seed) {
    SampleBatch b;
    b.rows = rows;
    for (int64_t i = 0; i < rows * kV; ++i) b.hidden.push_back(normal(gen));
    for (int64_t r = 0; r < rows; ++r) {
      b.params.push_back(RowParams{r % 3 == 0 ? 0.0f : 0.8f, seed, static_cast<uint64_t>(r), 0});
    }
    b.want_logz = true;
    return b;
  };
  SampleBatch sample = random_batch(40, 1);
  SampleBatch verify = random_batch(30, 2);
  for (int64_t r = 0; r < verify.rows; ++r) verify.draft_tokens.push_back(r % 4 == 3 ? -1 : r % kV);
  SampleBatch controlled = random_batch(10, 3);
  controlled.controls.resize(10);
  for (RowControls& c : controlled.controls) c.top_k = 3;
  controlled.draft_tokens.assign(10, 2);
  for (const std::vector<const SampleBatch*>& group :
       {std::vector<const SampleBatch*>{&sample, &verify},
        std::vector<const SampleBatch*>{&verify, &sample, &controlled}}) {
    std::vector<RowSlice> slices;
    for (const SampleBatch* b : group) {
      // Two slices per request (a split request), to exercise first_row.
      slices.push_back(RowSlice{b, 0, b->rows / 2});
      slices.push_back(RowSlice{b, b->rows / 2, b->rows - b->rows / 2});
    }
    absl::StatusOr<SampleResult> launch = engine->Sample(ConcatenateSlices(slices, kV));
    ASSERT_TRUE(launch.ok()) << launch.status();
    int64_t launch_row = 0;
    for (size_t i = 0; i < slices.size(); i += 2) {
      const SampleBatch& request = *slices[i].batch;
      SampleResult mixed = ResultFor(request);
      for (size_t k = i; k < i + 2; ++k) {
        ScatterSlice(*launch, launch_row, slices[k], &mixed);
        launch_row += slices[k].rows;
      }
      absl::StatusOr<SampleResult> alone = engine->Sample(request);
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ(mixed.token_ids, alone->token_ids);
      EXPECT_EQ(mixed.logz, alone->logz);
      ASSERT_EQ(mixed.draft_logprobs.size(), alone->draft_logprobs.size());
      for (size_t r = 0; r < mixed.draft_logprobs.size(); ++r) {
        const float a = mixed.draft_logprobs[r], b = alone->draft_logprobs[r];
        EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << r;
      }
    }
  }
}

class VerifyChainExactness : public ::testing::TestWithParam<int32_t> {};

TEST_P(VerifyChainExactness, EmittedTokensHaveTheTargetDistribution) {
  const int32_t draft = GetParam();
  std::unique_ptr<Engine> engine = IdentityEngine();
  // 2e6 sequences: the first token's z-tested tokens (p >= 0.18) need >= 1.64e6
  // for a 1% relative error to shift their count by 6 sigma; an accepted
  // argmax leaves ~8.4e5 bonus samples, enough for p1 (z-tested p >= 0.35 need
  // >= 6.7e5).
  constexpr int64_t kN = 2000000;
  const ChainStats stats = RunChains(*engine, kN, draft, 1.0f, 1000003ull * (draft + 1));
  const std::vector<double> p0 = testing::SoftmaxOfScaled(LogitsOf(kP0), kV, 1.0f);
  const std::vector<double> p1 = testing::SoftmaxOfScaled(LogitsOf(kP1), kV, 1.0f);
  testing::ExpectCountsMatch(stats.first_token, p0, 6.0, kOnePercent);
  ExpectBinomial(stats.accepted, stats.sequences, p0[draft]);
  if (draft == 0) testing::ExpectCountsMatch(stats.bonus_token, p1, 6.0, kOnePercent);
}

// The argmax (p = 0.42), a likely token (0.28) and an unlikely one (0.015).
INSTANTIATE_TEST_SUITE_P(Drafts, VerifyChainExactness, ::testing::Values(0, 1, 6));

// Controls + draft: the draft is judged under the distribution left after
// every control. With top_k = 5 the kept set is {0, ..., 4}: a draft outside
// it (token 6) is never accepted and the first token follows the filtered
// distribution; a draft inside it is accepted with its filtered probability.
TEST(VerifyChainEngine, ControlledRowsUseTheFilteredDistribution) {
  std::unique_ptr<Engine> engine = IdentityEngine();
  RowControls top5;
  top5.top_k = 5;
  const std::vector<float> l0 = LogitsOf(kP0);
  std::vector<float> kept(kV, -INFINITY);
  std::copy(l0.begin(), l0.begin() + 5, kept.begin());
  const std::vector<double> p = testing::SoftmaxOfScaled(kept, kV, 1.0f);
  // 1.6e6 sequences: the z-tested tokens (p >= 0.188) need >= 1.56e6 for the
  // 1% check.
  constexpr int64_t kN = 1600000;
  const ChainStats outside = RunChains(*engine, kN, 6, 1.0f, 77, &top5);
  EXPECT_EQ(outside.accepted, 0);
  testing::ExpectCountsMatch(outside.first_token, p, 6.0, kOnePercent);
  const ChainStats inside = RunChains(*engine, kN, 1, 1.0f, 99, &top5);
  testing::ExpectCountsMatch(inside.first_token, p, 6.0, kOnePercent);
  ExpectBinomial(inside.accepted, inside.sequences, p[1]);
}

}  // namespace
}  // namespace flashsampler
