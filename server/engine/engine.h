// Engine: a backend that holds the LM head and samples batches of rows.
//
// The service hands an Engine fully validated batches: hidden states already
// widened to fp32 and free of NaN/Inf, one resolved RowParams per row. Every
// engine first rounds the hidden states to the LM head's dtype (as a bf16 or
// fp16 GEMM does) and accumulates in fp32, so all backends and all kernel
// paths compute the same logits up to fp32 summation order, and a row's token
// does not depend on which path its batch size selects. The
// engine returns one token per row (plus logz / logprobs when asked, and the
// per-row details when the batch has controls) or an error status; it never
// crashes the process on a bad batch. Rows with controls (RowControls,
// semantics in kernels/common/row_controls.h) are served exactly by every
// backend that accepts them; a backend that cannot serve a control returns
// Unimplemented naming it.
//
// Thread safety: Sample() is NOT reentrant; the DynamicBatcher is its only
// caller and serialises calls. shape() and backend_name() are immutable;
// healthy() and DeviceMemory() may be called from any thread at any time.
// Outcomes: OK with `rows` results; InvalidArgument for a batch that breaks the
// engine's preconditions (a bug in the caller); FailedPrecondition when a row
// with controls has no token left with a finite logit; Unimplemented for a
// control the backend does not serve; Internal for a backend failure,
// after which healthy() turns false.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/common/kernel_status.h"
#include "kernels/common/row_controls.h"
#include "kernels/common/row_params.h"
#include "kernels/common/shard_exchange.h"
#include "kernels/common/shard_merge.h"
#include "server/model/lm_head.h"

namespace flashsampler {

struct ModelShape {
  int64_t vocab_size = 0;   // rows of W, padding included
  int64_t valid_vocab = 0;  // tokens that may be sampled: [0, valid_vocab)
  int64_t hidden_size = 0;
  WeightDType weight_dtype = WeightDType::kBFloat16;
};

// std::allocator, except that growing a vector leaves the new floats
// uninitialized (value-initialization by an explicit value still works):
// the request parser writes every hidden value it decodes, and zeroing first
// cost a memset of MiBs per decode step (4 MiB at 256 rows of D = 4096).
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialization: no write for float
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using HiddenStates = std::vector<float, UninitializedAllocator<float>>;

// Rows of a batch whose hidden states the engine takes as they arrived, in
// the caller's dtype, and widens itself on the device
// (kernels/cuda/hidden_states.h): host bytes (a gRPC payload or a
// shared-memory slice, usually copied by the request thread into the
// engine's HostStaging), which then cross the bus at their own width, or
// memory the device reads in place (a caller's CUDA IPC buffer, which never
// visits the host at all, or a shared-memory region mapped into the device's
// address space, read over the bus by the widening kernel). The request parser checked
// the shape and bounds but not the values: the engine checks them on the
// device and fails the batch with InvalidArgument naming the first bad
// element (row and column within the batch) when one is not finite, or
// rounds outside the range of a 16-bit weight dtype (fp16 from 65520; bf16
// only within half an ulp of FLT_MAX): the parser's checks for fp32 hidden
// states, in the same words.
inline constexpr int kHostMemory = -1;
struct WireHiddenRows {
  int64_t first_row = 0;  // within the batch
  int64_t rows = 0;       // >= 1
  const void* data = nullptr;  // rows * hidden_size elements of `dtype`, row-major
  WeightDType dtype = WeightDType::kBFloat16;  // the element type (one of the three dtypes)
  int device = kHostMemory;    // or the CUDA ordinal that reads `data` in place (a device address)
  // Pinned host memory (the engine's HostStaging): copied to the device as
  // it is, at bus speed, with no staging copy on the engine's thread.
  bool pinned = false;
  // Keeps `data` alive while any batch refers to it (a region, a buffer);
  // null where the caller guarantees it (the request message the bytes lie in).
  std::shared_ptr<const void> owner;
  // GPU rows still arriving: an event (a cudaEvent_t of `device`, opaque
  // here) recorded after the copy that fills `data` (DeviceUpload); the
  // engine's stream waits for it before reading them. Null: ready now.
  const void* ready = nullptr;
};

// Results an engine writes into device memory itself: a request's output
// region in a CUDA IPC buffer on the engine's GPU. Rows [first_row,
// first_row + rows) of the batch go to token_ids (int32), and to logz and
// logprobs (fp32) where those are set, each `rows` long. The engine writes
// them before Sample returns, from its device (the CUDA engine: its sampler's
// last kernel for up to kernels::kMaxOutputSpans runs a launch, a copy for
// more); its result still holds every row too.
struct DeviceOutputRows {
  int64_t first_row = 0;  // within the batch
  int64_t rows = 0;       // >= 1
  int32_t* token_ids = nullptr;
  float* logz = nullptr;      // null: not asked for
  float* logprobs = nullptr;  // null: not asked for
  int device = kHostMemory;   // the CUDA ordinal whose memory holds them
  // Keeps the memory alive while any batch refers to it (the region).
  std::shared_ptr<const void> owner;
};

// Host memory for hidden states on their way to an engine, which the
// engine's copies to the device read at bus speed (pinned memory, for the CUDA
// engine): request threads put a request's bytes there, so the engine's one
// thread only starts the transfer. Allocate returns null when no memory is
// to be had (the caller then uses ordinary memory); the memory stays valid
// while the returned pointer (or a copy) lives, also after the engine is gone.
// Thread safety: Allocate may be called from any thread at any time.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  virtual std::shared_ptr<void> Allocate(size_t bytes) = 0;
};

