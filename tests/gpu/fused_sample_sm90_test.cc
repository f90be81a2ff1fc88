// The Hopper WGMMA + TMA stage 1 (kernels/cuda/fused_sample_sm90.cu,
// FusedSampleArgs::stage1 = kWgmma) on the device (ctest label `gpu`; built
// only with FLASHSAMPLER_CUTLASS; skipped on a device that is not compute
// capability 9.0, the only one its sm_90a code runs on).
//
// 1. Agreement, per launch shape (both shapes of issue 22 with the vocabulary
//    cut small: D = 4096 and 8192; V not a multiple of 128, valid_vocab < V
//    with masked W rows that would win every row if they leaked; drafts, or
//    token_offset != 0; greedy and sampled rows; bf16 and fp16; batches that
//    take every block shape, 32 / 64 / 128 / 256 rows and two 256-row chunks):
//    every 128-token tile summary of mma.sync, final token, log Z, logprob
//    and draft logprob against a float64 reference; the WGMMA tile summaries
//    against mma.sync's (equal, or pruned by the cross-tile bound as
//    CompareTiles allows) and the final outputs bit for bit. Then the bound
//    at work on a 151936-token head. The bound (no other tolerance is used):
//      eps(v) = 2 * (K / 16) * 2^-24 * sum_d |w_vd h_d|
//    bounds the fp32 error of token v's dot product on the tensor cores: the
//    products of 16-bit values are exact in fp32, and each k16 step rounds at
//    most twice (its 16 products' sum, its add to the accumulator), each time
//    by at most 2^-24 of a magnitude <= sum_d |w_vd h_d|. A token may differ
//    from the reference's (or the other path's) only when the two tokens'
//    float64 scores are within scale * (eps(a) + eps(b)) plus 4 ulps of the
//    scores (the fp32 add of the noise). log Z within scale * max_v eps(v) +
//    V * 2^-23 (the dots' error moves every logit by at most the former; the
//    fp32 log-sum-exp over V terms adds at most 2^-24 relative per add and
//    rescale, and expf's 2 ulps, which the latter covers).
// 2. Batch invariance, bitwise: 64 random rows (random params, drafts or a
//    token_offset), each alone and inside batches of 2, 3, 17, 64, 80, 128,
//    160, 192, 208, 255, 256, 512 and 1024 with random companions at random positions: every
//    token, log Z, logprob and draft logprob is bit-identical to the row
//    alone. Run on the WGMMA path (the claim of fused_sample_sm90.cu's header,
//    including the one hardware assumption it names) and, for comparison, on
//    the mma.sync path.
// 3. Chi-square exactness of the WGMMA path (tests/gpu/sample_counts.h, as
//    fused_sample_exactness_test.cc's TensorCorePathChiSquare).
// 4. A forced kWgmma launch it cannot serve is refused (InvalidArgument).
// Every part runs on the four WGMMA schedules: kWgmma (one block per SM),
// kWgmmaOverlap (two per SM, at most 128 rows a block, paired-row epilogue),
// kWgmmaPingpong (persistent, two consumer warpgroups alternating, at most
// 128 rows a work item) and kWgmmaSeparateEpilogue (persistent, two MMA
// warpgroups handing each item's dot tile to 8 epilogue warps, 11 at 128
// rows; at D >= 8192 its 96- and 128-row boxes as 2-block tile pairs that
// share Hr through TMA multicast), which must give the same bits (all are
// held to mma.sync's tile summaries, kWgmma's exactly, the others' up to
// pruned winners).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/common/gumbel_noise.h"
#include "kernels/common/row_params.h"
#include "kernels/common/sample_summary.h"
#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/sample_counts.h"

namespace flashsampler::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::DeviceWeights;
using gpu_test::HostWeights;

constexpr int64_t kTileTokens = 128;  // the tensor-core stage 1's workspace tile

class FusedSampleSm90Test : public gpu_test::GpuTest {
 protected:
  void SetUp() override {
    gpu_test::GpuTest::SetUp();
    if (HasFatalFailure()) return;
    if (!WgmmaStage1Available()) {
      GTEST_SKIP() << "the WGMMA stage 1 runs on compute capability 9.0 (sm_90a) only";
    }
  }
};

// One launch's problem on the device.
struct Launch {
  const void* weight = nullptr;
  CudaWeightDType dtype = CudaWeightDType::kBFloat16;
  int64_t vocab = 0;
  int64_t valid_vocab = 0;
  int64_t hidden = 0;
  int64_t token_offset = 0;
};

struct Outputs {
  std::vector<int32_t> tokens;
  std::vector<float> logz, logprobs, draft_logprobs;
  std::vector<SampleSummary> tiles;  // [batch][ceil(valid_vocab / 128)]
};

int64_t NumTiles(int64_t valid_vocab) { return (valid_vocab + kTileTokens - 1) / kTileTokens; }

// Every row output (token, log Z, logprob, draft logprob) the same bits.
bool SameOutputBits(const Outputs& x, const Outputs& y) {
  const auto same = [](const auto& u, const auto& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(u[0])) == 0;
  };
  return same(x.tokens, y.tokens) && same(x.logz, y.logz) && same(x.logprobs, y.logprobs) &&
         same(x.draft_logprobs, y.draft_logprobs);
}

