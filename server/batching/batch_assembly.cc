#include "server/batching/batch_assembly.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/common/half_precision.h"

namespace flashsampler {

std::vector<RowSlice> PlanLaunch(const std::vector<PendingRequest>& queue, int64_t max_rows,
                                 DraftMixing mixing) {
  std::vector<RowSlice> slices;
  if (queue.empty()) return slices;
  const auto kind = [&mixing](const SampleBatch& b) {
    const bool controlled = !b.controls.empty();
    const bool split_drafts = !(controlled ? mixing.controlled : mixing.plain);
    return std::make_pair(controlled, split_drafts && !b.draft_tokens.empty());
  };
  const auto launch_kind = kind(*queue.front().batch);
  int64_t capacity = max_rows;
  for (const PendingRequest& p : queue) {
    if (capacity <= 0 || kind(*p.batch) != launch_kind) break;
    const int64_t take = std::min(capacity, p.batch->rows - p.next_row);
    slices.push_back(RowSlice{p.batch, p.next_row, take});
    capacity -= take;
  }
  return slices;
}

namespace {

// Appends `rows` rows of `dtype` values at `data` to `hidden`, widened to fp32.
void AppendWidened(const void* data, WeightDType dtype, int64_t rows, int64_t hidden_size,
                   HiddenStates* hidden) {
  const size_t n = static_cast<size_t>(rows * hidden_size);
  const size_t base = hidden->size();
  hidden->resize(base + n);
  float* const dst = hidden->data() + base;
  if (dtype == WeightDType::kFloat32) {
    std::memcpy(dst, data, n * sizeof(float));
    return;
  }
  // One loop per dtype, no branch inside: the compiler vectorizes it (this
  // is the payload's only pass on the CPU backend's launch path).
  const auto widen = [&](auto to_float) {
    const auto* src = static_cast<const char*>(data);
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * i, sizeof bits);
      dst[i] = to_float(bits);
    }
  };
  if (dtype == WeightDType::kBFloat16) {
    widen([](uint16_t b) { return Bf16ToFloat(b); });
  } else {
    widen([](uint16_t b) { return Fp16ToFloat(b); });
  }
}

}  // namespace