// Hidden-state bytes a request thread has started copying to the engine's
// GPU (DeviceUpload::Upload): `data` is `device` memory, readable by the
// engine's stream once it has waited for `ready` (WireHiddenRows::ready);
// `owner` keeps the device memory, and the host bytes the copy reads, alive.
struct UploadedRows {
  const void* data = nullptr;
  int device = kHostMemory;
  const void* ready = nullptr;
  std::shared_ptr<const void> owner;
};

// Host-to-device copies started by request threads as requests arrive, so a
// request's bytes cross the bus while the launch before it runs instead of
// at the start of its own launch (the engine's one thread then only waits
// for the copy's event). The CUDA engine's, over a copy stream of its own
// (server/engine/cuda_device_upload.h).
// Thread safety: Upload may be called from any thread at any time.
// Outcomes: the rows, or an error (no device memory, a CUDA error); the
// caller then leaves the bytes in host memory and the engine copies them at
// launch, as without an upload.
class DeviceUpload {
 public:
  virtual ~DeviceUpload() = default;
  // Payloads smaller than this stay with the launch's one batched copy: an
  // upload costs the request thread a few CUDA calls, more than a small
  // payload's share of one copy.
  virtual size_t min_bytes() const = 0;
  // `host`: `bytes` of pinned host memory, kept alive (and unchanged) by
  // `host_owner` until the copy has read them; the result's owner holds it.
  virtual absl::StatusOr<UploadedRows> Upload(const void* host, size_t bytes,
                                              std::shared_ptr<const void> host_owner) = 0;
};

// How an engine that widens hidden states itself (reads_wire_hidden
// (kHostMemory)) wants host bytes: staged in `staging` by the request
// thread when it has one, else left where they are; and, where the engine
// has `upload`, pinned runs of at least upload->min_bytes() copied to its
// GPU once the request is admitted (server/api/wire_upload.h).
struct WireInput {
  std::shared_ptr<HostStaging> staging;
  std::shared_ptr<DeviceUpload> upload = nullptr;
};

