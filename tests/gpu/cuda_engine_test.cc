// The CUDA Engine (server/engine/cuda_engine.cc) against the CPU Engine on the same
// demo LM head: same seeds give the same tokens on >= 99.9% of random rows,
// through both the fused and the cuBLAS-materialized paths; logz agrees to fp32
// rounding. Speculative-verification rows (draft_tokens) likewise: same
// residual tokens, draft log-probs to fp32 rounding. Needs a GPU: FAILS (does
// not skip) without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/half_precision.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/batching/dynamic_batcher.h"
#include "server/engine/engine.h"
#include "server/engine/pinned_host_staging.h"
#include "tests/gpu/engine_test_batches.h"

namespace flashsampler {
namespace {

constexpr int64_t kVocab = 5000;
constexpr int64_t kHidden = 256;

SampleBatch RandomBatch(int64_t rows, uint64_t seed) {
  return testing::RandomEngineBatch(rows, kHidden, seed);
}

// The CUDA and the CPU engine on the same demo head; batches of up to 4 rows
// take the fused kernel, larger ones the materialized path.
struct EnginePair {
  std::unique_ptr<Engine> cuda, cpu;
};
EnginePair MakeEnginePair() {
  EngineOptions options;
  options.valid_vocab = kVocab - 7;
  options.max_batch_rows = 128;
  options.cuda.fused_max_rows = 4;
  EnginePair pair;
  absl::StatusOr<std::unique_ptr<Engine>> cuda = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  EXPECT_TRUE(cuda.ok()) << cuda.status();
  absl::StatusOr<std::unique_ptr<Engine>> cpu = MakeEngine("cpu", LmHead::Demo(kVocab, kHidden, 9), options);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (cuda.ok() && cpu.ok()) {
    pair.cuda = *std::move(cuda);
    pair.cpu = *std::move(cpu);
  }
  return pair;
}

TEST(CudaEngine, MatchesTheCpuEngineOnBothPaths) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  Engine* const cpu = engines.cpu.get();
  EXPECT_EQ(cuda->backend_name(), "cuda");

  int64_t rows = 0, mismatches = 0;
  uint64_t seed = 1;
  for (int64_t batch_rows : {1, 3, 4, 5, 64, 128}) {  // <= 4: fused; above: materialized
    for (int rep = 0; rep < 8; ++rep) {
      SampleBatch batch = RandomBatch(batch_rows, seed++);
      absl::StatusOr<SampleResult> g = cuda->Sample(batch);
      absl::StatusOr<SampleResult> c = cpu->Sample(batch);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(c.ok()) << c.status();
      for (int64_t r = 0; r < batch_rows; ++r) {
        ++rows;
        EXPECT_LT(g->token_ids[r], kVocab - 7);
        if (g->token_ids[r] != c->token_ids[r]) ++mismatches;
        EXPECT_NEAR(g->logz[r], c->logz[r], 1e-4f * std::max(1.0f, std::abs(c->logz[r])));
      }
    }
  }
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows << " rows differ";
}

// Every third row plain (draft -1); of the drafted rows, half draft the CPU
// engine's greedy token (the likely case: p(x) large) and half a random one.
// The served path under the default options (EngineOptions{}: the fused
// kernel for every batch, on the tensor cores from one row, WGMMA from 16 on
// Hopper): a row's token, log Z and logprob are bit-identical alone and inside
// batches of 2 ... 1024 with random companions at random slots.
TEST(CudaEngine, DefaultPathGivesARowTheSameBitsInEveryBatch) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  EngineOptions options;
  options.valid_vocab = kVocab - 7;
  options.max_batch_rows = 1024;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  constexpr int64_t kProbes = 8;
  const SampleBatch probes = RandomBatch(kProbes, 777);
  // Runs the probes in a batch of `rows` (random companions, shuffled
  // slots); returns each probe's (token, logz, logprob).
  std::mt19937 shuffle(4242);
  auto run = [&](int64_t rows, std::vector<int32_t>* tokens, std::vector<float>* logz,
                 std::vector<float>* logprobs, int64_t only_probe) {
    SampleBatch b = RandomBatch(rows, 5000 + rows + only_probe);
    std::vector<int64_t> slots(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), shuffle);
    const int64_t first = only_probe >= 0 ? only_probe : 0;
    const int64_t count = only_probe >= 0 ? 1 : std::min(kProbes, rows);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t probe = first + i, slot = slots[i];
      std::copy(probes.hidden.begin() + probe * kHidden, probes.hidden.begin() + (probe + 1) * kHidden,
                b.hidden.begin() + slot * kHidden);
      b.params[slot] = probes.params[probe];
    }
    absl::StatusOr<SampleResult> r = (*engine)->Sample(b);
    ASSERT_TRUE(r.ok()) << r.status();
    for (int64_t i = 0; i < count; ++i) {
      (*tokens)[first + i] = r->token_ids[slots[i]];
      (*logz)[first + i] = r->logz[slots[i]];
      (*logprobs)[first + i] = r->logprobs[slots[i]];
    }
  };
  std::vector<int32_t> ref_tokens(kProbes);
  std::vector<float> ref_logz(kProbes), ref_logprobs(kProbes);
  for (int64_t i = 0; i < kProbes; ++i) run(1, &ref_tokens, &ref_logz, &ref_logprobs, i);
  for (int64_t rows : {2, 3, 17, 64, 128, 255, 256, 512, 1024}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    std::vector<int32_t> tokens(kProbes, -1);
    std::vector<float> logz(kProbes), logprobs(kProbes);
    if (rows >= kProbes) {
      run(rows, &tokens, &logz, &logprobs, -1);
    } else {
      for (int64_t i = 0; i < kProbes; ++i) run(rows, &tokens, &logz, &logprobs, i);
    }
    EXPECT_EQ(tokens, ref_tokens);
    EXPECT_EQ(0, std::memcmp(logz.data(), ref_logz.data(), sizeof(float) * kProbes));
    EXPECT_EQ(0, std::memcmp(logprobs.data(), ref_logprobs.data(), sizeof(float) * kProbes));
  }
}

