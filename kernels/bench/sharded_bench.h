// The multi-GPU mode of flashsampler-kernel-bench (--backend=cuda_sharded),
// built only with NCCL (FLASHSAMPLER_HAVE_NCCL). What it measures:
// sharded_bench.cu.
#pragma once

#include <vector>

#include "kernels/bench/cuda_bench.h"

namespace flashsampler::kernels::bench {

// Runs the sweep over options.shapes x options.batches with W split evenly
// (128-token aligned) over `devices` (>= 2), prints the table, writes JSON
// when options.json_path is set. Returns the process exit code (0 ok, 1
// device / NCCL / I/O error, 2 bad options).
int RunShardedBench(const CudaBenchOptions& options, const std::vector<int>& devices);

}  // namespace flashsampler::kernels::bench
