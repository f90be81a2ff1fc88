// CudaControlledRunner: flatten, upload, launch, download, scatter into
// SampleResult (cuda_controlled_runner.h).
#include "server/engine/cuda_controlled_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/logits_gemm.h"
#include "server/engine/cuda_call_status.h"

namespace flashsampler {
namespace {

using kernels::KernelStatus;

absl::Status CudaError(const char* what, cudaError_t err) {
  return CudaCallStatus(absl::StrCat("cuda controlled sampler: ", what), err);
}

#define FS_RETURN_IF_CUDA_ERROR(expr)                          \
  do {                                                         \
    const cudaError_t fs_err = (expr);                         \
    if (fs_err != cudaSuccess) return CudaError(#expr, fs_err); \
  } while (0)

}  // namespace

CudaSamplerPath PlanCudaSamplerPath(const SampleBatch& batch, int64_t fused_max_rows) {
  if (std::any_of(batch.controls.begin(), batch.controls.end(),
                  [](const RowControls& c) { return HasAnyControl(c); })) {
    return CudaSamplerPath::kControlled;
  }
  return batch.rows <= fused_max_rows ? CudaSamplerPath::kFused : CudaSamplerPath::kMaterialized;
}

CudaControlledRunner::~CudaControlledRunner() {
  cudaFree(subset_hidden_);
  cudaFree(subset_params_);
  for (Buffer* b : {&tokens_, &logz_, &logprobs_, &status_, &sample_tokens_, &sample_logprobs_,
                    &sample_ranks_, &top_ids_, &top_logprobs_, &top_counts_, &draft_logprobs_,
                    &controls_}) {
    cudaFree(b->device);
    cudaFreeHost(b->host);
  }
}

absl::Status CudaControlledRunner::Init(int64_t max_rows, int64_t fused_max_rows, bool split_rows) {
  max_rows_ = max_rows;
  fused_max_rows_ = fused_max_rows;
  split_rows_ = split_rows;
  const size_t rows = static_cast<size_t>(max_rows);
  const size_t samples = rows * kMaxNumSamples;
  const size_t top = rows * kMaxTopLogprobs;
  const std::initializer_list<std::pair<Buffer*, size_t>> sizes = {
      {&tokens_, rows * 4},       {&logz_, rows * 4},          {&logprobs_, rows * 4},
      {&status_, rows * 4},       {&sample_tokens_, samples * 4}, {&sample_logprobs_, samples * 4},
      {&sample_ranks_, samples * 4}, {&top_ids_, top * 4},     {&top_logprobs_, top * 4},
      {&top_counts_, rows * 4},   {&draft_logprobs_, rows * 4}};
  for (const auto& [buffer, bytes] : sizes) {
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&buffer->device, bytes));
    FS_RETURN_IF_CUDA_ERROR(cudaMallocHost(&buffer->host, bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaControlledRunner::EnsureControlsCapacity(size_t bytes) {
  if (bytes <= controls_capacity_) return absl::OkStatus();
  // Grow geometrically; the previous upload has completed (Run synchronizes).
  const size_t capacity = std::max(bytes, 2 * controls_capacity_);
  cudaFree(controls_.device);
  cudaFreeHost(controls_.host);
  controls_ = Buffer{};
  controls_capacity_ = 0;
  FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&controls_.device, capacity));
  FS_RETURN_IF_CUDA_ERROR(cudaMallocHost(&controls_.host, capacity));
  controls_capacity_ = capacity;
  return absl::OkStatus();
}

absl::StatusOr<CudaControlledRunner::LaunchBuffers> CudaControlledRunner::Prepare(
    const SampleBatch& batch, const ModelShape& shape, const int32_t* draft_tokens,
    cudaStream_t stream) {
  const int64_t rows = batch.rows;
  if ((!batch.controls.empty() && static_cast<int64_t>(batch.controls.size()) != rows) ||
      rows < 1 || rows > max_rows_) {
    return absl::InvalidArgumentError("cuda engine: controls must be one per row");
  }
  const bool drafts = !batch.draft_tokens.empty();
  if (drafts != (draft_tokens != nullptr)) {
    return absl::InvalidArgumentError("cuda engine: draft tokens must be uploaded with the batch");
  }
  const std::vector<RowControls> neutral(batch.controls.empty() ? static_cast<size_t>(rows) : 0);
  const RowControls* controls = batch.controls.empty() ? neutral.data() : batch.controls.data();
  if (const KernelStatus s = kernels::FlattenControls(controls, rows, shape.vocab_size,
                                                      shape.valid_vocab, &flat_);
      s != KernelStatus::kOk) {
    return KernelStatusToStatus(s, "cuda controlled sampler (controls)");
  }
  if (absl::Status s = EnsureControlsCapacity(flat_.PackedBytes()); !s.ok()) return s;
  flat_.PackTo(controls_.host);
  FS_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(controls_.device, controls_.host, flat_.PackedBytes(),
                                          cudaMemcpyHostToDevice, stream));
  LaunchBuffers b;
  b.controls = flat_.DeviceView(controls_.device);
  b.controls.draft_tokens = draft_tokens;
  kernels::ControlledSampleOutputs& o = b.outputs;
  o.token_ids = static_cast<int32_t*>(tokens_.device);
  o.logz = batch.want_logz ? static_cast<float*>(logz_.device) : nullptr;
  o.logprobs = batch.want_logprobs ? static_cast<float*>(logprobs_.device) : nullptr;
  o.row_status = static_cast<int32_t*>(status_.device);
  o.sample_tokens = static_cast<int32_t*>(sample_tokens_.device);
  o.sample_logprobs = static_cast<float*>(sample_logprobs_.device);
  o.sample_ranks = static_cast<int32_t*>(sample_ranks_.device);
  o.top_ids = static_cast<int32_t*>(top_ids_.device);
  o.top_logprobs = static_cast<float*>(top_logprobs_.device);
  o.top_counts = static_cast<int32_t*>(top_counts_.device);
  o.draft_logprobs = drafts ? static_cast<float*>(draft_logprobs_.device) : nullptr;
  return b;
}

bool CudaControlledRunner::fused_serves_every_row() const {
  return std::none_of(flat_.rows.begin(), flat_.rows.end(), [](const kernels::ControlledRowDesc& d) {
    return kernels::FusedRowKindOf(d) == kernels::kFusedUnservedRow;
  });
}

absl::StatusOr<SampleResult> CudaControlledRunner::Run(
    const SampleBatch& batch, const ModelShape& shape, const void* weight,
    kernels::CudaWeightDType dtype, const float* hidden, const RowParams* params,
    const int32_t* draft_tokens, void* workspace, size_t workspace_bytes, cublasHandle_t cublas,
    cudaStream_t stream) {
  if (static_cast<int64_t>(batch.controls.size()) != batch.rows) {
    return absl::InvalidArgumentError("cuda engine: controls must be one per row");
  }
  absl::StatusOr<LaunchBuffers> buffers = Prepare(batch, shape, draft_tokens, stream);
  if (!buffers.ok()) return buffers.status();
  kernels::ControlledSampleArgs args;
  args.weight = weight;
  args.weight_dtype = dtype;
  args.hidden = hidden;
  args.params = params;
  args.batch = batch.rows;
  args.vocab = shape.vocab_size;
  args.valid_vocab = shape.valid_vocab;
  args.hidden_dim = shape.hidden_size;
  args.controls = buffers->controls;
  args.outputs = buffers->outputs;
  args.workspace = workspace;
  args.workspace_bytes = workspace_bytes;
  // Under split_rows (--batch_invariant) the materialized path's logits come
  // from the fused kernels' own GEMM on any device (the engine refuses the
  // flag for heads it does not serve), so rows on that path keep their bits
  // in every batch too; by default they do where that GEMM is the fast one
  // (kAuto: Hopper), cuBLAS's elsewhere.
  args.logits_gemm = split_rows_ ? kernels::LogitsGemmPath::kBatchInvariant : kernels::LogitsGemmPath::kAuto;

  // Draft rows take the materialized path (the fused one does not verify).
  const bool fused_applies =
      draft_tokens == nullptr && batch.rows <= fused_max_rows_ &&
      kernels::FusedControlledShapeSupported(dtype, shape.valid_vocab, shape.hidden_size) &&
      (split_rows_ ? std::any_of(flat_.rows.begin(), flat_.rows.end(),
                                 [](const kernels::ControlledRowDesc& d) {
                                   return kernels::FusedRowKindOf(d) != kernels::kFusedUnservedRow;
                                 })
                   : fused_serves_every_row());
  // The whole batch on the materialized path.
  const auto materialized = [&](LaunchPath path) -> absl::StatusOr<SampleResult> {
    if (const KernelStatus s = kernels::LaunchControlledSample(args, cublas, stream); s != KernelStatus::kOk) {
      return KernelStatusToStatus(s, "cuda controlled sampler launch");
    }
    absl::StatusOr<SampleResult> result = Finish(batch, stream);
    if (result.ok()) result->path = path;
    return result;
  };
  if (!fused_applies) return materialized(LaunchPath::kControlled);
  // The fused path over the whole batch: the rows it serves are final; the
  // rows it cannot serve, and those it hands back, come back with row_status
  // 2 and run on the materialized path next: alone under split_rows (so the
  // fused rows' bits do not depend on them), else with the whole batch.
  if (const KernelStatus s = kernels::LaunchFusedControlledSample(args, stream); s != KernelStatus::kOk) {
    return KernelStatusToStatus(s, "cuda fused controlled sampler launch");
  }
  std::vector<int64_t> rest;
  absl::StatusOr<SampleResult> result = Finish(batch, stream, &rest);
  if (!result.ok()) return result;
  if (rest.empty()) {
    result->path = LaunchPath::kFusedControlled;
    return result;
  }
  if (!split_rows_) return materialized(LaunchPath::kFusedControlledFallback);
  absl::Status s = RunMaterializedRows(batch, shape, rest, args, cublas, stream, &*result);
  if (!s.ok()) return s;
  result->path = LaunchPath::kFusedControlledFallback;
  return result;
}

absl::Status CudaControlledRunner::RunMaterializedRows(const SampleBatch& batch,
                                                       const ModelShape& shape,
                                                       const std::vector<int64_t>& rows,
                                                       const kernels::ControlledSampleArgs& whole,
                                                       cublasHandle_t cublas, cudaStream_t stream,
                                                       SampleResult* result) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const size_t row_bytes = static_cast<size_t>(whole.hidden_dim) * sizeof(float);
  const size_t hidden_bytes = static_cast<size_t>(max_rows_) * row_bytes;
  if (subset_hidden_bytes_ < hidden_bytes) {
    cudaFree(subset_hidden_);
    subset_hidden_ = nullptr;
    subset_hidden_bytes_ = 0;
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&subset_hidden_, hidden_bytes));
    subset_hidden_bytes_ = hidden_bytes;
  }
  if (subset_params_ == nullptr) {
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&subset_params_, static_cast<size_t>(max_rows_) * sizeof(RowParams)));
  }
  // The rows' hidden states and params, gathered on the device in one
  // batched copy (the engine's buffers hold them rounded and checked).
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> bytes;
  dst.reserve(2 * n);
  src.reserve(2 * n);
  bytes.reserve(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    dst.push_back(static_cast<char*>(subset_hidden_) + i * row_bytes);
    src.push_back(reinterpret_cast<const char*>(whole.hidden) + rows[i] * row_bytes);
    bytes.push_back(row_bytes);
    dst.push_back(static_cast<RowParams*>(subset_params_) + i);
    src.push_back(whole.params + rows[i]);
    bytes.push_back(sizeof(RowParams));
  }
  cudaMemcpyAttributes in_stream_order{};
  in_stream_order.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attribute_index = 0;
  FS_RETURN_IF_CUDA_ERROR(cudaMemcpyBatchAsync(dst.data(), src.data(), bytes.data(), dst.size(),
                                               &in_stream_order, &attribute_index, 1, stream));
  SampleBatch subset;
  subset.rows = n;
  subset.want_logz = batch.want_logz;
  subset.want_logprobs = batch.want_logprobs;
  subset.controls.reserve(static_cast<size_t>(n));
  for (int64_t r : rows) subset.controls.push_back(batch.controls[r]);
  absl::StatusOr<LaunchBuffers> buffers = Prepare(subset, shape, nullptr, stream);
  if (!buffers.ok()) return buffers.status();
  kernels::ControlledSampleArgs args = whole;
  args.hidden = static_cast<const float*>(subset_hidden_);
  args.params = static_cast<const RowParams*>(subset_params_);
  args.batch = n;
  args.controls = buffers->controls;
  args.outputs = buffers->outputs;
  if (const KernelStatus k = kernels::LaunchControlledSample(args, cublas, stream); k != KernelStatus::kOk) {
    return KernelStatusToStatus(k, "cuda controlled sampler launch");
  }
  absl::StatusOr<SampleResult> part = Finish(subset, stream);
  if (!part.ok()) return part.status();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    result->token_ids[r] = part->token_ids[i];
    if (batch.want_logz) result->logz[r] = part->logz[i];
    if (batch.want_logprobs) result->logprobs[r] = part->logprobs[i];
    result->details[r] = std::move(part->details[i]);
  }
  return absl::OkStatus();
}

