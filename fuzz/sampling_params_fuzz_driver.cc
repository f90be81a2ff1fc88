#include "fuzz/sampling_params_fuzz_driver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input_reader.h"
#include "kernels/cpu/controlled_sampler.h"
#include "server/batching/batch_assembly.h"
#include "server/engine/engine.h"
#include "server/api/request_parser.h"
#include "server/api/row_controls_parser.h"

namespace flashsampler::fuzz {
namespace {

constexpr int64_t kHidden = 4;
constexpr int64_t kMaxRows = 16;      // rows per request
constexpr int kMaxRequests = 4;       // requests per input
constexpr int64_t kMaxLaunchRows = 32;
constexpr uint64_t kFirstDrawnSeed = 1000;

// Vocabulary shapes: one word and many, valid_vocab below V (padding), a
// single sampleable token, more tokens than the fused top-k bound and than one
// CPU tile (the engines use 16-token tiles).
struct Shape {
  int64_t vocab;
  int64_t valid;
};
constexpr Shape kShapes[] = {{32, 32}, {40, 33}, {64, 1}, {100, 70}, {1, 1}, {130, 130}};
constexpr int kNumShapes = sizeof(kShapes) / sizeof(kShapes[0]);

ModelShape ToModelShape(const Shape& s) {
  ModelShape m;
  m.vocab_size = s.vocab;
  m.valid_vocab = s.valid;
  m.hidden_size = kHidden;
  m.weight_dtype = WeightDType::kFloat32;
  return m;
}

// One CPU engine per shape, built on first use (demo head, one thread, small
// tiles so that a row spans several tiles).
Engine* EngineFor(int shape_index) {
  static std::unique_ptr<Engine> engines[kNumShapes];
  std::unique_ptr<Engine>& e = engines[shape_index];
  if (e == nullptr) {
    const Shape& s = kShapes[shape_index];
    CpuEngineOptions options;
    options.num_threads = 1;
    options.tile_rows = 16;
    absl::StatusOr<std::unique_ptr<Engine>> made =
        MakeCpuEngine(LmHead::Demo(s.vocab, kHidden, 11), s.valid, options);
    FUZZ_CHECK(made.ok(), std::string(made.status().ToString()).c_str());
    e = *std::move(made);
  }
  return e.get();
}

// ---- Reading the program -------------------------------------------------

// Boundary values of every float range in server/api/row_controls_parser.h, plus the
// IEEE specials.
constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNiceFloats[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.0f, -2.0f, 2.0000002f, -2.0000002f,
                             100.0f, -100.0f, 100.00001f, 0.99999994f, 1.0000001f, 1e-6f, 9.9e-7f,
                             1e-38f, 1e-45f, 3e38f, kInf, -kInf, std::nanf(""), 0.1f, 1.5f};

float TakeFloat(FuzzInputReader& in) {
  const uint8_t b = in.TakeByte();
  if (b < 0xc0) return kNiceFloats[b % (sizeof(kNiceFloats) / sizeof(float))];
  return in.TakeFloatBits();
}

int32_t TakeInt(FuzzInputReader& in, int32_t small_range) {
  const uint8_t b = in.TakeByte();
  if (b < 0xf0) return static_cast<int32_t>(b % small_range) - 2;  // a few negatives
  return static_cast<int32_t>(in.TakeU32());
}

// A token id: mostly inside [0, V + 2) (so V and V + 1 are just outside),
// sometimes any int32.
int32_t TakeTokenId(FuzzInputReader& in, int64_t vocab) {
  const uint8_t b = in.TakeByte();
  if (b >= 0xf0) return static_cast<int32_t>(in.TakeU32());
  return static_cast<int32_t>(b % (vocab + 2));
}

void TakeIds(FuzzInputReader& in, int64_t vocab, google::protobuf::RepeatedField<int32_t>* out) {
  out->Clear();
  const int n = in.TakeByte() % 48;
  for (int i = 0; i < n; ++i) out->Add(TakeTokenId(in, vocab));
}

std::string TakeBitmask(FuzzInputReader& in, const Shape& s) {
  const uint8_t mode = in.TakeByte();
  const size_t full = static_cast<size_t>((s.vocab + 31) / 32) * 4;
  const size_t valid = static_cast<size_t>((s.valid + 31) / 32) * 4;
  size_t len = 0;
  switch (mode % 4) {
    case 0: len = full; break;
    case 1: len = valid; break;
    case 2: len = in.TakeByte() % 24; break;
    case 3: len = full + 1; break;
  }
  std::string bytes(len, '\0');
  switch ((mode >> 2) % 4) {
    case 0: break;  // nothing allowed
    case 1: std::fill(bytes.begin(), bytes.end(), '\xff'); break;
    case 2: {
      const std::string taken = in.TakeBytes(len);
      std::copy(taken.begin(), taken.end(), bytes.begin());
      break;
    }
    case 3: {  // exactly one token allowed (maybe one past valid_vocab)
      const int64_t token = in.TakeByte() % (s.valid + 1);
      if (static_cast<size_t>(token / 8) < len) bytes[token / 8] = static_cast<char>(1 << (token % 8));
      break;
    }
  }
  return bytes;
}

// A list of edits to one params entry.
void TakeParams(FuzzInputReader& in, const Shape& s, v1::SamplingParams* p) {
  p->set_temperature(1.0f);
  const int edits = in.TakeByte() % 10;
  for (int e = 0; e < edits; ++e) {
    switch (in.TakeByte() % 20) {
      case 0: p->set_temperature(TakeFloat(in)); break;
      case 1: p->set_seed(in.TakeU64()); break;
      case 2: p->set_offset(in.TakeU64()); break;
      case 3: p->set_top_k(TakeInt(in, 140)); break;
      case 4: p->set_top_p(TakeFloat(in)); break;
      case 5: p->set_min_p(TakeFloat(in)); break;
      case 6: {
        p->clear_logit_bias();
        const int n = in.TakeByte() % 8;
        for (int i = 0; i < n; ++i) {
          const int32_t id = TakeTokenId(in, s.vocab);
          (*p->mutable_logit_bias())[id] = TakeFloat(in);
        }
        break;
      }
      case 7: TakeIds(in, s.vocab, p->mutable_banned_token_ids()); break;
      case 8: p->set_allowed_token_bitmask(TakeBitmask(in, s)); break;
      case 9: p->set_repetition_penalty(TakeFloat(in)); break;
      case 10: p->set_presence_penalty(TakeFloat(in)); break;
      case 11: p->set_frequency_penalty(TakeFloat(in)); break;
      case 12: TakeIds(in, s.vocab, p->mutable_output_token_ids()); break;
      case 13: TakeIds(in, s.vocab, p->mutable_prompt_token_ids()); break;
      case 14: p->set_top_logprobs(TakeInt(in, 26)); break;
      case 15: p->set_logprobs_mode(static_cast<v1::LogprobsMode>(TakeInt(in, 5))); break;
      case 16: p->set_num_samples(TakeInt(in, 70)); break;
      case 17: p->clear_top_p(); p->clear_repetition_penalty(); p->clear_num_samples(); break;
      case 18: p->clear_seed(); break;
      case 19: p->set_temperature(0.0f); break;  // greedy
    }
  }
}

v1::SampleRequest TakeRequest(FuzzInputReader& in, const Shape& s, int tag) {
  v1::SampleRequest request;
  const int64_t rows = 1 + in.TakeByte() % kMaxRows;
  v1::Tensor* t = request.mutable_hidden_states();
  t->set_dtype(v1::DTYPE_FP32);
  t->add_shape(rows);
  t->add_shape(kHidden);
  std::vector<float> hidden(static_cast<size_t>(rows * kHidden));
  for (size_t i = 0; i < hidden.size(); ++i) {
    hidden[i] = static_cast<float>(static_cast<int64_t>((i * 5 + tag * 3) % 13) - 6) / 4.0f;
  }
  t->set_data(hidden.data(), hidden.size() * sizeof(float));
  const uint8_t mode = in.TakeByte();
  int entries = 1;
  if (mode % 8 >= 4 && mode % 8 < 7) entries = static_cast<int>(rows);
  if (mode % 8 == 7) entries = in.TakeByte() % (rows + 3);  // also 0 and B + 1, B + 2
  for (int i = 0; i < entries; ++i) TakeParams(in, s, request.add_params());
  request.set_return_logz(mode & 0x10);
  request.set_return_logprobs(mode & 0x20);
  request.set_request_id(absl::StrCat("r", tag));
  return request;
}

// ---- The oracle: the documented contract, written independently -----------

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Any field other than temperature, seed and offset that is set, found by
// reflection so that a control added to the proto but not to HasControls is
// caught. A float field set to -0.0 counts as unset (it equals 0, the default).
bool OracleHasControls(const v1::SamplingParams& p) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  p.GetReflection()->ListFields(p, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->name() == "temperature" || f->name() == "seed" || f->name() == "offset") continue;
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_FLOAT && !f->is_repeated() &&
        !f->has_presence() && p.GetReflection()->GetFloat(p, f) == 0.0f) {
      continue;
    }
    return true;
  }
  return false;
}