// RunLaunch: LaunchFusedSample with every output requested (drafts when given;
// with_lse false: tokens only, no log Z or logprobs), outputs poisoned first, and downloads them plus the stage-1 tile summaries
// at the start of the workspace (fused_sample.cu's layout).
KernelStatus RunLaunch(const Launch& l, const std::vector<float>& hidden,
                 const std::vector<RowParams>& params, const std::vector<int32_t>* drafts,
                 Stage1Kernel stage1, Outputs* out, bool with_lse = true) {
  const int64_t batch = static_cast<int64_t>(params.size());
  DeviceBuffer<float> d_hidden(hidden.size());
  DeviceBuffer<RowParams> d_params(params.size());
  DeviceBuffer<int32_t> d_tokens(params.size()), d_drafts(params.size());
  DeviceBuffer<float> d_logz(params.size()), d_logprobs(params.size()),
      d_draft_logprobs(params.size());
  const size_t ws_bytes = FusedSampleWorkspaceBytes(batch, l.valid_vocab, l.hidden);
  DeviceBuffer<uint8_t> d_workspace(ws_bytes);
  if (d_hidden.data() == nullptr || d_workspace.data() == nullptr) return KernelStatus::kOutOfMemory;
  d_hidden.Upload(hidden);
  d_params.Upload(params);
  EXPECT_EQ(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_logz.data(), 0xff, d_logz.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_logprobs.data(), 0xff, d_logprobs.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_draft_logprobs.data(), 0xff, d_draft_logprobs.bytes()), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_workspace.data(), 0xff, d_workspace.bytes()), cudaSuccess);
  if (drafts != nullptr) d_drafts.Upload(*drafts);

  FusedSampleArgs args;
  args.weight = l.weight;
  args.weight_dtype = l.dtype;
  args.hidden = d_hidden.data();
  args.params = d_params.data();
  args.batch = batch;
  args.vocab = l.vocab;
  args.valid_vocab = l.valid_vocab;
  args.hidden_dim = l.hidden;
  args.token_offset = l.token_offset;
  args.token_ids = d_tokens.data();
  args.logz = with_lse ? d_logz.data() : nullptr;
  args.logprobs = with_lse ? d_logprobs.data() : nullptr;
  args.workspace = d_workspace.data();
  args.workspace_bytes = ws_bytes;
  args.stage1 = stage1;
  if (drafts != nullptr) {
    args.draft_tokens = d_drafts.data();
    args.draft_logprobs = d_draft_logprobs.data();
  }
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  KernelStatus status = LaunchFusedSample(args, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
  if (sync != cudaSuccess && status == KernelStatus::kOk) status = KernelStatus::kDeviceError;
  cudaStreamDestroy(stream);
  if (status != KernelStatus::kOk) return status;
  out->tokens = d_tokens.Download(params.size());
  out->logz = d_logz.Download(params.size());
  out->logprobs = d_logprobs.Download(params.size());
  out->draft_logprobs = drafts != nullptr ? d_draft_logprobs.Download(params.size())
                                          : std::vector<float>();
  const size_t n_tiles = static_cast<size_t>(batch * NumTiles(l.valid_vocab));
  const std::vector<uint8_t> ws = d_workspace.Download(n_tiles * sizeof(SampleSummary));
  out->tiles.resize(n_tiles);
  std::memcpy(out->tiles.data(), ws.data(), n_tiles * sizeof(SampleSummary));
  return status;
}

// ---- float64 reference of one row -------------------------------------------------
struct RowReference {
  std::vector<double> logit;  // l'_v = dot64 * scale, v < valid_vocab (local ids)
  std::vector<double> score;  // l'_v + noise (fp32 noise of the global id); NaN for an excluded draft
  std::vector<double> eps;    // scale * eps(v): the bound on |fp32 l'_v - l'_v|
  double logz = 0.0;
  double max_eps = 0.0;
};

RowReference ReferenceRow(const HostWeights& w, const float* h, const RowParams& p,
                          int64_t valid_vocab, int64_t token_offset, int32_t draft) {
  RowReference r;
  const double scale = LogitScale(p);
  const bool sampled = p.temperature > 0.0f;
  const double steps = static_cast<double>((w.hidden + 15) / 16);
  r.logit.resize(valid_vocab);
  r.score.resize(valid_vocab);
  r.eps.resize(valid_vocab);
  double m = -INFINITY;
  for (int64_t v = 0; v < valid_vocab; ++v) {
    const float* row = w.Row(v);
    double dot = 0.0, abs_sum = 0.0;
    for (int64_t d = 0; d < w.hidden; ++d) {
      const double prod = static_cast<double>(h[d]) * row[d];
      dot += prod;
      abs_sum += std::fabs(prod);
    }
    r.logit[v] = dot * scale;
    r.eps[v] = scale * 2.0 * steps * std::ldexp(abs_sum, -24);
    r.max_eps = std::max(r.max_eps, r.eps[v]);
    const uint32_t global = static_cast<uint32_t>(v + token_offset);
    r.score[v] = sampled ? r.logit[v] + GumbelNoise(p.seed, p.offset, p.stream, global) : r.logit[v];
    if (sampled && v == draft) r.score[v] = NAN;  // excluded from the sample, kept in log Z
    m = std::max(m, r.logit[v]);
  }
  double sum = 0.0;
  for (double l : r.logit) sum += std::exp(l - m);
  r.logz = m + std::log(sum);
  return r;
}

// True when `token` (a local id) is an acceptable winner among local tokens
// [begin, end): the reference's best there, or within the rounding bound of it.
bool AcceptableWinner(const RowReference& r, int64_t token, int64_t begin, int64_t end,
                      std::string* why) {
  int64_t best = -1;
  for (int64_t v = begin; v < end; ++v) {
    if (std::isnan(r.score[v])) continue;
    if (best < 0 || r.score[v] > r.score[best]) best = v;
  }
  if (token == best) return true;
  if (token < begin || token >= end || best < 0 || std::isnan(r.score[token])) {
    *why = "token " + std::to_string(token) + " outside the candidates (best " +
           std::to_string(best) + ")";
    return false;
  }
  const double gap = r.score[best] - r.score[token];
  const double bound = r.eps[best] + r.eps[token] +
                       4.0 * std::ldexp(std::fabs(r.score[best]) + std::fabs(r.score[token]), -24);
  if (gap <= bound) return true;
  *why = "token " + std::to_string(token) + " vs best " + std::to_string(best) + ": score gap " +
         std::to_string(gap) + " > bound " + std::to_string(bound);
  return false;
}

// Random inputs of one agreement / invariance problem.
struct Problem {
  HostWeights w;
  DeviceWeights dw;
  Launch launch;
};