struct SampleBatch {
  int64_t rows = 0;
  // [rows, hidden_size] fp32, finite; for rows covered by wire_hidden the
  // values are unspecified (never written, never read).
  HiddenStates hidden;
  // Sorted by first_row, disjoint, inside [0, rows); empty unless the engine's
  // reads_wire_hidden(device) is true for each run's device.
  std::vector<WireHiddenRows> wire_hidden;
  std::vector<RowParams> params;   // [rows]
  // [rows], or empty when no row has controls (then every row is plain). A
  // default RowControls is a plain row, so a batcher joining batches with and
  // without controls pads the latter with default entries.
  std::vector<RowControls> controls;
  bool want_logz = false;
  bool want_logprobs = false;
  // True when every hidden value is already exactly representable in the LM
  // head's dtype (RoundHiddenToWeightDType would change nothing): the request
  // parser rounds on the gRPC threads, in parallel, so the engine's single
  // caller thread skips that pass. False: the engine rounds.
  bool hidden_in_weight_dtype = false;
  // [rows], or empty when no row verifies a draft. Speculative verification of
  // a greedy draft token x = draft_tokens[b] >= 0 (-1: a plain row):
  // - temperature > 0: the row's sample is drawn with x excluded, i.e. from the
  //   residual distribution softmax(l') restricted to i != x (argmax over
  //   i != x of l'_i + g_i), while logz (when asked) still covers every token;
  // - greedy rows sample as usual (the argmax, x included);
  // and SampleResult::draft_logprobs[b] = l'_x - log sum_i exp(l'_i), the log
  // of the target probability of x (for greedy rows at T = 1, as logprobs).
  // Rows with controls and a draft apply the draft to the distribution left
  // after every control (a backend that cannot returns Unimplemented).
  std::vector<int32_t> draft_tokens;
  // Sorted by first_row, disjoint, inside [0, rows); only on a batch without
  // controls, only for rows without a draft (draft_tokens -1: a launch may
  // join a Verify request with such a Sample request), and only where
  // writes_device_outputs(device) is true for each run's device.
  std::vector<DeviceOutputRows> device_outputs;
  // When the batch is rows [k, k + rows) of one request (a part of a request
  // the batcher split across launches), k; otherwise 0. An engine names a row
  // in an error message as request_row_offset + its row in the batch, so the
  // message places the value in the client's request. (A failing launch of
  // several requests is re-run one request at a time, server/batching/
  // dynamic_batcher.h, and only those runs' messages reach clients.)
  int64_t request_row_offset = 0;
};

// Which kernel path served a launch: a label of the launches metric (a fixed
// set, LaunchPathName) and what tests check a planner's choice with.
enum class LaunchPath : int32_t {
  kUnspecified = 0,
  kCpu,                     // CPU backend (tiled sampler, controlled sampler for controlled rows)
  kFused,                   // CUDA: LaunchFusedSample
  kMaterialized,            // CUDA: LaunchMaterializedSample (cuBLAS logits)
  kFusedControlled,         // CUDA: LaunchFusedControlledSample
  kFusedControlledFallback, // CUDA: LaunchFusedControlledSample, then LaunchControlledSample for the
                            // batch it handed back (row_status 2) or, with batch_invariant, for the
                            // rows it did not serve, by themselves
  kControlled,              // CUDA: LaunchControlledSample (materialized controls)
  kSharded,                 // CUDA, several GPUs: LaunchShardedSample
  kShardedControlled,       // CUDA, several GPUs: LaunchShardedControlledSample (controls, drafts)
  kShardedFusedControlled,  // CUDA, several GPUs: LaunchShardedFusedControlledSample
};
const char* LaunchPathName(LaunchPath path);  // "cpu", "fused", ...

struct SampleResult {
  std::vector<int32_t> token_ids;  // [rows]
  std::vector<float> logz;         // [rows] when asked, else empty
  std::vector<float> logprobs;     // [rows] when asked, else empty
  // [rows] exactly when the batch's `controls` is non-empty, else empty.
  std::vector<RowSampleDetail> details;
  // [rows] exactly when the batch's `draft_tokens` is non-empty (NaN for rows
  // without a draft), else empty.
  std::vector<float> draft_logprobs;
  LaunchPath path = LaunchPath::kUnspecified;  // set by every engine
  // The CUDA engine: the batch's hidden states went to the sampler where
  // they lie, in the head's 16-bit dtype, with no widening launch
  // (kernels::HiddenInWeightDType). False for every other launch.
  bool hidden_read_in_place = false;
};