std::vector<uint32_t> BitmaskWords(const std::string& bytes) {
  std::vector<uint32_t> words(bytes.size() / 4);
  for (size_t w = 0; w < words.size(); ++w) {
    for (int b = 0; b < 4; ++b) {
      words[w] |= uint32_t{static_cast<unsigned char>(bytes[4 * w + b])} << (8 * b);
    }
  }
  return words;
}

bool IdsInVocab(const google::protobuf::RepeatedField<int32_t>& ids, int64_t vocab) {
  return std::all_of(ids.begin(), ids.end(), [vocab](int32_t id) { return id >= 0 && id < vocab; });
}

enum class Verdict { kOk, kInvalid, kNoToken };

Verdict OracleVerdict(const v1::SamplingParams& p, const Shape& s) {
  const float t = p.temperature();
  if (!(std::isfinite(t) && (t == 0.0f || t >= kMinTemperature))) return Verdict::kInvalid;
  if (!OracleHasControls(p)) return Verdict::kOk;
  const auto in_range = [](float x, float lo, float hi) { return x >= lo && x <= hi; };  // NaN: false
  if (p.top_k() < 0) return Verdict::kInvalid;
  if (p.has_top_p() && !(p.top_p() > 0.0f && p.top_p() <= 1.0f)) return Verdict::kInvalid;
  if (!(p.min_p() >= 0.0f && p.min_p() < 1.0f)) return Verdict::kInvalid;
  for (const auto& [id, bias] : p.logit_bias()) {
    if (id < 0 || id >= s.vocab || !in_range(bias, -100.0f, 100.0f)) return Verdict::kInvalid;
  }
  if (!IdsInVocab(p.banned_token_ids(), s.vocab)) return Verdict::kInvalid;
  const size_t mask_bytes = p.allowed_token_bitmask().size();
  if (mask_bytes != 0 && mask_bytes != static_cast<size_t>((s.vocab + 31) / 32) * 4 &&
      mask_bytes != static_cast<size_t>((s.valid + 31) / 32) * 4) {
    return Verdict::kInvalid;
  }
  if (p.has_repetition_penalty() && !(p.repetition_penalty() >= kMinRepetitionPenalty &&
                                      p.repetition_penalty() <= kMaxRepetitionPenalty)) {
    return Verdict::kInvalid;
  }
  if (!in_range(p.presence_penalty(), -2.0f, 2.0f) || !in_range(p.frequency_penalty(), -2.0f, 2.0f)) {
    return Verdict::kInvalid;
  }
  if (!IdsInVocab(p.output_token_ids(), s.vocab) || !IdsInVocab(p.prompt_token_ids(), s.vocab)) {
    return Verdict::kInvalid;
  }
  if (p.top_logprobs() < 0 || p.top_logprobs() > kMaxTopLogprobs) return Verdict::kInvalid;
  if (p.logprobs_mode() != v1::LOGPROBS_MODE_SAMPLED && p.logprobs_mode() != v1::LOGPROBS_MODE_RAW) {
    return Verdict::kInvalid;
  }
  if (p.has_num_samples() && (p.num_samples() < 1 || p.num_samples() > kMaxNumSamples)) {
    return Verdict::kInvalid;
  }
  // Some token of [0, valid_vocab) must survive the bitmask and the bans.
  const std::vector<uint32_t> mask = BitmaskWords(p.allowed_token_bitmask());
  const std::set<int32_t> banned(p.banned_token_ids().begin(), p.banned_token_ids().end());
  for (int32_t i = 0; i < s.valid; ++i) {
    const bool allowed = mask.empty() || ((mask[i / 32] >> (i % 32)) & 1u);
    if (allowed && banned.count(i) == 0) return Verdict::kOk;
  }
  return Verdict::kNoToken;
}