// W ~ N(0, 3 / sqrt(D)) below valid_vocab, 4.0 above it (masked rows: with
// positive H they would win every row); H positive (|N(0,1)| + 0.1) rounded to
// the weight dtype (the tensor-core paths' precondition, fused_sample.h).
void MakeProblem(CudaWeightDType dtype, int64_t vocab, int64_t valid_vocab, int64_t hidden,
                 int64_t token_offset, uint32_t seed, Problem* p) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f / std::sqrt(static_cast<float>(hidden)));
  p->w = gpu_test::MakeWeights(dtype, vocab, hidden, [&](int64_t v, int64_t) {
    return v >= valid_vocab ? 4.0f : normal(rng);
  });
  gpu_test::UploadWeights(p->w, 0, &p->dw);
  p->launch = Launch{p->dw.ptr, dtype, vocab, valid_vocab, hidden, token_offset};
}

std::vector<float> RandomHidden(int64_t rows, int64_t hidden, CudaWeightDType dtype, uint32_t seed) {
  std::vector<float> h = gpu_test::RandomMatrix(rows, hidden, 1.0f, seed);
  for (float& x : h) x = 0.1f + std::fabs(x);
  gpu_test::RoundInPlace(dtype, &h);
  return h;
}

// Drafts for about a third of the rows: a random token below valid_vocab, or
// (one row in 8 of those) valid_vocab itself, which is no valid draft.
std::vector<int32_t> RandomDrafts(int64_t rows, int64_t valid_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> d(static_cast<size_t>(rows), -1);
  for (auto& x : d) {
    const uint32_t r = rng() % 24;
    if (r < 7) x = static_cast<int32_t>(rng() % valid_vocab);
    if (r == 7) x = static_cast<int32_t>(valid_vocab);
  }
  return d;
}

// ---- Tile summaries against mma.sync's ----------------------------------------------
// The schedules with the pruned fold keep a cross-tile bound (fused_sample_sm90.cu,
// "The cross-tile bound"): a tile whose every token is beaten by a score another
// tile of its row already reported may keep an empty winner, or one that is not
// its own best. Against the exact summaries (mma.sync's, which never prune), a
// tile is therefore either bit-identical, or "pruned": its log-sum-exp fields
// bit-identical, its exact winner not the row's winner, and its own winner
// empty or a token of the tile that neither beats the exact one nor the row's.
// Whatever the timing, the rows merged from both sets of summaries must be the
// same bits.
struct TileComparison {
  int64_t identical = 0;
  int64_t pruned = 0;
  int64_t bad = 0;
  std::string first_bad;
};

