// Request validation: turns an untrusted SampleRequest into a SampleBatch the
// engine can run, or an InvalidArgument status saying exactly what is wrong.
//
// Every field is checked once, here: dtype, shape [B, D] against the model's D,
// 1 <= B <= max_batch_rows, the byte length against the shape, NaN/Inf in the
// hidden states, the params count (1 or B), each temperature (0, or finite and
// >= kMinTemperature), and the sampling controls of each entry
// (server/api/row_controls_parser.h; FAILED_PRECONDITION for an entry that allows
// no token). batch.controls stays empty unless some entry sets a control.
// Rows that share one params entry get noise streams 0..B-1; rows with their
// own entry get stream 0. Absent seeds are drawn from `draw_seed` (one per
// params entry) and reported per row.
//
// With `wire` (the engine takes hidden states as they arrived:
// Engine::reads_wire_hidden), the hidden states are not widened here: the
// batch's wire_hidden holds the bytes copied into the engine's staging
// (pinned memory; a region's read straight into it), or, without staging,
// points at them where they lie in `request` (which must then outlive the
// batch) or at a region's bytes read once; GPU memory on
// MemoryRegions::in_place_device stays where it is. The engine checks the
// values (NaN/Inf, the weights' fp16 or bf16 range) on the device.
//
// A request may name memory regions (server/regions/memory_regions.h) instead of
// carrying its hidden states (hidden_states_region: read here, once) or
// receiving its results (output_region: resolved and bounds-checked here,
// written by FillSampleResponse). Unknown regions are NOT_FOUND, slices that
// do not fit INVALID_ARGUMENT. With `wire`, a request without sampling
// controls whose output slice is GPU memory on
// MemoryRegions::in_place_device has its results written by the engine
// itself, from the GPU (batch.device_outputs).
//
// Thread safety: ParseSampleRequest is reentrant as long as `draw_seed` is.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "flashsampler/v1/sampler.pb.h"
#include "server/engine/engine.h"
#include "server/regions/memory_regions.h"

namespace flashsampler {

// Smallest non-zero temperature: 1/T stays far from fp32 overflow, so logits
// up to ~1e32 in magnitude still scale to finite values.
inline constexpr float kMinTemperature = 1e-6f;

struct RequestLimits {
  int64_t max_request_rows = 4096;  // rows of one request (--max_request_rows)
};

struct ParsedSampleRequest {
  SampleBatch batch;
  std::vector<uint64_t> seeds;  // [rows], the seed each row used
  std::string request_id;       // echoed in the response
  // Set when the request named output_region: where the results go. When
  // batch.device_outputs is not empty, the engine writes them there itself
  // and the response need not.
  std::optional<RegionSlice> output;
};

absl::StatusOr<ParsedSampleRequest> ParseSampleRequest(const v1::SampleRequest& request,
                                                       const ModelShape& shape,
                                                       const RequestLimits& limits,
                                                       const std::function<uint64_t()>& draw_seed,
                                                       const MemoryRegions* regions = nullptr,
                                                       const WireInput* wire = nullptr);
// The same, into `out`, whose previous contents are replaced but whose
// buffers are kept: a stream parses every message into one
// ParsedSampleRequest, so a message of the same size allocates nothing. On
// an error `out` holds a partial parse (only fit to be parsed into again).
//
// `widen_in_batcher` (without `wire`: an engine that takes fp32): hidden
// states sent in the message in the LM head's own 16-bit dtype (bf16 for a
// bf16 head, fp16 for fp16) are checked (NaN/Inf, the same errors) but not
// widened: batch.wire_hidden gets one host run pointing into `request`
// (which must outlive the batch) and batch.hidden stays empty. Such a batch
// is for the DynamicBatcher only, whose ConcatenateSlices widens the rows
// into the launch (exact: no rounding is needed).
absl::Status ParseSampleRequestInto(const v1::SampleRequest& request, const ModelShape& shape,
                                    const RequestLimits& limits,
                                    const std::function<uint64_t()>& draw_seed,
                                    const MemoryRegions* regions, const WireInput* wire,
                                    ParsedSampleRequest* out, bool widen_in_batcher = false);

// Empties `parsed` but keeps its buffers' capacity (as ParseSampleRequestInto
// does first), and so drops whatever it holds of others: region slices (a
// region stays open while a request holds one of its slices), pinned staging,
// uploads. A stream or local connection, which parses every message into one
// ParsedSampleRequest, has it cleared once a message's answer is built, so
// these go then and not with its next message.
void ClearParsedSampleRequest(ParsedSampleRequest* parsed);

// The response for a parsed request and its engine result; with
// parsed.output, token ids, logz and logprobs are written to that slice
// instead (an error when the region cannot be written; nothing to write when
// the engine wrote them, batch.device_outputs).
absl::Status FillSampleResponse(const ParsedSampleRequest& parsed, const SampleResult& result,
                                v1::SampleResponse* response);

// Bytes per element of a wire dtype; 0 for DTYPE_UNSPECIFIED or unknown values.
int64_t WireDTypeSize(int dtype);

// The checks shared by every request that carries hidden states (Sample and
// Verify). `field` names the tensor / params entry in error messages.
//
// Validates a [B, D] hidden-state tensor (dtype, 2 dims, D = hidden_size,
// 1 <= B <= max_rows, byte count) and appends its values widened to fp32 and
// rounded to `weight_dtype` (RoundHiddenToWeightDType; the caller may set
// SampleBatch::hidden_in_weight_dtype) to `out`; NaN/Inf are InvalidArgument.
// Returns B.
absl::StatusOr<int64_t> DecodeHiddenTensor(const v1::Tensor& tensor, const std::string& field,
                                           int64_t hidden_size, int64_t max_rows,
                                           WeightDType weight_dtype, HiddenStates* out);
// 0, or finite and >= kMinTemperature; else InvalidArgument.
absl::Status CheckTemperature(float temperature, const std::string& field);

}  // namespace flashsampler