SampleBatch ConcatenateSlices(const std::vector<RowSlice>& slices, int64_t hidden_size,
                              bool widen_wire_rows) {
  SampleBatch launch;
  bool any_controls = false;
  bool any_drafts = false;
  launch.hidden_in_weight_dtype = true;
  // One request's rows: an engine's error then names the request's row.
  if (slices.size() == 1) launch.request_row_offset = slices[0].first_row;
  for (const RowSlice& s : slices) {
    launch.rows += s.rows;
    any_controls = any_controls || !s.batch->controls.empty();
    any_drafts = any_drafts || !s.batch->draft_tokens.empty();
    launch.hidden_in_weight_dtype = launch.hidden_in_weight_dtype && s.batch->hidden_in_weight_dtype;
  }
  // Rows of a request without drafts are plain rows: draft -1.
  if (any_drafts) launch.draft_tokens.reserve(static_cast<size_t>(launch.rows));
  // Rows of a request without controls are plain rows: default RowControls.
  if (any_controls) launch.controls.reserve(static_cast<size_t>(launch.rows));
  launch.hidden.reserve(static_cast<size_t>(launch.rows * hidden_size));
  launch.params.reserve(static_cast<size_t>(launch.rows));
  for (const RowSlice& s : slices) {
    const SampleBatch& b = *s.batch;
    const int64_t at = static_cast<int64_t>(launch.params.size());  // the slice's first launch row
    // Results written on the device: the request's one run (as the parser
    // makes it), narrowed to the slice's rows.
    for (const DeviceOutputRows& d : b.device_outputs) {
      const int64_t skip = s.first_row - d.first_row;
      DeviceOutputRows part = d;
      part.first_row = at;
      part.rows = s.rows;
      part.token_ids = d.token_ids + skip;
      part.logz = d.logz != nullptr ? d.logz + skip : nullptr;
      part.logprobs = d.logprobs != nullptr ? d.logprobs + skip : nullptr;
      launch.device_outputs.push_back(std::move(part));
    }
    if (b.wire_hidden.empty()) {
      launch.hidden.insert(launch.hidden.end(), b.hidden.begin() + s.first_row * hidden_size,
                           b.hidden.begin() + (s.first_row + s.rows) * hidden_size);
    } else if (widen_wire_rows) {
      const WireHiddenRows& d = b.wire_hidden.front();
      const int64_t row_bytes = hidden_size * WeightDTypeSize(d.dtype);
      AppendWidened(static_cast<const char*>(d.data) + (s.first_row - d.first_row) * row_bytes, d.dtype,
                    s.rows, hidden_size, &launch.hidden);
    } else {
      // The request's rows are wire rows (one run covering them all, as the
      // parser makes them): the launch refers to them, and its fp32 rows for
      // them stay unwritten (no copy of values never read).
      const WireHiddenRows& d = b.wire_hidden.front();
      const int64_t row_bytes = hidden_size * WeightDTypeSize(d.dtype);
      WireHiddenRows part = d;
      part.first_row = at;
      part.rows = s.rows;
      part.data = static_cast<const char*>(d.data) + (s.first_row - d.first_row) * row_bytes;
      launch.wire_hidden.push_back(std::move(part));
      launch.hidden.resize(launch.hidden.size() + static_cast<size_t>(s.rows * hidden_size));
    }
    launch.params.insert(launch.params.end(), b.params.begin() + s.first_row,
                         b.params.begin() + s.first_row + s.rows);
    if (any_controls && b.controls.empty()) {
      launch.controls.resize(launch.controls.size() + static_cast<size_t>(s.rows));
    } else if (any_controls) {
      launch.controls.insert(launch.controls.end(), b.controls.begin() + s.first_row,
                             b.controls.begin() + s.first_row + s.rows);
    }
    if (any_drafts && b.draft_tokens.empty()) {
      launch.draft_tokens.insert(launch.draft_tokens.end(), static_cast<size_t>(s.rows), -1);
    } else if (any_drafts) {
      launch.draft_tokens.insert(launch.draft_tokens.end(), b.draft_tokens.begin() + s.first_row,
                                 b.draft_tokens.begin() + s.first_row + s.rows);
    }
    launch.want_logz = launch.want_logz || b.want_logz;
    launch.want_logprobs = launch.want_logprobs || b.want_logprobs;
  }
  return launch;
}

SampleResult ResultFor(const SampleBatch& request) {
  SampleResult r;
  r.token_ids.resize(static_cast<size_t>(request.rows));
  if (request.want_logz) r.logz.resize(static_cast<size_t>(request.rows));
  if (request.want_logprobs) r.logprobs.resize(static_cast<size_t>(request.rows));
  if (!request.controls.empty()) r.details.resize(static_cast<size_t>(request.rows));
  if (!request.draft_tokens.empty()) r.draft_logprobs.resize(static_cast<size_t>(request.rows));
  return r;
}

void ScatterSlice(const SampleResult& launch, int64_t launch_row, const RowSlice& slice,
                  SampleResult* out) {
  const auto copy_rows = [&](const auto& from, auto& to) {
    std::copy(from.begin() + launch_row, from.begin() + launch_row + slice.rows,
              to.begin() + slice.first_row);
  };
  copy_rows(launch.token_ids, out->token_ids);
  if (slice.batch->want_logz) copy_rows(launch.logz, out->logz);
  if (slice.batch->want_logprobs) copy_rows(launch.logprobs, out->logprobs);
  if (!slice.batch->controls.empty()) copy_rows(launch.details, out->details);
  if (!slice.batch->draft_tokens.empty()) copy_rows(launch.draft_logprobs, out->draft_logprobs);
}

}  // namespace flashsampler
