#include "server/engine/engine.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/half_precision.h"

#if FLASHSAMPLER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace flashsampler {

#if FLASHSAMPLER_HAVE_CUDA
// cuda_engine.cc
absl::StatusOr<std::unique_ptr<Engine>> MakeCudaEngine(const LmHead& head, int64_t valid_vocab,
                                                       int64_t max_batch_rows,
                                                       const CudaEngineOptions& options);
int VisibleCudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}
#else
bool CudaBackendAvailable() { return false; }
int VisibleCudaDeviceCount() { return 0; }
#endif

#if FLASHSAMPLER_HAVE_NCCL
// sharded_cuda_engine.cc
absl::StatusOr<std::unique_ptr<Engine>> MakeShardedCudaEngine(const LmHead& head,
                                                              int64_t valid_vocab,
                                                              int64_t max_batch_rows,
                                                              const CudaEngineOptions& options);
bool CudaShardingAvailable() { return true; }
#else
bool CudaShardingAvailable() { return false; }
#endif

namespace {

#if FLASHSAMPLER_HAVE_CUDA
// The CUDA engine for options.devices: the single-GPU engine for none or one
// device, the sharded engine for more.
absl::StatusOr<std::unique_ptr<Engine>> MakeCudaBackend(const LmHead& head,
                                                        const EngineOptions& options) {
  const std::vector<int>& devices = options.cuda.devices;
  if (devices.size() > 1 && options.cuda.batch_invariant) {
    // The sharded engine runs a batch that mixes rows the fused controlled
    // path serves with rows it cannot whole on the materialized path, with
    // cuBLAS logits: it would not keep the promise.
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_invariant is not supported across several GPUs (--devices lists ",
        devices.size(), "); give one device, e.g. --devices=", devices[0]));
  }
  if (devices.size() <= 1) {
    CudaEngineOptions single = options.cuda;
    if (devices.size() == 1) single.device = devices[0];
    return MakeCudaEngine(head, options.valid_vocab, options.max_batch_rows, single);
  }
#if FLASHSAMPLER_HAVE_NCCL
  return MakeShardedCudaEngine(head, options.valid_vocab, options.max_batch_rows, options.cuda);
#else
  return absl::UnavailableError(absl::StrCat(
      "sharding over ", devices.size(),
      " GPUs needs a build with NCCL (CMake found none: FLASHSAMPLER_NCCL); "
      "give one device, e.g. --devices=", devices[0]));
#endif
}
#endif

}  // namespace

absl::Status CheckBatchLayout(const SampleBatch& batch, int64_t hidden_size, int64_t max_rows,
                              const char* engine, int wire_hidden_device) {
  const auto per_row = [&batch](size_t n) { return static_cast<int64_t>(n) == batch.rows; };
  if (batch.rows <= 0 || batch.rows > max_rows || !per_row(batch.params.size()) ||
      static_cast<int64_t>(batch.hidden.size()) != batch.rows * hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(engine, ": batch of ", batch.rows,
                                                   " rows is inconsistent or over ", max_rows));
  }
  if (!batch.controls.empty() && !per_row(batch.controls.size())) {
    return absl::InvalidArgumentError(absl::StrCat(engine, ": controls must be empty or one per row"));
  }
  if (!batch.draft_tokens.empty() && !per_row(batch.draft_tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(engine, ": draft_tokens must be empty or one per row"));
  }
  // Runs of rows (wire_hidden, device_outputs) must be sorted, disjoint, non-empty
  // and inside the batch: each takes its rows after the previous run's.
  int64_t next_free_row = 0;
  const auto take_rows = [&](int64_t first, int64_t rows) {
    if (rows < 1 || first < next_free_row || first + rows > batch.rows) return false;
    next_free_row = first + rows;
    return true;
  };
  for (const WireHiddenRows& d : batch.wire_hidden) {
    if (wire_hidden_device == kNoWireHidden) {
      return absl::InvalidArgumentError(
          absl::StrCat(engine, " does not take hidden states in their wire dtype"));
    }
    if (d.device != kHostMemory && d.device != wire_hidden_device) {
      return absl::InvalidArgumentError(absl::StrCat(engine, " reads hidden states on GPU ",
                                                     wire_hidden_device, ", not on GPU ", d.device));
    }
    if (d.data == nullptr || !take_rows(d.first_row, d.rows)) {
      return absl::InvalidArgumentError(
          absl::StrCat(engine, ": wire_hidden rows must be sorted, disjoint and inside the batch"));
    }
  }
  if (!batch.device_outputs.empty() && !batch.controls.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(engine, ": results on the device serve batches without controls"));
  }
  next_free_row = 0;
  for (const DeviceOutputRows& d : batch.device_outputs) {
    // Only an engine that reads wire rows on a GPU writes results there.
    if (d.device < 0 || d.device != wire_hidden_device) {
      return absl::InvalidArgumentError(
          absl::StrCat(engine, " does not write results into memory of device ", d.device));
    }
    if (d.token_ids == nullptr || !take_rows(d.first_row, d.rows)) {
      return absl::InvalidArgumentError(
          absl::StrCat(engine, ": device_outputs rows must be sorted, disjoint and inside the batch"));
    }
    // A launch may join a Verify request's draft rows with a Sample request
    // whose results go to the device; the latter's rows carry no draft
    // (draft_tokens, when present, has a value per row: checked above).
    for (int64_t r = d.first_row; !batch.draft_tokens.empty() && r < d.first_row + d.rows; ++r) {
      if (batch.draft_tokens[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(engine, ": results on the device serve rows without a draft (row ", r, ")"));
      }
    }
  }
  return absl::OkStatus();
}