RowControls OracleControls(const v1::SamplingParams& p, uint32_t stride) {
  RowControls c;
  c.top_k = p.top_k();
  if (p.has_top_p()) c.top_p = p.top_p();
  c.min_p = p.min_p();
  const std::map<int32_t, float> bias(p.logit_bias().begin(), p.logit_bias().end());
  c.logit_bias.assign(bias.begin(), bias.end());
  c.banned_token_ids.assign(p.banned_token_ids().begin(), p.banned_token_ids().end());
  c.allowed_bitmask = BitmaskWords(p.allowed_token_bitmask());
  if (p.has_repetition_penalty()) c.repetition_penalty = p.repetition_penalty();
  c.presence_penalty = p.presence_penalty();
  c.frequency_penalty = p.frequency_penalty();
  c.output_token_ids.assign(p.output_token_ids().begin(), p.output_token_ids().end());
  c.prompt_token_ids.assign(p.prompt_token_ids().begin(), p.prompt_token_ids().end());
  c.top_logprobs = p.top_logprobs();
  c.logprobs_mode = p.logprobs_mode() == v1::LOGPROBS_MODE_RAW ? LogprobsMode::kRaw : LogprobsMode::kSampled;
  if (p.has_num_samples()) c.num_samples = p.num_samples();
  c.sample_stream_stride = stride;
  return c;
}

