// The CPU engine end to end below gRPC: weights kept in their dtype (bf16 and
// fp16 heads 16-bit, widened in the kernels), batches in, tokens out, and the
// MakeEngine backend switch.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/half_precision.h"
#include "server/engine/engine.h"
#include "server/model/safetensors_writer.h"
#include "tests/common/scoped_temp_dir.h"

namespace flashsampler {
namespace {

constexpr int64_t kVocab = 300;
constexpr int64_t kHidden = 16;

SampleBatch RandomBatch(int64_t rows, float temperature, uint64_t seed) {
  SampleBatch b;
  b.rows = rows;
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  b.hidden.resize(rows * kHidden);
  for (float& v : b.hidden) v = normal(gen);
  b.params.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    b.params[r].temperature = temperature;
    b.params[r].seed = 7;
    b.params[r].stream = static_cast<uint32_t>(r);
  }
  return b;
}

// float64 logits of the demo head, from the bf16 bits the engine widens.
std::vector<double> Logits(const LmHead& head, const std::vector<float>& h) {
  std::vector<double> out(head.vocab_size());
  const auto* w = static_cast<const uint16_t*>(head.data());
  for (int64_t v = 0; v < head.vocab_size(); ++v) {
    double acc = 0;
    for (int64_t d = 0; d < kHidden; ++d) acc += double(Bf16ToFloat(w[v * kHidden + d])) * h[d];
    out[v] = acc;
  }
  return out;
}

TEST(CpuEngine, GreedyMatchesFloat64ArgmaxAndLogZ) {
  LmHead reference = LmHead::Demo(kVocab, kHidden, 3);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->backend_name(), "cpu");
  EXPECT_EQ((*engine)->shape().vocab_size, kVocab);
  EXPECT_EQ((*engine)->shape().valid_vocab, kVocab);
  EXPECT_EQ((*engine)->shape().weight_dtype, WeightDType::kBFloat16);

  SampleBatch batch = RandomBatch(5, 0.0f, 11);
  batch.want_logz = batch.want_logprobs = true;
  absl::StatusOr<SampleResult> result = (*engine)->Sample(batch);
  ASSERT_TRUE(result.ok()) << result.status();
  for (int64_t r = 0; r < batch.rows; ++r) {
    std::vector<float> h(batch.hidden.begin() + r * kHidden, batch.hidden.begin() + (r + 1) * kHidden);
    for (float& x : h) x = Bf16ToFloat(FloatToBf16(x));  // engines round H to W's dtype
    std::vector<double> l = Logits(reference, h);
    int best = 0;
    double m = l[0];
    for (int v = 1; v < kVocab; ++v) {
      if (l[v] > m) m = l[v], best = v;
    }
    double s = 0;
    for (double x : l) s += std::exp(x - m);
    const double logz = m + std::log(s);
    EXPECT_EQ(result->token_ids[r], best);
    EXPECT_NEAR(result->logz[r], logz, 1e-4 * std::max(1.0, std::abs(logz)));
    EXPECT_NEAR(result->logprobs[r], l[best] - logz, 1e-4);
  }
}

TEST(CpuEngine, HiddenStatesAreRoundedToTheWeightDType) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  SampleBatch raw = RandomBatch(16, 0.7f, 21);
  raw.want_logz = true;
  SampleBatch rounded = raw;
  for (float& x : rounded.hidden) x = Bf16ToFloat(FloatToBf16(x));
  ASSERT_NE(raw.hidden, rounded.hidden);
  absl::StatusOr<SampleResult> a = (*engine)->Sample(raw);
  absl::StatusOr<SampleResult> b = (*engine)->Sample(rounded);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(a->logz, b->logz);  // bit-identical: the engine saw the same inputs
  // A value past bf16's range is refused and placed by its row in the
  // request: rows 40-55 of a split request name row 40 + 3.
  raw.hidden[3 * kHidden + 5] = FLT_MAX;
  raw.request_row_offset = 40;
  const absl::StatusOr<SampleResult> bad = (*engine)->Sample(raw);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("(hidden_states[43][5]) is outside the bf16 range"), std::string::npos)
      << bad.status();
}

