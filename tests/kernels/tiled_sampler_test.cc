// Tests of kernels/cpu/tiled_sampler.h: exactness (the sampled distribution is
// softmax(l / T), checked statistically; the token equals the brute-force
// argmax of l' + g), logz / logprobs against float64, greedy, invariances, the
// valid_vocab mask and argument checking.
//
// Inputs are built so the logits are known exactly, independently of how BLAS
// sums: either D = 1 and H = 1 (the logits are a column of W), or small
// integers in H and W (every partial sum is an exact integer in fp32). The
// transformed logit l' = logit * LogitScale(params) is then computed here with
// the same single fp32 multiply as the sampler, so the reference distribution
// is the exact softmax of the fp32 values the sampler sees.
#include "kernels/cpu/tiled_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "tests/common/goodness_of_fit.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels {
namespace {

constexpr int kThreads = 2;

// A row-major [rows, cols] matrix of small integers in [-range, range]: its
// products with another such matrix are exact in fp32.
std::vector<float> IntegerMatrix(int64_t rows, int64_t cols, int range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-range, range);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& x : m) x = static_cast<float>(dist(rng));
  return m;
}

std::vector<float> NormalMatrix(int64_t rows, int64_t cols, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& x : m) x = dist(rng);
  return m;
}

// Exact logits of integer-valued H [B, D] and W [V, D] (double accumulation of
// exact integer products; the sums stay far below 2^24).
std::vector<float> ExactLogits(const std::vector<float>& h, const std::vector<float>& w,
                               int64_t batch, int64_t vocab, int64_t hidden) {
  std::vector<float> logits(static_cast<size_t>(batch * vocab));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t v = 0; v < vocab; ++v) {
      double dot = 0.0;
      for (int64_t d = 0; d < hidden; ++d) dot += double{h[b * hidden + d]} * w[v * hidden + d];
      logits[b * vocab + v] = static_cast<float>(dot);
    }
  }
  return logits;
}

// Brute force over the whole valid vocabulary, no pruning: argmax of l' + g
// (l' for greedy rows), ties to the lower id.
int32_t ReferenceToken(const float* logits, int64_t valid_vocab, const RowParams& p) {
  const float scale = LogitScale(p);
  int32_t best = -1;
  float best_score = -INFINITY;
  for (int64_t v = 0; v < valid_vocab; ++v) {
    const float l = logits[v] * scale;
    const float s = p.temperature == 0.0f
                        ? l
                        : l + GumbelNoise(p.seed, p.offset, p.stream, static_cast<uint32_t>(v));
    if (best < 0 || s > best_score) {
      best = static_cast<int32_t>(v);
      best_score = s;
    }
  }
  return best;
}

// float64 softmax of the fp32 transformed logits [0, valid_vocab); log Z too.
std::vector<double> ReferenceProbs(const float* logits, int64_t valid_vocab, float scale,
                                   double* logz = nullptr) {
  double m = -INFINITY;
  for (int64_t v = 0; v < valid_vocab; ++v) m = std::max(m, double{logits[v] * scale});
  std::vector<double> p(static_cast<size_t>(valid_vocab));
  double sum = 0.0;
  for (int64_t v = 0; v < valid_vocab; ++v) sum += p[v] = std::exp(double{logits[v] * scale} - m);
  for (double& x : p) x /= sum;
  if (logz != nullptr) *logz = m + std::log(sum);
  return p;
}

struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<float> logz;
  std::vector<float> logprobs;
};

Outputs RunSampler(CpuTiledSampler& sampler, const std::vector<float>& h, int64_t batch,
                   const std::vector<RowParams>& params) {
  Outputs out{std::vector<int32_t>(batch, -7), std::vector<float>(batch, NAN),
              std::vector<float>(batch, NAN)};
  const KernelStatus status = sampler.Sample(
      h.data(), batch, params.data(), {out.tokens.data(), out.logz.data(), out.logprobs.data()});
  EXPECT_EQ(status, KernelStatus::kOk);
  return out;
}