bool SameControls(const RowControls& a, const RowControls& b) {
  const auto same_bias = [](const auto& x, const auto& y) {
    return x.size() == y.size() &&
           std::equal(x.begin(), x.end(), y.begin(), [](const auto& u, const auto& v) {
             return u.first == v.first && SameBits(u.second, v.second);
           });
  };
  return a.top_k == b.top_k && SameBits(a.top_p, b.top_p) && SameBits(a.min_p, b.min_p) &&
         SameBits(a.repetition_penalty, b.repetition_penalty) &&
         SameBits(a.presence_penalty, b.presence_penalty) &&
         SameBits(a.frequency_penalty, b.frequency_penalty) && same_bias(a.logit_bias, b.logit_bias) &&
         a.banned_token_ids == b.banned_token_ids && a.allowed_bitmask == b.allowed_bitmask &&
         a.output_token_ids == b.output_token_ids && a.prompt_token_ids == b.prompt_token_ids &&
         a.top_logprobs == b.top_logprobs && a.logprobs_mode == b.logprobs_mode &&
         a.num_samples == b.num_samples && a.sample_stream_stride == b.sample_stream_stride;
}

bool SameParams(const RowParams& a, const RowParams& b) {
  return SameBits(a.temperature, b.temperature) && a.seed == b.seed && a.offset == b.offset &&
         a.stream == b.stream;
}

// ---- Resolution --------------------------------------------------------------