const char* LaunchPathName(LaunchPath path) {
  switch (path) {
    case LaunchPath::kCpu: return "cpu";
    case LaunchPath::kFused: return "fused";
    case LaunchPath::kMaterialized: return "materialized";
    case LaunchPath::kFusedControlled: return "fused_controlled";
    case LaunchPath::kFusedControlledFallback: return "fused_controlled_fallback";
    case LaunchPath::kControlled: return "controlled";
    case LaunchPath::kSharded: return "sharded";
    case LaunchPath::kShardedControlled: return "sharded_controlled";
    case LaunchPath::kShardedFusedControlled: return "sharded_fused_controlled";
    case LaunchPath::kUnspecified: break;
  }
  return "unspecified";
}

SampleResult SampleResultFromHostOutputs(const SampleBatch& batch, const int32_t* tokens,
                                         const float* logz, const float* logprobs,
                                         const float* draft_logprobs) {
  const int64_t rows = batch.rows;
  SampleResult result;
  result.token_ids.assign(tokens, tokens + rows);
  if (batch.want_logz) result.logz.assign(logz, logz + rows);
  if (batch.want_logprobs) result.logprobs.assign(logprobs, logprobs + rows);
  if (!batch.draft_tokens.empty()) result.draft_logprobs.assign(draft_logprobs, draft_logprobs + rows);
  if (!batch.controls.empty()) {
    result.details.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) result.details[r].token_ids = {tokens[r]};
  }
  return result;
}

absl::Status RoundHiddenToWeightDType(WeightDType dtype, float* values, int64_t n, int64_t cols,
                                      absl::string_view field, int64_t first_row) {
  if (dtype == WeightDType::kFloat32) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    const float v = dtype == WeightDType::kBFloat16 ? Bf16ToFloat(FloatToBf16(values[i]))
                                                    : Fp16ToFloat(FloatToFp16(values[i]));
    // A finite input rounds to infinity past the dtype's largest finite value:
    // fp16 from 65520, bf16 from 0x1.ffp127 (half an ulp above 0x1.fep127;
    // the tie rounds up, to the even infinity).
    if (std::isinf(v)) {
      return HiddenOutOfRangeError(dtype, values[i],
                                   cols > 0 ? absl::StrCat(field, "[", first_row + i / cols, "][", i % cols, "]")
                                            : absl::StrCat("element ", i));
    }
    values[i] = v;
  }
  return absl::OkStatus();
}

absl::Status HiddenOutOfRangeError(WeightDType dtype, float value, absl::string_view where) {
  return absl::InvalidArgumentError(absl::StrCat(
      "hidden state value ", value, " (", where, ") is outside the ",
      dtype == WeightDType::kBFloat16 ? "bf16" : "fp16", " range of the LM head's weights"));
}

absl::Status KernelStatusToStatus(kernels::KernelStatus status, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", kernels::KernelStatusName(status));
  switch (status) {
    case kernels::KernelStatus::kOk: return absl::OkStatus();
    case kernels::KernelStatus::kInvalidArgument:
      return absl::InvalidArgumentError(
          absl::StrCat(message, " (the batch's logits are not finite, or a size is out of range)"));
    case kernels::KernelStatus::kOutOfMemory: return absl::ResourceExhaustedError(message);
    case kernels::KernelStatus::kFailedPrecondition:
      return absl::FailedPreconditionError(absl::StrCat(
          message, " (after masks, bans, bias and penalties a row has no token with a finite logit)"));
    case kernels::KernelStatus::kDeviceError:
    case kernels::KernelStatus::kInternal: break;
  }
  return absl::InternalError(message);
}

absl::StatusOr<ModelShape> ResolveModelShape(const LmHead& head, int64_t valid_vocab) {
  ModelShape shape;
  shape.vocab_size = head.vocab_size();
  shape.hidden_size = head.hidden_size();
  shape.weight_dtype = head.dtype();
  shape.valid_vocab = valid_vocab == 0 ? head.vocab_size() : valid_vocab;
  if (shape.valid_vocab < 1 || shape.valid_vocab > shape.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("valid_vocab ", valid_vocab, " is outside [1, ",
                                                   shape.vocab_size, "] for ", head.source()));
  }
  return shape;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const std::string& backend, LmHead head,
                                                   const EngineOptions& options) {
  if (backend == "cpu" || (backend == "auto" && !CudaBackendAvailable())) {
    return MakeCpuEngine(std::move(head), options.valid_vocab, options.cpu);
  }
  if (backend == "cuda" || backend == "auto") {
#if FLASHSAMPLER_HAVE_CUDA
    return MakeCudaBackend(head, options);
#else
    return absl::UnavailableError("this build of flashsampler-server has no CUDA backend");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", backend, "' (expected auto, cpu or cuda)"));
}

}  // namespace flashsampler