// ---------------------------------------------------------------------------
// (a) Goodness of fit against the float64 softmax.
//
// N = 2^21 samples per case (32 calls of 65536 rows: offset = call, stream =
// row, one seed). Power of the per-token z-test: a token with p >= 0.05 whose
// probability is off by 2% (relative) shifts its count by 0.02 N p against a
// standard deviation sqrt(N p (1 - p)), i.e. z = 0.02 sqrt(N p / (1 - p))
// >= 0.02 sqrt(2^21 * 0.05 / 0.95) = 6.6 at the smallest such p. The test fails
// at |z| > 5, so such an error is caught with probability ~0.95, while a correct
// sampler passes each z-test with probability 1 - 6e-7. Seeds are fixed, so
// the outcome is deterministic.
constexpr int64_t kRowsPerCall = 1 << 16;
constexpr int64_t kCalls = 32;
constexpr int64_t kSamples = kRowsPerCall * kCalls;

std::vector<int64_t> SampleCounts(const std::vector<float>& logits, int64_t valid_vocab,
                                  int64_t tile_rows, float temperature, uint64_t seed,
                                  int64_t calls = kCalls) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  // D = 1, H = 1: the logits are W itself, exactly.
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(logits, 1);
  CpuTiledSampler sampler(sampler_panels.data(), vocab, valid_vocab, 1, {kThreads, tile_rows});
  const std::vector<float> h(kRowsPerCall, 1.0f);
  std::vector<RowParams> params(kRowsPerCall);
  std::vector<int32_t> tokens(kRowsPerCall);
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t call = 0; call < calls; ++call) {
    for (int64_t r = 0; r < kRowsPerCall; ++r) {
      params[r] = RowParams{temperature, seed, static_cast<uint64_t>(call),
                            static_cast<uint32_t>(r)};
    }
    EXPECT_EQ(sampler.Sample(h.data(), kRowsPerCall, params.data(), {tokens.data()}),
              KernelStatus::kOk);
    for (int32_t t : tokens) {
      EXPECT_TRUE(t >= 0 && t < vocab);
      if (t >= 0 && t < vocab) ++counts[t];
    }
  }
  return counts;
}

// The shared goodness-of-fit check (tests/common/goodness_of_fit.h) against the
// float64 softmax of the fp32 transformed logits; tokens >= valid_vocab have no
// probability and must never appear.
void ExpectMatchesSoftmax(const std::vector<int64_t>& counts, const std::vector<float>& logits,
                          int64_t valid_vocab, float temperature) {
  const float scale = LogitScale(RowParams{temperature, 0, 0, 0});
  testing::ExpectCountsMatch(counts, testing::SoftmaxOfScaled(logits, valid_vocab, scale));
}

// `vocab` tokens (not a multiple of the tile of 64), six head tokens with
// p >= 0.05 at every tested temperature, sitting on tile edges and on every
// word of a Philox block (0, 1, 63, 64, vocab / 2 + 1, vocab - 1: words 0, 1,
// 3, 0, 1, 3; the last one is in the final, partial tile), and a tail of
// logits drawn uniformly in [-40, -2] at random positions.
std::vector<float> HeadAndTailLogits(int64_t vocab) {
  std::vector<float> logits(vocab);
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> tail(-40.0f, -2.0f);
  for (float& l : logits) l = tail(rng);
  const int64_t head[] = {0, 1, 63, 64, vocab / 2 + 1, vocab - 1};
  const float head_logit[] = {2.0f, 1.6f, 1.3f, 1.0f, 0.7f, 0.4f};
  for (int i = 0; i < 6; ++i) logits[head[i]] = head_logit[i];
  return logits;
}

// Cost: every sample scans the whole vocabulary, so the larger vocabulary
// goes to the main case and the temperature sweep uses V = 200.
TEST(TiledSamplerGoodnessOfFit, TemperatureOneVocab1000) {
  const auto logits = HeadAndTailLogits(1000);
  ExpectMatchesSoftmax(SampleCounts(logits, 1000, 64, 1.0f, 11), logits, 1000, 1.0f);
}

