#include "server/api/request_parser.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/half_precision.h"
#include "server/api/row_controls_parser.h"

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

// Widens the raw little-endian bytes to fp32 (appended to `out`) and rejects
// non-finite values. `bytes` holds exactly rows * cols elements of `dtype`
// (checked by the caller).
//
// One pass over the payload, and no branch per element: a 2 MiB decode step
// (256 rows of D = 4096 bf16) is a million elements on the request's path.
// Finiteness is read off the input's own exponent bits (all ones: inf or
// NaN, in fp32, bf16 and fp16 alike) and OR-ed into one flag, so the
// compiler vectorizes the loop; only a rejected payload is walked again, to
// name its first bad element.
template <typename Wire, Wire kExponentMask, typename Widen>
bool WidenAndCheck(const char* src, int64_t n, float* dst, Widen widen) {
  Wire bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    Wire bits;
    std::memcpy(&bits, src + i * static_cast<int64_t>(sizeof(Wire)), sizeof bits);
    dst[i] = widen(bits);
    bad |= static_cast<Wire>((bits & kExponentMask) == kExponentMask);  // 1: inf or NaN
  }
  return bad == 0;
}

// Widens n elements of `dtype` from `src` into `dst`; false when any is inf or NaN.
bool WidenHidden(const char* src, int dtype, int64_t n, float* dst) {
  if (dtype == v1::DTYPE_FP32) {
    return WidenAndCheck<uint32_t, 0x7f800000u>(src, n, dst, [](uint32_t b) { return BitsToFloat(b); });
  }
  if (dtype == v1::DTYPE_BF16) {
    return WidenAndCheck<uint16_t, 0x7f80u>(src, n, dst, [](uint16_t b) { return Bf16ToFloat(b); });
  }
  return WidenAndCheck<uint16_t, 0x7c00u>(src, n, dst, [](uint16_t b) { return Fp16ToFloat(b); });
}

// The error for element i (of rows of `cols`), whose value is `value`.
absl::Status NonFiniteError(const std::string& field, int64_t i, int64_t cols, float value) {
  return absl::InvalidArgumentError(absl::StrCat(field, "[", i / cols, "][", i % cols, "] is ",
                                                 std::isnan(value) ? "NaN" : "infinite",
                                                 "; hidden states must be finite"));
}

// The error for widened values `dst` [n] of which WidenHidden flagged one.
absl::Status FirstNonFinite(const float* dst, int64_t n, int64_t cols, const std::string& field) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(dst[i])) return NonFiniteError(field, i, cols, dst[i]);
  }
  return absl::InternalError("non-finite hidden state flagged but not found");
}

// True when none of the n 16-bit values at `src` is inf or NaN (exponent
// bits all ones): WidenAndCheck's test without the widening, one pass, no
// branch per element.
template <uint16_t kExponentMask>
bool AllFinite16(const char* src, int64_t n) {
  uint16_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, sizeof bits);
    bad |= static_cast<uint16_t>((bits & kExponentMask) == kExponentMask);
  }
  return bad == 0;
}

// Checks n bf16 or fp16 values (`dtype`) as WidenHidden would, without
// widening them; the error names the first bad element.
absl::Status CheckFinite16(const char* src, int dtype, int64_t n, int64_t cols, const std::string& field) {
  const bool bf16 = dtype == v1::DTYPE_BF16;
  if (bf16 ? AllFinite16<0x7f80u>(src, n) : AllFinite16<0x7c00u>(src, n)) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, sizeof bits);
    const float value = bf16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
    if (!std::isfinite(value)) return NonFiniteError(field, i, cols, value);
  }
  return absl::InternalError("non-finite hidden state flagged but not found");
}

// Reads a [rows, cols] tensor of `dtype` from `slice` (exactly its bytes)
// and widens it into `dst` a piece at a time, from the region's staging
// memory (server/regions/memory_regions.h), so the payload is touched once in cache
// and never staged whole.
absl::Status ReadHiddenFromRegion(const RegionSlice& slice, int dtype, int64_t rows, int64_t cols,
                                  const std::string& field, float* dst) {
  const int64_t elem = WireDTypeSize(dtype);
  bool finite = true;
  float* at = dst;
  const absl::Status read = slice.region->ReadPieces(
      slice.offset, slice.byte_size, static_cast<uint64_t>(elem), [&](const char* piece, uint64_t bytes) {
        const int64_t n = static_cast<int64_t>(bytes) / elem;
        finite = WidenHidden(piece, dtype, n, at) && finite;
        at += n;
      });
  if (!read.ok()) return read;
  return finite ? absl::OkStatus() : FirstNonFinite(dst, rows * cols, cols, field);
}

