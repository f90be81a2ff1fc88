// Fuzz driver for the sampling-params planner: the code that resolves each
// SamplingParams entry (temperature, seed, offset and every sampling control)
// into per-row RowParams / RowControls (server/api/request_parser.h,
// server/api/row_controls_parser.h), and the launch planning that groups the rows
// of queued requests into engine launches and hands the results back
// (server/batching/batch_assembly.h). Shared by the libFuzzer target
// (fuzz/sampling_params_fuzz.cc) and the replay test
// (tests/fuzz/sampling_params_fuzz_driver_test.cc).
//
// One input is a program (see the seed writer, fuzz/write_fuzz_seeds.cc): a
// model shape from a small table, then up to 4 requests, each with a row
// count, 1 or B params entries (or a wrong count), and per entry a list of
// field edits that set any control to boundary values, arbitrary bits or
// token ids just outside the vocabulary; then a launch size and the queue's
// behaviour (requests dropped between launches, as the batcher does on a
// deadline).
//
// Checks (FUZZ_CHECK aborts; memory errors are left to ASan/UBSan):
//  - resolution, against an independent oracle written from the documented
//    ranges: a request is accepted exactly when every entry is in range and
//    allows a token; a rejection is INVALID_ARGUMENT or FAILED_PRECONDITION as
//    one of its failing entries dictates, naming that entry; HasControls agrees
//    with protobuf reflection (every field but temperature, seed and offset);
//  - an accepted request resolves every row: its temperature, seed (given, or
//    drawn once per entry in entry order), offset, stream (r when shared, else
//    0) and controls (each field, sorted logit_bias, bitmask words, stream
//    stride) equal what the entry asked, and controls are empty exactly when
//    no entry sets one; the CPU path planner picks kFused exactly when every
//    row has 1 <= top_k <= kCpuFusedMaxTopK and no raw-mode top_logprobs;
//  - launch planning, until the queue drains: each launch is a non-empty
//    prefix of the queue in order, at most max_rows rows, never mixes
//    controlled and plain requests, is maximal (full, or ends at the queue's
//    end or the other kind), and only its last slice leaves rows behind; every
//    row of every request that is not dropped is launched exactly once;
//  - assembly: the launch batch holds each slice's hidden rows, params and
//    controls, flags OR-ed; scattering a fake result gives every request
//    exactly its own rows and only the outputs it asked for;
//  - the CPU engine on every launch: OK (FAILED_PRECONDITION only for a
//    controlled launch whose allowed logits all overflowed), tokens inside the
//    valid vocabulary, allowed by the row's bitmask and bans, num_samples
//    samples per row, top_logprobs lists no longer than asked, sorted, no
//    token twice.
//
// Thread safety: the engines are shared per process (static); call from one
// thread at a time (libFuzzer and the replay test do).
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashsampler::fuzz {

void CheckSamplingParams(const uint8_t* data, size_t size);

}  // namespace flashsampler::fuzz