// The 1% standard: 2^23 samples (128 calls), so a 1% relative error in any
// token with p >= 0.05 shifts its count by z >= 0.01 sqrt(2^23 * 0.05 / 0.95)
// = 6.6 (the check asserts >= 6), against a failure threshold of |z| > 5.
TEST(TiledSamplerGoodnessOfFit, CatchesAOnePercentErrorAtTemperatureOne) {
  const auto logits = HeadAndTailLogits(200);
  const float scale = LogitScale(RowParams{1.0f, 0, 0, 0});
  testing::ExpectCountsMatch(SampleCounts(logits, 200, 64, 1.0f, 15, 128),
                             testing::SoftmaxOfScaled(logits, 200, scale),
                             /*required_shift=*/6.0, /*detectable_error=*/0.01);
}

TEST(TiledSamplerGoodnessOfFit, TemperatureHalf) {
  const auto logits = HeadAndTailLogits(200);
  ExpectMatchesSoftmax(SampleCounts(logits, 200, 64, 0.5f, 12), logits, 200, 0.5f);
}

// At T = 2 the tail carries ~25% of the mass, spread over ~190 tokens.
TEST(TiledSamplerGoodnessOfFit, TemperatureTwo) {
  const auto logits = HeadAndTailLogits(200);
  ExpectMatchesSoftmax(SampleCounts(logits, 200, 64, 2.0f, 13), logits, 200, 2.0f);
}

// Logits spread uniformly over [-40, 10], and a valid_vocab below the
// vocabulary whose masked rows hold the largest logits.
TEST(TiledSamplerGoodnessOfFit, WideRangeWithMask) {
  std::vector<float> logits(500);
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> dist(-40.0f, 10.0f);
  for (float& l : logits) l = dist(rng);
  for (int v = 490; v < 500; ++v) logits[v] = 12.0f;  // masked: would dominate
  ExpectMatchesSoftmax(SampleCounts(logits, 490, 64, 1.0f, 14), logits, 490, 1.0f);
}

// ---------------------------------------------------------------------------
// Exactness per row: the token equals the brute-force argmax of l' + g, so
// pruning, tiling and threading never change a result.

struct Case {
  int64_t vocab, valid_vocab, hidden, tile_rows;
  int threads;
};

TEST(TiledSamplerTest, TokensEqualBruteForceArgmax) {
  const Case cases[] = {{1000, 1000, 1, 64, 2}, {1000, 937, 1, 50, 3}, {517, 517, 1, 1024, 1},
                        {4099, 4000, 1, 256, 2}};
  for (const Case& c : cases) {
    const int64_t batch = 300;  // > 128: several row blocks per tile
    // Logits with a realistic spread and many exact ties (quantised to 1/8).
    std::vector<float> w = NormalMatrix(c.vocab, 1, 3.0f, 5);
    for (float& x : w) x = std::round(x * 8.0f) / 8.0f;
    const std::vector<float> h(batch, 1.0f);
    std::vector<RowParams> params(batch);
    const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.5f, 3.0f};
    for (int64_t b = 0; b < batch; ++b) {
      params[b] = RowParams{temps[b % 6], 1000 + static_cast<uint64_t>(b % 7),
                            static_cast<uint64_t>(b / 7), static_cast<uint32_t>(b)};
    }
    const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
    CpuTiledSampler sampler(sampler_panels.data(), c.vocab, c.valid_vocab, 1, {c.threads, c.tile_rows});
    const Outputs out = RunSampler(sampler, h, batch, params);
    for (int64_t b = 0; b < batch; ++b) {
      ASSERT_EQ(out.tokens[b], ReferenceToken(w.data(), c.valid_vocab, params[b]))
          << "row " << b << " vocab " << c.vocab << " tile " << c.tile_rows;
    }
  }
}