// The element type of a wire dtype (checked by CheckHiddenShape).
WeightDType WireToWeightDType(int dtype) {
  if (dtype == v1::DTYPE_FP32) return WeightDType::kFloat32;
  if (dtype == v1::DTYPE_FP16) return WeightDType::kFloat16;
  return WeightDType::kBFloat16;
}

// `bytes` of the engine's host staging, or null when it has none to give.
std::shared_ptr<void> Stage(const WireInput* wire_input, int64_t bytes) {
  if (wire_input->staging == nullptr) return nullptr;
  return wire_input->staging->Allocate(static_cast<size_t>(bytes));
}

// Rounds the decoded values to the weights' dtype, here on the gRPC thread
// rather than on the batcher's one worker thread. Values sent in the
// weights' own dtype (or any values, for fp32 weights) are already exact.
absl::Status RoundToWeights(int wire_dtype, WeightDType weight_dtype, float* values, int64_t n,
                            int64_t cols, const std::string& field) {
  const bool same_dtype = (wire_dtype == v1::DTYPE_BF16 && weight_dtype == WeightDType::kBFloat16) ||
                          (wire_dtype == v1::DTYPE_FP16 && weight_dtype == WeightDType::kFloat16);
  if (same_dtype) return absl::OkStatus();
  return RoundHiddenToWeightDType(weight_dtype, values, n, cols, field);
}

// Checks a hidden-state tensor's dtype and shape ([B, D], D = hidden_size,
// 1 <= B <= max_rows) and returns B.
absl::StatusOr<int64_t> CheckHiddenShape(const v1::Tensor& t, const std::string& field,
                                         int64_t hidden_size, int64_t max_rows) {
  const int64_t elem = WireDTypeSize(t.dtype());
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".dtype must be DTYPE_FP32, DTYPE_FP16 or DTYPE_BF16, got ",
        v1::DType_IsValid(t.dtype()) ? v1::DType_Name(t.dtype()) : absl::StrCat(t.dtype())));
  }
  if (t.shape_size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shape must be [B, D] (2 dims), got ", t.shape_size(), " dims"));
  }
  const int64_t rows = t.shape(0);
  const int64_t cols = t.shape(1);
  if (cols != hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape[1] must be the model's hidden size ",
                                                   hidden_size, ", got ", cols));
  }
  if (rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape[0] (B) must be >= 1, got ", rows));
  }
  if (rows > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape[0] (B) is ", rows,
                                                   ", over this server's limit of ",
                                                   max_rows, " rows per request"));
  }
  return rows;
}

