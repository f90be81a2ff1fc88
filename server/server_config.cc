#include "server/server_config.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "gRPC listen address HOST:PORT (port 0: pick a free port), or unix:PATH for a Unix "
          "domain socket (a client on the same host: no TCP stack, a shorter round trip)");
ABSL_FLAG(std::string, weights, "",
          "LM head: a .safetensors file or a model folder (with model.safetensors or "
          "model.safetensors.index.json). Empty: serve the seeded demo LM head.");
ABSL_FLAG(std::string, tensor, "",
          "Tensor name of the LM head. Empty: lm_head.weight, falling back to "
          "model.embed_tokens.weight (tied embeddings).");
ABSL_FLAG(std::string, backend, "auto", "auto | cpu | cuda (auto: CUDA when available, else CPU)");
ABSL_FLAG(int64_t, valid_vocab, 0,
          "Sample only token ids below N; rows >= N are padding (0: the whole vocabulary)");
ABSL_FLAG(int32_t, threads, 0, "CPU backend worker threads (0: all hardware threads)");
ABSL_FLAG(int64_t, tile_rows, 1024, "CPU backend vocabulary tile, in tokens");
ABSL_FLAG(int64_t, max_request_rows, 1024,
          "Largest B one request may carry; the gRPC message size limit follows from it");
// The local channel (server/local/).
ABSL_FLAG(std::string, local_socket, "",
          "Also serve Sample requests on this Unix-domain socket path, for engines on the same "
          "host: the local channel (client/local_frame.h), the same requests without gRPC's round "
          "trip; meant for requests whose tensors are in registered memory regions. Mode 0600, "
          "peers of the server's user (or root) only; no TLS or token on it. Empty: off");
ABSL_FLAG(int32_t, max_local_connections, 64,
          "--local_socket: connections open at once (a thread each); one more is refused with "
          "RESOURCE_EXHAUSTED");
// The dynamic batcher.
ABSL_FLAG(int32_t, max_regions, 64,
          "Memory regions (POSIX shared memory, CUDA IPC) callers may register at once for "
          "requests that do not carry their tensors through gRPC; 0 turns RegisterRegion off. "
          "Any caller that may call the server may register any shared-memory object the "
          "server's user can open");
ABSL_FLAG(bool, shm_device_reads, true,
          "On the single-GPU CUDA backend, map registered shared-memory regions into the GPU's address "
          "space, so the widening kernel reads a request's hidden states from the object over the bus "
          "with no host copy. The GPU reads pages pinned at registration, so a client that shrinks an "
          "object cannot fault the server. Off: regions are read with pread into pinned staging.");
ABSL_FLAG(uint64_t, shm_device_reads_max_bytes, uint64_t{4} << 30,
          "Bytes of shared-memory regions that may be mapped (pinned) for the GPU at once: a region "
          "that would take the total past it is read with pread (pinned pages cannot be swapped)");
ABSL_FLAG(int64_t, max_batch_rows, 256,
          "Rows per engine launch: concurrent requests are coalesced up to this many rows; "
          "a larger request is split over several launches");
ABSL_FLAG(int64_t, max_queue_delay_us, 0,
          "How long the oldest queued request may wait for others to fill a launch, in "
          "microseconds (0: launch whatever is queued as soon as the engine is free)");
ABSL_FLAG(int64_t, max_queue_rows, 4096,
          "Admission bound: rows that may wait for a launch; a request that does not fit is "
          "refused with RESOURCE_EXHAUSTED. Must be >= --max_request_rows");
ABSL_FLAG(int32_t, completion_threads, 4,
          "Threads that answer the requests of a finished launch while the batcher forms the "
          "next one");
ABSL_FLAG(int64_t, idle_spin_us, -1,
          "After a launch, while nothing is queued, the batcher's worker polls for new requests "
          "this many microseconds (one busy core) before it sleeps, so a request arriving "
          "meanwhile starts without a thread wake-up. -1: 1000 on the CUDA backend, 0 on the "
          "CPU backend (whose workers need the cores)");
ABSL_FLAG(std::string, metrics_address, "",
          "HOST:PORT serving Prometheus metrics at /metrics (port 0: a free port); empty: off");
ABSL_FLAG(int32_t, cuda_device, -1,
          "CUDA backend: serve on this one device ordinal (the same as --devices=N); -1: use --devices");