TEST(CudaEngine, DraftRowsMatchTheCpuEngineOnBothPaths) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  Engine* const cpu = engines.cpu.get();
  EXPECT_TRUE(cuda->serves_draft_rows(false));
  EXPECT_TRUE(cuda->serves_draft_rows(true));  // with controls: the materialized controlled path

  int64_t rows = 0, mismatches = 0, drafted = 0;
  uint64_t seed = 100;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> any_token(0, static_cast<int32_t>(kVocab - 8));
  for (int64_t batch_rows : {1, 3, 4, 5, 64, 128}) {  // <= 4: fused; above: materialized
    for (int rep = 0; rep < 8; ++rep) {
      SampleBatch batch = RandomBatch(batch_rows, seed++);
      SampleBatch greedy = batch;
      for (RowParams& p : greedy.params) p.temperature = 0.0f;
      absl::StatusOr<SampleResult> argmax = cpu->Sample(greedy);
      ASSERT_TRUE(argmax.ok()) << argmax.status();
      batch.draft_tokens.resize(batch_rows);
      for (int64_t r = 0; r < batch_rows; ++r) {
        batch.draft_tokens[r] = r % 3 == 2 ? -1 : (r % 2 == 0 ? argmax->token_ids[r] : any_token(gen));
      }
      absl::StatusOr<SampleResult> g = cuda->Sample(batch);
      absl::StatusOr<SampleResult> c = cpu->Sample(batch);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_EQ(g->draft_logprobs.size(), static_cast<size_t>(batch_rows));
      ASSERT_EQ(c->draft_logprobs.size(), static_cast<size_t>(batch_rows));
      for (int64_t r = 0; r < batch_rows; ++r) {
        ++rows;
        if (g->token_ids[r] != c->token_ids[r]) ++mismatches;
        const int32_t x = batch.draft_tokens[r];
        if (x < 0) {
          EXPECT_TRUE(std::isnan(g->draft_logprobs[r])) << "row " << r;
          continue;
        }
        ++drafted;
        // A sampled row never returns its draft (the residual excludes it).
        if (batch.params[r].temperature > 0.0f) {
          EXPECT_NE(g->token_ids[r], x) << "row " << r;
        }
        EXPECT_NEAR(g->draft_logprobs[r], c->draft_logprobs[r],
                    1e-4f * std::max(1.0f, std::abs(c->draft_logprobs[r])))
            << "row " << r << " draft " << x;
      }
    }
  }
  EXPECT_GT(drafted, rows / 2);
  EXPECT_LE(mismatches * 1000, rows) << mismatches << " of " << rows << " rows differ";
}

// A CUDA engine on a tiny head (V = 300, D = 16) that takes at most 8 rows.
absl::StatusOr<std::unique_ptr<Engine>> SmallCudaEngine() {
  EngineOptions options;
  options.max_batch_rows = 8;
  return MakeEngine("cuda", LmHead::Demo(300, 16, 1), options);
}

// Draft rows with controls are served (the materialized controlled path; its
// agreement with the CPU engine is in cuda_engine_controls_test): a draft the
// controls keep with p < 1 is excluded from the sample, a row without a draft
// reports NaN.
TEST(CudaEngine, DraftRowsWithSamplingControlsAreServed) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const absl::StatusOr<std::unique_ptr<Engine>> cuda = SmallCudaEngine();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  SampleBatch batch;
  batch.rows = 2;
  batch.hidden.assign(2 * 16, 0.5f);
  batch.params.resize(2);
  batch.params[0].temperature = batch.params[1].temperature = 1.0f;
  batch.controls.resize(2);
  batch.controls[0].top_k = 5;
  batch.controls[1].top_k = 5;
  const absl::StatusOr<SampleResult> first = (*cuda)->Sample(batch);
  ASSERT_TRUE(first.ok()) << first.status();
  batch.draft_tokens = {first->token_ids[0], -1};  // row 0's draft is a kept token
  const absl::StatusOr<SampleResult> verified = (*cuda)->Sample(batch);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->path, LaunchPath::kControlled);
  ASSERT_EQ(verified->draft_logprobs.size(), 2u);
  EXPECT_TRUE(std::isfinite(verified->draft_logprobs[0]));
  EXPECT_LT(verified->draft_logprobs[0], 0.0f);  // top_k = 5 keeps others: p < 1
  EXPECT_NE(verified->token_ids[0], batch.draft_tokens[0]);
  EXPECT_TRUE(std::isnan(verified->draft_logprobs[1]));
  EXPECT_TRUE((*cuda)->healthy());
}

TEST(CudaEngine, OversizedBatchIsInvalidAndTheEngineStaysHealthy) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const absl::StatusOr<std::unique_ptr<Engine>> cuda = SmallCudaEngine();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  SampleBatch big;
  big.rows = 9;
  big.hidden.assign(9 * 16, 0.5f);
  big.params.resize(9);
  EXPECT_EQ((*cuda)->Sample(big).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*cuda)->healthy());
}

// Hidden states in their wire dtype (SampleBatch::wire_hidden: host bytes,
// or a CUDA IPC buffer read in place) give what the same values give as fp32
// from the host, bit for bit: bf16 rows (widened exactly) and fp32 rows
// (rounded to the head's bf16 on the device as on the host), alone and
// between fp32 rows, on both paths.
struct WireCopy {
  void* device = nullptr;
  std::vector<char> host;
  std::shared_ptr<void> staged;
  ~WireCopy() { cudaFree(device); }
};