// Validates a [B, D] hidden-state tensor and appends its values, widened to
// fp32, NaN/Inf rejected and rounded to `weight_dtype`, to `out`. The bytes
// are the tensor's data, or, when `region` is given, the slice of a
// registered region it names (the tensor then gives dtype and shape only).
// With `wire_input` (an engine that widens itself; `out` must then be empty,
// as for a Sample request's one tensor) the values are not decoded: `out`
// gets room for them, unwritten, and `wire` one run covering every row.
// With `widen_in_batcher` (and no wire_input; `out` empty), bytes in the
// message in the weights' own 16-bit dtype are only checked: `wire` gets one
// run pointing at them and `out` stays empty. Returns B.
absl::StatusOr<int64_t> DecodeHidden(const v1::Tensor& t, const std::string& field, int64_t hidden_size,
                                     int64_t max_rows, WeightDType weight_dtype,
                                     const v1::RegionSlice* region, const MemoryRegions* regions,
                                     HiddenStates* out, const WireInput* wire_input,
                                     std::vector<WireHiddenRows>* wire, bool widen_in_batcher = false) {
  absl::StatusOr<int64_t> rows = CheckHiddenShape(t, field, hidden_size, max_rows);
  if (!rows.ok()) return rows.status();
  const int64_t cols = hidden_size;
  // rows <= max_rows and cols is the model's D, so this cannot overflow.
  const int64_t want_bytes = *rows * cols * WireDTypeSize(t.dtype());
  const int64_t n = *rows * cols;
  std::optional<RegionSlice> slice;
  if (region == nullptr) {
    if (static_cast<int64_t>(t.data().size()) != want_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".data has ", t.data().size(), " bytes, but shape [", *rows, ", ", cols,
          "] of ", v1::DType_Name(t.dtype()), " needs ", want_bytes));
    }
  } else {
    if (!t.data().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".data must be empty when ", field, "_region is set (the bytes are read from the region)"));
    }
    // The name first: an unknown region is NOT_FOUND whatever its size says.
    absl::StatusOr<RegionSlice> resolved =
        regions->Resolve(region->region(), region->offset(), region->byte_size(), field + "_region");
    if (!resolved.ok()) return resolved.status();
    if (region->byte_size() != static_cast<uint64_t>(want_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "_region.byte_size is ", region->byte_size(), ", but shape [", *rows, ", ", cols,
          "] of ", v1::DType_Name(t.dtype()), " needs ", want_bytes));
    }
    slice = *std::move(resolved);
  }
  // Widening such bytes is exact and needs no rounding, so the batcher can
  // widen them straight into the launch: one pass over the payload instead
  // of widening here and copying the fp32 rows there (and no fp32 buffer per
  // request).
  const bool own_16_bit_dtype = (t.dtype() == v1::DTYPE_BF16 && weight_dtype == WeightDType::kBFloat16) ||
                                (t.dtype() == v1::DTYPE_FP16 && weight_dtype == WeightDType::kFloat16);
  if (widen_in_batcher && wire_input == nullptr && !slice.has_value() && own_16_bit_dtype) {
    if (absl::Status s = CheckFinite16(t.data().data(), t.dtype(), n, cols, field); !s.ok()) return s;
    wire->push_back(WireHiddenRows{0, *rows, t.data().data(), weight_dtype, kHostMemory, false, nullptr});
    return *rows;
  }
  const size_t base = out->size();
  out->resize(base + static_cast<size_t>(n));
  float* const dst = out->data() + base;

  if (wire_input != nullptr) {
    const auto add_run = [&](const void* data, int device, bool pinned, std::shared_ptr<const void> owner) {
      wire->push_back(WireHiddenRows{0, *rows, data, WireToWeightDType(t.dtype()), device, pinned, std::move(owner)});
      return *rows;
    };
    if (slice.has_value()) {
      // GPU memory on the engine's device, and host memory mapped into its
      // address space, are read where they are, by the widening kernel (or
      // the fused sampler's first kernel, for 16-byte aligned rows in the
      // head's dtype), whose loads need elements at their natural alignment: a misaligned
      // address would fault the device (and stop its context for every
      // later request), so such a slice is read through the host instead.
      const MemoryRegion::DeviceAddress device = slice->region->DeviceAddressOf(slice->offset, slice->byte_size);
      if (device.data != nullptr && device.device == regions->in_place_device() &&
          reinterpret_cast<uintptr_t>(device.data) % static_cast<uintptr_t>(WireDTypeSize(t.dtype())) == 0) {
        return add_run(device.data, device.device, false, slice->region);
      }
    }
    // Host bytes go once, at the wire's width, into the engine's staging;
    // without staging, a message's bytes stay where they lie and a region's
    // are read into memory the batch owns.
    std::shared_ptr<void> bytes = Stage(wire_input, want_bytes);
    const bool pinned = bytes != nullptr;
    if (!slice.has_value() && !pinned) return add_run(t.data().data(), kHostMemory, false, nullptr);
    if (!pinned) bytes = std::shared_ptr<char>(new char[static_cast<size_t>(want_bytes)], std::default_delete<char[]>());
    void* const data = bytes.get();  // read before `bytes` moves into the run
    if (!slice.has_value()) {
      std::memcpy(data, t.data().data(), static_cast<size_t>(want_bytes));
    } else if (absl::Status s = slice->Read(data); !s.ok()) {
      return s;
    }
    return add_run(data, kHostMemory, pinned, std::move(bytes));
  }

  if (!slice.has_value()) {
    if (!WidenHidden(t.data().data(), t.dtype(), n, dst)) return FirstNonFinite(dst, n, cols, field);
  } else if (absl::Status s = ReadHiddenFromRegion(*slice, t.dtype(), *rows, cols, field, dst); !s.ok()) {
    return s;
  }
  if (absl::Status s = RoundToWeights(t.dtype(), weight_dtype, dst, n, cols, field); !s.ok()) return s;
  return *rows;
}

// The bytes SampleRequest.output_region receives for `rows` rows.
uint64_t OutputBytes(int64_t rows, bool logz, bool logprobs) {
  return static_cast<uint64_t>(rows) * (sizeof(int32_t) + (logz ? sizeof(float) : 0) +
                                        (logprobs ? sizeof(float) : 0));
}

// Empties `p` for the next parse; vectors keep their capacity.
}  // namespace