// ---------------------------------------------------------------------------
// (b) logz and logprobs against float64.
//
// Tolerance: a tile sums <= 64 terms exp(l' - m), each within 1 ulp (expf),
// so its relative error is <= (64 + 1) * 2^-24 = 3.9e-6; 16 tile merges add at
// most 2 roundings each (2e-6); log adds 1 ulp. So |logz - ref| stays below
// ~6e-6 + ulp(logz): 1e-5 * max(1, |logz|) covers it. The logprob is
// best_logit - logz with best_logit exact, so it gets the same bound.
TEST(TiledSamplerTest, LogZAndLogprobsMatchFloat64) {
  constexpr int64_t kVocab = 1000, kHidden = 16, kBatch = 24;
  const std::vector<float> w = IntegerMatrix(kVocab, kHidden, 2, 21);
  const std::vector<float> h = IntegerMatrix(kBatch, kHidden, 2, 22);
  const std::vector<float> logits = ExactLogits(h, w, kBatch, kVocab, kHidden);
  std::vector<RowParams> params(kBatch);
  const float temps[] = {0.0f, 0.5f, 1.0f, 2.0f};
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = RowParams{temps[b % 4], 31, 4, static_cast<uint32_t>(b)};
  }
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, kHidden);
  CpuTiledSampler sampler(sampler_panels.data(), kVocab, kVocab, kHidden, {kThreads, 64});
  const Outputs out = RunSampler(sampler, h, kBatch, params);
  for (int64_t b = 0; b < kBatch; ++b) {
    const float* row = logits.data() + b * kVocab;
    double logz = 0.0;
    ReferenceProbs(row, kVocab, LogitScale(params[b]), &logz);
    const double tol = 1e-5 * std::max(1.0, std::fabs(logz));
    EXPECT_NEAR(out.logz[b], logz, tol) << "row " << b;
    const int32_t t = out.tokens[b];
    ASSERT_EQ(t, ReferenceToken(row, kVocab, params[b]));
    EXPECT_NEAR(out.logprobs[b], double{row[t] * LogitScale(params[b])} - logz, tol);
    EXPECT_LE(out.logprobs[b], 0.0f);
  }
  // Asking for only one of the two gives the same values.
  std::vector<int32_t> tokens(kBatch);
  std::vector<float> logz_only(kBatch), logprobs_only(kBatch);
  ASSERT_EQ(sampler.Sample(h.data(), kBatch, params.data(), {tokens.data(), logz_only.data()}),
            KernelStatus::kOk);
  ASSERT_EQ(sampler.Sample(h.data(), kBatch, params.data(),
                           {tokens.data(), nullptr, logprobs_only.data()}),
            KernelStatus::kOk);
  EXPECT_EQ(tokens, out.tokens);
  EXPECT_EQ(logz_only, out.logz);
  EXPECT_EQ(logprobs_only, out.logprobs);
}

// ---------------------------------------------------------------------------
// (c) Greedy rows are the argmax, ties to the lowest id, whatever the seed.
TEST(TiledSamplerTest, GreedyIsArgmaxWithLowestIndexTies) {
  constexpr int64_t kVocab = 1000;
  std::vector<float> w(kVocab);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> dist(-50, 4);
  for (float& x : w) x = static_cast<float>(dist(rng));
  w[700] = 5.0f;  // the maximum, repeated in later tiles and the last one
  w[701] = 5.0f;
  w[850] = 5.0f;
  w[999] = 5.0f;
  for (int threads : {1, 3}) {
    for (int64_t tile : {1, 7, 64, 2000}) {
      const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
      CpuTiledSampler sampler(sampler_panels.data(), kVocab, kVocab, 1, {threads, tile});
      const std::vector<float> h = {1.0f, 1.0f, 1.0f};
      const std::vector<RowParams> params = {{0.0f, 1, 0, 0}, {0.0f, 99, 5, 1}, {0.0f, 7, 7, 7}};
      const Outputs out = RunSampler(sampler, h, 3, params);
      for (int b = 0; b < 3; ++b) EXPECT_EQ(out.tokens[b], 700) << threads << " " << tile;
    }
  }
  // With the first maximum masked away, the next one wins.
  const std::vector<float> masked_panels = testing::TokenPanelsOf(w, 1);
  CpuTiledSampler masked(masked_panels.data(), kVocab, 700, 1, {kThreads, 64});
  std::vector<float> h1 = {1.0f};
  std::vector<RowParams> greedy = {{0.0f, 0, 0, 0}};
  const Outputs out = RunSampler(masked, h1, 1, greedy);
  const int64_t expected = std::max_element(w.begin(), w.begin() + 700) - w.begin();
  EXPECT_EQ(out.tokens[0], expected);
}

