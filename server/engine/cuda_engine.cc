// The CUDA Engine: W resident on one GPU, one stream, pinned host staging.
//
// Per batch: the fp32 hidden states and RowParams are copied into pinned
// buffers and uploaded asynchronously, every host-to-device copy of the batch
// in one cudaMemcpyBatchAsync (wire rows, SampleBatch::wire_hidden, cross the
// bus in the caller's dtype, or not at all for a CUDA IPC buffer on this GPU,
// and are widened, rounded and checked on the device; when no row needs a
// copy, the RowParams ride with the first widening kernel instead; a decode
// step whose rows are one GPU run in W's 16-bit dtype skips the widening:
// the fused sampler's first kernel copies and checks them where they lie,
// kernels::HiddenInWeightDType, and the RowParams ride with it), one
// sampler launch runs (PlanCudaSamplerPath,
// cuda_controlled_runner.h: batches with sampling controls take the fused
// controlled path for the rows it serves and the materialized one for the
// rest; plain ones the fused kernel up to --cuda_fused_max_rows rows, by
// default every batch, so a row's bits do not depend on its batch; the
// cuBLAS-materialized path above), the results come back in pinned host
// memory that the sampler's last kernel writes itself (and a request's CUDA
// IPC output region gets them from the same kernel, kernels::OutputSpan), and
// the stream is synchronised: no copy follows a plain launch's kernels. Speculative-verification rows
// (SampleBatch::draft_tokens) ride in the same launch on the fused and
// materialized paths: their draft tokens are uploaded beside the params and
// the kernels exclude / score them (FusedSampleArgs::draft_tokens); with
// controls, the materialized controlled path does (after every control, as
// the CPU backend); under --batch_invariant a batch with drafts that mixes
// rows with and without controls also runs the fused kernel, whose results
// the rows without controls keep (what they get in a batch of their own).
// Every CUDA call is checked: a failure marks
// the engine unhealthy (health flips to NOT_SERVING) and the batch fails with
// Internal; a sticky device error is not retried.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/half_precision.h"
#include "kernels/cuda/controlled_sample.h"
#include "kernels/cuda/fused_controlled_sample.h"
#include "kernels/cuda/fused_sample.h"
#include "kernels/cuda/hidden_states.h"
#include "kernels/cuda/materialized_sample.h"
#include "server/engine/cuda_controlled_runner.h"
#include "server/engine/cuda_call_status.h"
#include "server/engine/cuda_device_upload.h"
#include "server/engine/engine.h"
#include "server/engine/pinned_host_staging.h"