// Where wire rows lie: ordinary host memory, the engine's pinned staging, GPU 0,
// or staged and then started for GPU 0 by the engine's DeviceUpload (as the
// request parser does with large payloads).
enum class Place { kHost, kStaged, kGpu, kUploaded };
constexpr int kPlaces = 4;

// Rows [first, first + rows) of `values` as `dtype` at `place` (staged in
// `engine`'s host staging); `host` gets the values the fp32 path must see for
// them (bf16: the widened bf16).
WireHiddenRows ToWire(const HiddenStates& values, int64_t first, int64_t rows, WeightDType dtype, Place place,
                      WireCopy* copy, HiddenStates* host, const Engine* engine = nullptr) {
  const size_t n = static_cast<size_t>(rows * kHidden);
  const float* from = values.data() + first * kHidden;
  if (dtype == WeightDType::kBFloat16) {
    copy->host.resize(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits = FloatToBf16(from[i]);
      std::memcpy(copy->host.data() + 2 * i, &bits, 2);
      (*host)[first * kHidden + i] = Bf16ToFloat(bits);
    }
  } else {
    copy->host.assign(reinterpret_cast<const char*>(from), reinterpret_cast<const char*>(from + n));
  }
  WireHiddenRows run{first, rows, copy->host.data(), dtype, kHostMemory, false, nullptr};
  if (place == Place::kGpu) {
    EXPECT_EQ(cudaMalloc(&copy->device, copy->host.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(copy->device, copy->host.data(), copy->host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    run.data = copy->device;
    run.device = 0;
  } else if (place == Place::kStaged || place == Place::kUploaded) {
    copy->staged = engine->host_staging()->Allocate(copy->host.size());
    EXPECT_NE(copy->staged, nullptr);
    std::memcpy(copy->staged.get(), copy->host.data(), copy->host.size());
    run.data = copy->staged.get();
    run.pinned = true;
    run.owner = copy->staged;
    if (place == Place::kUploaded) {
      std::shared_ptr<DeviceUpload> upload = engine->device_upload();
      EXPECT_NE(upload, nullptr);
      absl::StatusOr<UploadedRows> up = upload->Upload(run.data, copy->host.size(), copy->staged);
      EXPECT_TRUE(up.ok()) << up.status();
      // The staging goes; the upload's owner keeps it until its copy is done.
      copy->staged.reset();
      run = WireHiddenRows{first, rows, up->data, dtype, up->device, false, up->owner, up->ready};
    }
  }
  return run;
}

// `wire` (its hidden states as wire rows) gives `fp32`'s tokens, log Z and
// logprobs bit for bit.
void ExpectSameResults(Engine* engine, const SampleBatch& fp32, const SampleBatch& wire) {
  const absl::StatusOr<SampleResult> want = engine->Sample(fp32);
  const absl::StatusOr<SampleResult> got = engine->Sample(wire);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->token_ids, want->token_ids);
  ASSERT_EQ(got->logz.size(), want->logz.size());
  EXPECT_EQ(std::memcmp(got->logz.data(), want->logz.data(), want->logz.size() * sizeof(float)), 0);
  ASSERT_EQ(got->logprobs.size(), want->logprobs.size());
  EXPECT_EQ(std::memcmp(got->logprobs.data(), want->logprobs.data(), want->logprobs.size() * sizeof(float)), 0);
}

TEST(CudaEngine, WireRowsGiveTheFp32PathsResults) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  EXPECT_TRUE(cuda->reads_wire_hidden(kHostMemory));
  EXPECT_TRUE(cuda->reads_wire_hidden(0));
  EXPECT_FALSE(cuda->reads_wire_hidden(1));
  uint64_t seed = 100;
  for (int64_t rows : {4, 7, 64}) {  // 4: fused; 7, 64: materialized
    for (WeightDType dtype : {WeightDType::kBFloat16, WeightDType::kFloat32}) {
      for (Place where : {Place::kHost, Place::kStaged, Place::kGpu, Place::kUploaded}) {
        // Layouts: every row wire; fp32, wire, wire (the next place), fp32.
        for (bool mixed : {false, true}) {
          SCOPED_TRACE(::testing::Message() << rows << " rows, dtype " << WeightDTypeName(dtype) << ", place "
                                            << static_cast<int>(where) << (mixed ? ", mixed" : ""));
          const SampleBatch original = RandomBatch(rows, seed++);
          SampleBatch fp32 = original;         // the fp32 path's batch
          fp32.hidden_in_weight_dtype = false;  // the engine rounds fp32 values
          SampleBatch wire = original;
          wire.hidden_in_weight_dtype = false;
          WireCopy first_copy, second_copy;
          if (mixed) {
            const Place next = static_cast<Place>((static_cast<int>(where) + 1) % kPlaces);
            wire.wire_hidden.push_back(
                ToWire(original.hidden, 1, 1, dtype, where, &first_copy, &fp32.hidden, cuda));
            wire.wire_hidden.push_back(
                ToWire(original.hidden, 2, rows - 3, dtype, next, &second_copy, &fp32.hidden, cuda));
          } else {
            wire.wire_hidden.push_back(
                ToWire(original.hidden, 0, rows, dtype, where, &first_copy, &fp32.hidden, cuda));
          }
          // The engine must not read the fp32 values of wire rows.
          for (const WireHiddenRows& run : wire.wire_hidden) {
            std::fill(wire.hidden.begin() + run.first_row * kHidden,
                      wire.hidden.begin() + (run.first_row + run.rows) * kHidden, std::nanf(""));
          }
          ExpectSameResults(cuda, fp32, wire);
        }
      }
    }
  }
  EXPECT_TRUE(cuda->healthy());
}

TEST(CudaEngine, ABadWireValueIsNamedAndTheEngineStaysHealthy) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  for (Place where : {Place::kHost, Place::kStaged, Place::kGpu, Place::kUploaded}) {
    SampleBatch batch = RandomBatch(6, 7);
    HiddenStates values = batch.hidden;
    values[4 * kHidden + 17] = where == Place::kGpu ? std::nanf("") : INFINITY;
    values[5 * kHidden + 3] = std::nanf("");
    WireCopy copy;
    HiddenStates ignored = values;
    batch.wire_hidden.push_back(ToWire(values, 2, 4, WeightDType::kBFloat16, where, &copy, &ignored, cuda));
    const absl::StatusOr<SampleResult> bad = cuda->Sample(batch);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string want = where == Place::kGpu ? "hidden_states[4][17] is NaN" : "hidden_states[4][17] is infinite";
    EXPECT_NE(bad.status().message().find(want), std::string::npos) << bad.status();
    EXPECT_TRUE(cuda->healthy());
  }
  // Another GPU, or rows outside the batch: refused before any launch.
  static const uint16_t kNeverRead[2 * kHidden] = {};
  SampleBatch elsewhere = RandomBatch(6, 8);
  elsewhere.wire_hidden.push_back(WireHiddenRows{0, 2, kNeverRead, WeightDType::kBFloat16, 1, false, nullptr});
  EXPECT_EQ(cuda->Sample(elsewhere).status().code(), absl::StatusCode::kInvalidArgument);
  elsewhere.wire_hidden.back() = WireHiddenRows{5, 2, kNeverRead, WeightDType::kBFloat16, kHostMemory, false, nullptr};
  EXPECT_EQ(cuda->Sample(elsewhere).status().code(), absl::StatusCode::kInvalidArgument);
  // The engine serves the next batch.
  const absl::StatusOr<SampleResult> next = cuda->Sample(RandomBatch(6, 9));
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(cuda->healthy());
}