void ClearParsedSampleRequest(ParsedSampleRequest* p) {
  SampleBatch& b = p->batch;
  b.rows = 0;
  b.hidden.clear();
  b.wire_hidden.clear();
  b.params.clear();
  b.controls.clear();
  b.want_logz = false;
  b.want_logprobs = false;
  b.hidden_in_weight_dtype = false;
  b.draft_tokens.clear();
  b.device_outputs.clear();
  p->seeds.clear();
  p->request_id.clear();
  p->output.reset();
}

namespace {

bool TemperatureIsValid(float t) {
  return std::isfinite(t) && (t == 0.0f || t >= kMinTemperature);
}

}  // namespace

absl::Status CheckTemperature(float t, const std::string& field) {
  if (std::isnan(t) || std::isinf(t) || t < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".temperature must be finite and >= 0 (0 = greedy), got ", t));
  }
  // Backends multiply logits by the fp32 reciprocal 1/T; below kMinTemperature
  // it would overflow (or scale any logit to +-inf). Use 0 for greedy instead.
  if (t > 0.0f && t < kMinTemperature) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".temperature ", t, " is below the smallest supported ",
        kMinTemperature, "; use 0 for greedy sampling"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DecodeHiddenTensor(const v1::Tensor& t, const std::string& field,
                                           int64_t hidden_size, int64_t max_rows,
                                           WeightDType weight_dtype, HiddenStates* out) {
  return DecodeHidden(t, field, hidden_size, max_rows, weight_dtype, nullptr, nullptr, out, nullptr, nullptr);
}

absl::StatusOr<ParsedSampleRequest> ParseSampleRequest(const v1::SampleRequest& request,
                                                       const ModelShape& shape,
                                                       const RequestLimits& limits,
                                                       const std::function<uint64_t()>& draw_seed,
                                                       const MemoryRegions* regions, const WireInput* wire) {
  ParsedSampleRequest parsed;
  if (absl::Status s = ParseSampleRequestInto(request, shape, limits, draw_seed, regions, wire, &parsed);
      !s.ok()) {
    return s;
  }
  return parsed;
}