// ---------------------------------------------------------------------------
// Draft rows (speculative verification). A sampled row with draft x returns
// exactly the token a plain row returns when x's logit is pushed out of reach
// (same noise for every other token), for any tile size and thread count;
// greedy rows are unchanged; draft_logprobs is l'_x - log Z over all tokens.
TEST(TiledSamplerTest, DraftRowsSampleTheResidualAndScoreTheDraft) {
  constexpr int64_t kVocab = 300;
  std::vector<float> w(kVocab);
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : w) x = normal(rng);
  w[123] = 5.0f;  // the argmax, a likely draft
  std::vector<float> w_without = w;
  w_without[123] = -1e30f;
  constexpr int64_t kBatch = 64;
  const std::vector<float> h(kBatch, 1.0f);
  std::vector<RowParams> params(kBatch);
  std::vector<int32_t> drafts(kBatch, 123);
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = RowParams{b % 8 == 0 ? 0.0f : 0.7f, 1000 + static_cast<uint64_t>(b), 2, 0};
    if (b % 5 == 4) drafts[b] = -1;
  }
  double m = -INFINITY, sum = 0;
  for (float x : w) m = std::max(m, static_cast<double>(x));
  for (float x : w) sum += std::exp(x - m);
  const double ref_logz_t1 = m + std::log(sum);
  for (int threads : {1, 3}) {
    for (int64_t tile : {7, 64, 1024}) {
      const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
      CpuTiledSampler sampler(sampler_panels.data(), kVocab, kVocab, 1, {threads, tile});
      const std::vector<float> without_panels = testing::TokenPanelsOf(w_without, 1);
      CpuTiledSampler without(without_panels.data(), kVocab, kVocab, 1, {threads, tile});
      const Outputs plain = RunSampler(sampler, h, kBatch, params);
      const Outputs excluded = RunSampler(without, h, kBatch, params);
      std::vector<int32_t> tokens(kBatch, -7);
      std::vector<float> logz(kBatch), draft_logprobs(kBatch);
      ASSERT_EQ(sampler.Sample(h.data(), kBatch, params.data(), drafts.data(),
                               {tokens.data(), logz.data(), nullptr, draft_logprobs.data()}),
                KernelStatus::kOk);
      for (int64_t b = 0; b < kBatch; ++b) {
        EXPECT_EQ(logz[b], plain.logz[b]) << b;  // log Z covers every token, x included
        if (drafts[b] < 0) {
          EXPECT_EQ(tokens[b], plain.tokens[b]);
          EXPECT_TRUE(std::isnan(draft_logprobs[b]));
        } else if (params[b].temperature == 0.0f) {
          EXPECT_EQ(tokens[b], plain.tokens[b]);  // greedy: the argmax (here x itself)
          EXPECT_EQ(tokens[b], 123);
          EXPECT_NEAR(draft_logprobs[b], 5.0 - ref_logz_t1, 1e-5);
        } else {
          EXPECT_EQ(tokens[b], excluded.tokens[b]) << b << " " << threads << " " << tile;
          EXPECT_NE(tokens[b], 123);
          EXPECT_NEAR(draft_logprobs[b], 5.0f * (1.0f / 0.7f) - logz[b], 1e-6);
        }
      }
    }
  }
  // A draft outside [0, valid_vocab), or drafts without the output, is refused.
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
  CpuTiledSampler sampler(sampler_panels.data(), kVocab, 200, 1, {kThreads, 64});
  std::vector<int32_t> tokens(1);
  std::vector<float> lp(1);
  const RowParams p{1.0f, 1, 0, 0};
  const int32_t bad = 200, ok = 5;
  EXPECT_EQ(sampler.Sample(h.data(), 1, &p, &bad, {tokens.data(), nullptr, nullptr, lp.data()}),
            KernelStatus::kInvalidArgument);
  EXPECT_EQ(sampler.Sample(h.data(), 1, &p, &ok, {tokens.data(), nullptr, nullptr, nullptr}),
            KernelStatus::kInvalidArgument);
  // A vocabulary of x alone: no residual, x is returned with p(x) = 1.
  const std::vector<float> single_panels = testing::TokenPanelsOf(w, 1);
  CpuTiledSampler single(single_panels.data(), kVocab, 1, 1, {kThreads, 64});
  const int32_t zero = 0;
  ASSERT_EQ(single.Sample(h.data(), 1, &p, &zero, {tokens.data(), nullptr, nullptr, lp.data()}),
            KernelStatus::kOk);
  EXPECT_EQ(tokens[0], 0);
  EXPECT_EQ(lp[0], 0.0f);
}