// A launch the batcher formed from many small requests: one wire run per
// row, in every place, dtypes changing along the batch, an fp32 row between
// them. The engine groups adjacent host runs of one dtype (one widening, one
// batched upload); the results must be those of the fp32 path bit for bit,
// and a bad value deep inside a group must still name its row and column.
TEST(CudaEngine, ManySmallWireRunsGiveTheFp32PathsResults) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  for (int64_t rows : {5, 37}) {  // fused; materialized
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const SampleBatch original = RandomBatch(rows, 500 + rows);
    SampleBatch fp32 = original;
    fp32.hidden_in_weight_dtype = false;
    SampleBatch wire = original;
    wire.hidden_in_weight_dtype = false;
    std::vector<WireCopy> copies(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      if (r == 3) continue;  // an fp32 row between wire runs
      const Place where = r % 7 == 6   ? Place::kGpu
                          : r % 11 == 9 ? Place::kUploaded
                          : r % 2 == 0  ? Place::kStaged
                                        : Place::kHost;
      const WeightDType dtype = r % 5 == 4 ? WeightDType::kFloat32 : WeightDType::kBFloat16;
      wire.wire_hidden.push_back(ToWire(original.hidden, r, 1, dtype, where, &copies[r], &fp32.hidden, cuda));
      std::fill(wire.hidden.begin() + r * kHidden, wire.hidden.begin() + (r + 1) * kHidden, std::nanf(""));
    }
    ExpectSameResults(cuda, fp32, wire);
  }
  // Ten one-row bf16 runs, host and staged alternating (one group): the bad
  // value in the eighth is named by its batch row.
  SampleBatch batch = RandomBatch(10, 77);
  HiddenStates values = batch.hidden;
  values[7 * kHidden + 5] = INFINITY;
  HiddenStates ignored = values;
  std::vector<WireCopy> copies(10);
  for (int64_t r = 0; r < 10; ++r) {
    batch.wire_hidden.push_back(ToWire(values, r, 1, WeightDType::kBFloat16, r % 2 == 0 ? Place::kStaged : Place::kHost,
                                       &copies[r], &ignored, cuda));
  }
  const absl::StatusOr<SampleResult> bad = cuda->Sample(batch);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hidden_states[7][5] is infinite"), std::string::npos) << bad.status();
  EXPECT_TRUE(cuda->healthy());
  // A finite fp32 value that rounds past bf16's range (FLT_MAX) for this bf16
  // head: refused, named, and the engine stays healthy.
  SampleBatch huge = RandomBatch(3, 78);
  HiddenStates huge_values = huge.hidden;
  huge_values[2 * kHidden + 9] = -FLT_MAX;
  HiddenStates unused = huge_values;
  std::vector<WireCopy> huge_copies(1);
  huge.wire_hidden.push_back(ToWire(huge_values, 0, 3, WeightDType::kFloat32, Place::kHost, &huge_copies[0],
                                    &unused, cuda));
  const absl::StatusOr<SampleResult> out_of_range = cuda->Sample(huge);
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out_of_range.status().message().find("hidden_states[2][9]) is outside the bf16 range"),
            std::string::npos)
      << out_of_range.status();
  EXPECT_TRUE(cuda->healthy());
  // The same batches as rows of a request the batcher split: named by the
  // request's row (request_row_offset + the batch row). And fp32 rows in the
  // message (no wire run), rounded on the host: placed the same way.
  batch.request_row_offset = 300;
  const absl::StatusOr<SampleResult> later = cuda->Sample(batch);
  EXPECT_NE(later.status().message().find("hidden_states[307][5] is infinite"), std::string::npos) << later.status();
  huge.request_row_offset = 20;
  const absl::StatusOr<SampleResult> later_huge = cuda->Sample(huge);
  EXPECT_NE(later_huge.status().message().find("hidden_states[22][9]) is outside the bf16 range"), std::string::npos)
      << later_huge.status();
  SampleBatch host = RandomBatch(4, 79);
  host.hidden_in_weight_dtype = false;
  host.hidden[1 * kHidden + 6] = FLT_MAX;
  host.request_row_offset = 8;
  const absl::StatusOr<SampleResult> host_huge = cuda->Sample(host);
  EXPECT_EQ(host_huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(host_huge.status().message().find("hidden_states[9][6]) is outside the bf16 range"), std::string::npos)
      << host_huge.status();
  EXPECT_TRUE(cuda->healthy());
}