absl::Status ParseSampleRequestInto(const v1::SampleRequest& request, const ModelShape& shape,
                                    const RequestLimits& limits,
                                    const std::function<uint64_t()>& draw_seed,
                                    const MemoryRegions* regions, const WireInput* wire,
                                    ParsedSampleRequest* out, bool widen_in_batcher) {
  if (!request.has_hidden_states()) {
    return absl::InvalidArgumentError("hidden_states is missing");
  }
  const bool uses_regions = request.has_hidden_states_region() || request.has_output_region();
  if (uses_regions && regions == nullptr) {
    return absl::FailedPreconditionError("this server does not serve memory regions");
  }
  ParsedSampleRequest& parsed = *out;
  ClearParsedSampleRequest(&parsed);
  SampleBatch& batch = parsed.batch;
  absl::StatusOr<int64_t> decoded =
      DecodeHidden(request.hidden_states(), "hidden_states", shape.hidden_size, limits.max_request_rows,
                   shape.weight_dtype,
                   request.has_hidden_states_region() ? &request.hidden_states_region() : nullptr, regions,
                   &batch.hidden, wire, &batch.wire_hidden, widen_in_batcher);
  if (!decoded.ok()) return decoded.status();
  const int64_t rows = *decoded;
  if (request.has_output_region()) {
    const v1::RegionSlice& ref = request.output_region();
    const uint64_t need = OutputBytes(rows, request.return_logz(), request.return_logprobs());
    // The name first: an unknown region is NOT_FOUND whatever its size says.
    absl::StatusOr<RegionSlice> slice =
        regions->Resolve(ref.region(), ref.offset(), ref.byte_size(), "output_region");
    if (!slice.ok()) return slice.status();
    if (ref.byte_size() < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output_region.byte_size is ", ref.byte_size(), ", but ", rows, " rows of results (token ids",
          request.return_logz() ? ", logz" : "", request.return_logprobs() ? ", logprobs" : "",
          ") need ", need));
    }
    parsed.output = *std::move(slice);
  }
  const int num_params = request.params_size();
  if (num_params != 1 && num_params != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "params must have 1 entry (shared by all rows) or B = ", rows, " entries, got ", num_params));
  }
  bool any_controls = false;
  for (int i = 0; i < num_params; ++i) {
    const float t = request.params(i).temperature();
    if (!TemperatureIsValid(t)) return CheckTemperature(t, absl::StrCat("params[", i, "]"));
    any_controls = any_controls || HasControls(request.params(i));
  }
  // Only requests with controls pay for the per-entry controls.
  std::vector<RowControls> entry_controls(any_controls ? num_params : 0);
  for (int i = 0; any_controls && i < num_params; ++i) {
    if (!HasControls(request.params(i))) continue;
    // Rows sharing an entry are spaced `rows` streams apart per extra sample.
    const uint32_t stride = num_params == 1 ? static_cast<uint32_t>(rows) : 1u;
    absl::StatusOr<RowControls> c = ParseRowControls(request.params(i), absl::StrCat("params[", i, "]"), shape, stride);
    if (!c.ok()) return c.status();
    entry_controls[i] = *std::move(c);
  }
  int64_t expanded = 0;
  for (int i = 0; any_controls && i < num_params; ++i) {
    expanded += ControlElements(entry_controls[i]) * (num_params == 1 ? rows : 1);
  }
  if (expanded > kMaxExpandedControlElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the sampling controls hold ", expanded, " token ids / bitmask words once the shared params "
        "entry is applied to every row, over the limit of ", kMaxExpandedControlElements,
        "; send one params entry per row"));
  }

  batch.rows = rows;
  batch.want_logz = request.return_logz();
  batch.want_logprobs = request.return_logprobs();
  parsed.request_id = request.request_id();
  batch.hidden_in_weight_dtype = true;  // DecodeHiddenTensor rounded it
  absl::InlinedVector<uint64_t, 1> entry_seeds(static_cast<size_t>(num_params));
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
  // Results for a CUDA IPC buffer on the engine's GPU: the engine writes
  // them there from the GPU (for a plain batch; the controlled paths
  // assemble theirs on the host, which writes them).
  if (parsed.output.has_value() && !any_controls && wire != nullptr) {
    const MemoryRegion::DeviceAddress device =
        parsed.output->region->DeviceWritableAddressOf(parsed.output->offset);
    // The device writes int32 and fp32 words: 4-byte alignment, else the host writes them.
    if (device.data != nullptr && device.device == regions->in_place_device() &&
        reinterpret_cast<uintptr_t>(device.data) % sizeof(int32_t) == 0) {
      // The region is the client's writable buffer; DeviceAddress is const
      // because readers share it.
      char* base = static_cast<char*>(const_cast<void*>(device.data));
      DeviceOutputRows out;
      out.rows = rows;
      out.token_ids = reinterpret_cast<int32_t*>(base);
      const int64_t words = rows * static_cast<int64_t>(sizeof(int32_t));
      if (batch.want_logz) out.logz = reinterpret_cast<float*>(base + words);
      if (batch.want_logprobs) out.logprobs = reinterpret_cast<float*>(base + words * (batch.want_logz ? 2 : 1));
      out.device = device.device;
      out.owner = parsed.output->region;
      batch.device_outputs.push_back(std::move(out));
    }
  }
  return absl::OkStatus();
}

absl::Status FillSampleResponse(const ParsedSampleRequest& parsed, const SampleResult& result,
                                v1::SampleResponse* response) {
  response->Clear();
  if (!parsed.batch.device_outputs.empty()) {
    // The engine wrote them into the region before the result came back.
  } else if (parsed.output.has_value()) {
    // token_ids, logz, logprobs: packed, in that order (sampler.proto).
    std::vector<char> packed;
    packed.reserve(result.token_ids.size() * sizeof(int32_t) +
                   (result.logz.size() + result.logprobs.size()) * sizeof(float));
    auto append = [&packed](const auto& values) {  // an empty vector may hold no pointer at all
      const char* bytes = reinterpret_cast<const char*>(values.data());
      packed.insert(packed.end(), bytes, bytes + values.size() * sizeof(values[0]));
    };
    append(result.token_ids);
    append(result.logz);
    append(result.logprobs);
    if (absl::Status s = parsed.output->Write(packed.data(), packed.size()); !s.ok()) return s;
  } else {
    response->mutable_token_ids()->Add(result.token_ids.begin(), result.token_ids.end());
    response->mutable_logz()->Add(result.logz.begin(), result.logz.end());
    response->mutable_logprobs()->Add(result.logprobs.begin(), result.logprobs.end());
  }
  response->mutable_seeds()->Add(parsed.seeds.begin(), parsed.seeds.end());
  response->set_request_id(parsed.request_id);
  const std::vector<RowControls>& controls = parsed.batch.controls;
  const bool want_rows = std::any_of(controls.begin(), controls.end(), [](const RowControls& c) {
    return c.top_logprobs > 0 || c.num_samples > 1;
  });
  if (!want_rows || result.details.size() != controls.size()) return absl::OkStatus();
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
  return absl::OkStatus();
}

}  // namespace flashsampler