// ---------------------------------------------------------------------------
// (d) Invariances.

// Thread count: bit-identical tokens, logz and logprobs (random fp32 inputs:
// same logits whatever the split, same merge order). The small head is one
// tile, so more threads cut the batch into smaller row blocks instead.
TEST(TiledSamplerTest, BitIdenticalForAnyThreadCount) {
  struct Head {
    int64_t vocab, valid_vocab, tile_rows;
  };
  constexpr int64_t kHidden = 64, kBatch = 200;
  for (const Head head : {Head{5000, 4990, 256}, Head{130, 128, 1024}}) {
    const std::vector<float> w = NormalMatrix(head.vocab, kHidden, 0.3f, 41);
    const std::vector<float> h = NormalMatrix(kBatch, kHidden, 1.0f, 42);
    std::vector<RowParams> params(kBatch);
    for (int64_t b = 0; b < kBatch; ++b) {
      params[b] = RowParams{b % 5 == 0 ? 0.0f : 0.8f, 5, 9, static_cast<uint32_t>(b)};
    }
    const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, kHidden);
    for (int64_t batch : {kBatch, int64_t{37}, int64_t{3}}) {
      Outputs reference;
      for (int threads : {1, 2, 3, 5}) {
        CpuTiledSampler sampler(sampler_panels.data(), head.vocab, head.valid_vocab, kHidden,
                                {threads, head.tile_rows});
        EXPECT_EQ(sampler.num_threads(), threads);
        const Outputs out = RunSampler(sampler, h, batch, params);
        if (threads == 1) {
          reference = out;
          continue;
        }
        const std::string where =
            "vocab " + std::to_string(head.vocab) + " batch " + std::to_string(batch) + " threads " + std::to_string(threads);
        EXPECT_EQ(out.tokens, reference.tokens) << where;
        for (int64_t b = 0; b < batch; ++b) {  // bitwise, NaN-free
          EXPECT_EQ(std::memcmp(&out.logz[b], &reference.logz[b], 4), 0) << where << " row " << b;
          EXPECT_EQ(std::memcmp(&out.logprobs[b], &reference.logprobs[b], 4), 0) << where << " row " << b;
        }
      }
    }
  }
}

// Tile size: identical tokens (exact integer logits, so the sgemm shape cannot
// change them), including tiles of 1, of odd sizes and larger than V.
TEST(TiledSamplerTest, TokensIndependentOfTileSize) {
  constexpr int64_t kVocab = 2003, kHidden = 8, kBatch = 64;
  const std::vector<float> w = IntegerMatrix(kVocab, kHidden, 3, 51);
  const std::vector<float> h = IntegerMatrix(kBatch, kHidden, 3, 52);
  std::vector<RowParams> params(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = RowParams{b % 8 == 0 ? 0.0f : 1.3f, 77, 1, static_cast<uint32_t>(b)};
  }
  std::vector<int32_t> reference;
  for (int64_t tile : {1, 3, 50, 64, 1000, 4096}) {
    const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, kHidden);
    CpuTiledSampler sampler(sampler_panels.data(), kVocab, kVocab, kHidden, {kThreads, tile});
    const Outputs out = RunSampler(sampler, h, kBatch, params);
    if (reference.empty()) {
      reference = out.tokens;
      const std::vector<float> logits = ExactLogits(h, w, kBatch, kVocab, kHidden);
      for (int64_t b = 0; b < kBatch; ++b) {
        ASSERT_EQ(reference[b], ReferenceToken(logits.data() + b * kVocab, kVocab, params[b]));
      }
    }
    EXPECT_EQ(out.tokens, reference) << "tile " << tile;
  }
}