// A launch the batcher forms from a Verify request (draft rows) and a Sample
// request whose results go to GPU memory (a CUDA IPC output region): one
// launch, and the device rows' tokens and log Z are the host results of the
// same batch, bit for bit, as are the draft rows' results; the draft
// log-probs agree with the CPU engine's.
TEST(CudaEngine, DraftRowsAndResultsOnTheDeviceShareALaunch) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  ASSERT_TRUE(cuda->writes_device_outputs(0));
  for (int64_t rows : {4, 9}) {  // fused; materialized
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    SampleBatch batch = RandomBatch(rows, 600 + rows);
    batch.want_logz = true;
    const int64_t first = rows / 2;  // rows [0, first) verify a draft
    batch.draft_tokens.assign(static_cast<size_t>(rows), -1);
    for (int64_t r = 0; r < first; ++r) batch.draft_tokens[r] = static_cast<int32_t>((r * 37 + 5) % (kVocab - 7));
    const absl::StatusOr<SampleResult> want = cuda->Sample(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    // The draft log-probs (stage 1 stores l'_x, stage 2 turns it into the
    // log-prob, through the engine's mapped host buffer) against the CPU
    // engine's, to the tolerance of the dot products' summation order.
    const absl::StatusOr<SampleResult> cpu = engines.cpu->Sample(batch);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    for (int64_t r = 0; r < first; ++r) {
      EXPECT_TRUE(std::isfinite(want->draft_logprobs[r])) << "row " << r;
      EXPECT_NEAR(want->draft_logprobs[r], cpu->draft_logprobs[r], 1e-4f * std::max(1.0f, std::abs(cpu->logz[r])))
          << "row " << r;
    }
    for (int64_t r = first; r < rows; ++r) EXPECT_TRUE(std::isnan(want->draft_logprobs[r])) << "row " << r;
    const int64_t n = rows - first;
    int32_t* tokens = nullptr;
    float* logz = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&tokens), n * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&logz), n * sizeof(float)), cudaSuccess);
    SampleBatch on_device = batch;
    on_device.device_outputs.push_back(DeviceOutputRows{first, n, tokens, logz, nullptr, 0, nullptr});
    const absl::StatusOr<SampleResult> got = cuda->Sample(on_device);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int32_t> device_tokens(static_cast<size_t>(n));
    std::vector<float> device_logz(static_cast<size_t>(n));
    ASSERT_EQ(cudaMemcpy(device_tokens.data(), tokens, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device_logz.data(), logz, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(tokens);
    cudaFree(logz);
    EXPECT_EQ(device_tokens, std::vector<int32_t>(want->token_ids.begin() + first, want->token_ids.end()));
    EXPECT_EQ(std::memcmp(device_logz.data(), want->logz.data() + first, n * sizeof(float)), 0);
    EXPECT_EQ(got->token_ids, want->token_ids);
    ASSERT_EQ(got->draft_logprobs.size(), want->draft_logprobs.size());
    EXPECT_EQ(std::memcmp(got->draft_logprobs.data(), want->draft_logprobs.data(),
                          want->draft_logprobs.size() * sizeof(float)), 0);
  }
  EXPECT_TRUE(cuda->healthy());
}

// Results a launch writes into GPU memory (CUDA IPC output regions), on both
// paths: stage 2 writes them itself for up to kMaxOutputSpans requests, and a
// launch of more copies them after it. Every layout gives the device rows
// the host results of the same batch without device outputs, bit for bit,
// and leaves the host results unchanged; rows outside every span are never
// written.
TEST(CudaEngine, ResultsOnTheDeviceFromStageTwoAndFromCopies) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  EngineOptions options;
  options.valid_vocab = kVocab - 7;
  options.max_batch_rows = 64;
  for (const int64_t fused_max_rows : {int64_t{64}, int64_t{0}}) {  // fused; materialized
    SCOPED_TRACE(::testing::Message() << "fused_max_rows " << fused_max_rows);
    options.cuda.fused_max_rows = fused_max_rows;
    absl::StatusOr<std::unique_ptr<Engine>> made = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
    ASSERT_TRUE(made.ok()) << made.status();
    Engine* const cuda = made->get();
    for (const int64_t rows : {int64_t{3}, int64_t{12}, int64_t{40}}) {
      SampleBatch batch = RandomBatch(rows, 700 + rows);
      batch.want_logz = true;
      batch.want_logprobs = true;
      const absl::StatusOr<SampleResult> want = cuda->Sample(batch);
      ASSERT_TRUE(want.ok()) << want.status();
      // Each layout: runs of (first_row, rows) with results on the device.
      std::vector<std::vector<std::pair<int64_t, int64_t>>> layouts;
      layouts.push_back({{0, rows}});
      layouts.push_back({{1, 1}, {rows - 1, 1}});
      std::vector<std::pair<int64_t, int64_t>> every_row;  // > kMaxOutputSpans from 12 rows: copies
      for (int64_t r = 0; r < rows; ++r) every_row.push_back({r, 1});
      layouts.push_back(every_row);
      for (size_t l = 0; l < layouts.size(); ++l) {
        SCOPED_TRACE(::testing::Message() << rows << " rows, layout " << l);
        // One buffer for the batch's rows, three words a row, set to a
        // pattern no result has; rows outside the runs must keep it.
        const size_t words = static_cast<size_t>(rows) * 3;
        std::vector<uint32_t> pattern(words, 0xdeadbeefu);
        uint32_t* buffer = nullptr;
        ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), words * 4), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(buffer, pattern.data(), words * 4, cudaMemcpyHostToDevice), cudaSuccess);
        SampleBatch on_device = batch;
        std::vector<bool> placed(static_cast<size_t>(rows), false);
        for (const auto& [first, n] : layouts[l]) {
          // In the layout of two runs log Z only for the first, to cover
          // runs with and without it.
          const bool logz = !(l == 1 && first != 1);
          on_device.device_outputs.push_back(DeviceOutputRows{
              first, n, reinterpret_cast<int32_t*>(buffer + first),
              logz ? reinterpret_cast<float*>(buffer + rows + first) : nullptr,
              reinterpret_cast<float*>(buffer + 2 * rows + first), 0, nullptr});
          for (int64_t r = first; r < first + n; ++r) placed[static_cast<size_t>(r)] = true;
        }
        const absl::StatusOr<SampleResult> got = cuda->Sample(on_device);
        ASSERT_TRUE(got.ok()) << got.status();
        std::vector<uint32_t> device(words);
        ASSERT_EQ(cudaMemcpy(device.data(), buffer, words * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(buffer);
        for (int64_t r = 0; r < rows; ++r) {
          uint32_t token_word, logz_word, logprob_word;
          std::memcpy(&token_word, &want->token_ids[r], 4);
          std::memcpy(&logz_word, &want->logz[r], 4);
          std::memcpy(&logprob_word, &want->logprobs[r], 4);
          const bool in = placed[static_cast<size_t>(r)];
          const bool logz = in && !(l == 1 && r != 1);
          EXPECT_EQ(device[r], in ? token_word : 0xdeadbeefu) << "token of row " << r;
          EXPECT_EQ(device[rows + r], logz ? logz_word : 0xdeadbeefu) << "log Z of row " << r;
          EXPECT_EQ(device[2 * rows + r], in ? logprob_word : 0xdeadbeefu) << "logprob of row " << r;
        }
        EXPECT_EQ(got->token_ids, want->token_ids);
        EXPECT_EQ(std::memcmp(got->logz.data(), want->logz.data(), rows * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(got->logprobs.data(), want->logprobs.data(), rows * sizeof(float)), 0);
      }
    }
    EXPECT_TRUE(cuda->healthy());
  }
}