// Parses `request` and checks the outcome against the oracle; the parsed
// request when accepted.
std::unique_ptr<ParsedSampleRequest> ResolveAndCheck(const v1::SampleRequest& request, const Shape& s) {
  const ModelShape shape = ToModelShape(s);
  RequestLimits limits;
  limits.max_request_rows = kMaxRows;
  uint64_t next_seed = kFirstDrawnSeed;
  int draws = 0;
  absl::StatusOr<ParsedSampleRequest> parsed =
      ParseSampleRequest(request, shape, limits, [&] { ++draws; return next_seed++; });

  const int64_t rows = request.hidden_states().shape(0);
  const int entries = request.params_size();
  for (const v1::SamplingParams& p : request.params()) {
    FUZZ_CHECK(HasControls(p) == OracleHasControls(p),
               "HasControls disagrees with the fields set (a control missing from HasControls?)");
  }
  if (entries != 1 && entries != rows) {
    FUZZ_CHECK(!parsed.ok() && parsed.status().code() == absl::StatusCode::kInvalidArgument,
               "a params count other than 1 or B was not INVALID_ARGUMENT");
    return nullptr;
  }
  std::vector<Verdict> verdicts;
  bool any_invalid = false, any_no_token = false;
  int64_t expanded = 0;
  for (const v1::SamplingParams& p : request.params()) {
    verdicts.push_back(OracleVerdict(p, s));
    any_invalid = any_invalid || verdicts.back() == Verdict::kInvalid;
    any_no_token = any_no_token || verdicts.back() == Verdict::kNoToken;
    if (OracleHasControls(p)) {
      expanded += static_cast<int64_t>(p.logit_bias_size() + p.banned_token_ids_size() +
                                       p.allowed_token_bitmask().size() / 4 + p.output_token_ids_size() +
                                       p.prompt_token_ids_size()) *
                  (entries == 1 ? rows : 1);
    }
  }
  const bool over_limit = !any_invalid && !any_no_token && expanded > kMaxExpandedControlElements;
  if (!parsed.ok()) {
    const absl::Status& st = parsed.status();
    FUZZ_CHECK(any_invalid || any_no_token || over_limit,
               absl::StrCat("rejected a request the documented ranges accept: ", st.ToString()).c_str());
    FUZZ_CHECK(!st.message().empty(), "rejection without a message");
    if (over_limit) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument, "over the control limit, not INVALID_ARGUMENT");
      return nullptr;
    }
    const Verdict want = st.code() == absl::StatusCode::kInvalidArgument     ? Verdict::kInvalid
                         : st.code() == absl::StatusCode::kFailedPrecondition ? Verdict::kNoToken
                                                                              : Verdict::kOk;
    FUZZ_CHECK(want != Verdict::kOk, absl::StrCat("unexpected code: ", st.ToString()).c_str());
    bool named = false;
    for (int i = 0; i < entries; ++i) {
      named = named || (verdicts[i] == want &&
                        absl::StrContains(st.message(), absl::StrCat("params[", i, "]")));
    }
    FUZZ_CHECK(named, absl::StrCat("the rejection names no entry that fails that way: ", st.ToString()).c_str());
    return nullptr;
  }
  FUZZ_CHECK(!any_invalid && !any_no_token && !over_limit, "accepted a request outside the documented ranges");

  // Every row resolved as its entry asked.
  const SampleBatch& batch = parsed->batch;
  const bool shared = entries == 1;
  FUZZ_CHECK(batch.rows == rows && static_cast<int64_t>(batch.params.size()) == rows &&
                 static_cast<int64_t>(parsed->seeds.size()) == rows &&
                 static_cast<int64_t>(batch.hidden.size()) == rows * kHidden,
             "resolved batch sizes differ from B");
  const bool any_controls = std::any_of(request.params().begin(), request.params().end(), OracleHasControls);
  FUZZ_CHECK(batch.controls.empty() == !any_controls, "controls present exactly when an entry sets one: no");
  FUZZ_CHECK(!any_controls || static_cast<int64_t>(batch.controls.size()) == rows, "controls not one per row");
  std::set<uint64_t> drawn;  // the seeds of entries without one
  int unseeded = 0;
  for (int i = 0; i < entries; ++i) unseeded += request.params(i).has_seed() ? 0 : 1;
  FUZZ_CHECK(draws == unseeded, "not one drawn seed per entry without a seed");
  for (int64_t r = 0; r < rows; ++r) {
    const v1::SamplingParams& p = request.params(shared ? 0 : static_cast<int>(r));
    const RowParams& got = batch.params[r];
    RowParams want;
    want.temperature = p.temperature();
    want.seed = p.has_seed() ? p.seed() : got.seed;
    want.offset = p.offset();
    want.stream = shared ? static_cast<uint32_t>(r) : 0u;
    FUZZ_CHECK(SameParams(got, want), "row params differ from the entry's");
    FUZZ_CHECK(parsed->seeds[r] == got.seed, "reported seed differs from the row's");
    if (!p.has_seed()) {
      FUZZ_CHECK(got.seed >= kFirstDrawnSeed && got.seed < kFirstDrawnSeed + unseeded, "seed not drawn");
      if (shared ? r == 0 : true) drawn.insert(got.seed);
    }
    if (any_controls) {
      const RowControls want_c = OracleHasControls(p) ? OracleControls(p, shared ? static_cast<uint32_t>(rows) : 1u)
                                                      : RowControls{};
      FUZZ_CHECK(SameControls(batch.controls[r], want_c), "row controls differ from the entry's");
    }
  }
  FUZZ_CHECK(static_cast<int>(drawn.size()) == unseeded, "two entries got the same drawn seed");
  if (any_controls) {
    const bool fused = std::all_of(batch.controls.begin(), batch.controls.end(), [](const RowControls& c) {
      return c.top_k >= 1 && c.top_k <= kernels::kCpuFusedMaxTopK &&
             !(c.top_logprobs > 0 && c.logprobs_mode == LogprobsMode::kRaw);
    });
    FUZZ_CHECK((kernels::PlanCpuControlledPath(batch.controls.data(), rows) ==
                kernels::CpuControlledPath::kFused) == fused,
               "the CPU path planner's choice breaks its contract");
  }
  return std::make_unique<ParsedSampleRequest>(*std::move(parsed));
}