// Batch composition: a row gives the same result alone and among other rows
// (at another position, with other params), and replaying (seed, offset)
// replays the token while a new offset draws anew.
TEST(TiledSamplerTest, RowIndependentOfBatchAndReplayable) {
  constexpr int64_t kVocab = 3000, kHidden = 32, kBatch = 150;
  const std::vector<float> w = NormalMatrix(kVocab, kHidden, 0.4f, 61);
  const std::vector<float> h = NormalMatrix(kBatch, kHidden, 1.0f, 62);
  std::vector<RowParams> params(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = RowParams{1.0f, 123 + static_cast<uint64_t>(b), 0, 0};
  }
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, kHidden);
  CpuTiledSampler sampler(sampler_panels.data(), kVocab, kVocab, kHidden, {kThreads, 512});
  const Outputs batched = RunSampler(sampler, h, kBatch, params);
  for (int64_t b : {0, 1, 77, 128, 149}) {
    const std::vector<float> row(h.begin() + b * kHidden, h.begin() + (b + 1) * kHidden);
    const Outputs alone = RunSampler(sampler, row, 1, {params[b]});
    EXPECT_EQ(alone.tokens[0], batched.tokens[b]) << b;
    // The logits of a row may round differently between sgemm shapes (M = 1 vs
    // M = 128), so logz is compared to fp32 accuracy here, not bitwise.
    EXPECT_NEAR(alone.logz[0], batched.logz[b], 1e-5 * std::fabs(batched.logz[b])) << b;
  }
  const Outputs replay = RunSampler(sampler, h, kBatch, params);
  EXPECT_EQ(replay.tokens, batched.tokens);
  for (auto& p : params) p.offset = 1;
  const Outputs next_step = RunSampler(sampler, h, kBatch, params);
  int64_t changed = 0;
  for (int64_t b = 0; b < kBatch; ++b) changed += next_step.tokens[b] != batched.tokens[b];
  EXPECT_GT(changed, kBatch / 2);
}

// ---------------------------------------------------------------------------
// (e) valid_vocab: tokens >= valid_vocab are never sampled, even with the
// largest logits, and they are left out of log Z.
TEST(TiledSamplerTest, MaskedTokensNeverSampledAndNotInLogZ) {
  constexpr int64_t kVocab = 1000, kValid = 900, kBatch = 2000;
  std::vector<float> w = NormalMatrix(kVocab, 1, 1.0f, 71);
  for (int64_t v = kValid; v < kVocab; ++v) w[v] = 1000.0f;
  const std::vector<float> h(kBatch, 1.0f);
  std::vector<RowParams> params(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    params[b] = RowParams{b == 0 ? 0.0f : 5.0f, 8, 0, static_cast<uint32_t>(b)};
  }
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
  CpuTiledSampler sampler(sampler_panels.data(), kVocab, kValid, 1, {kThreads, 64});
  const Outputs out = RunSampler(sampler, h, kBatch, params);
  for (int64_t b = 0; b < kBatch; ++b) ASSERT_LT(out.tokens[b], kValid) << b;
  double logz = 0.0;
  ReferenceProbs(w.data(), kValid, LogitScale(params[1]), &logz);
  EXPECT_NEAR(out.logz[1], logz, 1e-5 * std::max(1.0, logz));
  EXPECT_EQ(out.tokens[0], std::max_element(w.begin(), w.begin() + kValid) - w.begin());
}