namespace flashsampler {
namespace {

using kernels::CudaWeightDType;
using kernels::KernelStatus;

#define FS_RETURN_IF_CUDA_ERROR(expr)                          \
  do {                                                         \
    const cudaError_t fs_err = (expr);                         \
    if (fs_err != cudaSuccess) return CudaCallStatus(#expr, fs_err); \
  } while (0)

CudaWeightDType ToCudaDType(WeightDType d) {
  switch (d) {
    case WeightDType::kFloat32: return CudaWeightDType::kFloat32;
    case WeightDType::kFloat16: return CudaWeightDType::kFloat16;
    case WeightDType::kBFloat16: return CudaWeightDType::kBFloat16;
  }
  return CudaWeightDType::kBFloat16;
}

// What the host writes into a group's first-bad word before its widening:
// no element index (a batch has at most max_rows x hidden_size elements)
// and not kNoBadHiddenElement, so a report the launch failed to write is
// seen as such, not read as an element.
constexpr unsigned long long kFirstBadNotReported = kernels::kNoBadHiddenElement - 1;

// Pinned host memory the device reads and writes over the bus (mapped into
// its address space, for every device), and the device's address of it.
cudaError_t AllocateMappedHost(void** host, void** device, size_t bytes) {
  cudaError_t err = cudaHostAlloc(host, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(device, *host, 0);
  return err;
}

class CudaEngine final : public Engine {
 public:
  CudaEngine(const ModelShape& shape, const CudaEngineOptions& options, int64_t max_rows)
      : shape_(shape), options_(options), max_rows_(max_rows),
        staging_(MakePinnedHostStaging(options.device)) {}

  ~CudaEngine() override {
    cudaSetDevice(options_.device);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    for (void* p : {weight_, hidden_, wire_, params_, drafts_, first_bad_, blocks_done_,
                    error_bytes_, workspace_}) {
      cudaFree(p);
    }
    for (void* p : {host_hidden_, host_params_, host_tokens_, host_logz_, host_logprobs_,
                    host_drafts_, host_draft_logprobs_, host_first_bad_}) {
      cudaFreeHost(p);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Uploads W and allocates every buffer for batches of up to max_rows_ rows.
  absl::Status Init(const LmHead& head) {
    FS_RETURN_IF_CUDA_ERROR(cudaSetDevice(options_.device));
    FS_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return absl::InternalError("cublasCreate failed");
    }
    const CudaWeightDType dtype = ToCudaDType(shape_.weight_dtype);
    const size_t weight_bytes = static_cast<size_t>(shape_.vocab_size) * shape_.hidden_size *
                                kernels::CudaWeightDTypeBytes(dtype);
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&weight_, weight_bytes));
    // One copy from the mapping straight to the device; nothing is staged.
    FS_RETURN_IF_CUDA_ERROR(cudaMemcpy(weight_, head.data(), weight_bytes, cudaMemcpyHostToDevice));

    const size_t rows = static_cast<size_t>(max_rows_);
    const size_t hidden_bytes = rows * shape_.hidden_size * sizeof(float);
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&hidden_, hidden_bytes));
    // Host wire rows land here before widening, at their fp32 rows' offsets.
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&wire_, hidden_bytes));
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&params_, rows * sizeof(RowParams)));
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&drafts_, rows * sizeof(int32_t)));
    FS_RETURN_IF_CUDA_ERROR(cudaMallocHost(&host_hidden_, hidden_bytes));
    // Read by the device itself when they ride with the widening (StageHidden).
    FS_RETURN_IF_CUDA_ERROR(AllocateMappedHost(&host_params_, &device_host_params_, rows * sizeof(RowParams)));
    // The kernels write these themselves (mapped into the device's address
    // space), so no copy brings them back.
    FS_RETURN_IF_CUDA_ERROR(AllocateMappedHost(&host_tokens_, &device_tokens_, rows * sizeof(int32_t)));
    FS_RETURN_IF_CUDA_ERROR(AllocateMappedHost(&host_logz_, &device_logz_, rows * sizeof(float)));
    FS_RETURN_IF_CUDA_ERROR(AllocateMappedHost(&host_logprobs_, &device_logprobs_, rows * sizeof(float)));
    FS_RETURN_IF_CUDA_ERROR(cudaMallocHost(&host_drafts_, rows * sizeof(int32_t)));
    // Stage 1 stores a draft row's l'_x here and stage 2 reads it back and
    // writes the log-prob: one word a draft row each way over the bus.
    FS_RETURN_IF_CUDA_ERROR(
        AllocateMappedHost(&host_draft_logprobs_, &device_draft_logprobs_, rows * sizeof(float)));
    // One first-bad index per group of wire rows (a batch has at most one
    // per row), with its block counter: set once here, and left so by every
    // widening launch, which reports into host_first_bad_ itself
    // (kernels::LaunchWidenHiddenStatesToHost).
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&first_bad_, rows * sizeof(unsigned long long)));
    // On stream_, so every widening finds them set (a plain cudaMemset goes
    // on the legacy stream, which this non-blocking stream does not wait for).
    FS_RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(first_bad_, 0xff, rows * sizeof(unsigned long long), stream_));  // kNoBadHiddenElement
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&blocks_done_, rows * sizeof(unsigned int)));
    FS_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(blocks_done_, 0, rows * sizeof(unsigned int), stream_));
    FS_RETURN_IF_CUDA_ERROR(
        AllocateMappedHost(&host_first_bad_, &device_first_bad_host_, rows * sizeof(unsigned long long)));
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&error_bytes_, sizeof(unsigned long long)));
    if (options_.upload_min_bytes > 0) {
      absl::StatusOr<std::shared_ptr<DeviceUpload>> upload =
          MakeCudaDeviceUpload(options_.device, static_cast<size_t>(options_.upload_min_bytes));
      if (!upload.ok()) return upload.status();
      upload_ = *std::move(upload);
    }

    // Workspace for the largest batch either path may get.
    const int64_t fused_rows = std::min<int64_t>(max_rows_, options_.fused_max_rows);
    workspace_bytes_ = std::max(
        kernels::FusedSampleWorkspaceBytes(fused_rows, shape_.valid_vocab, shape_.hidden_size),
        kernels::MaterializedSampleWorkspaceBytes(max_rows_, shape_.valid_vocab,
                                                  shape_.hidden_size, dtype));
    workspace_bytes_ = std::max(workspace_bytes_,
                                kernels::ControlledSampleWorkspaceBytes(
                                    max_rows_, shape_.valid_vocab, shape_.hidden_size, dtype));
    const bool fused_controls =
        options_.fused_controls && fused_rows > 0 &&
        kernels::FusedControlledShapeSupported(dtype, shape_.valid_vocab, shape_.hidden_size);
    if (fused_controls) {
      workspace_bytes_ = std::max(workspace_bytes_,
                                  kernels::FusedControlledWorkspaceBytes(
                                      fused_rows, shape_.valid_vocab, shape_.hidden_size));
    }
    if (workspace_bytes_ == 0) return absl::InvalidArgumentError("model too large for the CUDA backend");
    FS_RETURN_IF_CUDA_ERROR(cudaMalloc(&workspace_, workspace_bytes_));
    return controlled_.Init(max_rows_, fused_controls ? fused_rows : 0, options_.batch_invariant);
  }

  absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) override {
    if (!healthy_) return absl::UnavailableError("the CUDA backend failed earlier and is not serving");
    if (absl::Status s = CheckBatchLayout(batch, shape_.hidden_size, max_rows_, "cuda engine",
                                          options_.device);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<SampleResult> result = Run(batch);
    if (!result.ok() && result.status().code() == absl::StatusCode::kInternal) healthy_ = false;
    return result;
  }

  const ModelShape& shape() const override { return shape_; }
  std::string backend_name() const override { return "cuda"; }
  bool healthy() const override { return healthy_; }
  // Draft rows ride every launch: the fused and materialized ones, and with
  // controls the materialized controlled one.
  bool serves_draft_rows(bool /*with_controls*/) const override { return true; }
  bool reads_wire_hidden(int device) const override {
    return device == kHostMemory || device == options_.device;
  }
  bool writes_device_outputs(int device) const override { return device == options_.device; }
  std::shared_ptr<HostStaging> host_staging() const override { return staging_; }
  std::shared_ptr<DeviceUpload> device_upload() const override { return upload_; }
  // cudaMemGetInfo on this engine's device; cudaSetDevice only changes the
  // calling thread's current device, so this is safe next to a running Sample.
  std::vector<DeviceMemoryInfo> DeviceMemory() const override {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(options_.device) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      return {};
    }
    return {DeviceMemoryInfo{options_.device, static_cast<int64_t>(total_bytes - free_bytes),
                             static_cast<int64_t>(total_bytes)}};
  }

 private:
  absl::StatusOr<SampleResult> Run(const SampleBatch& batch) {
    absl::StatusOr<SampleResult> result = RunOnStream(batch);
    // An error can return with copies and kernels still enqueued: they read
    // the pinned staging, the batch's own buffers (kept alive only until
    // Sample returns) and write the outputs the next launch reuses. Wait for
    // them, so nothing on the stream outlives the batch that enqueued it.
    // Its own error is the one already being returned, or a sticky one the
    // next launch reports.
    if (!result.ok() && stream_ != nullptr) cudaStreamSynchronize(stream_);
    return result;
  }

  absl::StatusOr<SampleResult> RunOnStream(const SampleBatch& batch) {
    FS_RETURN_IF_CUDA_ERROR(cudaSetDevice(options_.device));
    // Planned once: where the rows go depends on it (ReadsInPlace).
    const CudaSamplerPath path = PlanCudaSamplerPath(batch, options_.fused_max_rows);
    if (absl::Status s = StageHidden(batch, path); !s.ok()) return s;
    absl::StatusOr<SampleResult> result = RunSampler(batch, path);
    // A device error is the launch's outcome: what the failed stream left in
    // the first-bad indices is not evidence about the rows. Nor is an
    // unwritten report of rows read in place: the sampler checks those, and
    // a launch refused before its first kernel has not.
    if (!result.ok() &&
        (result.status().code() == absl::StatusCode::kInternal || in_place_.rows != nullptr)) {
      return result;
    }
    // A bad value in wire rows fails the batch whatever the sampler made of
    // it (its outputs are garbage then, never a crash).
    if (absl::Status s = CheckWireRows(batch.request_row_offset); !s.ok()) return s;
    return result;
  }

  // Puts the batch's hidden states, fp32 and rounded to W's dtype, in
  // hidden_ (enqueued on stream_): fp32 rows through pinned staging; wire
  // rows (SampleBatch::wire_hidden) widened on the device
  // (kernels/cuda/hidden_states.h), from their GPU memory in place or, for
  // host bytes, from wire_ after a copy at their own width.
  //
  // Per-launch cost, not per-request: a launch the batcher formed from many
  // small requests has one wire run per request. Host runs that follow each
  // other row for row in one dtype form one group (WireGroup): they land
  // back to back in wire_ and take one widening launch, one first-bad index
  // and one check; and every host-to-device copy of the batch (fp32 rows and
  // wire runs) goes out in one cudaMemcpyBatchAsync. Per request that was
  // four CUDA calls (copy, memset, widen, first-bad copy), ~0.4 ms of a
  // 25-request launch of a small head on an H100 host.
  //
  // Rows read in place (ReadsInPlace): no widening launch; in_place_ tells
  // RunPlain to hand them to the fused sampler, which checks them into the
  // first group's report and copies the parameters.
  absl::Status StageHidden(const SampleBatch& batch, CudaSamplerPath path) {
    const int64_t d = shape_.hidden_size;
    wire_groups_.clear();
    in_place_ = kernels::HiddenInWeightDType{};
    const bool in_place = ReadsInPlace(batch, path);
    // Copies a failed launch left behind (an argument error returns before
    // they are enqueued) must not reach this one.
    copy_dst_.clear();
    copy_src_.clear();
    copy_bytes_.clear();
    const auto stage_host_rows = [&](int64_t first, int64_t end) -> absl::Status {
      if (first >= end) return absl::OkStatus();
      const size_t offset = static_cast<size_t>(first * d);
      const size_t count = static_cast<size_t>((end - first) * d);
      float* staged = static_cast<float*>(host_hidden_) + offset;
      std::memcpy(staged, batch.hidden.data() + offset, count * sizeof(float));
      // Both launch paths then see the same (exactly representable) inputs.
      if (!batch.hidden_in_weight_dtype) {
        if (absl::Status s = RoundHiddenToWeightDType(shape_.weight_dtype, staged, static_cast<int64_t>(count), d,
                                                      "hidden_states", batch.request_row_offset + first);
            !s.ok()) {
          return s;
        }
      }
      AddCopy(static_cast<float*>(hidden_) + offset, staged, count * sizeof(float));
      return absl::OkStatus();
    };
    int64_t row = 0;
    for (const WireHiddenRows& run : batch.wire_hidden) {
      if (absl::Status s = stage_host_rows(row, run.first_row); !s.ok()) return s;
      row = run.first_row + run.rows;
      if (run.device != kHostMemory) {
        // A CUDA IPC buffer on this GPU, read in place; or rows a request
        // thread uploaded (DeviceUpload), read once their copy is done.
        if (run.ready != nullptr) {
          FS_RETURN_IF_CUDA_ERROR(
              cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(run.ready)), 0));
        }
        wire_groups_.push_back(WireGroup{run.first_row, run.rows, run.dtype, run.data, false});
        continue;
      }
      // A group starts at its first row's fp32 offset in wire_ and holds its
      // rows at their own width, so it ends at or before the next group's
      // start: groups never overlap, whatever their dtypes.
      const int64_t elem = WeightDTypeSize(run.dtype);
      if (wire_groups_.empty() || !wire_groups_.back().host || wire_groups_.back().dtype != run.dtype ||
          wire_groups_.back().first_row + wire_groups_.back().rows != run.first_row) {
        wire_groups_.push_back(WireGroup{run.first_row, 0, run.dtype,
                                         static_cast<char*>(wire_) + run.first_row * d * sizeof(float), true});
      }
      WireGroup& group = wire_groups_.back();
      const size_t within = static_cast<size_t>(group.rows * d * elem);
      const size_t bytes = static_cast<size_t>(run.rows * d * elem);
      group.rows += run.rows;
      // Across the bus at the wire's width (2 bytes per value for bf16), from
      // pinned memory: run.data as it is when pinned (host_staging(), a
      // registered region), else this thread copies the bytes into the same
      // place of the fp32 staging (free: these rows take no fp32 copy, and it
      // is at least as large) first; a pageable source would be staged by
      // the driver, at a fraction of the bus.
      const void* pinned = run.data;
      if (!run.pinned) {
        char* staged = static_cast<char*>(host_hidden_) + group.first_row * d * sizeof(float) + within;
        std::memcpy(staged, run.data, bytes);
        pinned = staged;
      }
      AddCopy(const_cast<char*>(static_cast<const char*>(group.source)) + within, pinned, bytes);
    }
    if (absl::Status s = stage_host_rows(row, batch.rows); !s.ok()) return s;
    // The rows' parameters (and draft tokens) ride in the same upload; or,
    // when there is nothing else to upload (every row already on the GPU: a
    // CUDA IPC buffer, a mapped shared-memory region, a request thread's
    // upload), with the first widening kernel, which copies them from mapped
    // host memory: a decode step then starts with a kernel, not a copy.
    std::memcpy(host_params_, batch.params.data(), batch.rows * sizeof(RowParams));
    kernels::RideAlongCopy params_ride;
    if (copy_dst_.empty() && !wire_groups_.empty() && batch.draft_tokens.empty()) {
      params_ride = kernels::RideAlongCopy{device_host_params_, params_, batch.rows * sizeof(RowParams)};
    } else {
      AddCopy(params_, host_params_, batch.rows * sizeof(RowParams));
    }
    if (!batch.draft_tokens.empty()) {
      std::memcpy(host_drafts_, batch.draft_tokens.data(), batch.rows * sizeof(int32_t));
      AddCopy(drafts_, host_drafts_, batch.rows * sizeof(int32_t));
    }
    if (absl::Status s = EnqueueCopies(); !s.ok()) return s;
    for (size_t g = 0; g < wire_groups_.size(); ++g) {
      const WireGroup& group = wire_groups_[g];
      // Overwritten by the launch's report; still there after the stream has
      // passed the launch means the report was lost (CheckWireRows).
      static_cast<unsigned long long*>(host_first_bad_)[g] = kFirstBadNotReported;
      const kernels::FirstBadToHost report{static_cast<unsigned long long*>(first_bad_) + g,
                                           static_cast<unsigned int*>(blocks_done_) + g,
                                           static_cast<unsigned long long*>(device_first_bad_host_) + g};
      if (in_place) {  // one group (ReadsInPlace)
        in_place_ = kernels::HiddenInWeightDType{group.source, report, params_ride};
        break;
      }
      const KernelStatus status = kernels::LaunchWidenHiddenStatesToHost(
          group.source, ToCudaDType(group.dtype), group.rows * d, ToCudaDType(shape_.weight_dtype),
          static_cast<float*>(hidden_) + group.first_row * d, report, stream_,
          g == 0 ? params_ride : kernels::RideAlongCopy{});
      if (status != KernelStatus::kOk) return KernelStatusToStatus(status, "widening hidden states on the GPU");
    }
    return absl::OkStatus();
  }

  // Whether the batch's hidden states go to the fused sampler where they lie
  // (kernels::HiddenInWeightDType): one run of rows on this GPU holding the
  // whole batch, in W's 16-bit dtype and 16-byte aligned (a decode step from
  // a CUDA IPC buffer or an upload), on the plain fused path with a
  // tensor-core stage 1. A 16-bit value is its own rounding, so the rows'
  // results are those of the widened fp32 rows bit for bit; what goes is the
  // widening kernel and its fp32 copy of the rows.
  bool ReadsInPlace(const SampleBatch& batch, CudaSamplerPath path) const {
    if (batch.wire_hidden.size() != 1) return false;
    const WireHiddenRows& run = batch.wire_hidden.front();
    if (run.device == kHostMemory || run.first_row != 0 || run.rows != batch.rows ||
        run.dtype != shape_.weight_dtype || WeightDTypeSize(run.dtype) != 2 ||
        reinterpret_cast<uintptr_t>(run.data) % 16 != 0 || path != CudaSamplerPath::kFused) {
      return false;
    }
    kernels::FusedSampleArgs args = PlainArgs(batch.rows);
    args.hidden = nullptr;
    args.hidden_in_weight_dtype.rows = run.data;
    return kernels::FusedSampleReadsHiddenInWeightDType(args);
  }

  // The plain launches' shape and buffers for `rows` rows (RunPlain fills in
  // the rest).
  kernels::FusedSampleArgs PlainArgs(int64_t rows) const {
    kernels::FusedSampleArgs args;
    args.weight = weight_;
    args.weight_dtype = ToCudaDType(shape_.weight_dtype);
    args.hidden = static_cast<const float*>(hidden_);
    args.params = static_cast<const RowParams*>(params_);
    args.batch = rows;
    args.vocab = shape_.vocab_size;
    args.valid_vocab = shape_.valid_vocab;
    args.hidden_dim = shape_.hidden_size;
    args.workspace = workspace_;
    args.workspace_bytes = workspace_bytes_;
    return args;
  }

  void AddCopy(void* dst, const void* src, size_t bytes) {
    copy_dst_.push_back(dst);
    copy_src_.push_back(src);
    copy_bytes_.push_back(bytes);
  }

  // Enqueues the copies AddCopy collected on stream_ (in
  // either direction: every pointer is CUDA-known, so the runtime tells
  // them apart) with one API call, and clears the lists.
  absl::Status EnqueueCopies() {
    if (copy_dst_.size() == 1) {
      FS_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(copy_dst_[0], copy_src_[0], copy_bytes_[0], cudaMemcpyDefault, stream_));
    } else if (!copy_dst_.empty()) {
      // Stream order: every host side is pinned memory this launch owns
      // until the stream passes the copies (the staging and output buffers,
      // or a batch member's buffer kept alive by the batch).
      cudaMemcpyAttributes in_stream_order{};
      in_stream_order.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attribute_index = 0;
      FS_RETURN_IF_CUDA_ERROR(cudaMemcpyBatchAsync(copy_dst_.data(), copy_src_.data(), copy_bytes_.data(),
                                                   copy_dst_.size(), &in_stream_order, &attribute_index, 1,
                                                   stream_));
    }
    copy_dst_.clear();
    copy_src_.clear();
    copy_bytes_.clear();
    return absl::OkStatus();
  }

  // InvalidArgument naming the first bad element of the batch's wire rows
  // (its row counted from request_row_offset, SampleBatch), after the stream
  // has finished.
  absl::Status CheckWireRows(int64_t request_row_offset) {
    // Called only after StageHidden enqueued every group's widening (or
    // handed its one group to a sampler launch that ran); a report a launch
    // failed to write still holds kFirstBadNotReported.
    if (wire_groups_.empty()) return absl::OkStatus();
    FS_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
    const int64_t d = shape_.hidden_size;
    for (size_t g = 0; g < wire_groups_.size(); ++g) {
      const unsigned long long bad = static_cast<const unsigned long long*>(host_first_bad_)[g];
      if (bad == kernels::kNoBadHiddenElement) continue;
      if (bad == kFirstBadNotReported) {
        return absl::InternalError("a launch that checks hidden states did not report its first bad element");
      }
      const WireGroup& group = wire_groups_[g];
      // Read the element itself for the message (a few bytes, errors only)
      // by a device thread into device scratch, then to the host: the
      // source may be host memory mapped into the device's address space (a
      // shared-memory region), which the CPU never reads (cudaMemcpy from it
      // would: a shrunk object would fault the server). Not into first_bad_,
      // whose words the widening launches keep at kNoBadHiddenElement.
      const int64_t elem = WeightDTypeSize(group.dtype);
      uint32_t bits = 0;
      void* slot = error_bytes_;
      if (kernels::LaunchCopyDeviceBytes(static_cast<const char*>(group.source) + bad * elem,
                                         static_cast<int>(elem), slot, stream_) != KernelStatus::kOk) {
        return absl::InternalError("reading a bad hidden-state element on the GPU: launch failed");
      }
      FS_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(&bits, slot, elem, cudaMemcpyDeviceToHost, stream_));
      FS_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
      const float value = group.dtype == WeightDType::kFloat32    ? BitsToFloat(bits)
                          : group.dtype == WeightDType::kBFloat16 ? Bf16ToFloat(static_cast<uint16_t>(bits))
                                                                  : Fp16ToFloat(static_cast<uint16_t>(bits));
      const int64_t r = request_row_offset + group.first_row + static_cast<int64_t>(bad) / d;
      const int64_t c = static_cast<int64_t>(bad) % d;
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(absl::StrCat("hidden_states[", r, "][", c, "] is ",
                                                       std::isnan(value) ? "NaN" : "infinite",
                                                       "; hidden states must be finite"));
      }
      return HiddenOutOfRangeError(shape_.weight_dtype, value, absl::StrCat("hidden_states[", r, "][", c, "]"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<SampleResult> RunSampler(const SampleBatch& batch, CudaSamplerPath path) {
    const bool drafts = !batch.draft_tokens.empty();  // uploaded by StageHidden
    if (path != CudaSamplerPath::kControlled) return RunPlain(batch, path);
    const auto controlled = [&] {
      return controlled_.Run(batch, shape_, weight_, ToCudaDType(shape_.weight_dtype),
                             static_cast<const float*>(hidden_),
                             static_cast<const RowParams*>(params_),
                             drafts ? static_cast<const int32_t*>(drafts_) : nullptr, workspace_,
                             workspace_bytes_, cublas_, stream_);
    };
    const auto plain_row = [&](int64_t r) { return !HasAnyControl(batch.controls[r]); };
    bool any_plain = false;
    for (int64_t r = 0; r < batch.rows && !any_plain; ++r) any_plain = plain_row(r);
    if (!options_.batch_invariant || !drafts || !any_plain) return controlled();
    // --batch_invariant, draft rows with and without controls in one batch:
    // the controlled path verifies every draft on the materialized path,
    // while a draft row without controls in a batch of its own is verified
    // by the fused kernel. So the fused kernel runs over the whole batch
    // first (a second pass over W) and its results are what the rows without
    // controls get, as they would alone; the rows with controls get the
    // controlled path's.
    absl::StatusOr<SampleResult> fused = RunPlain(batch, CudaSamplerPath::kFused);
    if (!fused.ok()) return fused;
    absl::StatusOr<SampleResult> result = controlled();
    if (!result.ok()) return result;
    for (int64_t r = 0; r < batch.rows; ++r) {
      if (!plain_row(r)) continue;
      result->token_ids[r] = fused->token_ids[r];
      if (batch.want_logz) result->logz[r] = fused->logz[r];
      if (batch.want_logprobs) result->logprobs[r] = fused->logprobs[r];
      result->draft_logprobs[r] = fused->draft_logprobs[r];
      result->details[r] = std::move(fused->details[r]);
    }
    return result;
  }

  // The plain kernels (fused or materialized) over the whole batch; controls,
  // if any, are neutral or ignored.
  absl::StatusOr<SampleResult> RunPlain(const SampleBatch& batch, CudaSamplerPath path) {
    const int64_t rows = batch.rows;
    const bool drafts = !batch.draft_tokens.empty();
    kernels::FusedSampleArgs args = PlainArgs(rows);
    if (in_place_.rows != nullptr) {  // StageHidden left the rows where they lie
      args.hidden = nullptr;
      args.hidden_in_weight_dtype = in_place_;
    }
    args.token_ids = static_cast<int32_t*>(device_tokens_);
    args.logz = batch.want_logz ? static_cast<float*>(device_logz_) : nullptr;
    args.logprobs = batch.want_logprobs ? static_cast<float*>(device_logprobs_) : nullptr;
    args.draft_tokens = drafts ? static_cast<const int32_t*>(drafts_) : nullptr;
    args.draft_logprobs = drafts ? static_cast<float*>(device_draft_logprobs_) : nullptr;
    // Results that stay on the device (a CUDA IPC output region): stage 2
    // writes the first kMaxOutputSpans requests' there too; the rest are
    // copied from the host buffers afterwards.
    const size_t spans = std::min(batch.device_outputs.size(), static_cast<size_t>(kernels::kMaxOutputSpans));
    for (size_t i = 0; i < spans; ++i) {
      const DeviceOutputRows& out = batch.device_outputs[i];
      kernels::OutputSpan& span = args.output_spans[args.num_output_spans++];
      span.first_row = out.first_row;
      span.rows = out.rows;
      span.token_ids = out.token_ids;
      span.logz = out.logz;
      span.logprobs = out.logprobs;
    }
    const KernelStatus status = path == CudaSamplerPath::kFused
                                    ? kernels::LaunchFusedSample(args, stream_)
                                    : kernels::LaunchMaterializedSample(args, cublas_, stream_);
    if (status != KernelStatus::kOk) return KernelStatusToStatus(status, "cuda sampler launch");
    // Copies remain only for device results beyond the spans (from the host
    // buffers stage 2 wrote, in stream order after it).
    for (size_t i = spans; i < batch.device_outputs.size(); ++i) {
      const DeviceOutputRows& out = batch.device_outputs[i];
      const size_t bytes = static_cast<size_t>(out.rows) * 4;
      AddCopy(out.token_ids, static_cast<int32_t*>(host_tokens_) + out.first_row, bytes);
      if (out.logz != nullptr) AddCopy(out.logz, static_cast<float*>(host_logz_) + out.first_row, bytes);
      if (out.logprobs != nullptr) {
        AddCopy(out.logprobs, static_cast<float*>(host_logprobs_) + out.first_row, bytes);
      }
    }
    if (absl::Status s = EnqueueCopies(); !s.ok()) return s;
    FS_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
    // Controls that are all neutral reach here (details: one sample per row).
    SampleResult result = SampleResultFromHostOutputs(
        batch, static_cast<const int32_t*>(host_tokens_), static_cast<const float*>(host_logz_),
        static_cast<const float*>(host_logprobs_), static_cast<const float*>(host_draft_logprobs_));
    result.path = path == CudaSamplerPath::kFused ? LaunchPath::kFused : LaunchPath::kMaterialized;
    result.hidden_read_in_place = in_place_.rows != nullptr;
    return result;
  }

  const ModelShape shape_;
  const CudaEngineOptions options_;
  const int64_t max_rows_;
  const std::shared_ptr<HostStaging> staging_;
  std::shared_ptr<DeviceUpload> upload_;  // set by Init, null when turned off
  std::atomic<bool> healthy_{true};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* weight_ = nullptr;
  void* hidden_ = nullptr;
  void* wire_ = nullptr;
  void* params_ = nullptr;
  void* drafts_ = nullptr;
  void* first_bad_ = nullptr;    // [max_rows_], kNoBadHiddenElement between launches
  void* blocks_done_ = nullptr;  // [max_rows_], 0 between launches
  void* error_bytes_ = nullptr;  // 8 bytes: a bad element on its way to the host
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* host_hidden_ = nullptr;
  void* host_params_ = nullptr;
  void* host_tokens_ = nullptr;
  void* host_logz_ = nullptr;
  void* host_logprobs_ = nullptr;
  void* host_drafts_ = nullptr;
  void* host_draft_logprobs_ = nullptr;
  void* host_first_bad_ = nullptr;
  // The device's addresses of the mapped host buffers the kernels read or write.
  void* device_host_params_ = nullptr;
  void* device_tokens_ = nullptr;
  void* device_logz_ = nullptr;
  void* device_logprobs_ = nullptr;
  void* device_draft_logprobs_ = nullptr;
  void* device_first_bad_host_ = nullptr;
  // Consecutive wire rows widened by one launch from `source` (device
  // memory: wire_ for host rows, `host`; else a CUDA IPC buffer in place),
  // with first_bad_[index in wire_groups_].
  struct WireGroup {
    int64_t first_row;
    int64_t rows;
    WeightDType dtype;
    const void* source;
    bool host;
  };
  // The current launch's rows read in place (ReadsInPlace), or rows ==
  // null: set by StageHidden, read by RunPlain.
  kernels::HiddenInWeightDType in_place_;
  // The current launch's groups (each reports its first-bad index into
  // host_first_bad_) and its copies in flight to one EnqueueCopies call
  // (reused).
  std::vector<WireGroup> wire_groups_;
  std::vector<void*> copy_dst_;
  std::vector<const void*> copy_src_;
  std::vector<size_t> copy_bytes_;
  // Destroyed after ~CudaEngine's body has synchronized the stream.
  CudaControlledRunner controlled_;
};

}  // namespace

