#include "tests/gpu/controls_test_problems.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/controlled_sampler.h"
#include "tests/common/token_panels.h"

namespace flashsampler::kernels::controls_test {

uint16_t Bf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

float RoundToBf16(float x) {
  const uint32_t u = static_cast<uint32_t>(Bf16Bits(x)) << 16;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

RandomProblem MakeRandomProblem(int64_t vocab, int64_t rows, float tie_step, uint32_t seed,
                                bool fused_only) {
  RandomProblem p;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  p.w.resize(vocab);
  for (float& x : p.w) {
    x = normal(rng);
    if (tie_step > 0) x = std::round(x / tie_step) * tie_step;
    if (fused_only) x = RoundToBf16(x);
  }
  for (int64_t r = 0; r < rows; ++r) {
    p.h.push_back(fused_only ? RoundToBf16(0.5f + unit(rng)) : 0.5f + unit(rng));
    p.params.push_back(RowParams{r % 7 == 0 ? 0.0f : 0.3f + 1.5f * unit(rng),
                                 static_cast<uint64_t>(seed) * 100000 + r, static_cast<uint64_t>(r % 5),
                                 static_cast<uint32_t>(r % 3)});
    RowControls c;
    switch (r % 4) {
      case 0: c.top_k = 1 + static_cast<int32_t>(rng() % 64); break;
      case 1: c.top_k = 65 + static_cast<int32_t>(rng() % 2000); break;
      default: break;
    }
    if (r % 3 != 2) c.top_p = 0.2f + 0.79f * unit(rng);
    if (r % 5 == 1 || r % 5 == 3) c.min_p = 0.3f * unit(rng);
    if (r % 4 == 2) {
      c.repetition_penalty = 1.3f;
      c.frequency_penalty = 0.4f;
      c.presence_penalty = -0.2f;
      for (int i = 0; i < 40; ++i) c.output_token_ids.push_back(token(rng));
      for (int i = 0; i < 40; ++i) c.prompt_token_ids.push_back(token(rng));
    }
    if (r % 6 == 3) {
      c.logit_bias = {{token(rng), 5.0f}, {token(rng) / 2 * 2 + 1, -3.0f}};
      c.banned_token_ids = {token(rng), token(rng)};
      c.allowed_bitmask.assign((vocab + 31) / 32, 0xF0F0F0F7u ^ static_cast<uint32_t>(r));
    }
    c.top_logprobs = static_cast<int32_t>(r % 7) * 3;  // 0 .. 18
    if (r % 9 == 4) c.logprobs_mode = LogprobsMode::kRaw;
    c.num_samples = 1 + static_cast<int32_t>(r % 3);
    c.sample_stream_stride = 3;
    if (fused_only) {
      c.logprobs_mode = LogprobsMode::kSampled;
      if (c.top_k > 64) c.top_k = 1 + c.top_k % 64;
      if (c.top_k == 0) {  // a summary row: no filter, no top list, one sample
        c.top_p = 1.0f;
        c.min_p = 0.0f;
        c.top_logprobs = 0;
        c.num_samples = 1;
      }
    }
    p.controls.push_back(c);
  }
  return p;
}

Outputs RunCpu(const std::vector<float>& w, const std::vector<float>& h,
               const std::vector<RowParams>& params, const std::vector<RowControls>& controls,
               const std::vector<int32_t>* drafts) {
  const int64_t vocab = static_cast<int64_t>(w.size());
  const int64_t rows = static_cast<int64_t>(h.size());
  const std::vector<float> sampler_panels = testing::TokenPanelsOf(w, 1);
  CpuControlledSampler sampler(sampler_panels.data(), vocab, vocab, 1, {2, 1024});
  Outputs out;
  out.tokens.assign(rows, -7);
  out.logz.assign(rows, NAN);
  out.logprobs.assign(rows, NAN);
  out.details.resize(rows);
  if (drafts != nullptr) out.draft_logprobs.assign(rows, 7.0f);
  out.launch = sampler.Sample(
      h.data(), rows, params.data(), controls.data(), drafts != nullptr ? drafts->data() : nullptr,
      CpuControlledPath::kMaterialized,
      {out.tokens.data(), out.logz.data(), out.logprobs.data(), out.details.data(),
       drafts != nullptr ? out.draft_logprobs.data() : nullptr});
  return out;
}

void ExpectAgrees(const Outputs& gpu, const Outputs& cpu, const RandomProblem& p) {
  const size_t n = p.h.size();
  ASSERT_EQ(gpu.row_status.size(), n) << "the GPU launch returned no outputs";
  for (const Outputs* o : {&gpu, &cpu}) {
    ASSERT_EQ(o->details.size(), n);
    ASSERT_EQ(o->tokens.size(), n);
    ASSERT_EQ(o->logz.size(), n);
    ASSERT_EQ(o->logprobs.size(), n);
  }
  const int64_t rows = static_cast<int64_t>(n);
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    ASSERT_EQ(gpu.row_status[r], 0);
    const RowSampleDetail& g = gpu.details[r];
    const RowSampleDetail& c = cpu.details[r];
    if (g.token_ids != c.token_ids) {
      ++mismatches;
      continue;
    }
    EXPECT_EQ(gpu.tokens[r], cpu.tokens[r]);
    const float tol = 2e-5f * std::max(1.0f, std::fabs(cpu.logz[r]));
    if (!gpu.draft_logprobs.empty() || !cpu.draft_logprobs.empty()) {
      ASSERT_EQ(gpu.draft_logprobs.size(), n);
      ASSERT_EQ(cpu.draft_logprobs.size(), n);
      const float gd = gpu.draft_logprobs[r], cd = cpu.draft_logprobs[r];
      if (std::isnan(cd)) {
        EXPECT_TRUE(std::isnan(gd)) << gd;
      } else if (std::isinf(cd)) {
        EXPECT_EQ(gd, cd);  // -inf: a control removed the draft
      } else {
        EXPECT_NEAR(gd, cd, tol);
      }
    }
    EXPECT_NEAR(gpu.logz[r], cpu.logz[r], tol);
    EXPECT_NEAR(gpu.logprobs[r], cpu.logprobs[r], tol);
    EXPECT_EQ(g.ranks, c.ranks);
    ASSERT_EQ(g.logprobs.size(), c.logprobs.size());
    for (size_t j = 0; j < g.logprobs.size(); ++j) EXPECT_NEAR(g.logprobs[j], c.logprobs[j], tol);
    ASSERT_EQ(g.top.size(), c.top.size());
    for (size_t i = 0; i < g.top.size(); ++i) {
      EXPECT_EQ(g.top[i].token_id, c.top[i].token_id) << "top " << i;
      EXPECT_NEAR(g.top[i].logprob, c.top[i].logprob, tol) << "top " << i;
    }
  }
  EXPECT_LE(mismatches, rows / 1000) << mismatches << " of " << rows << " rows differ";
}

DeviceOutputs::DeviceOutputs(int64_t rows, int64_t samples)
    : tokens_(rows), status_(rows), sample_tokens_(samples), ranks_(samples),
      top_ids_(rows * kMaxTopLogprobs), top_counts_(rows), logz_(rows), logprobs_(rows),
      sample_logprobs_(samples), top_logprobs_(rows * kMaxTopLogprobs), draft_logprobs_(rows) {
  for (const auto* b : {&tokens_, &status_, &sample_tokens_, &ranks_, &top_ids_, &top_counts_}) {
    EXPECT_EQ(cudaMemset(b->data(), 0xff, b->bytes()), cudaSuccess);
  }
  for (const auto* b : {&logz_, &logprobs_, &sample_logprobs_, &top_logprobs_}) {
    EXPECT_EQ(cudaMemset(b->data(), 0xff, b->bytes()), cudaSuccess);
  }
  // Finite poison: an unwritten draft log-probability is not mistaken for the
  // NaN of a row without a draft.
  draft_logprobs_.Upload(std::vector<float>(static_cast<size_t>(rows), 7.0f));
}

ControlledSampleOutputs DeviceOutputs::View() {
  return ControlledSampleOutputs{tokens_.data(),        logz_.data(),          logprobs_.data(),
                                 status_.data(),        sample_tokens_.data(), sample_logprobs_.data(),
                                 ranks_.data(),         top_ids_.data(),       top_logprobs_.data(),
                                 top_counts_.data(),    draft_logprobs_.data()};
}

void DeviceOutputs::Download(const FlatControls& flat, int64_t rows, Outputs* out,
                             bool drafts) const {
  const size_t samples = static_cast<size_t>(flat.total_samples);
  if (drafts) out->draft_logprobs = draft_logprobs_.Download(rows);
  out->tokens = tokens_.Download(rows);
  out->logz = logz_.Download(rows);
  out->logprobs = logprobs_.Download(rows);
  out->row_status = status_.Download(rows);
  const auto st = sample_tokens_.Download(samples);
  const auto sl = sample_logprobs_.Download(samples);
  const auto sr = ranks_.Download(samples);
  const auto ti = top_ids_.Download(rows * kMaxTopLogprobs);
  const auto tl = top_logprobs_.Download(rows * kMaxTopLogprobs);
  const auto tc = top_counts_.Download(rows);
  out->details.assign(rows, RowSampleDetail{});
  for (int64_t r = 0; r < rows; ++r) {
    const ControlledRowDesc& d = flat.rows[r];
    RowSampleDetail& detail = out->details[r];
    detail.token_ids.assign(st.begin() + d.sample_begin, st.begin() + d.sample_begin + d.num_samples);
    if (d.top_logprobs <= 0 || out->row_status[r] != 0) continue;
    detail.logprobs.assign(sl.begin() + d.sample_begin, sl.begin() + d.sample_begin + d.num_samples);
    detail.ranks.assign(sr.begin() + d.sample_begin, sr.begin() + d.sample_begin + d.num_samples);
    EXPECT_TRUE(tc[r] >= 0 && tc[r] <= d.top_logprobs) << "row " << r << ": " << tc[r];
    for (int32_t i = 0; i < tc[r] && i < kMaxTopLogprobs; ++i) {
      detail.top.push_back(TokenLogprob{ti[r * kMaxTopLogprobs + i], tl[r * kMaxTopLogprobs + i]});
    }
  }
}

}  // namespace flashsampler::kernels::controls_test
