// The chi-square helpers of the GPU exactness tests
// (fused_sample_exactness_test.cc, fused_sample_sm90_test.cc): draw many
// samples from the fused sampler with H = e_0, so the logits are exactly W's
// column 0 whatever the stage 1's summation order, and compare the counts with
// the float64 softmax of the fp32 transformed logits
// (tests/common/goodness_of_fit.h). Statistics, the required shift and why:
// the top of fused_sample_exactness_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/fused_sample.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels::gpu_test {

// z of a 2% relative error in the probability of a token with p >= 0.05.
constexpr double kRequiredShift = 7.0;

// Counts of `rows * calls` samples: call c launches `rows` rows with
// RowParams{temperature, seed, offset = c, stream = row} on the stage-1 kernel
// `stage1` (FusedSampleArgs::stage1).
std::vector<int64_t> SampleCounts(const DeviceWeights& dw, const HostWeights& w, int64_t rows,
                                  int64_t calls, float temperature, uint64_t seed,
                                  Stage1Kernel stage1 = Stage1Kernel::kAuto);

// float64 softmax of the fp32 transformed logits w[v] * LogitScale(T) (w has
// hidden 1: one logit per token), checked with ExpectCountsMatch.
void ExpectMatchesSoftmax(const std::vector<int64_t>& counts, const HostWeights& w,
                          float temperature);

// The tensor-core stage 1's chi-square problem (hidden_dim 16, V = 200: two
// tiles, the second partial): logits -(v % 50) / 8 plus three heavy tokens on
// the tile edges (127, 128) and at the end (199), exact in bf16 and fp16, in
// W's column 0. `logits` gets that column as a hidden-1 head for
// ExpectMatchesSoftmax.
HostWeights TensorCoreChiSquareWeights(CudaWeightDType dtype, HostWeights* logits);

}  // namespace flashsampler::kernels::gpu_test
