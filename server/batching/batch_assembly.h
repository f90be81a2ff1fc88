// Batch assembly: the one place where the rows of several requests become one
// engine launch, and where the launch's result is handed back row by row.
//
// PlanLaunch decides which queued rows form the next launch; a launch is a
// list of RowSlices: consecutive rows [first_row, first_row +
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

#include "server/engine/engine.h"

namespace flashsampler {

struct RowSlice {
  const SampleBatch* batch = nullptr;  // the request the rows come from
  int64_t first_row = 0;               // 0 <= first_row, first_row + rows <= batch->rows
  int64_t rows = 0;                    // >= 1
};

// Whether a launch may hold requests with draft rows (Verify) together with
// requests without: per launch kind, as the engine's serves_draft_rows says.
// Where it may not, drafted and undrafted requests are kept apart like
// controlled and plain ones, so a backend's refusal of draft rows fails only
// the requests that carry them.
struct DraftMixing {
  bool plain = true;       // launches whose rows have no sampling controls
  bool controlled = true;  // launches whose rows have sampling controls
};

// One queued request as the planner sees it: `next_row` of its rows have been
// handed to earlier launches (0 <= next_row < batch->rows).
struct PendingRequest {
  const SampleBatch* batch = nullptr;
  int64_t next_row = 0;
};

// The next launch: slices taken in arrival order from the front of `queue`,
// slices[i] from queue[i], together at most `max_rows` rows. Requests with
// sampling controls and plain ones never share a launch: a backend that cannot
// serve a control (UNIMPLEMENTED), or a controlled row the engine
// rejects, must fail only the requests that asked for controls, and plain rows
// keep their fast path; so the launch ends at the first request of the other
// kind than queue[0] (kinds also split by drafts where `mixing` says so). A request that does not fit is cut: its first rows go
// into this launch, the rest waits for the next (the launch is then full).
// Every slice has >= 1 row; the plan is empty only when `queue` is empty or
// max_rows < 1. Planning launches until the queue is drained covers every
// queued row exactly once, in order.
std::vector<RowSlice> PlanLaunch(const std::vector<PendingRequest>& queue, int64_t max_rows,
                                 DraftMixing mixing = {});

// One SampleBatch holding every slice's rows, in slice order. `hidden_size` is
// the model's D (each request's hidden has rows * D values). A request whose
// hidden states are wire rows has one WireHiddenRows covering all its rows
// (host memory the caller keeps alive, when `widen_wire_rows`); its slice
// becomes a WireHiddenRows of the launch (no copy), or, with
// `widen_wire_rows` (an engine that takes fp32), rows of the launch's fp32
// hidden states, widened from the wire dtype (exact: such rows are in the
// weights' dtype, server/api/request_parser.h). A launch of one slice has
// request_row_offset = its first_row, so an engine's error names the row in
// the request; a launch of several has 0.
SampleBatch ConcatenateSlices(const std::vector<RowSlice>& slices, int64_t hidden_size,
                              bool widen_wire_rows = false);

// A result for the whole of `request`, sized for its rows and for the outputs
// it asked for, to be filled by ScatterSlice.
SampleResult ResultFor(const SampleBatch& request);

// Copies the launch result's rows [launch_row, launch_row + slice.rows) into
// `out` (a ResultFor(*slice.batch)) at slice.first_row, keeping only the
// outputs the slice's request asked for.
void ScatterSlice(const SampleResult& launch, int64_t launch_row, const RowSlice& slice,
                  SampleResult* out);

}  // namespace flashsampler