bool SameBits(const SampleSummary& a, const SampleSummary& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

TileComparison CompareTiles(const std::vector<SampleSummary>& got,
                            const std::vector<SampleSummary>& exact, int64_t batch,
                            int64_t tiles, int64_t first_token, int64_t valid_vocab) {
  TileComparison c;
  auto bad = [&](const std::string& what) {
    if (c.bad++ == 0) c.first_bad = what;
  };
  for (int64_t b = 0; b < batch; ++b) {
    SampleSummary row_exact = EmptySampleSummary(), row_got = EmptySampleSummary();
    for (int64_t t = 0; t < tiles; ++t) {
      row_exact = MergeSummaries(row_exact, exact[b * tiles + t]);
      row_got = MergeSummaries(row_got, got[b * tiles + t]);
    }
    const std::string row = "row " + std::to_string(b) + ": ";
    if (!SameBits(row_got, row_exact)) bad(row + "merged summaries differ");
    for (int64_t t = 0; t < tiles; ++t) {
      const SampleSummary& g = got[b * tiles + t];
      const SampleSummary& e = exact[b * tiles + t];
      if (SameBits(g, e)) {
        ++c.identical;
        continue;
      }
      ++c.pruned;
      const std::string where = row + "tile " + std::to_string(t) + ": ";
      const int64_t begin = first_token + t * kTileTokens;
      const int64_t end = first_token + std::min((t + 1) * kTileTokens, valid_vocab);
      if (std::memcmp(&g.max_logit, &e.max_logit, 4) != 0 ||
          std::memcmp(&g.sum_exp, &e.sum_exp, 4) != 0) {
        bad(where + "log-sum-exp fields differ");
      } else if (!ScoreBeats(row_exact.best_score, row_exact.best_index, e.best_score, e.best_index)) {
        bad(where + "the row's winning tile is not exact");
      } else if (g.best_index >= 0 &&
                 (g.best_index < begin || g.best_index >= end ||
                  ScoreBeats(g.best_score, g.best_index, e.best_score, e.best_index) ||
                  !ScoreBeats(row_exact.best_score, row_exact.best_index, g.best_score,
                              g.best_index))) {
        bad(where + "winner " + std::to_string(g.best_index) + " (" +
            std::to_string(g.best_score) + ") against the tile's " + std::to_string(e.best_index) +
            " (" + std::to_string(e.best_score) + ")");
      }
    }
  }
  return c;
}

// ---- 1. Agreement -----------------------------------------------------------------
struct Shape {
  int64_t hidden, vocab, valid_vocab, token_offset;
  bool drafts;  // drafts are refused with token_offset != 0 (fused_sample.h)
};
const Shape kShapes[] = {
    {4096, 1100, 1037, 0, true},      // D of the 151936-token head; 9 tiles, the last partial
    // D of the 128256-token head; a shard at global 4096; 9 tiles, so the
    // separate schedule's tile pairs (D >= 8192) end on a phantom tile
    {8192, 1100, 1063, 4096, false},
    // One partial tile (OneTile below): in the separate schedule's tile pairs
    // every item of the second block is a phantom past the vocabulary.
    {8192, 100, 97, 0, true},
};

using AgreementCase =
    std::tuple<Stage1Kernel, CudaWeightDType, int /*shape*/, int64_t /*batch*/>;
class FusedSampleSm90Agreement : public FusedSampleSm90Test,
                                 public ::testing::WithParamInterface<AgreementCase> {};

TEST_P(FusedSampleSm90Agreement, MatchesFloat64AndMmaSync) {
  const auto [stage1, dtype, shape_index, batch] = GetParam();
  const Shape& s = kShapes[shape_index];
  Problem prob;
  MakeProblem(dtype, s.vocab, s.valid_vocab, s.hidden, s.token_offset,
              static_cast<uint32_t>(11 + batch + s.hidden), &prob);
  const std::vector<float> hidden =
      RandomHidden(batch, s.hidden, dtype, static_cast<uint32_t>(batch * 7 + 1));
  const std::vector<RowParams> params =
      gpu_test::RandomParams(batch, 0.25, static_cast<uint32_t>(batch + 3));
  const std::vector<int32_t> drafts = RandomDrafts(batch, s.valid_vocab, static_cast<uint32_t>(batch));
  const std::vector<int32_t>* d = s.drafts ? &drafts : nullptr;

  Outputs wg, mma, again;
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, d, stage1, &wg), KernelStatus::kOk);
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, d, stage1, &again), KernelStatus::kOk);
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, d, Stage1Kernel::kMmaSync, &mma), KernelStatus::kOk);
  // Deterministic, bit for bit: every output, and every tile summary but
  // for the pruned winners (CompareTiles).
  EXPECT_TRUE(SameOutputBits(wg, again));

  const int64_t tiles = NumTiles(s.valid_vocab);
  const TileComparison vs_mma =
      CompareTiles(wg.tiles, mma.tiles, batch, tiles, s.token_offset, s.valid_vocab);
  const TileComparison again_vs_mma =
      CompareTiles(again.tiles, mma.tiles, batch, tiles, s.token_offset, s.valid_vocab);
  EXPECT_EQ(vs_mma.bad, 0) << vs_mma.first_bad;
  EXPECT_EQ(again_vs_mma.bad, 0) << again_vs_mma.first_bad;
  // kWgmma folds row by row (FoldRow), without the bound.
  if (stage1 == Stage1Kernel::kWgmma) {
    EXPECT_EQ(vs_mma.pruned, 0);
  }
  const double lse_rounding = static_cast<double>(s.valid_vocab) * std::ldexp(1.0, -23);
  int64_t failures = 0, rows_identical = 0;
  auto fail = [&](const std::string& what) {
    if (++failures <= 10) ADD_FAILURE() << what;
  };
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t draft = s.drafts ? drafts[b] : -1;
    const bool valid_draft = draft >= 0 && draft < s.valid_vocab;
    const RowReference ref = ReferenceRow(prob.w, hidden.data() + b * s.hidden, params[b],
                                          s.valid_vocab, s.token_offset,
                                          valid_draft ? draft : -1);
    const std::string row = "row " + std::to_string(b) + ": ";
    // Tile summaries: each tile's winner and max logit.
    for (int64_t t = 0; t < tiles; ++t) {
      // The exact summary (mma.sync's): wg's equals it or is pruned (vs_mma).
      const SampleSummary& exact = mma.tiles[b * tiles + t];
      const int64_t begin = t * kTileTokens, end = std::min(begin + kTileTokens, s.valid_vocab);
      std::string why;
      const bool only_draft = end - begin == 1 && std::isnan(ref.score[begin]);
      if (!only_draft &&
          !AcceptableWinner(ref, int64_t{exact.best_index} - s.token_offset, begin, end, &why)) {
        fail(row + "tile " + std::to_string(t) + ": " + why);
      }
      double ref_max = -INFINITY, eps = 0.0;
      for (int64_t v = begin; v < end; ++v) {
        ref_max = std::max(ref_max, ref.logit[v]);
        eps = std::max(eps, ref.eps[v]);
      }
      if (!(std::fabs(exact.max_logit - ref_max) <= eps)) {
        fail(row + "tile " + std::to_string(t) + ": max_logit " + std::to_string(exact.max_logit) +
             " vs " + std::to_string(ref_max));
      }
    }
    // Final outputs against float64 and against the mma.sync path.
    std::string why;
    const int64_t local = int64_t{wg.tokens[b]} - s.token_offset;
    if (!AcceptableWinner(ref, local, 0, s.valid_vocab, &why)) fail(row + "token: " + why);
    if (mma.tokens[b] != wg.tokens[b] &&
        !AcceptableWinner(ref, int64_t{mma.tokens[b]} - s.token_offset, 0, s.valid_vocab, &why)) {
      fail(row + "mma.sync token: " + why);
    }
    const double logz_bound = ref.max_eps + lse_rounding;
    if (!(std::fabs(wg.logz[b] - ref.logz) <= logz_bound)) {
      fail(row + "logz " + std::to_string(wg.logz[b]) + " vs " + std::to_string(ref.logz));
    }
    if (!(std::fabs(wg.logz[b] - mma.logz[b]) <= 2.0 * logz_bound)) {
      fail(row + "logz " + std::to_string(wg.logz[b]) + " vs mma.sync " + std::to_string(mma.logz[b]));
    }
    if (local >= 0 && local < s.valid_vocab) {
      const double want = ref.logit[local] - ref.logz;
      if (!(std::fabs(wg.logprobs[b] - want) <= ref.eps[local] + logz_bound)) {
        fail(row + "logprob " + std::to_string(wg.logprobs[b]) + " vs " + std::to_string(want));
      }
    }
    if (s.drafts) {
      if (valid_draft) {
        const double want = ref.logit[draft] - ref.logz;
        if (!(std::fabs(wg.draft_logprobs[b] - want) <= ref.eps[draft] + logz_bound)) {
          fail(row + "draft logprob " + std::to_string(wg.draft_logprobs[b]) + " vs " +
               std::to_string(want));
        }
      } else if (!std::isnan(wg.draft_logprobs[b])) {
        fail(row + "draft logprob of a row without a valid draft is not NaN");
      }
    }
    if (wg.tokens[b] == mma.tokens[b] && std::memcmp(&wg.logz[b], &mma.logz[b], 4) == 0) ++rows_identical;
  }
  EXPECT_EQ(failures, 0);
  // The two tensor-core kernels feed the same bf16/fp16 operands to the same
  // tensor-core datapath in the same K order (k16 steps, increasing), so
  // their fp32 dots, and with the shared epilogue every summary (but the
  // pruned winners, CompareTiles), are bit-identical: measured so on an H200
  // for every case here. kAuto relies on it (mma.sync up to 64 rows, WGMMA
  // above, fused_sample.cu): a row's outputs must not change when its batch
  // crosses that line.
  EXPECT_EQ(vs_mma.identical + vs_mma.pruned, batch * tiles);
  EXPECT_EQ(rows_identical, batch) << "wgmma and mma.sync rows (token, logz) differ";
  EXPECT_EQ(wg.logprobs, mma.logprobs);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedSampleSm90Agreement,
    ::testing::Combine(::testing::Values(Stage1Kernel::kWgmma, Stage1Kernel::kWgmmaOverlap,
                                         Stage1Kernel::kWgmmaPingpong,
                                         Stage1Kernel::kWgmmaSeparateEpilogue),
                       ::testing::Values(CudaWeightDType::kBFloat16, CudaWeightDType::kFloat16),
                       ::testing::Values(0, 1),
                       // block rows 32, 32, 64, 128, then 300 rows: 2 chunks of
                       // 150 in 256-row blocks (kWgmma) or 3 of 100 in 128-row
                       // blocks (the other three); 160 rows: one 256-row block
                       // (kWgmma) or 2 chunks of 80 (HiddenChunks::Balanced; in
                       // 96-row boxes under separate epilogue warps); 80 rows:
                       // one chunk (a 96-row box under separate epilogue warps)
                       ::testing::Values(int64_t{1}, int64_t{7}, int64_t{33}, int64_t{100},
                                         int64_t{300}, int64_t{160}, int64_t{80})));

