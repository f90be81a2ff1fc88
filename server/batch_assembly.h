// Batch assembly: the one place where the rows of several requests become one
// engine launch, and where the launch's result is handed back row by row.
//
// A launch is a list of RowSlices: consecutive rows [first_row, first_row +
// rows) of one request's SampleBatch. Slices of different requests are
// concatenated in list order; a request larger than a launch is cut into
// several slices over successive launches. Every per-row field of SampleBatch
// and SampleResult is copied here and nowhere else, so a new per-row field
// (e.g. a sampling control) needs an edit in batch_assembly.cc only.
// Requests without controls are padded with default (plain) RowControls in a
// launch that has controls, and requests without drafts with draft -1 in a
// launch that has draft rows; the scatter hands details and draft_logprobs
// back only to the requests that carry controls / drafts.
// Per-request flags (want_logz, want_logprobs) are OR-ed over the launch, and
// the scatter returns to each request only what it asked for.
//
// Exactness: a row's noise depends only on its own RowParams (the RNG
// contract), never on its position in the launch, so concatenation changes no
// token as long as the engine computes each row's logits independently of the
// other rows (see "Batch invariance" in server/README-dev.md).
//
// Thread safety: pure functions over their arguments; callers own the data.
// Outcomes: no errors; inputs that break the preconditions below are bugs.
#pragma once

#include <cstdint>
#include <vector>

#include "server/engine.h"

namespace flashsampler {

struct RowSlice {
  const SampleBatch* batch = nullptr;  // the request the rows come from
  int64_t first_row = 0;               // 0 <= first_row, first_row + rows <= batch->rows
  int64_t rows = 0;                    // >= 1
};

// One SampleBatch holding every slice's rows, in slice order. `hidden_size` is
// the model's D (each request's hidden has rows * D values).
SampleBatch ConcatenateSlices(const std::vector<RowSlice>& slices, int64_t hidden_size);

// A result for the whole of `request`, sized for its rows and for the outputs
// it asked for, to be filled by ScatterSlice.
SampleResult ResultFor(const SampleBatch& request);

// Copies the launch result's rows [launch_row, launch_row + slice.rows) into
// `out` (a ResultFor(*slice.batch)) at slice.first_row, keeping only the
// outputs the slice's request asked for.
void ScatterSlice(const SampleResult& launch, int64_t launch_row, const RowSlice& slice,
                  SampleResult* out);

}  // namespace flashsampler