// Every row on the GPU in two runs (a CUDA IPC buffer, a request thread's
// upload): nothing to copy, so the rows' parameters ride with the first
// widening kernel; with results on the device as well. Each row has its own
// temperature and seed, so a parameter in the wrong place changes tokens:
// the results must be the fp32 path's bit for bit, on the host and on the
// device, on both paths.
TEST(CudaEngine, RowsOnTheGpuTakeTheirParametersWithTheWidening) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  const EnginePair engines = MakeEnginePair();
  ASSERT_NE(engines.cuda, nullptr);
  Engine* const cuda = engines.cuda.get();
  for (int64_t rows : {4, 40}) {  // fused; materialized
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const SampleBatch original = RandomBatch(rows, 800 + rows);
    SampleBatch fp32 = original;
    fp32.hidden_in_weight_dtype = false;
    fp32.want_logz = true;
    SampleBatch wire = fp32;
    WireCopy first, second;
    const int64_t half = rows / 2;
    wire.wire_hidden.push_back(ToWire(original.hidden, 0, half, WeightDType::kBFloat16, Place::kGpu, &first,
                                      &fp32.hidden, cuda));
    wire.wire_hidden.push_back(ToWire(original.hidden, half, rows - half, WeightDType::kBFloat16,
                                      Place::kUploaded, &second, &fp32.hidden, cuda));
    std::fill(wire.hidden.begin(), wire.hidden.end(), std::nanf(""));  // never read
    const absl::StatusOr<SampleResult> want = cuda->Sample(fp32);
    ASSERT_TRUE(want.ok()) << want.status();
    int32_t* tokens = nullptr;
    float* logz = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&tokens), rows * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&logz), rows * sizeof(float)), cudaSuccess);
    wire.device_outputs.push_back(DeviceOutputRows{0, 1, tokens, logz, nullptr, 0, nullptr});
    wire.device_outputs.push_back(DeviceOutputRows{1, rows - 1, tokens + 1, logz + 1, nullptr, 0, nullptr});
    const absl::StatusOr<SampleResult> got = cuda->Sample(wire);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int32_t> device_tokens(static_cast<size_t>(rows));
    std::vector<float> device_logz(static_cast<size_t>(rows));
    ASSERT_EQ(cudaMemcpy(device_tokens.data(), tokens, rows * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device_logz.data(), logz, rows * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(tokens);
    cudaFree(logz);
    EXPECT_EQ(got->token_ids, want->token_ids);
    EXPECT_EQ(std::memcmp(got->logz.data(), want->logz.data(), rows * sizeof(float)), 0);
    EXPECT_EQ(device_tokens, want->token_ids);
    EXPECT_EQ(std::memcmp(device_logz.data(), want->logz.data(), rows * sizeof(float)), 0);
  }
  EXPECT_TRUE(cuda->healthy());
}

