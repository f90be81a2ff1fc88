#include "server/request_parser.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/half_precision.h"
#include "server/row_controls_parser.h"

namespace flashsampler {

int64_t WireDTypeSize(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32: return 4;
    case v1::DTYPE_FP16: return 2;
    case v1::DTYPE_BF16: return 2;
    default: return 0;
  }
}

namespace {

// Widens the raw little-endian bytes to fp32 and rejects non-finite values.
// `bytes` holds exactly rows * cols elements of `dtype` (checked by the caller).
absl::Status DecodeHidden(const std::string& bytes, int dtype, int64_t rows, int64_t cols,
                          std::vector<float>* out) {
  const int64_t n = rows * cols;
  out->resize(static_cast<size_t>(n));
  const char* src = bytes.data();
  if (dtype == v1::DTYPE_FP32) {
    std::memcpy(out->data(), src, static_cast<size_t>(n) * sizeof(float));
  } else {
    const bool bf16 = dtype == v1::DTYPE_BF16;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, sizeof bits);
      (*out)[i] = bf16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite((*out)[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden_states[", i / cols, "][", i % cols, "] is ",
                       std::isnan((*out)[i]) ? "NaN" : "infinite",
                       "; hidden states must be finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTemperature(float t, int index) {
  if (std::isnan(t) || std::isinf(t) || t < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params[", index, "].temperature must be finite and >= 0 (0 = greedy), got ", t));
  }
  // Backends multiply logits by the fp32 reciprocal 1/T; below kMinTemperature
  // it would overflow (or scale any logit to +-inf). Use 0 for greedy instead.
  if (t > 0.0f && t < kMinTemperature) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params[", index, "].temperature ", t, " is below the smallest supported ",
        kMinTemperature, "; use 0 for greedy sampling"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedSampleRequest> ParseSampleRequest(const v1::SampleRequest& request,
                                                       const ModelShape& shape,
                                                       const RequestLimits& limits,
                                                       const std::function<uint64_t()>& draw_seed) {
  if (!request.has_hidden_states()) {
    return absl::InvalidArgumentError("hidden_states is missing");
  }
  const v1::Tensor& t = request.hidden_states();
  const int64_t elem = WireDTypeSize(t.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden_states.dtype must be DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16, got ",
        v1::DType_IsValid(t.dtype()) ? v1::DType_Name(t.dtype()) : absl::StrCat(t.dtype())));
  }
  if (t.shape_size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden_states.shape must be [B, D] (2 dims), got ", t.shape_size(), " dims"));
  }
  const int64_t rows = t.shape(0);
  const int64_t cols = t.shape(1);
  if (cols != shape.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_states.shape[1] must be the model's hidden size ",
                                                   shape.hidden_size, ", got ", cols));
  }
  if (rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden_states.shape[0] (B) must be >= 1, got ", rows));
  }
  if (rows > limits.max_batch_rows) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_states.shape[0] (B) is ", rows,
                                                   ", over this server's limit of ",
                                                   limits.max_batch_rows, " rows per request"));
  }
  // rows <= max_batch_rows and cols is the model's D, so this cannot overflow.
  const int64_t want_bytes = rows * cols * elem;
  if (static_cast<int64_t>(t.data().size()) != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hidden_states.data has ", t.data().size(), " bytes, but shape [", rows, ", ", cols,
        "] of ", v1::DType_Name(t.dtype()), " needs ", want_bytes));
  }
  const int num_params = request.params_size();
  if (num_params != 1 && num_params != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params must have 1 entry (shared by all rows) or B = ", rows, " entries, got ", num_params));
  }
  bool any_controls = false;
  std::vector<RowControls> entry_controls(num_params);
  for (int i = 0; i < num_params; ++i) {
    if (absl::Status s = CheckTemperature(request.params(i).temperature(), i); !s.ok()) return s;
    if (!HasControls(request.params(i))) continue;
    any_controls = true;
    // Rows sharing an entry are spaced `rows` streams apart per extra sample.
    const uint32_t stride = num_params == 1 ? static_cast<uint32_t>(rows) : 1u;
    absl::StatusOr<RowControls> c = ParseRowControls(request.params(i), i, shape, stride);
    if (!c.ok()) return c.status();
    entry_controls[i] = *std::move(c);
  }
  int64_t expanded = 0;
  for (int i = 0; i < num_params; ++i) {
    expanded += ControlElements(entry_controls[i]) * (num_params == 1 ? rows : 1);
  }
  if (expanded > kMaxExpandedControlElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sampling controls hold ", expanded, " token ids / bitmask words once the shared params "
        "entry is applied to every row, over the limit of ", kMaxExpandedControlElements,
        "; send one params entry per row"));
  }

  ParsedSampleRequest parsed;
  SampleBatch& batch = parsed.batch;
  batch.rows = rows;
  batch.want_logz = request.return_logz();
  batch.want_logprobs = request.return_logprobs();
  parsed.request_id = request.request_id();
  if (absl::Status s = DecodeHidden(t.data(), t.dtype(), rows, cols, &batch.hidden); !s.ok()) {
    return s;
  }
  // Round H to the weights' dtype here, on this gRPC thread, rather than on the
  // batcher's one worker thread. Values sent in the weights' own dtype (or
  // any values, for fp32 weights) are already exact after widening.
  const bool same_dtype = (t.dtype() == v1::DTYPE_BF16 && shape.weight_dtype == WeightDType::kBFloat16) ||
                          (t.dtype() == v1::DTYPE_FP16 && shape.weight_dtype == WeightDType::kFloat16);
  if (!same_dtype) {
    if (absl::Status s = RoundHiddenToWeightDType(shape.weight_dtype, batch.hidden.data(),
                                                  static_cast<int64_t>(batch.hidden.size()));
        !s.ok()) {
      return s;
    }
  }
  batch.hidden_in_weight_dtype = true;
  std::vector<uint64_t> entry_seeds(num_params);
  for (int i = 0; i < num_params; ++i) {
    const v1::SamplingParams& p = request.params(i);
    entry_seeds[i] = p.has_seed() ? p.seed() : draw_seed();
  }
  batch.params.resize(rows);
  parsed.seeds.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const bool shared = num_params == 1;
    const int entry = shared ? 0 : static_cast<int>(r);
    const v1::SamplingParams& p = request.params(entry);
    RowParams& row = batch.params[r];
    row.temperature = p.temperature();
    row.seed = entry_seeds[entry];
    row.offset = p.offset();
    row.stream = shared ? static_cast<uint32_t>(r) : 0u;
    parsed.seeds[r] = row.seed;
  }
  if (any_controls) {
    batch.controls.resize(rows);
    for (int64_t r = 0; r < rows; ++r) batch.controls[r] = entry_controls[num_params == 1 ? 0 : r];
  }
  return parsed;
}