// At D >= 8192 the separate schedule's 96- and 128-row boxes run tile pairs
// (a 2-block cluster sharing Hr): with one tile, the second block of every
// pair only loads its half of Hr for the first and folds nothing. 100 rows: one
// 128-row chunk; 300: three; 160: two 80-row chunks in 96-row boxes; 80: one.
INSTANTIATE_TEST_SUITE_P(
    OneTile, FusedSampleSm90Agreement,
    ::testing::Combine(::testing::Values(Stage1Kernel::kWgmmaSeparateEpilogue),
                       ::testing::Values(CudaWeightDType::kBFloat16), ::testing::Values(2),
                       ::testing::Values(int64_t{100}, int64_t{300}, int64_t{160}, int64_t{80})));

// Tokens only (no log Z, logprobs or drafts): the straight epilogue then
// merges the winner fields alone (fused_sample_sm90.cu's MergeWinner), which
// must give the summaries of the full merge: the winner fields of a launch
// with log Z, bit for bit, and an empty log-sum-exp (-inf, 0), exactly as the
// mma.sync kernel's tokens-only summaries.
using TokensOnlyCase = std::tuple<Stage1Kernel, int64_t /*batch*/>;
class FusedSampleSm90TokensOnly : public FusedSampleSm90Test,
                                  public ::testing::WithParamInterface<TokensOnlyCase> {};

TEST_P(FusedSampleSm90TokensOnly, WinnersAsWithLogZAndAsMmaSync) {
  const auto [stage1, batch] = GetParam();
  const Shape& s = kShapes[0];
  Problem prob;
  MakeProblem(CudaWeightDType::kBFloat16, s.vocab, s.valid_vocab, s.hidden, s.token_offset,
              static_cast<uint32_t>(23 + batch), &prob);
  const std::vector<float> hidden = RandomHidden(batch, s.hidden, CudaWeightDType::kBFloat16,
                                                 static_cast<uint32_t>(batch * 5 + 2));
  // A quarter greedy, so pairs of sampled rows and mixed pairs both occur.
  const std::vector<RowParams> params =
      gpu_test::RandomParams(batch, 0.25, static_cast<uint32_t>(batch + 9));
  Outputs tokens_only, with_lse, mma;
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, nullptr, stage1, &tokens_only, false),
            KernelStatus::kOk);
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, nullptr, stage1, &with_lse), KernelStatus::kOk);
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, nullptr, Stage1Kernel::kMmaSync, &mma, false),
            KernelStatus::kOk);
  EXPECT_EQ(tokens_only.tokens, with_lse.tokens);
  EXPECT_EQ(tokens_only.tokens, mma.tokens);
  ASSERT_EQ(tokens_only.tiles.size(), mma.tiles.size());
  // mma.sync's tokens-only summaries are exact; the WGMMA ones equal them
  // but for pruned winners (CompareTiles).
  const int64_t tiles = NumTiles(s.valid_vocab);
  const TileComparison c =
      CompareTiles(tokens_only.tiles, mma.tiles, batch, tiles, s.token_offset, s.valid_vocab);
  EXPECT_EQ(c.bad, 0) << "tokens-only tile summaries against mma.sync's: " << c.first_bad;
  // The log-Z launch's winner fields are those of the tokens-only launch up
  // to the same pruning: both against mma.sync's winners with the log-Z
  // launch's log-sum-exp fields.
  std::vector<SampleSummary> exact_with_lse = mma.tiles;
  for (size_t i = 0; i < exact_with_lse.size(); ++i) {
    exact_with_lse[i].max_logit = with_lse.tiles[i].max_logit;
    exact_with_lse[i].sum_exp = with_lse.tiles[i].sum_exp;
  }
  const TileComparison w =
      CompareTiles(with_lse.tiles, exact_with_lse, batch, tiles, s.token_offset, s.valid_vocab);
  EXPECT_EQ(w.bad, 0) << "log-Z tile summaries' winners: " << w.first_bad;
  int64_t lse_not_empty = 0;
  for (const SampleSummary& a : tokens_only.tiles) {
    if (!(a.max_logit == -INFINITY && a.sum_exp == 0.0f)) ++lse_not_empty;
  }
  EXPECT_EQ(lse_not_empty, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, FusedSampleSm90TokensOnly,
    ::testing::Combine(::testing::Values(Stage1Kernel::kWgmmaOverlap, Stage1Kernel::kWgmmaPingpong,
                                         Stage1Kernel::kWgmmaSeparateEpilogue),
                       // 1 and 3 chunks, a partial quad (a pair past the batch)
                       ::testing::Values(int64_t{7}, int64_t{33}, int64_t{100}, int64_t{300})));

