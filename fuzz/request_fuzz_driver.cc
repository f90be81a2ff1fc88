#include "fuzz/request_fuzz_driver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input_reader.h"
#include "kernels/common/half_precision.h"
#include "server/api/request_parser.h"
#include "server/api/row_controls_parser.h"
#include "server/api/verify_request.h"

namespace flashsampler::fuzz {
namespace {

// The fuzz model both parsers validate against (request_fuzz_driver.h).
ModelShape FuzzShape() {
  ModelShape shape;
  shape.vocab_size = kFuzzVocabSize;
  shape.valid_vocab = kFuzzVocabSize;
  shape.hidden_size = kFuzzHiddenSize;
  return shape;
}

RequestLimits FuzzLimits() {
  RequestLimits limits;
  limits.max_request_rows = kFuzzMaxBatchRows;
  return limits;
}

// A parser may reject only with InvalidArgument, and must say why; a request
// that names a memory region may also get NotFound (the driver's registry is
// empty, as a server's is before any RegisterRegion).
void CheckRejection(const absl::Status& status, bool names_region = false) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
                 (names_region && status.code() == absl::StatusCode::kNotFound),
             std::string(status.ToString()).c_str());
  FUZZ_CHECK(!status.message().empty(), "rejection without a message");
}

bool NamesRegion(const v1::SampleRequest& request) {
  return request.has_hidden_states_region() || request.has_output_region();
}

// The one call into the parser, with a registry as the service passes one
// (empty: region-backed requests are checked for their bounds and names, and
// none can be accepted). A signature change is a one-line edit here.
absl::StatusOr<ParsedSampleRequest> Parse(const v1::SampleRequest& request) {
  static MemoryRegions* const regions = new MemoryRegions(MemoryRegionsOptions{});
  uint64_t next_seed = 1000;
  return ParseSampleRequest(request, FuzzShape(), FuzzLimits(), [&next_seed] { return next_seed++; },
                            regions);
}

// The parser's contract for one request (see server/api/request_parser.h).
void ValidateAndCheck(const v1::SampleRequest& request) {
  absl::StatusOr<ParsedSampleRequest> parsed = Parse(request);
  if (!parsed.ok()) {
    CheckRejection(parsed.status(), NamesRegion(request));
    return;
  }
  FUZZ_CHECK(!NamesRegion(request), "accepted a request naming a region that is not registered");
  const SampleBatch& batch = parsed->batch;
  const v1::Tensor& t = request.hidden_states();
  FUZZ_CHECK(t.shape_size() == 2, "accepted a shape that is not [B, D]");
  FUZZ_CHECK(batch.rows == t.shape(0), "rows differ from shape[0]");
  FUZZ_CHECK(batch.rows >= 1 && batch.rows <= kFuzzMaxBatchRows, "rows outside [1, max]");
  FUZZ_CHECK(t.shape(1) == kFuzzHiddenSize, "accepted the wrong hidden size");
  FUZZ_CHECK(static_cast<int64_t>(batch.hidden.size()) == batch.rows * kFuzzHiddenSize,
             "decoded hidden states have the wrong length");
  FUZZ_CHECK(static_cast<int64_t>(t.data().size()) ==
                 batch.rows * kFuzzHiddenSize * WireDTypeSize(t.dtype()),
             "accepted data whose byte length disagrees with the shape");
  for (float x : batch.hidden) FUZZ_CHECK(std::isfinite(x), "accepted a non-finite hidden state");
  FUZZ_CHECK(static_cast<int64_t>(batch.params.size()) == batch.rows, "params not one per row");
  FUZZ_CHECK(static_cast<int64_t>(parsed->seeds.size()) == batch.rows, "seeds not one per row");
  FUZZ_CHECK(request.params_size() == 1 || request.params_size() == batch.rows,
             "accepted a params count that is neither 1 nor B");
  for (int64_t r = 0; r < batch.rows; ++r) {
    const RowParams& p = batch.params[r];
    FUZZ_CHECK(std::isfinite(p.temperature) &&
                   (p.temperature == 0.0f || p.temperature >= kMinTemperature),
               "accepted an unusable temperature");
    FUZZ_CHECK(p.seed == parsed->seeds[r], "reported seed differs from the row's seed");
  }
  // The response side: a fake engine result for every row.
  SampleResult result;
  result.token_ids.assign(static_cast<size_t>(batch.rows), 0);
  if (batch.want_logz) result.logz.assign(static_cast<size_t>(batch.rows), 0.0f);
  if (batch.want_logprobs) result.logprobs.assign(static_cast<size_t>(batch.rows), 0.0f);
  v1::SampleResponse response;
  FUZZ_CHECK(FillSampleResponse(*parsed, result, &response).ok(), "filling a response failed");
  FUZZ_CHECK(response.token_ids_size() == batch.rows, "response token count differs from B");
  FUZZ_CHECK(response.seeds_size() == batch.rows, "response seed count differs from B");
  FUZZ_CHECK(response.request_id() == request.request_id(), "request id not echoed");
}

