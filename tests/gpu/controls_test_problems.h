// Shared by the GPU tests of the two controlled paths (controlled_sample_test,
// fused_controlled_sample_test): random rows with random controls, the CPU
// backend's answer on the same logits, the device output buffers of a
// controlled launch and the comparison both suites apply.
//
// Problems are [vocab, 1] heads: logit(token v, row b) = w[v] * h[b], one fp32
// product, which every backend rounds identically (for the fused path w and h
// are bf16 values, whose product is exact in fp32).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/kernel_status.h"
#include "kernels/common/row_controls.h"
#include "kernels/common/row_params.h"
#include "kernels/cuda/controlled_sample.h"
#include "tests/gpu/gpu_test_util.h"

namespace flashsampler::kernels::controls_test {

struct Outputs {
  KernelStatus launch = KernelStatus::kOk;
  std::vector<int32_t> tokens;
  std::vector<float> logz;
  std::vector<float> logprobs;
  std::vector<int32_t> row_status;
  std::vector<RowSampleDetail> details;
  std::vector<float> draft_logprobs;  // [rows] when the run had draft tokens
};

struct RandomProblem {
  std::vector<float> w, h;
  std::vector<RowParams> params;
  std::vector<RowControls> controls;
};

// Random controls of every kind on every row (greedy rows included): top_k
// from 0 to 2000 (beyond any fused limit), top_p, min_p, penalties, bias,
// bans, bitmask, top_logprobs in both modes, 1-3 samples. `tie_step` > 0
// rounds the weights to multiples of it, so many tokens share a logit.
// fused_only: only rows the fused path serves (top_k 1..64 with anything but
// raw-mode top lists, or no filter, no top list and one sample), and w, h
// rounded to bf16.
RandomProblem MakeRandomProblem(int64_t vocab, int64_t rows, float tie_step, uint32_t seed,
                                bool fused_only = false);

// The CPU backend on the same problem (materialized path: it serves every row),
// with draft tokens (speculative verification, one per row, -1: none) when
// `drafts` is given.
Outputs RunCpu(const std::vector<float>& w, const std::vector<float>& h,
               const std::vector<RowParams>& params, const std::vector<RowControls>& controls,
               const std::vector<int32_t>* drafts = nullptr);

// Identical tokens on >= 99.9% of rows; on agreeing rows logz / logprobs (and
// draft log-probabilities, when both runs have them) to float64
// summation-order rounding, ranks and top lists exactly (ids) and to rounding
// (logprobs). Every GPU row must have row_status 0.
void ExpectAgrees(const Outputs& gpu, const Outputs& cpu, const RandomProblem& p);

// Device outputs of one controlled launch (poisoned with 0xff bytes), and
// their download assembled as the engine does (server/engine/cuda_controlled_runner.cc).
class DeviceOutputs {
 public:
  DeviceOutputs(int64_t rows, int64_t samples);
  ControlledSampleOutputs View();  // draft_logprobs set: a launch with drafts may write it
  // Fills tokens, logz, logprobs, row_status and details of `out`, and
  // draft_logprobs when `drafts`.
  void Download(const FlatControls& flat, int64_t rows, Outputs* out, bool drafts = false) const;

 private:
  gpu_test::DeviceBuffer<int32_t> tokens_, status_, sample_tokens_, ranks_, top_ids_, top_counts_;
  gpu_test::DeviceBuffer<float> logz_, logprobs_, sample_logprobs_, top_logprobs_, draft_logprobs_;
};

// x rounded to the nearest bf16 (ties to even), as a float; and its bits.
float RoundToBf16(float x);
uint16_t Bf16Bits(float x);

}  // namespace flashsampler::kernels::controls_test