// The cross-tile bound at work: a head of 151936 tokens (1187 tiles: every
// persistent block folds several work items in turn, so later tiles find
// their rows' known scores raised), D = 128 to keep the host's weights
// small. Every output is bit-identical to mma.sync's (which never prunes),
// with and without log Z, drafts included; every tile summary is exact or
// pruned as CompareTiles allows; and the bound acts exactly where the
// launcher uses it (more than 128 rows at this D, fused_sample_sm90.cu's
// kCrossTileBoundMinBatch): there it prunes (the count is printed, and is
// zero only if no tile ever read a raised score, which these many waves
// rule out), and at 100 rows no summary differs from mma.sync's.
using BoundCase = std::tuple<Stage1Kernel, int64_t /*batch*/, bool /*with_lse*/>;
class FusedSampleSm90CrossTileBound : public FusedSampleSm90Test,
                                      public ::testing::WithParamInterface<BoundCase> {};

TEST_P(FusedSampleSm90CrossTileBound, RowsExactAndLaterTilesPruned) {
  const auto [stage1, batch, with_lse] = GetParam();
  constexpr int64_t kVocab = 151936, kHidden = 128;
  Problem prob;
  MakeProblem(CudaWeightDType::kBFloat16, kVocab, kVocab, kHidden, 0,
              static_cast<uint32_t>(31 + batch), &prob);
  const std::vector<float> hidden = RandomHidden(batch, kHidden, CudaWeightDType::kBFloat16,
                                                 static_cast<uint32_t>(batch * 3 + 5));
  const std::vector<RowParams> params =
      gpu_test::RandomParams(batch, 0.25, static_cast<uint32_t>(batch + 17));
  const std::vector<int32_t> drafts = RandomDrafts(batch, kVocab, static_cast<uint32_t>(batch + 1));
  const std::vector<int32_t>* d = with_lse ? &drafts : nullptr;
  Outputs wg, mma;
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, d, stage1, &wg, with_lse), KernelStatus::kOk);
  ASSERT_EQ(RunLaunch(prob.launch, hidden, params, d, Stage1Kernel::kMmaSync, &mma, with_lse),
            KernelStatus::kOk);
  EXPECT_EQ(wg.tokens, mma.tokens);
  EXPECT_TRUE(SameOutputBits(wg, mma));
  const TileComparison c = CompareTiles(wg.tiles, mma.tiles, batch, NumTiles(kVocab), 0, kVocab);
  EXPECT_EQ(c.bad, 0) << c.first_bad;
  EXPECT_EQ(c.identical + c.pruned, batch * NumTiles(kVocab));
  if (batch > 128) {
    EXPECT_GT(c.pruned, 0) << "no tile summary was pruned: the bound never acted";
  } else {
    EXPECT_EQ(c.pruned, 0) << "the bound acted at " << batch << " rows";
  }
  std::printf("batch %lld: %lld of %lld tile summaries pruned\n", static_cast<long long>(batch),
              static_cast<long long>(c.pruned), static_cast<long long>(batch * NumTiles(kVocab)));
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, FusedSampleSm90CrossTileBound,
    ::testing::Combine(::testing::Values(Stage1Kernel::kWgmmaOverlap, Stage1Kernel::kWgmmaPingpong,
                                         Stage1Kernel::kWgmmaSeparateEpilogue),
                       // one chunk (no bound), two 96-row boxes, three chunks
                       ::testing::Values(int64_t{100}, int64_t{160}, int64_t{300}),
                       ::testing::Bool()));

// ---- 2. Batch invariance ----------------------------------------------------------
using InvarianceCase = std::tuple<Stage1Kernel, CudaWeightDType, int /*shape*/>;
class FusedSampleSm90Invariance : public FusedSampleSm90Test,
                                  public ::testing::WithParamInterface<InvarianceCase> {};

