// ServerConfig: flashsampler-server's command line, parsed and validated once.
//
// The flags are defined in server_config.cc (Abseil flags); ServerConfigFromFlags
// reads them after absl::ParseCommandLine and returns InvalidArgument naming the
// flag for any value out of range. Not thread-safe: call once from main.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace flashsampler {

struct ServerConfig {
  std::string address;       // HOST:PORT (port 0 picks a free port) or unix:PATH
  std::string weights;       // safetensors file or model folder; empty = demo head
  std::string tensor;        // tensor name; empty = lm_head.weight, then tied embeddings
  std::string backend;       // auto | cpu | cuda
  int64_t valid_vocab = 0;   // 0 = whole vocabulary
  int threads = 0;           // CPU backend threads; 0 = all
  int64_t tile_rows = 1024;  // CPU backend vocabulary tile
  int64_t max_request_rows = 1024;  // largest B one request may carry
  // Dynamic batcher (server/batching/dynamic_batcher.h).
  int64_t max_batch_rows = 256;     // rows per engine launch
  int64_t max_queue_delay_us = 0;
  int64_t max_queue_rows = 4096;    // admission bound, >= max_request_rows
  std::string local_socket;         // the local channel's socket path; empty = off
  int max_local_connections = 64;   // the local channel's connections at once
  int max_regions = 64;             // registered memory regions (0: the feature is off)
  bool shm_device_reads = true;     // shared-memory regions read in place by the GPU (--shm_device_reads)
  uint64_t shm_device_reads_max_bytes = uint64_t{4} << 30;  // pinned by those regions at once
  int completion_threads = 4;       // threads answering finished requests
  int64_t idle_spin_us = -1;        // batcher worker's idle poll; -1: by backend
  std::string metrics_address;      // HOST:PORT of /metrics; empty = off
  int cuda_device = -1;            // CUDA backend: one device ordinal; -1: use `devices`
  // CUDA backend: the GPUs W is sharded over by vocabulary (--devices);
  // empty: every visible GPU.
  std::vector<int> devices;
  std::vector<double> shard_split;  // relative shard sizes; empty: equal
  std::string shard_merge = "exact";  // exact | group_gumbel
  std::string shard_exchange = "nccl";  // nccl | peer
  double shard_timeout_s = 30;
  int64_t cuda_fused_max_rows = int64_t{1} << 20;  // CUDA backend: fused kernel up to this batch
  int64_t cuda_upload_min_bytes = int64_t{128} << 10;  // CUDA backend: copy on arrival from this size
  bool cuda_fused_controls = true;   // CUDA backend: fused path for sampling controls
  bool batch_invariant = false;      // CUDA backend: split mixed controlled batches per row
  double grace_period_s = 10;
  int64_t lame_duck_ms = 250;       // SIGTERM: refuse with UNAVAILABLE this long before closing
  int64_t demo_vocab = 32000;
  int64_t demo_hidden = 1024;
  uint64_t demo_seed = 0;
};

absl::StatusOr<ServerConfig> ServerConfigFromFlags();

}  // namespace flashsampler
