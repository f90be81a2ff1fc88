// The multi-GPU mode of flashsampler-kernel-bench (--backend=cuda_sharded),
// built only with NCCL (FLASHSAMPLER_HAVE_NCCL). What it measures:
// sharded_bench.cu.
#pragma once

#include <string>
#include <vector>

#include "kernels/bench/cuda_bench.h"
#include "kernels/cuda/sharded_sample.h"

namespace flashsampler::kernels::bench {

// Runs the sweep over options.shapes x options.batches with W split evenly
// (128-token aligned) over `devices` (>= 2), prints the table, writes JSON
// when options.json_path is set. Returns the process exit code (0 ok, 1
// device / NCCL / I/O error, 2 bad options).
int RunShardedBench(const CudaBenchOptions& options, const std::vector<int>& devices);

// WaitForShards with a 60 s bound; 0, or 1 after printing what happened.
int WaitForBenchShards(std::vector<ShardDevice>* devices);

// Controlled rows over the shards (sharded_controlled_bench.cc): the
// gathered-logits and gathered-tile launchers against one GPU for the control
// sets in `which` (ControlSets). `devices` (>= 2) may repeat. Same exit codes.
int RunShardedControlledBench(const CudaBenchOptions& options, const std::vector<int>& devices,
                              const std::string& which);

}  // namespace flashsampler::kernels::bench