TEST_P(FusedSampleSm90Invariance, EveryRowBitIdenticalInEveryBatch) {
  const auto [stage1, dtype, shape_index] = GetParam();
  const Shape& s = kShapes[shape_index];
  constexpr int64_t kProbes = 64;
  Problem prob;
  MakeProblem(dtype, s.vocab, s.valid_vocab, s.hidden, s.token_offset, 77u + shape_index, &prob);
  const std::vector<float> probe_h = RandomHidden(kProbes, s.hidden, dtype, 501);
  std::vector<RowParams> probe_p = gpu_test::RandomParams(kProbes, 0.25, 502);
  std::mt19937 rng(503);
  for (auto& p : probe_p) p.stream = rng() % 1000;  // streams that do not follow the position
  const std::vector<int32_t> probe_d = RandomDrafts(kProbes, s.valid_vocab, 504);

  // Each probe alone.
  Outputs alone;
  alone.tokens.resize(kProbes);
  alone.logz.resize(kProbes);
  alone.logprobs.resize(kProbes);
  alone.draft_logprobs.resize(kProbes);
  for (int64_t i = 0; i < kProbes; ++i) {
    Outputs o;
    const std::vector<float> h(probe_h.begin() + i * s.hidden, probe_h.begin() + (i + 1) * s.hidden);
    const std::vector<int32_t> d{probe_d[i]};
    ASSERT_EQ(RunLaunch(prob.launch, h, {probe_p[i]}, s.drafts ? &d : nullptr, stage1, &o), KernelStatus::kOk);
    alone.tokens[i] = o.tokens[0];
    alone.logz[i] = o.logz[0];
    alone.logprobs[i] = o.logprobs[0];
    alone.draft_logprobs[i] = s.drafts ? o.draft_logprobs[0] : 0.0f;
  }

  auto same_bits = [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; };
  int64_t differences = 0, checked = 0;
  uint32_t companion_seed = 1000;
  constexpr int64_t kBatches[] = {2, 3, 17, 64, 80, 128, 160, 192, 208, 255, 256, 512, 1024};
  for (const int64_t batch : kBatches) {
    // Probes per launch: one with 1-2 companions below 17 rows, else half the
    // batch (at most all 64); the rest are random companions.
    const int64_t per_launch = batch < 17 ? 1 : std::min<int64_t>(kProbes, batch / 2);
    for (int64_t first = 0; first < kProbes; first += per_launch) {
      const int64_t n_probes = std::min(per_launch, kProbes - first);
      std::vector<float> h = RandomHidden(batch, s.hidden, dtype, ++companion_seed);
      std::vector<RowParams> p = gpu_test::RandomParams(batch, 0.25, ++companion_seed);
      std::vector<int32_t> d = RandomDrafts(batch, s.valid_vocab, ++companion_seed);
      std::vector<int64_t> slots(static_cast<size_t>(batch));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      for (int64_t i = 0; i < n_probes; ++i) {
        const int64_t slot = slots[i];
        std::copy(probe_h.begin() + (first + i) * s.hidden, probe_h.begin() + (first + i + 1) * s.hidden,
                  h.begin() + slot * s.hidden);
        p[slot] = probe_p[first + i];
        d[slot] = probe_d[first + i];
      }
      Outputs o;
      ASSERT_EQ(RunLaunch(prob.launch, h, p, s.drafts ? &d : nullptr, stage1, &o), KernelStatus::kOk);
      for (int64_t i = 0; i < n_probes; ++i) {
        const int64_t slot = slots[i], probe = first + i;
        ++checked;
        const bool same = o.tokens[slot] == alone.tokens[probe] &&
                          same_bits(o.logz[slot], alone.logz[probe]) &&
                          same_bits(o.logprobs[slot], alone.logprobs[probe]) &&
                          (!s.drafts || same_bits(o.draft_logprobs[slot], alone.draft_logprobs[probe]));
        if (!same && ++differences <= 10) {
          ADD_FAILURE() << "batch " << batch << ", probe " << probe << " at row " << slot
                        << ": token " << o.tokens[slot] << " vs " << alone.tokens[probe]
                        << ", logz " << o.logz[slot] << " vs " << alone.logz[probe]
                        << ", logprob " << o.logprobs[slot] << " vs " << alone.logprobs[probe];
        }
      }
    }
  }
  EXPECT_EQ(differences, 0) << "of " << checked << " probe placements";
  EXPECT_EQ(checked, static_cast<int64_t>(std::size(kBatches)) * kProbes);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, FusedSampleSm90Invariance,
    ::testing::Values(InvarianceCase{Stage1Kernel::kWgmma, CudaWeightDType::kBFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmma, CudaWeightDType::kBFloat16, 1},
                      InvarianceCase{Stage1Kernel::kWgmma, CudaWeightDType::kFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaOverlap, CudaWeightDType::kBFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaOverlap, CudaWeightDType::kBFloat16, 1},
                      InvarianceCase{Stage1Kernel::kWgmmaOverlap, CudaWeightDType::kFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaPingpong, CudaWeightDType::kBFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaPingpong, CudaWeightDType::kBFloat16, 1},
                      InvarianceCase{Stage1Kernel::kWgmmaPingpong, CudaWeightDType::kFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaSeparateEpilogue, CudaWeightDType::kBFloat16, 0},
                      InvarianceCase{Stage1Kernel::kWgmmaSeparateEpilogue, CudaWeightDType::kBFloat16, 1},
                      InvarianceCase{Stage1Kernel::kWgmmaSeparateEpilogue, CudaWeightDType::kFloat16, 0},
                      InvarianceCase{Stage1Kernel::kMmaSync, CudaWeightDType::kBFloat16, 0},
                      InvarianceCase{Stage1Kernel::kMmaSync, CudaWeightDType::kBFloat16, 1}));

// The path the server takes (kAuto): mma.sync from 1 to 15 rows, WGMMA from
// 16 (separate epilogue warps; above 128 rows in balanced chunks). A row's bits must not change with its batch, across that line
// too: 64 probes with random params (a quarter greedy), each first
// launched alone, then inside batches of 2 ... 1024 with random companions
// at random slots; on both shapes (the D = 8192 one a vocabulary shard at
// global token 4096), and on the whole head with draft tokens too (every
// other probe verifies a random draft; companions likewise): token, log Z,
// logprob and the draft's log-prob bit for bit.
TEST_F(FusedSampleSm90Test, AutoPathRowsAreBitIdenticalInEveryBatch) {
  constexpr int64_t kProbes = 64;
  for (int shape_index = 0; shape_index < 2; ++shape_index) {
    const Shape& s = kShapes[shape_index];
    const bool drafts = s.token_offset == 0;  // a shard's launch takes no drafts
    SCOPED_TRACE(::testing::Message() << "D " << s.hidden << " V " << s.vocab);
    Problem prob;
    MakeProblem(CudaWeightDType::kBFloat16, s.vocab, s.valid_vocab, s.hidden, s.token_offset,
                91u + shape_index, &prob);
    const std::vector<float> probe_h =
        RandomHidden(kProbes, s.hidden, CudaWeightDType::kBFloat16, 601 + shape_index);
    const std::vector<RowParams> probe_p = gpu_test::RandomParams(kProbes, 0.25, 602 + shape_index);
    std::mt19937 rng(603 + shape_index);
    std::vector<int32_t> probe_d(kProbes, -1);
    for (int64_t i = 1; i < kProbes; i += 2) probe_d[i] = static_cast<int32_t>(rng() % s.valid_vocab);
    uint32_t seed = 700;
    // Runs the probes [first, first + n) in a batch of `batch` rows with
    // random companions at random slots; returns each probe's outputs.
    auto run = [&](int64_t batch, int64_t first, int64_t n, std::vector<Outputs>* per_probe) {
      std::vector<float> h = RandomHidden(batch, s.hidden, CudaWeightDType::kBFloat16, ++seed);
      std::vector<RowParams> p = gpu_test::RandomParams(batch, 0.25, ++seed);
      std::vector<int32_t> d(static_cast<size_t>(batch), -1);
      for (int32_t& x : d) x = rng() % 2 == 0 ? -1 : static_cast<int32_t>(rng() % s.valid_vocab);
      std::vector<int64_t> slots(static_cast<size_t>(batch));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      for (int64_t i = 0; i < n; ++i) {
        std::copy(probe_h.begin() + (first + i) * s.hidden, probe_h.begin() + (first + i + 1) * s.hidden,
                  h.begin() + slots[i] * s.hidden);
        p[slots[i]] = probe_p[first + i];
        d[slots[i]] = probe_d[first + i];
      }
      Outputs o;
      ASSERT_EQ(RunLaunch(prob.launch, h, p, drafts ? &d : nullptr, Stage1Kernel::kAuto, &o),
                KernelStatus::kOk);
      for (int64_t i = 0; i < n; ++i) {
        Outputs& r = (*per_probe)[first + i];
        r.tokens = {o.tokens[slots[i]]};
        r.logz = {o.logz[slots[i]]};
        r.logprobs = {o.logprobs[slots[i]]};
        r.draft_logprobs = {drafts ? o.draft_logprobs[slots[i]] : 0.0f};
      }
    };
    std::vector<Outputs> reference(kProbes);
    for (int64_t i = 0; i < kProbes; ++i) run(1, i, 1, &reference);
    int64_t differences = 0;
    for (const int64_t batch : {2, 3, 17, 31, 32, 33, 64, 80, 128, 160, 192, 208, 255, 256, 512, 1024}) {
      std::vector<Outputs> got(kProbes);
      const int64_t per_launch = std::min<int64_t>(kProbes, batch / 2 > 0 ? batch / 2 : 1);
      for (int64_t first = 0; first < kProbes; first += per_launch) {
        run(batch, first, std::min(per_launch, kProbes - first), &got);
      }
      for (int64_t i = 0; i < kProbes; ++i) {
        // Bits, not values: a NaN draft log-prob (no draft) equals itself here.
        const bool same = got[i].tokens[0] == reference[i].tokens[0] &&
                          std::memcmp(&got[i].logz[0], &reference[i].logz[0], 4) == 0 &&
                          std::memcmp(&got[i].logprobs[0], &reference[i].logprobs[0], 4) == 0 &&
                          std::memcmp(&got[i].draft_logprobs[0], &reference[i].draft_logprobs[0], 4) == 0;
        if (!same && ++differences <= 10) {
          ADD_FAILURE() << "batch " << batch << ", probe " << i << ": token " << got[i].tokens[0]
                        << " vs " << reference[i].tokens[0] << ", logz " << got[i].logz[0] << " vs "
                        << reference[i].logz[0];
        }
      }
    }
    EXPECT_EQ(differences, 0);
  }
}

