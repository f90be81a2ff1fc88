#include "tests/gpu/sample_counts.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tests/common/goodness_of_fit.h"

namespace flashsampler::kernels::gpu_test {

std::vector<int64_t> SampleCounts(const DeviceWeights& dw, const HostWeights& w, int64_t rows,
                                  int64_t calls, float temperature, uint64_t seed,
                                  Stage1Kernel stage1) {
  std::vector<int64_t> counts(static_cast<size_t>(w.vocab), 0);
  DeviceBuffer<float> d_hidden(rows * w.hidden);
  DeviceBuffer<RowParams> d_params(rows);
  DeviceBuffer<int32_t> d_tokens(rows);
  const size_t ws_bytes = FusedSampleWorkspaceBytes(rows, w.vocab, w.hidden);
  DeviceBuffer<uint8_t> d_workspace(ws_bytes);
  if (d_hidden.data() == nullptr || d_params.data() == nullptr || d_tokens.data() == nullptr ||
      d_workspace.data() == nullptr) {
    return counts;  // reported by DeviceBuffer
  }
  // H = e_0: every logit is W's column 0 exactly, in either stage-1 path.
  std::vector<float> hidden(static_cast<size_t>(rows * w.hidden), 0.0f);
  for (int64_t r = 0; r < rows; ++r) hidden[r * w.hidden] = 1.0f;
  d_hidden.Upload(hidden);
  std::vector<RowParams> params(static_cast<size_t>(rows));

  FusedSampleArgs args;
  args.weight = dw.ptr;
  args.weight_dtype = w.dtype;
  args.hidden = d_hidden.data();
  args.params = d_params.data();
  args.batch = rows;
  args.vocab = w.vocab;
  args.valid_vocab = w.vocab;
  args.hidden_dim = w.hidden;
  args.token_ids = d_tokens.data();
  args.workspace = d_workspace.data();
  args.workspace_bytes = ws_bytes;
  args.stage1 = stage1;
  int64_t out_of_range = 0;
  for (int64_t call = 0; call < calls; ++call) {
    for (int64_t r = 0; r < rows; ++r) {
      params[r] = RowParams{temperature, seed, static_cast<uint64_t>(call),
                            static_cast<uint32_t>(r)};
    }
    d_params.Upload(params);
    EXPECT_EQ(cudaMemset(d_tokens.data(), 0xff, d_tokens.bytes()), cudaSuccess);
    const KernelStatus status = LaunchFusedSample(args, nullptr);
    EXPECT_EQ(status, KernelStatus::kOk);
    if (status != KernelStatus::kOk) break;
    const std::vector<int32_t> tokens = d_tokens.Download(rows);  // synchronizes
    for (int32_t t : tokens) {
      if (t >= 0 && t < w.vocab) {
        ++counts[t];
      } else {
        ++out_of_range;
      }
    }
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out_of_range, 0) << "tokens outside [0, vocab) (or unwritten)";
  return counts;
}

void ExpectMatchesSoftmax(const std::vector<int64_t>& counts, const HostWeights& w,
                          float temperature) {
  const float scale = LogitScale(RowParams{temperature, 0, 0, 0});
  flashsampler::testing::ExpectCountsMatch(
      counts, flashsampler::testing::SoftmaxOfScaled(w.values, w.vocab, scale), kRequiredShift);
}

HostWeights TensorCoreChiSquareWeights(CudaWeightDType dtype, HostWeights* logits) {
  constexpr int64_t kVocab = 200, kHidden = 16;
  const HostWeights w = MakeWeights(dtype, kVocab, kHidden, [](int64_t v, int64_t d) {
    if (d != 0) return 0.25f;  // multiplied by H's zeros
    if (v == 127 || v == 128 || v == 199) return 0.5f;
    return -0.125f * static_cast<float>(v % 50);
  });
  *logits = w;
  logits->hidden = 1;
  logits->values.assign(static_cast<size_t>(kVocab), 0.0f);
  for (int64_t v = 0; v < kVocab; ++v) logits->values[v] = w.values[v * kHidden];
  return w;
}

}  // namespace flashsampler::kernels::gpu_test