// ParseVerifyRequest's contract (server/api/verify_request.h) for one request,
// then FillVerifyResponse over a fake engine result.
void ValidateAndCheckVerify(const v1::VerifyRequest& request) {
  uint64_t next_seed = 2000;
  absl::StatusOr<ParsedVerifyRequest> parsed =
      ParseVerifyRequest(request, FuzzShape(), FuzzLimits(), [&next_seed] { return next_seed++; });
  if (!parsed.ok()) {
    CheckRejection(parsed.status());
    return;
  }
  const SampleBatch& batch = parsed->batch;
  FUZZ_CHECK(static_cast<int>(parsed->sequences.size()) == request.sequences_size(),
             "one span per sequence");
  int64_t rows = 0;
  for (int i = 0; i < request.sequences_size(); ++i) {
    const VerifySpan& span = parsed->sequences[static_cast<size_t>(i)];
    FUZZ_CHECK(span.first_row == rows, "spans are not contiguous");
    FUZZ_CHECK(span.num_drafts == request.sequences(i).draft_token_ids_size(), "gamma changed");
    rows += span.num_drafts + 1;
  }
  FUZZ_CHECK(batch.rows == rows && rows >= 1 && rows <= kFuzzMaxBatchRows, "rows differ from sum(gamma + 1)");
  FUZZ_CHECK(static_cast<int64_t>(batch.hidden.size()) == rows * kFuzzHiddenSize,
             "decoded hidden states have the wrong length");
  for (float x : batch.hidden) FUZZ_CHECK(std::isfinite(x), "accepted a non-finite hidden state");
  FUZZ_CHECK(static_cast<int64_t>(batch.params.size()) == rows, "params not one per position");
  FUZZ_CHECK(batch.draft_tokens.empty() || static_cast<int64_t>(batch.draft_tokens.size()) == rows,
             "draft tokens neither empty nor one per position");
  for (int32_t x : batch.draft_tokens) FUZZ_CHECK(x >= -1 && x < kFuzzVocabSize, "draft id out of range");
  FUZZ_CHECK(batch.controls.empty() || static_cast<int64_t>(batch.controls.size()) == rows,
             "controls neither empty nor one per position");
  int64_t elements = 0;
  for (const RowControls& c : batch.controls) elements += ControlElements(c);
  FUZZ_CHECK(elements <= kMaxExpandedControlElements, "accepted controls over the expanded limit");
  // The response side: a fake engine result for every position.
  SampleResult result;
  result.token_ids.assign(static_cast<size_t>(rows), 0);
  if (batch.want_logz) result.logz.assign(static_cast<size_t>(rows), 0.0f);
  if (!batch.draft_tokens.empty()) result.draft_logprobs.assign(static_cast<size_t>(rows), -0.7f);
  v1::VerifyResponse response;
  FillVerifyResponse(*parsed, result, &response);
  FUZZ_CHECK(response.sequences_size() == request.sequences_size(), "one result per sequence");
  for (int i = 0; i < response.sequences_size(); ++i) {
    const v1::VerifyResult& out = response.sequences(i);
    FUZZ_CHECK(out.num_accepted() >= 0 && out.num_accepted() <= parsed->sequences[i].num_drafts,
               "accepted more drafts than there are");
    FUZZ_CHECK(out.token_ids_size() == out.num_accepted() + 1, "not the accepted prefix plus one token");
  }
}

// Encodes `x` as one element of `dtype` at `out`.
void PutElement(float x, v1::DType dtype, char* out) {
  if (dtype == v1::DTYPE_FP32) {
    std::memcpy(out, &x, 4);
  } else {
    const uint16_t bits = dtype == v1::DTYPE_BF16 ? FloatToBf16(x) : FloatToFp16(x);
    std::memcpy(out, &bits, 2);
  }
}

}  // namespace

v1::SampleRequest ValidFuzzRequest(int64_t rows, v1::DType dtype, uint64_t seed) {
  v1::SampleRequest request;
  v1::Tensor* t = request.mutable_hidden_states();
  t->set_dtype(dtype);
  t->add_shape(rows);
  t->add_shape(kFuzzHiddenSize);
  const int64_t elem = WireDTypeSize(dtype);
  std::string data(static_cast<size_t>(rows * kFuzzHiddenSize * elem), '\0');
  for (int64_t i = 0; i < rows * kFuzzHiddenSize; ++i) {
    // Small distinct values, exact in every dtype.
    const float x = static_cast<float>(static_cast<int64_t>((i * 7 + seed) % 17) - 8) / 4.0f;
    PutElement(x, dtype, data.data() + i * elem);
  }
  t->set_data(std::move(data));
  v1::SamplingParams* p = request.add_params();
  p->set_temperature(1.0f);
  p->set_seed(seed);
  return request;
}

void CheckRequestBytes(const uint8_t* data, size_t size) {
  v1::SampleRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) ValidateAndCheck(request);
  v1::VerifyRequest verify;
  if (verify.ParseFromArray(data, static_cast<int>(size))) ValidateAndCheckVerify(verify);
}