absl::Status CudaControlledRunner::EnqueueDownloads(const SampleBatch& batch, cudaStream_t stream) {
  const int64_t rows = batch.rows;
  const bool any_top = std::any_of(batch.controls.begin(), batch.controls.end(),
                                   [](const RowControls& c) { return c.top_logprobs > 0; });
  const size_t samples = static_cast<size_t>(flat_.total_samples);
  auto download = [&](const Buffer& b, size_t bytes) {
    return cudaMemcpyAsync(b.host, b.device, bytes, cudaMemcpyDeviceToHost, stream);
  };
  FS_RETURN_IF_CUDA_ERROR(download(tokens_, rows * 4));
  FS_RETURN_IF_CUDA_ERROR(download(status_, rows * 4));
  FS_RETURN_IF_CUDA_ERROR(download(sample_tokens_, samples * 4));
  if (batch.want_logz) FS_RETURN_IF_CUDA_ERROR(download(logz_, rows * 4));
  if (batch.want_logprobs) FS_RETURN_IF_CUDA_ERROR(download(logprobs_, rows * 4));
  if (!batch.draft_tokens.empty()) FS_RETURN_IF_CUDA_ERROR(download(draft_logprobs_, rows * 4));
  if (any_top) {
    FS_RETURN_IF_CUDA_ERROR(download(sample_logprobs_, samples * 4));
    FS_RETURN_IF_CUDA_ERROR(download(sample_ranks_, samples * 4));
    FS_RETURN_IF_CUDA_ERROR(download(top_ids_, rows * kMaxTopLogprobs * 4));
    FS_RETURN_IF_CUDA_ERROR(download(top_logprobs_, rows * kMaxTopLogprobs * 4));
    FS_RETURN_IF_CUDA_ERROR(download(top_counts_, rows * 4));
  }
  return absl::OkStatus();
}