// A decode step whose rows are one GPU run in the head's bf16 (a CUDA IPC
// buffer, an upload) is read where it lies by the fused sampler's first
// kernel, with no widening launch (CudaEngine's ReadsInPlace): on the
// default engine (the fused kernel at every batch), from 1 row to chunked
// batches, its tokens, log Z, logprobs and device outputs are the fp32
// rows' bit for bit; its parameters arrive with that kernel; a bad value is
// named by its first element and the engine serves on; a source that is not
// 16-byte aligned takes the widening and gives the same bits.
TEST(CudaEngine, RowsOnTheGpuInTheHeadsDTypeAreReadInPlace) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  EngineOptions options;
  options.valid_vocab = kVocab - 7;
  options.max_batch_rows = 320;
  absl::StatusOr<std::unique_ptr<Engine>> made = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(made.ok()) << made.status();
  Engine* const cuda = made->get();
  for (int64_t rows : {1, 4, 33, 160, 300}) {
    for (Place where : {Place::kGpu, Place::kUploaded}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, place " << static_cast<int>(where));
      const SampleBatch original = RandomBatch(rows, 900 + rows);
      SampleBatch fp32 = original;
      fp32.hidden_in_weight_dtype = false;
      fp32.want_logz = true;
      fp32.want_logprobs = true;
      SampleBatch wire = fp32;
      WireCopy copy;
      wire.wire_hidden.push_back(ToWire(original.hidden, 0, rows, WeightDType::kBFloat16, where, &copy,
                                        &fp32.hidden, cuda));
      std::fill(wire.hidden.begin(), wire.hidden.end(), std::nanf(""));  // never read
      int32_t* tokens = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&tokens), rows * sizeof(int32_t)), cudaSuccess);
      wire.device_outputs.push_back(DeviceOutputRows{0, rows, tokens, nullptr, nullptr, 0, nullptr});
      const absl::StatusOr<SampleResult> want = cuda->Sample(fp32);
      const absl::StatusOr<SampleResult> got = cuda->Sample(wire);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      std::vector<int32_t> device_tokens(static_cast<size_t>(rows));
      ASSERT_EQ(cudaMemcpy(device_tokens.data(), tokens, rows * sizeof(int32_t), cudaMemcpyDeviceToHost),
                cudaSuccess);
      cudaFree(tokens);
      EXPECT_EQ(got->path, LaunchPath::kFused);
      EXPECT_TRUE(got->hidden_read_in_place);
      EXPECT_FALSE(want->hidden_read_in_place);
      EXPECT_EQ(got->token_ids, want->token_ids);
      EXPECT_EQ(device_tokens, want->token_ids);
      EXPECT_EQ(std::memcmp(got->logz.data(), want->logz.data(), rows * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got->logprobs.data(), want->logprobs.data(), rows * sizeof(float)), 0);

      // Bad values: NaN in the last row, and an earlier infinity, which is named.
      HiddenStates bad_values = original.hidden;
      bad_values[(rows - 1) * kHidden + 200] = std::nanf("");
      bad_values[(rows - 1) / 2 * kHidden + 9] = -INFINITY;
      SampleBatch bad = fp32;
      HiddenStates ignored = bad_values;
      WireCopy bad_copy;
      bad.wire_hidden.push_back(
          ToWire(bad_values, 0, rows, WeightDType::kBFloat16, where, &bad_copy, &ignored, cuda));
      const absl::StatusOr<SampleResult> refused = cuda->Sample(bad);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string named = absl::StrCat("hidden_states[", (rows - 1) / 2, "][9] is infinite");
      EXPECT_NE(refused.status().message().find(named), std::string::npos) << refused.status();
      EXPECT_TRUE(cuda->healthy());
    }
  }
  // With draft rows (their tokens and the params then go up by copy, with
  // no ride): the same residual tokens and draft log-probs.
  {
    const SampleBatch original = RandomBatch(5, 980);
    SampleBatch fp32 = original;
    fp32.hidden_in_weight_dtype = false;
    fp32.draft_tokens = {3, -1, 17, 4000, -1};
    SampleBatch wire = fp32;
    WireCopy copy;
    wire.wire_hidden.push_back(
        ToWire(original.hidden, 0, 5, WeightDType::kBFloat16, Place::kGpu, &copy, &fp32.hidden, cuda));
    const absl::StatusOr<SampleResult> want = cuda->Sample(fp32);
    const absl::StatusOr<SampleResult> got = cuda->Sample(wire);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(got->hidden_read_in_place);
    EXPECT_EQ(got->token_ids, want->token_ids);
    ASSERT_EQ(got->draft_logprobs.size(), 5u);
    EXPECT_EQ(std::memcmp(got->draft_logprobs.data(), want->draft_logprobs.data(), 5 * sizeof(float)), 0);
  }
  // A source 2 bytes past a 16-byte boundary: widened, the same bits.
  const SampleBatch original = RandomBatch(6, 990);
  SampleBatch fp32 = original;
  fp32.hidden_in_weight_dtype = false;
  SampleBatch wire = fp32;
  WireCopy copy;
  // The bf16 bytes (copy.host) and the fp32 path's values of them.
  ToWire(original.hidden, 0, 6, WeightDType::kBFloat16, Place::kHost, &copy, &fp32.hidden, cuda);
  char* shifted = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&shifted), copy.host.size() + 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(shifted + 2, copy.host.data(), copy.host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  wire.wire_hidden.push_back(WireHiddenRows{0, 6, shifted + 2, WeightDType::kBFloat16, 0, false, nullptr});
  ExpectSameResults(cuda, fp32, wire);
  const absl::StatusOr<SampleResult> widened = cuda->Sample(wire);
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_FALSE(widened->hidden_read_in_place);
  cudaFree(shifted);
  const absl::StatusOr<SampleResult> next = cuda->Sample(RandomBatch(3, 991));
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(cuda->healthy());
}