TEST(CpuEngine, ValidVocabMasksPaddingRows) {
  EngineOptions options;
  options.valid_vocab = 10;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->shape().valid_vocab, 10);
  SampleBatch batch = RandomBatch(64, 2.0f, 5);
  absl::StatusOr<SampleResult> result = (*engine)->Sample(batch);
  ASSERT_TRUE(result.ok());
  for (int32_t t : result->token_ids) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 10);
  }
}

TEST(CpuEngine, RejectsBadOptionsAndBackends) {
  EngineOptions options;
  options.valid_vocab = kVocab + 1;
  EXPECT_EQ(MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEngine("tpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuEngine, AutoPicksCudaOnlyWhenAGpuIsUsable) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("auto", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->backend_name(), CudaBackendAvailable() ? "cuda" : "cpu");
  if (!CudaBackendAvailable()) {
    EXPECT_EQ(MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{}).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

TEST(CpuEngine, InconsistentBatchIsAnErrorNotACrash) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  SampleBatch batch = RandomBatch(2, 1.0f, 1);
  batch.params.pop_back();
  EXPECT_EQ((*engine)->Sample(batch).status().code(), absl::StatusCode::kInvalidArgument);
}

// The CPU backend takes fp32 hidden states only: wire rows, in host or GPU
// memory, are an error (the parser never makes them for it), never a read.
TEST(CpuEngine, WireRowsAreRefused) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  EXPECT_FALSE((*engine)->reads_wire_hidden(kHostMemory));
  EXPECT_FALSE((*engine)->reads_wire_hidden(0));
  static const float kNeverRead = 0.0f;
  for (int device : {kHostMemory, 0}) {
    SampleBatch batch = RandomBatch(2, 1.0f, 1);
    batch.wire_hidden.push_back(WireHiddenRows{0, 1, &kNeverRead, WeightDType::kBFloat16, device, false, nullptr});
    const absl::Status s = (*engine)->Sample(batch).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("does not take hidden states in their wire dtype"), std::string::npos) << s;
  }
}

// A batch mixing plain rows and rows with controls: the plain rows get exactly
// the tokens (and logz) of a batch without controls, the controlled rows those
// of the same rows sampled on their own, whatever path the planner picks.
TEST(CpuEngine, MixedBatchSplitsPlainAndControlledRows) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  SampleBatch plain = RandomBatch(8, 0.8f, 13);
  plain.want_logz = plain.want_logprobs = true;
  absl::StatusOr<SampleResult> plain_result = (*engine)->Sample(plain);
  ASSERT_TRUE(plain_result.ok());
  EXPECT_TRUE(plain_result->details.empty());

  for (int32_t top_k : {5, 0}) {  // fused path, then materialized (top_p only)
    SampleBatch mixed = plain;
    mixed.controls.resize(8);
    for (int r : {1, 4, 6}) {
      mixed.controls[r].top_k = top_k;
      mixed.controls[r].top_p = 0.8f;
      mixed.controls[r].top_logprobs = 3;
      mixed.controls[r].num_samples = 2;
    }
    absl::StatusOr<SampleResult> result = (*engine)->Sample(mixed);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->details.size(), 8u);
    for (int r = 0; r < 8; ++r) {
      SCOPED_TRACE(r);
      EXPECT_EQ(result->details[r].token_ids.front(), result->token_ids[r]);
      if (r == 1 || r == 4 || r == 6) {
        EXPECT_EQ(result->details[r].token_ids.size(), 2u);
        EXPECT_EQ(result->details[r].top.size(), 3u);
        // The same row alone in a batch gives the same outputs.
        SampleBatch alone;
        alone.rows = 1;
        alone.hidden.assign(mixed.hidden.begin() + r * kHidden, mixed.hidden.begin() + (r + 1) * kHidden);
        alone.params = {mixed.params[r]};
        alone.controls = {mixed.controls[r]};
        alone.want_logz = true;
        absl::StatusOr<SampleResult> one = (*engine)->Sample(alone);
        ASSERT_TRUE(one.ok());
        EXPECT_EQ(one->token_ids[0], result->token_ids[r]);
        EXPECT_EQ(one->details[0].token_ids, result->details[r].token_ids);
        EXPECT_EQ(one->logz[0], result->logz[r]);
      } else {
        EXPECT_EQ(result->token_ids[r], plain_result->token_ids[r]);
        EXPECT_EQ(result->logz[r], plain_result->logz[r]);
        EXPECT_EQ(result->logprobs[r], plain_result->logprobs[r]);
        EXPECT_EQ(result->details[r].token_ids.size(), 1u);
      }
    }
  }
}