// Memory of one device the engine uses (for the metrics endpoint).
struct DeviceMemoryInfo {
  int device = 0;           // the CUDA ordinal
  int64_t used_bytes = 0;   // by every process on the device
  int64_t total_bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual absl::StatusOr<SampleResult> Sample(const SampleBatch& batch) = 0;
  virtual const ModelShape& shape() const = 0;
  virtual std::string backend_name() const = 0;
  // False once the backend hit an unrecoverable error (e.g. a device fault).
  virtual bool healthy() const { return true; }
  // True when the backend serves SampleBatch::draft_tokens in a launch whose
  // rows have sampling controls (`with_controls`) or have none. The batcher
  // puts draft rows into one launch with other requests' rows of that kind
  // only for such a backend; otherwise a Verify request runs in launches of
  // its own, so the backend's refusal fails only the requests that carry drafts.
  virtual bool serves_draft_rows(bool with_controls) const {
    (void)with_controls;
    return false;
  }
  // True when the engine takes SampleBatch::wire_hidden rows in `device`'s
  // memory (kHostMemory, or a CUDA ordinal): the single-GPU CUDA engine, for
  // host memory and its own GPU.
  virtual bool reads_wire_hidden(int device) const {
    (void)device;
    return false;
  }
  // True when the engine writes SampleBatch::device_outputs in `device`'s
  // memory: the single-GPU CUDA engine, for its own GPU.
  virtual bool writes_device_outputs(int device) const {
    (void)device;
    return false;
  }
  // Where request threads stage host wire rows for this engine (see
  // HostStaging), or null: the CUDA engine's pinned pool. Immutable.
  virtual std::shared_ptr<HostStaging> host_staging() const { return nullptr; }
  // Copies request threads may start to this engine's GPU (DeviceUpload), or
  // null: the single-GPU CUDA engine's, unless turned off. Immutable.
  virtual std::shared_ptr<DeviceUpload> device_upload() const { return nullptr; }
  // The devices this engine holds W on; empty for the CPU backend, or when
  // the device cannot be queried.
  virtual std::vector<DeviceMemoryInfo> DeviceMemory() const { return {}; }
};

struct CpuEngineOptions {
  int num_threads = 0;       // 0: all hardware threads
  int64_t tile_rows = 1024;
};

struct CudaEngineOptions {
  // The single-GPU engine's device (MakeEngine sets it from `devices` when
  // that names exactly one).
  int device = 0;
  // Vocabulary sharding (sharded_cuda_engine.cc): the GPUs W is split over,
  // one contiguous vocabulary shard each, in this order; empty: {device}.
  // More than one needs a build with NCCL (CudaShardingAvailable()).
  std::vector<int> devices;
  // Relative shard sizes (server/engine/vocab_shards.h); empty: equal.
  std::vector<double> shard_split;
  // How the shards' summaries merge (kernels/common/shard_merge.h): kExact,
  // the single-GPU tokens, or kGroupGumbel, the paper's variant.
  ShardMergeMode shard_merge = ShardMergeMode::kExact;
  // How the summaries reach GPU 0 (kernels/common/shard_exchange.h). kPeerWrite
  // fails MakeEngine (FailedPrecondition) where a GPU cannot reach GPU 0.
  ShardExchange shard_exchange = ShardExchange::kNcclAllGather;
  // A sharded step that has not finished after this long is declared hung:
  // the NCCL communicators are aborted and the engine turns unhealthy.
  double shard_timeout_s = 30.0;
  // Batches of up to this many rows use the fused kernel; larger ones the
  // cuBLAS-materialized path. Default: every batch (the server's
  // --max_batch_rows bound), so a row's bits do not depend on its batch: the
  // fused kernel keeps one kernel family for every B (fused_sample.h,
  // Stage1Kernel::kAuto), cuBLAS does not. With the WGMMA stage 1 the fused
  // kernel is also the faster path at every batch measured: 256 to 1024 rows
  // on an H100 (where cuBLAS was faster at 129-192 rows at D = 8192 before
  // the chunks above 128 rows were padded; not re-measured since), 1 to
  // 1024 rows on an H200 (bf16, BENCHMARKS.md).
  int64_t fused_max_rows = int64_t{1} << 20;
  // Batches with sampling controls of up to fused_max_rows rows take the fused
  // controlled path (kernels/cuda/fused_controlled_sample.h) when every row
  // is one it serves; false: always the materialized controlled path.
  bool fused_controls = true;
  // Batches with sampling controls that mix rows the fused controlled path
  // serves with rows it cannot (top_p without top_k, say): true runs the
  // fused launch for the batch and then the other rows by themselves on the
  // materialized path, so a fused row's bits never depend on its companions
  // (a second pass over W for such batches); false runs the whole batch on
  // the materialized path (one pass; every row's logits from cuBLAS).
  bool batch_invariant = false;
  // Requests whose pinned host hidden states (the wire payload staged by the
  // request thread, or a registered shared-memory slice) take at least this
  // many bytes, admitted while a launch runs, are copied to the GPU by the
  // request thread at once, on a copy stream of their own (DeviceUpload),
  // overlapping that launch; the rest ride their launch's batched copy.
  // 0: never.
  int64_t upload_min_bytes = int64_t{128} << 10;
};