// ---- 3. Chi-square ------------------------------------------------------------------
// As TensorCorePathChiSquare: hidden_dim 16, 2^22 rows in one launch (16384
// chunks of 256 rows), V = 200 (two tiles, the second partial), logits
// -(v % 50) / 8 plus three heavy tokens on the tile edges (127, 128) and at
// the end (199), exact in either dtype; T = 0.8.
using ChiSquareCase = std::tuple<Stage1Kernel, CudaWeightDType>;
class FusedSampleSm90ChiSquare : public FusedSampleSm90Test,
                                 public ::testing::WithParamInterface<ChiSquareCase> {};

TEST_P(FusedSampleSm90ChiSquare, MatchesSoftmax) {
  const auto [stage1, dtype] = GetParam();
  HostWeights logits;
  const HostWeights w = gpu_test::TensorCoreChiSquareWeights(dtype, &logits);
  DeviceWeights dw;
  gpu_test::UploadWeights(w, 0, &dw);
  constexpr float kTemperature = 0.8f;
  const std::vector<int64_t> counts = gpu_test::SampleCounts(
      dw, w, int64_t{1} << 22, 1, kTemperature, 44, stage1);
  gpu_test::ExpectMatchesSoftmax(counts, logits, kTemperature);
}

INSTANTIATE_TEST_SUITE_P(
    DTypes, FusedSampleSm90ChiSquare,
    ::testing::Combine(::testing::Values(Stage1Kernel::kWgmma, Stage1Kernel::kWgmmaOverlap,
                                         Stage1Kernel::kWgmmaPingpong,
                                         Stage1Kernel::kWgmmaSeparateEpilogue),
                       ::testing::Values(CudaWeightDType::kBFloat16, CudaWeightDType::kFloat16)));

// ---- 4. Refusals ------------------------------------------------------------------
TEST_F(FusedSampleSm90Test, RefusesWhatItCannotServe) {
  Problem prob;
  MakeProblem(CudaWeightDType::kBFloat16, 300, 300, 64, 0, 5, &prob);
  const std::vector<float> h = RandomHidden(4, 64, CudaWeightDType::kBFloat16, 6);
  const std::vector<RowParams> p = gpu_test::RandomParams(4, 0.0, 7);
  Outputs o;
  // fp32 weights: no tensor-core path.
  const HostWeights w32 = gpu_test::RandomWeights(CudaWeightDType::kFloat32, 300, 64, 0.1f, 8);
  DeviceWeights dw32;
  gpu_test::UploadWeights(w32, 0, &dw32);
  Launch l32 = prob.launch;
  l32.weight = dw32.ptr;
  l32.dtype = CudaWeightDType::kFloat32;
  // W not 16-byte aligned (a TMA base address must be).
  DeviceWeights shifted;
  gpu_test::UploadWeights(prob.w, 2, &shifted);
  Launch ls = prob.launch;
  ls.weight = shifted.ptr;
  for (const Stage1Kernel k :
       {Stage1Kernel::kWgmma, Stage1Kernel::kWgmmaOverlap, Stage1Kernel::kWgmmaPingpong,
        Stage1Kernel::kWgmmaSeparateEpilogue}) {
    EXPECT_EQ(RunLaunch(l32, h, p, nullptr, k, &o), KernelStatus::kInvalidArgument);
    EXPECT_EQ(RunLaunch(ls, h, p, nullptr, k, &o), KernelStatus::kInvalidArgument);
    // The same launch on the aligned copy is served.
    EXPECT_EQ(RunLaunch(prob.launch, h, p, nullptr, k, &o), KernelStatus::kOk);
  }
}

}  // namespace
}  // namespace flashsampler::kernels