// Declared in engine.h; MakeCudaEngine is declared in engine.cc, its only caller.
bool CudaBackendAvailable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeCudaEngine(const LmHead& head, int64_t valid_vocab,
                                                       int64_t max_batch_rows,
                                                       const CudaEngineOptions& options) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat("no CUDA device is usable: ",
                                               err == cudaSuccess ? "none found" : cudaGetErrorString(err)));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " visible)"));
  }
  if (max_batch_rows < 1) return absl::InvalidArgumentError("max_batch_rows must be >= 1");
  absl::StatusOr<ModelShape> shape = ResolveModelShape(head, valid_vocab);
  if (!shape.ok()) return shape.status();
  if (options.batch_invariant && (shape->weight_dtype == WeightDType::kFloat32 || shape->hidden_size % 16 != 0)) {
    // The materialized path's batch-invariant logits come from the
    // tensor-core GEMM (kernels/cuda/logits_gemm.h), which needs these.
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_invariant needs a bf16 or fp16 LM head with a hidden size divisible by 16 on the "
        "CUDA backend (this one: ", WeightDTypeName(shape->weight_dtype), ", hidden size ",
        shape->hidden_size, "); the CPU backend is batch-invariant for every head"));
  }
  auto engine = std::make_unique<CudaEngine>(*shape, options, max_batch_rows);
  if (absl::Status s = engine->Init(head); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("CUDA backend initialisation failed: ", s.message()));
  }
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace flashsampler