// ---- Launches ----------------------------------------------------------------

int32_t FakeToken(int request, int64_t row) { return static_cast<int32_t>(request * 1000 + row); }

bool TokenAllowed(const RowControls& c, int32_t token) {
  if (!c.allowed_bitmask.empty()) {
    if (static_cast<size_t>(token / 32) >= c.allowed_bitmask.size()) return false;
    if (((c.allowed_bitmask[token / 32] >> (token % 32)) & 1u) == 0) return false;
  }
  return std::find(c.banned_token_ids.begin(), c.banned_token_ids.end(), token) ==
         c.banned_token_ids.end();
}

void CheckEngineResult(const SampleBatch& launch, const absl::StatusOr<SampleResult>& result,
                       const Shape& s) {
  if (!result.ok()) {
    FUZZ_CHECK(result.status().code() == absl::StatusCode::kFailedPrecondition && !launch.controls.empty(),
               absl::StrCat("the engine failed a resolved batch: ", result.status().ToString()).c_str());
    return;
  }
  const int64_t rows = launch.rows;
  FUZZ_CHECK(static_cast<int64_t>(result->token_ids.size()) == rows, "engine: not one token per row");
  FUZZ_CHECK(static_cast<int64_t>(result->logz.size()) == (launch.want_logz ? rows : 0), "engine: logz size");
  FUZZ_CHECK(static_cast<int64_t>(result->logprobs.size()) == (launch.want_logprobs ? rows : 0),
             "engine: logprobs size");
  FUZZ_CHECK(result->details.size() == launch.controls.size(), "engine: details not one per controlled row");
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t token = result->token_ids[r];
    FUZZ_CHECK(token >= 0 && token < s.valid, "engine: token outside the valid vocabulary");
    if (launch.want_logz) FUZZ_CHECK(std::isfinite(result->logz[r]), "engine: logz not finite");
    if (launch.want_logprobs) {
      FUZZ_CHECK(std::isfinite(result->logprobs[r]) && result->logprobs[r] <= 1e-5f, "engine: logprob > 0");
    }
    if (launch.controls.empty()) continue;
    const RowControls& c = launch.controls[r];
    const RowSampleDetail& d = result->details[r];
    FUZZ_CHECK(TokenAllowed(c, token), "engine: sampled a banned or masked token");
    FUZZ_CHECK(static_cast<int32_t>(d.token_ids.size()) == c.num_samples && d.token_ids[0] == token,
               "engine: details do not hold num_samples samples starting with the token");
    for (int32_t t : d.token_ids) {
      FUZZ_CHECK(t >= 0 && t < s.valid && TokenAllowed(c, t), "engine: a sample is outside what is allowed");
    }
    if (c.top_logprobs == 0) {
      FUZZ_CHECK(d.logprobs.empty() && d.ranks.empty() && d.top.empty(), "engine: top lists nobody asked for");
      continue;
    }
    FUZZ_CHECK(static_cast<int32_t>(d.logprobs.size()) == c.num_samples &&
                   static_cast<int32_t>(d.ranks.size()) == c.num_samples,
               "engine: not one logprob and rank per sample");
    for (size_t j = 0; j < d.logprobs.size(); ++j) {
      FUZZ_CHECK(!std::isnan(d.logprobs[j]) && d.logprobs[j] <= 1e-5f && d.ranks[j] >= 1,
                 "engine: a sample's logprob or rank is impossible");
    }
    FUZZ_CHECK(!d.top.empty() && static_cast<int32_t>(d.top.size()) <= c.top_logprobs,
               "engine: top list empty or longer than asked");
    for (size_t j = 0; j < d.top.size(); ++j) {
      FUZZ_CHECK(!std::isnan(d.top[j].logprob) && d.top[j].logprob <= 1e-5f && d.top[j].token_id >= 0 &&
                     d.top[j].token_id < s.valid,
                 "engine: impossible top entry");
      // Most likely first. (Ties go to the lower id by logit; two logits one
      // ulp apart can round to the same fp32 logprob, so only the order of
      // the reported values is checked.)
      if (j > 0) FUZZ_CHECK(d.top[j - 1].logprob >= d.top[j].logprob, "engine: top list not most likely first");
      for (size_t k = 0; k < j; ++k) {
        FUZZ_CHECK(d.top[k].token_id != d.top[j].token_id, "engine: a token twice in the top list");
      }
    }
  }
}