ABSL_FLAG(std::string, devices, "",
          "CUDA backend: comma-separated GPU ordinals to shard the LM head over by vocabulary "
          "(one contiguous shard per GPU, in this order; e.g. 0,1). Empty: every visible GPU. "
          "More than one needs a build with NCCL");
ABSL_FLAG(std::string, shard_split, "",
          "CUDA backend, several --devices: relative vocabulary shard sizes, one per device "
          "(e.g. 1,3); empty: equal");
ABSL_FLAG(std::string, shard_merge, "exact",
          "CUDA backend, several --devices: exact (the tokens of one GPU for the same seeds) or "
          "group_gumbel (pick the shard by a fresh Gumbel over the shards' log-masses; exact "
          "in distribution)");
ABSL_FLAG(std::string, shard_exchange, "nccl",
          "CUDA backend, several --devices: how the shards' per-row summaries reach GPU 0: nccl "
          "(one NCCL all-gather) or peer (each GPU's kernel writes them into GPU 0's memory; "
          "needs peer access from every GPU to the first). The same tokens either way");
ABSL_FLAG(double, shard_timeout_s, 30.0,
          "CUDA backend, several --devices: a sampling step not finished after this many seconds "
          "is a hang; the server stops serving (NOT_SERVING)");
ABSL_FLAG(int64_t, cuda_fused_max_rows, int64_t{1} << 20,
          "CUDA backend: batches of up to N rows use the fused kernel, larger ones the "
          "cuBLAS-materialized path. The default (every batch) keeps a row's token, log Z and "
          "logprob bit-identical in every batch it can be part of; a lower value trades that for "
          "cuBLAS above N rows (slower than the fused kernel at every batch measured on an H200; "
          "on an H100 faster only at 129-192 rows with D = 8192, before the fused kernel's "
          "chunk change, BENCHMARKS.md)");
ABSL_FLAG(int64_t, cuda_upload_min_bytes, int64_t{128} << 10,
          "CUDA backend (one GPU): a request whose hidden states arrive as host bytes of at least "
          "this size (the gRPC payload, or a shared-memory region slice) and that is admitted "
          "while a launch runs is copied to the GPU by the thread that received it, at once, so "
          "the copy overlaps that launch instead of preceding its own; the rest ride their "
          "launch's one batched copy. 0: every copy at launch");
ABSL_FLAG(bool, cuda_fused_controls, true,
          "CUDA backend: batches with sampling controls (up to --cuda_fused_max_rows rows) apply "
          "them inside the fused kernel when every row allows it (top_k <= 64, or no filter); "
          "false: always the materialized controlled path");
ABSL_FLAG(bool, batch_invariant, false,
          "CUDA backend, one GPU: every row's token, log Z and logprobs are bit-identical in every "
          "batch. A batch that mixes rows with top_k <= 64 (or no filter) and rows the fused "
          "controlled path cannot serve (top_p or min_p without top_k, top_k > 64, ...) runs the "
          "first on the fused path and the others by themselves on the materialized path (a "
          "second pass over W for such batches: 1.2-1.8x the kernel time at 16-256 rows on an "
          "H100); a Verify batch that mixes draft rows with and without controls runs the fused "
          "kernel for the latter too; and the materialized path takes its logits from the fused "
          "kernels' own GEMM on any GPU (the default does on Hopper only, where it is as fast as "
          "cuBLAS; elsewhere it is slower from a few dozen rows). Without the flag a mixed batch "
          "takes the materialized path whole. Batches without such rows, and the CPU backend, "
          "are batch-invariant either way. Needs a 16-bit head with a hidden size divisible by 16 "
          "and --cuda_fused_max_rows >= --max_batch_rows");
ABSL_FLAG(double, grace_period_s, 10.0,
          "On SIGTERM/SIGINT: seconds in-flight RPCs get to finish before they are cancelled");
ABSL_FLAG(int64_t, lame_duck_ms, 250,
          "On SIGTERM/SIGINT, once in-flight requests are answered: milliseconds during which new "
          "ones are still refused with UNAVAILABLE before the listener closes (within the grace period)");