struct EngineOptions {
  int64_t valid_vocab = 0;        // 0: the whole vocabulary
  int64_t max_batch_rows = 1024;  // largest batch the engine must accept
  CpuEngineOptions cpu;
  CudaEngineOptions cuda;
};

// The CPU backend: W laid out once as token panels in its own dtype
// (kernels/cpu/fixed_order_logits.h; 16-bit heads stay 16-bit and are widened
// in registers). InvalidArgument when valid_vocab exceeds the vocabulary.
absl::StatusOr<std::unique_ptr<Engine>> MakeCpuEngine(LmHead head, int64_t valid_vocab,
                                                      const CpuEngineOptions& options);

// Rounds `n` fp32 hidden values to the precision of `dtype` (nearest even),
// in place; nothing changes for kFloat32. InvalidArgument, naming the dtype,
// when a value rounds past the dtype's finite range (fp16: |h| >= 65520;
// bf16: |h| >= 0x1.ffp127, near FLT_MAX). The message places the first such
// value as field[row][col] for rows of `cols` values, the first of them row
// `first_row` (a batch's request_row_offset plus where `values` start in it),
// or as "element i" when cols is 0.
absl::Status RoundHiddenToWeightDType(WeightDType dtype, float* values, int64_t n, int64_t cols = 0,
                                      absl::string_view field = "hidden_states", int64_t first_row = 0);

// The one wording of that refusal (the CUDA engine's check on the device
// says it too): InvalidArgument for `value`, placed by `where` (e.g.
// "hidden_states[2][9]"), outside the range of 16-bit `dtype`.
absl::Status HiddenOutOfRangeError(WeightDType dtype, float value, absl::string_view where);

// The layout every engine requires of a batch: 1 <= rows <= max_rows, hidden
// rows * hidden_size values, params one per row, controls and draft_tokens
// empty or one per row, wire_hidden sorted, disjoint and inside the batch,
// each in host memory or on `wire_hidden_device` (kNoWireHidden: the engine
// takes no wire rows). InvalidArgument naming `engine` otherwise.
inline constexpr int kNoWireHidden = -2;
absl::Status CheckBatchLayout(const SampleBatch& batch, int64_t hidden_size, int64_t max_rows,
                              const char* engine, int wire_hidden_device = kNoWireHidden);

// The SampleResult of a launch whose per-row outputs were copied to host
// arrays of batch.rows entries (the GPU backends' pinned buffers): tokens
// always; logz / logprobs when the batch asked for them; draft_logprobs when
// the batch has draft rows; and when it carries (all-neutral) controls, one
// sample per row in details. Pointers not needed may be null.
SampleResult SampleResultFromHostOutputs(const SampleBatch& batch, const int32_t* tokens,
                                         const float* logz, const float* logprobs,
                                         const float* draft_logprobs);

// The one mapping of a kernel launcher's outcome to a status: kInvalidArgument
// -> InvalidArgument (a batch the kernel refuses, e.g. logits that overflow),
// kOutOfMemory -> ResourceExhausted, device and internal errors -> Internal
// (which marks a device engine unhealthy). `what` names the launcher.
absl::Status KernelStatusToStatus(kernels::KernelStatus status, const std::string& what);

// The shape an engine serves: W's dimensions and dtype, with valid_vocab
// resolved (0 = the whole vocabulary). InvalidArgument when it is outside
// [1, vocab_size].
absl::StatusOr<ModelShape> ResolveModelShape(const LmHead& head, int64_t valid_vocab);

// True when this build has the CUDA backend and a CUDA device is usable.
bool CudaBackendAvailable();

// The number of CUDA devices this process sees (0 without the CUDA backend or
// without a usable device).
int VisibleCudaDeviceCount();

// True when this build can shard W over several GPUs (CUDA and NCCL found at
// configure time, CMake option FLASHSAMPLER_NCCL).
bool CudaShardingAvailable();

// Builds the backend named by `backend`: "cpu", "cuda" or "auto" (CUDA when
// CudaBackendAvailable(), else CPU). For CUDA, options.cuda.devices picks the
// engine: none or one device, the single-GPU engine; more, the sharded engine
// (Unavailable in a build without NCCL). InvalidArgument for an unknown name or bad
// options, Unavailable for a backend this build or machine cannot provide,
// Internal when the device fails during initialisation. The CUDA backend copies
// W to the device, after which `head` (and its mapping) is released.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const std::string& backend, LmHead head,
                                                   const EngineOptions& options);

}  // namespace flashsampler