// Through the batcher, launches of at most 4 rows: a bad value in a later
// part of a split request is named by its row in the request, when that part
// runs alone and when it is re-run alone after a launch it shared failed.
TEST(CudaEngine, ABadValueInASplitRequestIsNamedByItsRequestRow) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  struct Request {
    SampleBatch batch;
    WireCopy copy;
    absl::Notification done;
    absl::Status status;
  };
  // `rows` bf16 host wire rows, `bad` at [bad_row][bad_col].
  const auto make = [](Request& req, int64_t rows, int64_t bad_row, int64_t bad_col, float bad, uint64_t seed) {
    req.batch = RandomBatch(rows, seed);
    HiddenStates values = req.batch.hidden;
    values[bad_row * kHidden + bad_col] = bad;
    HiddenStates ignored = values;
    req.batch.wire_hidden.push_back(
        ToWire(values, 0, rows, WeightDType::kBFloat16, Place::kHost, &req.copy, &ignored));
  };
  const auto submit = [](DynamicBatcher& batcher, Request& req) {
    batcher.Submit(&req.batch, [&req](absl::StatusOr<SampleResult> r) {
      req.status = r.status();
      req.done.Notify();
    });
  };
  const auto start = [](DynamicBatcher& batcher) {
    EngineOptions options;
    options.max_batch_rows = 4;
    absl::StatusOr<std::unique_ptr<Engine>> engine = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    batcher.SetEngine(*std::move(engine));
  };
  {
    // Launches a[0,4), a[4,8), a[8,10): the NaN in row 9 is in the last,
    // alone.
    DynamicBatcher batcher(BatcherOptions{4, absl::ZeroDuration(), 1 << 12, 1});
    start(batcher);
    Request a;
    make(a, 10, 9, 3, std::nanf(""), 90);
    submit(batcher, a);
    a.done.WaitForNotification();
    EXPECT_EQ(a.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status.message().find("hidden_states[9][3] is NaN"), std::string::npos) << a.status;
    EXPECT_TRUE(batcher.ready());
  }
  {
    // A launch waits for 4 rows (up to a minute): b[0,4), then b[4,6) with
    // `good`'s 2 rows, which fails and is re-run one request at a time.
    DynamicBatcher batcher(BatcherOptions{4, absl::Seconds(60), 1 << 12, 1});
    start(batcher);
    Request b, good;
    make(b, 6, 5, 2, INFINITY, 91);
    good.batch = RandomBatch(2, 92);
    submit(batcher, b);
    submit(batcher, good);
    b.done.WaitForNotification();
    good.done.WaitForNotification();
    EXPECT_EQ(b.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status.message().find("hidden_states[5][2] is infinite"), std::string::npos) << b.status;
    EXPECT_TRUE(good.status.ok()) << good.status;
    EXPECT_TRUE(batcher.ready());
  }
}

// The CUDA engine's DeviceUpload: on by default, device memory of the
// engine's GPU holding the bytes once its event has passed, the host bytes
// held until the copy is done (also for an upload dropped at once, as a
// request refused before its launch), many threads at a time, and valid
// after the engine is gone. Off with upload_min_bytes = 0.
TEST(CudaDeviceUpload, CopiesFromManyThreadsAndOutlivesTheEngine) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  EngineOptions options;
  options.max_batch_rows = 16;
  options.cuda.upload_min_bytes = 0;
  absl::StatusOr<std::unique_ptr<Engine>> off = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ((*off)->device_upload(), nullptr);
  options.cuda.upload_min_bytes = CudaEngineOptions{}.upload_min_bytes;
  absl::StatusOr<std::unique_ptr<Engine>> engine = MakeEngine("cuda", LmHead::Demo(kVocab, kHidden, 9), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::shared_ptr<DeviceUpload> upload = (*engine)->device_upload();
  ASSERT_NE(upload, nullptr);
  EXPECT_EQ(upload->min_bytes(), size_t{128} << 10);
  std::shared_ptr<HostStaging> staging = (*engine)->host_staging();

  constexpr int kThreads = 8, kPerThread = 20;
  constexpr size_t kBytes = size_t{256} << 10;
  std::vector<std::vector<UploadedRows>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        std::shared_ptr<void> host = staging->Allocate(kBytes);
        ASSERT_NE(host, nullptr);
        std::memset(host.get(), t * kPerThread + i, kBytes);
        absl::StatusOr<UploadedRows> up = upload->Upload(host.get(), kBytes, host);
        ASSERT_TRUE(up.ok()) << up.status();
        EXPECT_EQ(up->device, 0);
        if (i % 2 == 1) kept[t].push_back(*std::move(up));  // the others are dropped at once
      }
    });
  }
  for (std::thread& t : threads) t.join();
  engine->reset();  // the uploads outlive the engine
  std::vector<unsigned char> back(kBytes);
  for (int t = 0; t < kThreads; ++t) {
    for (size_t j = 0; j < kept[t].size(); ++j) {
      const UploadedRows& up = kept[t][j];
      ASSERT_EQ(cudaStreamWaitEvent(nullptr, static_cast<cudaEvent_t>(const_cast<void*>(up.ready)), 0),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(back.data(), up.data, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
      const unsigned char want = static_cast<unsigned char>(t * kPerThread + 2 * j + 1);
      EXPECT_EQ(std::count(back.begin(), back.end(), want), static_cast<std::ptrdiff_t>(kBytes));
    }
  }
  kept.clear();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The CUDA engine's host staging: pinned memory, reused once released, and
// valid for as long as a caller holds it, also after the pool is dropped.
TEST(PinnedHostStaging, ReusesReleasedBuffersAndOutlivesThePool) {
  ASSERT_TRUE(CudaBackendAvailable()) << "this GPU test needs a CUDA device (exclude label gpu)";
  std::shared_ptr<HostStaging> pool = MakePinnedHostStaging(0, 1 << 20);
  std::shared_ptr<void> a = pool->Allocate(100);
  ASSERT_NE(a, nullptr);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, a.get()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // pinned, not pageable
  void* const first = a.get();
  a.reset();
  std::shared_ptr<void> b = pool->Allocate(60000);  // the same 64 KiB size class
  EXPECT_EQ(b.get(), first);
  std::shared_ptr<void> c = pool->Allocate(70000);  // the 128 KiB class: another buffer
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c.get(), first);
  pool.reset();
  std::memset(c.get(), 1, 70000);  // still valid
  EXPECT_EQ(static_cast<const char*>(c.get())[69999], 1);
}

}  // namespace
}  // namespace flashsampler