absl::StatusOr<SampleResult> CudaControlledRunner::Finish(const SampleBatch& batch,
                                                          cudaStream_t stream,
                                                          std::vector<int64_t>* not_served) {
  if (absl::Status s = EnqueueDownloads(batch, stream); !s.ok()) return s;
  FS_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return not_served != nullptr ? CollectRows(batch, not_served) : Collect(batch);
}

absl::StatusOr<SampleResult> CudaControlledRunner::Collect(const SampleBatch& batch) {
  const int64_t rows = batch.rows;
  fused_row_not_served_ = false;
  const auto* status = static_cast<const int32_t*>(status_.host);
  if (std::any_of(status, status + rows,
                  [](int32_t s) { return s == kernels::kFusedRowNotServed; })) {
    fused_row_not_served_ = true;  // only the fused path writes it: the caller re-runs
    return SampleResult{};
  }
  return CollectRows(batch, nullptr);
}

absl::StatusOr<SampleResult> CudaControlledRunner::CollectRows(const SampleBatch& batch,
                                                               std::vector<int64_t>* not_served) {
  const int64_t rows = batch.rows;
  const auto* status = static_cast<const int32_t*>(status_.host);
  for (int64_t r = 0; r < rows; ++r) {
    if (status[r] == 0) continue;
    if (status[r] == kernels::kFusedRowNotServed && not_served != nullptr) {
      not_served->push_back(r);
      continue;
    }
    return KernelStatusToStatus(KernelStatus::kFailedPrecondition, "cuda controlled sampler");
  }
  const kernels::FlatControls& flat = flat_;
  SampleResult result;
  const auto* tokens = static_cast<const int32_t*>(tokens_.host);
  result.token_ids.assign(tokens, tokens + rows);
  if (batch.want_logz) {
    const auto* v = static_cast<const float*>(logz_.host);
    result.logz.assign(v, v + rows);
  }
  if (batch.want_logprobs) {
    const auto* v = static_cast<const float*>(logprobs_.host);
    result.logprobs.assign(v, v + rows);
  }
  if (!batch.draft_tokens.empty()) {
    const auto* v = static_cast<const float*>(draft_logprobs_.host);
    result.draft_logprobs.assign(v, v + rows);
  }
  const auto* sample_tokens = static_cast<const int32_t*>(sample_tokens_.host);
  const auto* sample_logprobs = static_cast<const float*>(sample_logprobs_.host);
  const auto* sample_ranks = static_cast<const int32_t*>(sample_ranks_.host);
  const auto* top_ids = static_cast<const int32_t*>(top_ids_.host);
  const auto* top_logprobs = static_cast<const float*>(top_logprobs_.host);
  const auto* top_counts = static_cast<const int32_t*>(top_counts_.host);
  result.details.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (status[r] != 0) continue;  // a row the caller re-runs (not_served)
    const kernels::ControlledRowDesc& d = flat.rows[r];
    RowSampleDetail& detail = result.details[r];
    detail.token_ids.assign(sample_tokens + d.sample_begin,
                            sample_tokens + d.sample_begin + d.num_samples);
    if (d.top_logprobs <= 0) continue;
    detail.logprobs.assign(sample_logprobs + d.sample_begin,
                           sample_logprobs + d.sample_begin + d.num_samples);
    detail.ranks.assign(sample_ranks + d.sample_begin, sample_ranks + d.sample_begin + d.num_samples);
    for (int32_t i = 0; i < top_counts[r]; ++i) {
      detail.top.push_back(TokenLogprob{top_ids[r * kMaxTopLogprobs + i],
                                        top_logprobs[r * kMaxTopLogprobs + i]});
    }
  }
  return result;
}

}  // namespace flashsampler