ABSL_FLAG(int64_t, demo_vocab, 32000, "Vocabulary size of the demo LM head (no --weights)");
ABSL_FLAG(int64_t, demo_hidden, 1024, "Hidden size of the demo LM head (no --weights)");
ABSL_FLAG(uint64_t, demo_seed, 0, "Seed of the demo LM head (no --weights)");

namespace flashsampler {

absl::StatusOr<ServerConfig> ServerConfigFromFlags() {
  ServerConfig c;
  c.address = absl::GetFlag(FLAGS_address);
  c.weights = absl::GetFlag(FLAGS_weights);
  c.tensor = absl::GetFlag(FLAGS_tensor);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.valid_vocab = absl::GetFlag(FLAGS_valid_vocab);
  c.threads = absl::GetFlag(FLAGS_threads);
  c.tile_rows = absl::GetFlag(FLAGS_tile_rows);
  c.max_request_rows = absl::GetFlag(FLAGS_max_request_rows);
  c.max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows);
  c.local_socket = absl::GetFlag(FLAGS_local_socket);
  c.max_local_connections = absl::GetFlag(FLAGS_max_local_connections);
  c.max_regions = absl::GetFlag(FLAGS_max_regions);
  c.shm_device_reads = absl::GetFlag(FLAGS_shm_device_reads);
  c.shm_device_reads_max_bytes = absl::GetFlag(FLAGS_shm_device_reads_max_bytes);
  c.max_queue_delay_us = absl::GetFlag(FLAGS_max_queue_delay_us);
  c.max_queue_rows = absl::GetFlag(FLAGS_max_queue_rows);
  c.completion_threads = absl::GetFlag(FLAGS_completion_threads);
  c.idle_spin_us = absl::GetFlag(FLAGS_idle_spin_us);
  c.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  c.grace_period_s = absl::GetFlag(FLAGS_grace_period_s);
  c.lame_duck_ms = absl::GetFlag(FLAGS_lame_duck_ms);
  c.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  c.shard_merge = absl::GetFlag(FLAGS_shard_merge);
  c.shard_exchange = absl::GetFlag(FLAGS_shard_exchange);
  c.shard_timeout_s = absl::GetFlag(FLAGS_shard_timeout_s);
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',', absl::SkipWhitespace())) {
    int device = 0;
    if (!absl::SimpleAtoi(item, &device) || device < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices must be comma-separated GPU ordinals >= 0, got '", absl::GetFlag(FLAGS_devices), "'"));
    }
    c.devices.push_back(device);
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_shard_split), ',', absl::SkipWhitespace())) {
    double weight = 0;
    if (!absl::SimpleAtod(item, &weight) || !(weight > 0) || !std::isfinite(weight)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shard_split must be comma-separated positive numbers, got '",
          absl::GetFlag(FLAGS_shard_split), "'"));
    }
    c.shard_split.push_back(weight);
  }
  c.cuda_fused_max_rows = absl::GetFlag(FLAGS_cuda_fused_max_rows);
  c.cuda_upload_min_bytes = absl::GetFlag(FLAGS_cuda_upload_min_bytes);
  c.cuda_fused_controls = absl::GetFlag(FLAGS_cuda_fused_controls);
  c.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  c.demo_vocab = absl::GetFlag(FLAGS_demo_vocab);
  c.demo_hidden = absl::GetFlag(FLAGS_demo_hidden);
  c.demo_seed = absl::GetFlag(FLAGS_demo_seed);

  if (c.address.empty()) return absl::InvalidArgumentError("--address must not be empty");
  if (c.backend != "auto" && c.backend != "cpu" && c.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be auto, cpu or cuda, got '", c.backend, "'"));
  }
  if (c.valid_vocab < 0) return absl::InvalidArgumentError("--valid_vocab must be >= 0");
  if (c.threads < 0 || c.threads > 1024) return absl::InvalidArgumentError("--threads must be in [0, 1024]");
  if (c.tile_rows < 1) return absl::InvalidArgumentError("--tile_rows must be >= 1");
  if (c.max_request_rows < 1 || c.max_request_rows > (1 << 20)) {
    return absl::InvalidArgumentError("--max_request_rows must be in [1, 1048576]");
  }
  if (c.max_local_connections < 1 || c.max_local_connections > 4096) {
    return absl::InvalidArgumentError("--max_local_connections must be in [1, 4096]");
  }
  if (c.local_socket.size() > 107) {
    return absl::InvalidArgumentError("--local_socket must be a path of at most 107 bytes");
  }
  if (c.max_regions < 0 || c.max_regions > 4096) {
    return absl::InvalidArgumentError("--max_regions must be in [0, 4096]");
  }
  if (c.max_batch_rows < 1 || c.max_batch_rows > (1 << 20)) {
    return absl::InvalidArgumentError("--max_batch_rows must be in [1, 1048576]");
  }
  if (c.max_queue_delay_us < 0 || c.max_queue_delay_us > 1000000) {
    return absl::InvalidArgumentError("--max_queue_delay_us must be in [0, 1000000]");
  }
  if (c.idle_spin_us < -1 || c.idle_spin_us > 1000000) {
    return absl::InvalidArgumentError("--idle_spin_us must be -1 (auto) or in [0, 1000000]");
  }
  if (c.completion_threads < 1 || c.completion_threads > 64) {
    return absl::InvalidArgumentError("--completion_threads must be in [1, 64]");
  }
  if (c.max_queue_rows < c.max_request_rows || c.max_queue_rows > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(
        "--max_queue_rows must be >= --max_request_rows (else a request could never be "
        "admitted) and <= 16777216");
  }
  if (c.cuda_device < -1) return absl::InvalidArgumentError("--cuda_device must be >= 0 (or -1: use --devices)");
  if (c.cuda_device >= 0 && !c.devices.empty()) {
    return absl::InvalidArgumentError("give --devices or --cuda_device, not both");
  }
  if (c.cuda_device >= 0) c.devices = {c.cuda_device};
  if (!c.shard_split.empty() && c.backend == "cpu") {
    return absl::InvalidArgumentError("--shard_split applies to the CUDA backend's GPU shards");
  }
  // Without --devices the GPU count is known only at start (main.cc checks then).
  if (!c.shard_split.empty() && !c.devices.empty() && c.shard_split.size() != c.devices.size()) {
    return absl::InvalidArgumentError("--shard_split needs one entry per --devices entry");
  }
  if (c.shard_merge != "exact" && c.shard_merge != "group_gumbel") {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_merge must be exact or group_gumbel, got '", c.shard_merge, "'"));
  }
  if (c.shard_exchange != "nccl" && c.shard_exchange != "peer") {
    return absl::InvalidArgumentError(
        absl::StrCat("--shard_exchange must be nccl or peer, got '", c.shard_exchange, "'"));
  }
  if (!(c.shard_timeout_s > 0 && c.shard_timeout_s <= 3600)) {
    return absl::InvalidArgumentError("--shard_timeout_s must be in (0, 3600]");
  }
  if (c.cuda_fused_max_rows < 0) return absl::InvalidArgumentError("--cuda_fused_max_rows must be >= 0");
  if (c.batch_invariant && c.cuda_fused_max_rows < c.max_batch_rows) {
    // Plain batches above --cuda_fused_max_rows take the materialized plain
    // path, whose log Z rounds otherwise than the fused kernel's.
    return absl::InvalidArgumentError(absl::StrCat(
        "--batch_invariant needs --cuda_fused_max_rows >= --max_batch_rows (", c.cuda_fused_max_rows,
        " < ", c.max_batch_rows, "): a row's bits would change when its batch crosses it"));
  }
  if (c.cuda_upload_min_bytes < 0) return absl::InvalidArgumentError("--cuda_upload_min_bytes must be >= 0");
  if (!(c.grace_period_s >= 0 && c.grace_period_s <= 3600)) {
    return absl::InvalidArgumentError("--grace_period_s must be in [0, 3600]");
  }
  if (c.lame_duck_ms < 0 || c.lame_duck_ms > 600000) {
    return absl::InvalidArgumentError("--lame_duck_ms must be in [0, 600000]");
  }
  if (c.weights.empty() && (c.demo_vocab < 1 || c.demo_hidden < 1 ||
                            c.demo_vocab > (int64_t{1} << 24) || c.demo_hidden > (1 << 16))) {
    return absl::InvalidArgumentError(
        "--demo_vocab must be in [1, 2^24] and --demo_hidden in [1, 65536]");
  }
  return c;
}

}  // namespace flashsampler