TEST(CpuEngine, RowWithNoFiniteLogitIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 3), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  SampleBatch batch = RandomBatch(2, 1.0f, 3);
  batch.controls.resize(2);
  batch.controls[1].allowed_bitmask.assign((kVocab + 31) / 32, 0u);
  const absl::StatusOr<SampleResult> result = (*engine)->Sample(batch);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  // The engine keeps serving.
  batch.controls.clear();
  EXPECT_TRUE((*engine)->Sample(batch).ok());
  batch.controls.resize(1);  // neither empty nor one per row
  EXPECT_EQ((*engine)->Sample(batch).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flashsampler

// ---------------------------------------------------------------------------
// Batch invariance by construction (kernels/cpu/fixed_order_logits.h): a
// row's token, log Z, logprob, sampled list, top logprobs and draft
// log-probability (Verify's acceptance probabilities come from it) are
// bit-identical whether it runs alone or inside batches of 2, 3, 17, 128 and
// 1000 rows of random companions, whose controls send them down every CPU
// path, on 1 or 2 threads, and with other tile sizes. (With the OpenBLAS
// logits the CPU backend used before, this test failed: 38 rows differed in
// batches of 17, 128 and 1000.)
namespace flashsampler {
namespace {
namespace batch_invariance {

constexpr int64_t kV = 2000, kD = 64, kTestRows = 64;
enum class Kind { kPlain, kControlled, kDraft };

struct Row {
  std::vector<float> hidden;
  RowParams params;
  RowControls controls;
  int32_t draft = -1;
};

Row RandomRow(Kind kind, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> token(0, kV - 1);
  Row row;
  row.hidden.resize(kD);
  for (float& v : row.hidden) v = normal(gen);
  row.params.temperature = std::uniform_real_distribution<float>(0.3f, 1.5f)(gen);
  row.params.seed = gen();
  row.params.offset = gen() % 100;
  if (kind == Kind::kControlled) {
    row.controls.top_k = 1 + gen() % 40;  // the fused controlled path
    row.controls.top_p = 0.9f;
    row.controls.top_logprobs = 3;
    row.controls.num_samples = 2;
  }
  if (kind == Kind::kDraft) row.draft = token(gen);
  return row;
}

// A companion of a test row of `kind`: plain, or with controls that the
// fused controlled path serves, or ones only the materialized path serves
// (top_p alone), so that the batch's mix of paths varies around the row.
Row RandomCompanion(Kind kind, std::mt19937& gen) {
  Row row = RandomRow(kind, gen);
  switch (gen() % 3) {
    case 0: row.controls = RowControls(); break;
    case 1: row.controls.top_k = 1 + gen() % 40; break;
    default: row.controls = RowControls(); row.controls.top_p = 0.8f; row.controls.min_p = 0.01f; break;
  }
  return row;
}

SampleBatch BatchOf(const std::vector<const Row*>& rows, Kind kind) {
  SampleBatch b;
  b.rows = static_cast<int64_t>(rows.size());
  const bool controls = std::any_of(rows.begin(), rows.end(), [](const Row* r) { return HasAnyControl(r->controls); });
  for (const Row* r : rows) {
    b.hidden.insert(b.hidden.end(), r->hidden.begin(), r->hidden.end());
    b.params.push_back(r->params);
    if (controls) b.controls.push_back(r->controls);
    if (kind == Kind::kDraft) b.draft_tokens.push_back(r->draft);
  }
  b.want_logz = b.want_logprobs = true;
  return b;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Everything the engine returned for row i of `result`, as bits. (A plain
// row in a batch with controls also gets a detail, holding just its token.)
std::vector<uint32_t> RowBits(const SampleResult& result, size_t i, Kind kind) {
  std::vector<uint32_t> bits = {static_cast<uint32_t>(result.token_ids[i]), Bits(result.logz[i]),
                                Bits(result.logprobs[i])};
  if (!result.draft_logprobs.empty()) bits.push_back(Bits(result.draft_logprobs[i]));
  if (kind == Kind::kControlled) {
    const RowSampleDetail& d = result.details[i];
    for (int32_t t : d.token_ids) bits.push_back(static_cast<uint32_t>(t));
    for (float l : d.logprobs) bits.push_back(Bits(l));
    for (const TokenLogprob& t : d.top) {
      bits.push_back(static_cast<uint32_t>(t.token_id));
      bits.push_back(Bits(t.logprob));
    }
  }
  return bits;
}

std::unique_ptr<Engine> CpuEngineWith(int threads, int64_t tile_rows) {
  EngineOptions options;
  options.cpu.num_threads = threads;
  options.cpu.tile_rows = tile_rows;
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeEngine("cpu", LmHead::Demo(kV, kD, 5), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

class CpuEngineBatchInvariance : public ::testing::TestWithParam<Kind> {};

TEST_P(CpuEngineBatchInvariance, ARowsOutputsAreBitIdenticalInEveryBatch) {
  const Kind kind = GetParam();
  std::mt19937 gen(static_cast<uint32_t>(kind) + 17);
  std::vector<Row> test_rows;
  for (int i = 0; i < kTestRows; ++i) test_rows.push_back(RandomRow(kind, gen));
  std::unique_ptr<Engine> one_thread = CpuEngineWith(1, 1024), two_threads = CpuEngineWith(2, 1024);
  ASSERT_TRUE(one_thread && two_threads);

  std::vector<std::vector<uint32_t>> alone(kTestRows);
  for (int i = 0; i < kTestRows; ++i) {
    absl::StatusOr<SampleResult> r = one_thread->Sample(BatchOf({&test_rows[i]}, kind));
    ASSERT_TRUE(r.ok()) << r.status();
    alone[i] = RowBits(*r, 0, kind);
    absl::StatusOr<SampleResult> r2 = two_threads->Sample(BatchOf({&test_rows[i]}, kind));
    ASSERT_TRUE(r2.ok()) << r2.status();
    EXPECT_EQ(RowBits(*r2, 0, kind), alone[i]) << "row " << i << ": 1 vs 2 threads";
  }
  // Batches of B rows: the test rows, `per_batch` at a time, at random
  // positions among random companions.
  for (int64_t batch_rows : {2, 3, 17, 128, 1000}) {
    const int64_t per_batch = std::min<int64_t>(batch_rows <= 3 ? 1 : 8, kTestRows);
    std::vector<Row> companions;
    for (int64_t c = 0; c < batch_rows; ++c) companions.push_back(RandomCompanion(kind, gen));
    for (int64_t first = 0; first < kTestRows; first += per_batch) {
      std::vector<const Row*> rows;
      for (const Row& c : companions) rows.push_back(&c);
      std::vector<std::pair<size_t, int64_t>> placed;  // (position, test row)
      for (int64_t i = first; i < std::min(first + per_batch, kTestRows); ++i) {
        size_t at;
        do {
          at = std::uniform_int_distribution<size_t>(0, rows.size() - 1)(gen);
        } while (std::any_of(placed.begin(), placed.end(), [&](auto& p) { return p.first == at; }));
        rows[at] = &test_rows[i];
        placed.emplace_back(at, i);
      }
      Engine* engine = (first / per_batch) % 2 == 0 ? one_thread.get() : two_threads.get();
      absl::StatusOr<SampleResult> r = engine->Sample(BatchOf(rows, kind));
      ASSERT_TRUE(r.ok()) << r.status();
      for (const auto& [at, i] : placed) {
        EXPECT_EQ(RowBits(*r, at, kind), alone[i]) << "row " << i << " in a batch of " << batch_rows;
      }
    }
  }
  // Other tile sizes: every output the same bits for tiles that are whole
  // 64-token chunks (log Z is summed per chunk and folded in token order),
  // and the same tokens for any tile (log Z is then summed per tile).
  for (int64_t tile : {64, 256, 2048}) {
    std::unique_ptr<Engine> other_tiles = CpuEngineWith(2, tile);
    ASSERT_TRUE(other_tiles);
    for (int i = 0; i < kTestRows; ++i) {
      absl::StatusOr<SampleResult> r = other_tiles->Sample(BatchOf({&test_rows[i]}, kind));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(RowBits(*r, 0, kind), alone[i]) << "row " << i << ": tile " << tile;
    }
  }
  std::unique_ptr<Engine> odd_tiles = CpuEngineWith(2, 100);
  ASSERT_TRUE(odd_tiles);
  for (int i = 0; i < kTestRows; ++i) {
    absl::StatusOr<SampleResult> r = odd_tiles->Sample(BatchOf({&test_rows[i]}, kind));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(static_cast<uint32_t>(r->token_ids[0]), alone[i][0]) << "row " << i << ": tile 100";
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CpuEngineBatchInvariance,
                         ::testing::Values(Kind::kPlain, Kind::kControlled, Kind::kDraft));

// ---------------------------------------------------------------------------
// A bf16 or fp16 head stays 16-bit in the engine's token panels (half the
// memory of fp32 panels) and the kernels widen it exactly, so nothing but
// memory changes: an engine on the head and one on the same head converted
// to F32 beforehand return the same bits for every output of every row
// (tokens, log Z, logprobs, draft log-probabilities, sampled lists, top
// logprobs) on every CPU path. The hidden states are values of the head's
// dtype, because the engine rounds H to W's dtype (an F32 head leaves it).

// `head` written as `dtype` and loaded back.
LmHead Reloaded(const LmHead& head, WeightDType dtype, const std::string& path) {
  const absl::Status written = WriteLmHeadSafetensors(path, head, dtype);
  EXPECT_TRUE(written.ok()) << written;
  absl::StatusOr<LmHead> loaded = LmHead::Load(path, "lm_head.weight");
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->dtype(), dtype);
  return *std::move(loaded);
}

TEST(CpuEngineWeightDType, SixteenBitHeadsGiveTheBitsOfTheSameHeadWidenedToFp32) {
  testing::ScopedTempDir tmp("cpu_engine_dtype");
  EngineOptions options;
  options.cpu.num_threads = 2;
  options.cpu.tile_rows = 256;
  for (WeightDType dtype : {WeightDType::kBFloat16, WeightDType::kFloat16}) {
    SCOPED_TRACE(WeightDTypeName(dtype));
    LmHead head16 = Reloaded(LmHead::Demo(kV, kD, 9), dtype, tmp.Path("w16.safetensors"));
    LmHead head32 = Reloaded(head16, WeightDType::kFloat32, tmp.Path("w32.safetensors"));
    absl::StatusOr<std::unique_ptr<Engine>> engine16 = MakeEngine("cpu", std::move(head16), options);
    absl::StatusOr<std::unique_ptr<Engine>> engine32 = MakeEngine("cpu", std::move(head32), options);
    ASSERT_TRUE(engine16.ok() && engine32.ok());
    EXPECT_EQ((*engine16)->shape().weight_dtype, dtype);
    EXPECT_EQ((*engine32)->shape().weight_dtype, WeightDType::kFloat32);
    std::mt19937 gen(static_cast<uint32_t>(dtype) + 31);
    for (Kind kind : {Kind::kPlain, Kind::kControlled, Kind::kDraft}) {
      // 40 rows of this kind and, but for the plain batch, 40 companions
      // whose controls take the fused and the materialized paths.
      std::vector<Row> rows;
      for (int i = 0; i < 80; ++i) {
        if (i < 40) {
          rows.push_back(RandomRow(kind, gen));
        } else if (kind != Kind::kPlain) {
          rows.push_back(RandomCompanion(kind, gen));
        }
      }
      for (Row& row : rows) {
        for (float& v : row.hidden) {
          v = dtype == WeightDType::kBFloat16 ? Bf16ToFloat(FloatToBf16(v))
                                              : Fp16ToFloat(FloatToFp16(v));
        }
      }
      std::vector<const Row*> pointers;
      for (const Row& row : rows) pointers.push_back(&row);
      const SampleBatch batch = BatchOf(pointers, kind);
      absl::StatusOr<SampleResult> r16 = (*engine16)->Sample(batch);
      absl::StatusOr<SampleResult> r32 = (*engine32)->Sample(batch);
      ASSERT_TRUE(r16.ok() && r32.ok());
      const Kind bits_of = batch.controls.empty() ? kind : Kind::kControlled;  // details too
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(RowBits(*r16, i, bits_of), RowBits(*r32, i, bits_of))
            << "row " << i << " of a batch of kind " << static_cast<int>(kind);
      }
    }
  }
}

}  // namespace batch_invariance
}  // namespace
}  // namespace flashsampler