// ---------------------------------------------------------------------------
// (f) Bad arguments: kInvalidArgument, outputs untouched.
TEST(TiledSamplerTest, RejectsBadArguments) {
  const std::vector<float> w(100 * 4, 0.5f);
  const std::vector<float> h(2 * 4, 1.0f);
  const std::vector<RowParams> params(2);
  int32_t tokens[2] = {-7, -7};
  float logz[2] = {-7.0f, -7.0f};
  auto expect_invalid = [&](CpuTiledSampler& s, const float* hs, int64_t batch,
                            const RowParams* p, CpuSampleOutputs o) {
    EXPECT_EQ(s.Sample(hs, batch, p, o), KernelStatus::kInvalidArgument);
    EXPECT_EQ(tokens[0], -7);
    EXPECT_EQ(logz[0], -7.0f);
  };
  const CpuSampleOutputs outs{tokens, logz, nullptr};

  // Bad construction: every Sample() fails.
  struct BadConfig {
    const float* weight;
    int64_t vocab, valid_vocab, hidden;
    CpuSamplerConfig config;
  };
  const BadConfig bad_configs[] = {
      {nullptr, 100, 100, 4, {1, 64}},  {w.data(), 0, 0, 4, {1, 64}},
      {w.data(), 100, 0, 4, {1, 64}},   {w.data(), 100, 101, 4, {1, 64}},
      {w.data(), 100, -1, 4, {1, 64}},  {w.data(), 100, 100, 0, {1, 64}},
      {w.data(), -5, 100, 4, {1, 64}},  {w.data(), 100, 100, 4, {1, 0}},
      {w.data(), 100, 100, 4, {1, -64}}, {w.data(), 100, 100, 4, {-1, 64}},
      {w.data(), int64_t{1} << 31, 100, 4, {1, 64}},
  };
  for (const BadConfig& c : bad_configs) {
    CpuTiledSampler s(c.weight, c.vocab, c.valid_vocab, c.hidden, c.config);
    expect_invalid(s, h.data(), 2, params.data(), outs);
  }

  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 4);
  CpuTiledSampler sampler(sampler_panels.data(), 100, 100, 4, {2, 64});
  expect_invalid(sampler, nullptr, 2, params.data(), outs);
  expect_invalid(sampler, h.data(), 2, nullptr, outs);
  expect_invalid(sampler, h.data(), 2, params.data(), {nullptr, logz, nullptr});
  expect_invalid(sampler, h.data(), 0, params.data(), outs);
  expect_invalid(sampler, h.data(), -1, params.data(), outs);
  // Negative, NaN, infinite, and so small that 1/T overflows to infinity.
  for (float t : {-1.0f, -1e-30f, NAN, INFINITY, 1e-39f}) {
    std::vector<RowParams> bad = params;
    bad[1].temperature = t;
    expect_invalid(sampler, h.data(), 2, bad.data(), outs);
  }
  for (float x : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> bad_h = h;
    bad_h[5] = x;
    expect_invalid(sampler, bad_h.data(), 2, params.data(), outs);
  }
  // Weights whose logits are all NaN leave a row without a winner.
  std::vector<float> nan_w = w;
  for (float& x : nan_w) x = NAN;
  const std::vector<float> nan_sampler_panels = testing::TokenPanelsOf(nan_w, 4);
  CpuTiledSampler nan_sampler(nan_sampler_panels.data(), 100, 100, 4, {2, 64});
  expect_invalid(nan_sampler, h.data(), 2, params.data(), outs);
  // And the first sampler still works.
  EXPECT_EQ(sampler.Sample(h.data(), 2, params.data(), outs), KernelStatus::kOk);
  EXPECT_GE(tokens[0], 0);
}

TEST(TiledSamplerTest, DefaultThreadCountIsHardwareConcurrency) {
  const std::vector<float> w(16, 1.0f);
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
  CpuTiledSampler sampler(sampler_panels.data(), 16, 16, 1, {0, 4});
  EXPECT_EQ(sampler.num_threads(),
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace flashsampler::kernels