void FillSampleResponse(const ParsedSampleRequest& parsed, const SampleResult& result,
                        v1::SampleResponse* response) {
  response->Clear();
  response->mutable_token_ids()->Add(result.token_ids.begin(), result.token_ids.end());
  response->mutable_logz()->Add(result.logz.begin(), result.logz.end());
  response->mutable_logprobs()->Add(result.logprobs.begin(), result.logprobs.end());
  response->mutable_seeds()->Add(parsed.seeds.begin(), parsed.seeds.end());
  response->set_request_id(parsed.request_id);
  const std::vector<RowControls>& controls = parsed.batch.controls;
  const bool want_rows = std::any_of(controls.begin(), controls.end(), [](const RowControls& c) {
    return c.top_logprobs > 0 || c.num_samples > 1;
  });
  if (!want_rows || result.details.size() != controls.size()) return;
  for (const RowSampleDetail& d : result.details) {
    v1::RowOutput* row = response->add_rows();
    row->mutable_sample_token_ids()->Add(d.token_ids.begin(), d.token_ids.end());
    row->mutable_sample_logprobs()->Add(d.logprobs.begin(), d.logprobs.end());
    row->mutable_sample_ranks()->Add(d.ranks.begin(), d.ranks.end());
    for (const TokenLogprob& t : d.top) {
      v1::TokenLogprob* out = row->add_top_logprobs();
      out->set_token_id(t.token_id);
      out->set_logprob(t.logprob);
    }
  }
}

}  // namespace flashsampler