v1::VerifyRequest ValidFuzzVerifyRequest(std::initializer_list<int32_t> gammas, uint64_t seed) {
  v1::VerifyRequest request;
  for (int32_t gamma : gammas) {
    const v1::SampleRequest rows = ValidFuzzRequest(gamma + 1, v1::DTYPE_BF16, seed++);
    v1::VerifySequence* s = request.add_sequences();
    *s->mutable_hidden_states() = rows.hidden_states();
    for (int32_t j = 0; j < gamma; ++j) s->add_draft_token_ids((j * 5 + 3) % kFuzzVocabSize);
    *s->mutable_params() = rows.params(0);
  }
  request.set_return_acceptance_probs(true);
  return request;
}

void CheckRequestEdits(const uint8_t* data, size_t size) {
  FuzzInputReader in(data, size);
  const uint8_t start = in.TakeByte();
  const v1::DType start_dtype = static_cast<v1::DType>(1 + start % 3);
  v1::SampleRequest request = ValidFuzzRequest(1 + (start >> 2) % 4, start_dtype, start);
  v1::Tensor* t = request.mutable_hidden_states();
  // At most 64 edits: enough to combine several, bounded cost per input.
  for (int edit = 0; edit < 64 && !in.empty(); ++edit) {
    switch (in.TakeByte() % 12) {
      case 0:  // any dtype value, including ones the enum does not define
        t->set_dtype(static_cast<v1::DType>(static_cast<int32_t>(in.TakeU32())));
        break;
      case 1: {  // one dimension set to any int64 (negative, huge, overflowing)
        if (t->shape_size() == 0) t->add_shape(0);
        t->set_shape(in.TakeByte() % t->shape_size(), static_cast<int64_t>(in.TakeU64()));
        break;
      }
      case 2:  // a dimension added or removed
        if (in.TakeByte() & 1) {
          t->add_shape(static_cast<int64_t>(in.TakeByte()));
        } else if (t->shape_size() > 0) {
          t->mutable_shape()->RemoveLast();
        }
        break;
      case 3: {  // data length changed by a small signed amount
        const int delta = static_cast<int8_t>(in.TakeByte());
        const int64_t len = static_cast<int64_t>(t->data().size()) + delta;
        t->mutable_data()->resize(static_cast<size_t>(std::clamp<int64_t>(len, 0, 1 << 16)));
        break;
      }
      case 4:  // data replaced by raw bytes (NaN/Inf patterns, odd lengths)
        t->set_data(in.TakeBytes(4 * kFuzzHiddenSize * 8));
        break;
      case 5: {  // one element overwritten with arbitrary bits
        std::string* d = t->mutable_data();
        if (d->empty()) break;
        const size_t at = in.TakeU32() % d->size();
        const uint32_t bits = in.TakeU32();
        std::memcpy(d->data() + at, &bits, std::min<size_t>(4, d->size() - at));
        break;
      }
      case 6: {  // rows and data made consistent again for B rows of the dtype
        const int64_t rows = in.TakeByte() % (kFuzzMaxBatchRows + 2);
        const int64_t elem = WireDTypeSize(t->dtype());
        t->clear_shape();
        t->add_shape(rows);
        t->add_shape(kFuzzHiddenSize);
        t->mutable_data()->assign(static_cast<size_t>(rows * kFuzzHiddenSize * elem), '\0');
        break;
      }
      case 7:  // a params entry added
        request.add_params()->set_temperature(in.TakeFloatBits());
        break;
      case 8:  // a params entry removed
        if (request.params_size() > 0) request.mutable_params()->RemoveLast();
        break;
      case 9: {  // one params entry's fields set to arbitrary values
        if (request.params_size() == 0) break;
        v1::SamplingParams* p = request.mutable_params(in.TakeByte() % request.params_size());
        p->set_temperature(in.TakeFloatBits());
        if (in.TakeByte() & 1) p->set_seed(in.TakeU64()); else p->clear_seed();
        p->set_offset(in.TakeU64());
        break;
      }
      case 10: {  // one params entry per row, each with its own temperature
        request.clear_params();
        const int64_t rows = t->shape_size() > 0 ? std::clamp<int64_t>(t->shape(0), 0, 128) : 1;
        for (int64_t r = 0; r < rows; ++r) request.add_params()->set_temperature(in.TakeFloatBits());
        break;
      }
      case 11: {  // flags and the echoed id
        request.set_return_logz(in.TakeByte() & 1);
        request.set_return_logprobs(in.TakeByte() & 1);
        // proto3 strings must be UTF-8 (the wire parser rejects others), so
        // the id is printable ASCII.
        std::string id = in.TakeBytes(64);
        for (char& c : id) c = static_cast<char>(' ' + static_cast<uint8_t>(c) % 95);
        request.set_request_id(std::move(id));
        break;
      }
    }
  }
  ValidateAndCheck(request);
  // What the service receives is the wire form; it must round-trip.
  v1::SampleRequest reparsed;
  FUZZ_CHECK(reparsed.ParseFromString(request.SerializeAsString()), "request does not round-trip");
  ValidateAndCheck(reparsed);
}

}  // namespace flashsampler::fuzz