struct Queued {
  int request;
  int64_t next_row = 0;
  bool dropped = false;
};

void PlanAndCheckLaunches(FuzzInputReader& in, const std::vector<std::unique_ptr<ParsedSampleRequest>>& parsed,
                          int shape_index) {
  const Shape& s = kShapes[shape_index];
  const int64_t max_rows = 1 + in.TakeByte() % kMaxLaunchRows;
  std::deque<Queued> queue;
  std::vector<SampleResult> results(parsed.size());
  std::vector<std::vector<int>> launched(parsed.size());  // per row: times launched
  std::vector<bool> dropped(parsed.size(), false);
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (parsed[i] == nullptr) continue;
    queue.push_back(Queued{static_cast<int>(i)});
    launched[i].assign(static_cast<size_t>(parsed[i]->batch.rows), 0);
  }
  for (int launches = 0; !queue.empty(); ++launches) {
    FUZZ_CHECK(launches <= kMaxRequests * kMaxRows, "the queue does not drain");
    // The batcher drops requests whose deadline passed, even partly launched ones.
    const uint8_t drop = in.TakeByte();
    if (drop & 0x80) {
      const size_t at = drop % queue.size();
      dropped[queue[at].request] = true;
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(at));
      if (queue.empty()) break;
    }
    std::vector<PendingRequest> pending;
    for (const Queued& q : queue) pending.push_back({&parsed[q.request]->batch, q.next_row});
    const std::vector<RowSlice> plan = PlanLaunch(pending, max_rows);

    // The plan: a non-empty prefix of the queue, in order, one kind, maximal.
    FUZZ_CHECK(!plan.empty() && plan.size() <= pending.size(), "plan empty or longer than the queue");
    const bool kind = !pending[0].batch->controls.empty();
    int64_t total = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      const RowSlice& sl = plan[i];
      FUZZ_CHECK(sl.batch == pending[i].batch && sl.first_row == pending[i].next_row,
                 "slice i is not the continuation of queued request i");
      FUZZ_CHECK(sl.rows >= 1 && sl.first_row + sl.rows <= sl.batch->rows, "slice outside its request");
      FUZZ_CHECK(!sl.batch->controls.empty() == kind, "a launch mixes controlled and plain requests");
      FUZZ_CHECK(i + 1 == plan.size() || sl.first_row + sl.rows == sl.batch->rows,
                 "a slice before the last leaves rows behind");
      total += sl.rows;
    }
    FUZZ_CHECK(total <= max_rows, "launch larger than max_rows");
    if (total < max_rows) {
      const RowSlice& last = plan.back();
      FUZZ_CHECK(last.first_row + last.rows == last.batch->rows, "a launch with room left cut a request");
      FUZZ_CHECK(plan.size() == pending.size() || !pending[plan.size()].batch->controls.empty() != kind,
                 "a launch with room left stopped before a request of its kind");
    }

    // Assembly: the launch holds exactly the slices' rows.
    const SampleBatch launch = ConcatenateSlices(plan, kHidden);
    FUZZ_CHECK(launch.rows == total && static_cast<int64_t>(launch.params.size()) == total &&
                   static_cast<int64_t>(launch.hidden.size()) == total * kHidden,
               "launch sizes differ from the plan");
    FUZZ_CHECK(launch.controls.size() == (kind ? static_cast<size_t>(total) : 0u), "launch controls size");
    bool want_logz = false, want_logprobs = false;
    int64_t j = 0;
    for (const RowSlice& sl : plan) {
      want_logz = want_logz || sl.batch->want_logz;
      want_logprobs = want_logprobs || sl.batch->want_logprobs;
      for (int64_t r = sl.first_row; r < sl.first_row + sl.rows; ++r, ++j) {
        FUZZ_CHECK(std::memcmp(launch.hidden.data() + j * kHidden, sl.batch->hidden.data() + r * kHidden,
                               kHidden * sizeof(float)) == 0,
                   "launch hidden row differs from its source");
        FUZZ_CHECK(SameParams(launch.params[j], sl.batch->params[r]), "launch params differ from the source");
        if (kind) FUZZ_CHECK(SameControls(launch.controls[j], sl.batch->controls[r]), "launch controls differ");
      }
    }
    FUZZ_CHECK(launch.want_logz == want_logz && launch.want_logprobs == want_logprobs, "flags not OR-ed");

    CheckEngineResult(launch, EngineFor(shape_index)->Sample(launch), s);

    // Scatter a fake result that names every row, as the batcher does.
    SampleResult fake;
    for (const RowSlice& sl : plan) {
      const int req = queue[&sl - plan.data()].request;
      for (int64_t r = sl.first_row; r < sl.first_row + sl.rows; ++r) {
        fake.token_ids.push_back(FakeToken(req, r));
        if (launch.want_logz) fake.logz.push_back(FakeToken(req, r) + 0.5f);
        if (launch.want_logprobs) fake.logprobs.push_back(-FakeToken(req, r));
        if (kind) fake.details.push_back(RowSampleDetail{{FakeToken(req, r), -1}, {}, {}, {}});
      }
    }
    int64_t launch_row = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      Queued& q = queue[i];
      if (plan[i].first_row == 0) results[q.request] = ResultFor(*plan[i].batch);
      ScatterSlice(fake, launch_row, plan[i], &results[q.request]);
      launch_row += plan[i].rows;
      for (int64_t r = plan[i].first_row; r < plan[i].first_row + plan[i].rows; ++r) ++launched[q.request][r];
      q.next_row += plan[i].rows;
    }
    while (!queue.empty() && queue.front().next_row == parsed[queue.front().request]->batch.rows) {
      queue.pop_front();
    }
  }

  // Coverage: every row of every request still queued launched exactly once,
  // and its result is its own.
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (parsed[i] == nullptr) continue;
    const SampleBatch& b = parsed[i]->batch;
    const SampleResult& got = results[i];
    for (int64_t r = 0; r < b.rows; ++r) {
      FUZZ_CHECK(launched[i][r] <= 1, "a row was launched twice");
      FUZZ_CHECK(dropped[i] || launched[i][r] == 1, "a row of a served request was never launched");
    }
    if (dropped[i]) continue;
    FUZZ_CHECK(static_cast<int64_t>(got.token_ids.size()) == b.rows &&
                   got.logz.size() == (b.want_logz ? got.token_ids.size() : 0u) &&
                   got.logprobs.size() == (b.want_logprobs ? got.token_ids.size() : 0u) &&
                   got.details.size() == (b.controls.empty() ? 0u : got.token_ids.size()),
               "a request's result does not have the outputs it asked for");
    for (int64_t r = 0; r < b.rows; ++r) {
      const int32_t want = FakeToken(static_cast<int>(i), r);
      FUZZ_CHECK(got.token_ids[r] == want, "a request got another row's token");
      if (b.want_logz) FUZZ_CHECK(got.logz[r] == want + 0.5f, "a request got another row's logz");
      if (b.want_logprobs) FUZZ_CHECK(got.logprobs[r] == -want, "a request got another row's logprob");
      if (!b.controls.empty()) {
        FUZZ_CHECK(got.details[r].token_ids == std::vector<int32_t>({want, -1}),
                   "a request got another row's details");
      }
    }
  }
}

}  // namespace

void CheckSamplingParams(const uint8_t* data, size_t size) {
  FuzzInputReader in(data, size);
  const int shape_index = in.TakeByte() % kNumShapes;
  const Shape& s = kShapes[shape_index];
  const int requests = 1 + in.TakeByte() % kMaxRequests;
  std::vector<std::unique_ptr<ParsedSampleRequest>> parsed;
  for (int i = 0; i < requests; ++i) {
    const v1::SampleRequest request = TakeRequest(in, s, i);
    parsed.push_back(ResolveAndCheck(request, s));
  }
  PlanAndCheckLaunches(in, parsed, shape_index);
}

}  // namespace flashsampler::fuzz
