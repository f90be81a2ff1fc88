// Fuzz drivers for request validation (server/api/request_parser.h): untrusted
// SampleRequests go through ParseSampleRequest exactly as the service calls
// it, and every outcome is checked against the parser's contract. Shared by the
// libFuzzer targets (fuzz/*_fuzz.cc) and the replay tests
// (tests/fuzz/request_fuzz_driver_test.cc), so a crash input found by the
// fuzzer replays through the same code in the normal test suite.
//
// Outcomes: returns normally for every input the parser handles correctly
// (accepted, or rejected with InvalidArgument; NotFound for a request that
// names a memory region, since the driver's registry is empty, and such a
// request is never accepted); aborts (FUZZ_CHECK) when the
// parser returns another code or an accepted batch breaks the contract
// (row count, fp32 data size, finiteness, params and seeds per row,
// temperatures). Memory errors are left to ASan/UBSan.
//
// Thread safety: the drivers share no state; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "flashsampler/v1/sampler.pb.h"

namespace flashsampler::fuzz {

// The model shape and limits the drivers validate against: a small D so that
// random inputs reach the data checks, and a row limit that keeps every
// accepted request cheap.
inline constexpr int64_t kFuzzHiddenSize = 8;
inline constexpr int64_t kFuzzVocabSize = 32;
inline constexpr int64_t kFuzzMaxBatchRows = 64;

// Arbitrary bytes, parsed as a SampleRequest (wire format) and validated, and
// parsed as a VerifyRequest and validated (ParseVerifyRequest's contract:
// rows = sum of gamma + 1 within the limit, draft ids in range, controls
// within the expanded limit; FillVerifyResponse's chain lengths).
void CheckRequestBytes(const uint8_t* data, size_t size);

// The bytes as a list of edits (dtype, shape, data length and contents,
// params, flags) applied to a valid request, which is then validated. Reaches
// the parser's checks far more often than random wire bytes do.
void CheckRequestEdits(const uint8_t* data, size_t size);

// A valid request for the fuzz model: `rows` rows of `dtype` data, one shared
// params entry. The start of CheckRequestEdits and the source of seed inputs.
v1::SampleRequest ValidFuzzRequest(int64_t rows, v1::DType dtype, uint64_t seed);

// A valid Verify request for the fuzz model: one sequence per entry of
// `gammas` (that many draft tokens, gamma + 1 bf16 rows). A seed input.
v1::VerifyRequest ValidFuzzVerifyRequest(std::initializer_list<int32_t> gammas, uint64_t seed);

}  // namespace flashsampler::fuzz
