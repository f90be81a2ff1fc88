#!/usr/bin/env bash
# Stage 1's tile cut on one GPU (kernels/common/tile_partition.h): times the
# fused sampler on the whole heads and on half-vocabulary shards of the two
# issue shapes, three ways in one call, then runs the GPU tests:
#
#   tile_cut_run.sh BIN_DIR OUT_DIR [BASE_BENCH]
#
# A record: it ran binaries of commit 92e2e3b (the tile cut, reverted in the
# next commit) on 2026-11-25; flashsampler-kernel-bench no longer has
# --tile_parts. See docs/benchmark-log.md, "Tried: a balanced stage-1 grid".
#
#   base:  BASE_BENCH (a flashsampler-kernel-bench built before the cut, when given)
#   whole: this build, --tile_parts=INT64_MAX (one block per tile, as before)
#   auto:  this build, the launcher's choice (balanced where it keeps more SMs busy)
#
# 76032 and 64128 are the larger shard of a 2-way split of 151936 and 128256
# (multiples of 128). Writes OUT_DIR/{base,whole,auto}.json, bench.log, and the
# device_check.sh tests phase under OUT_DIR/chk; prints a side-by-side table
# (fused ms and % of the read-W floor) and the tests' summary last.
set -u
bin=$1; out=$2; base=${3:-}
mkdir -p "$out"
shapes=${SHAPES:-4096x151936,4096x76032,8192x128256,8192x64128}
batches=${BATCHES:-1,2,4,8,16,32,64}
args=(--backend=cuda --shapes="$shapes" --batches="$batches" --iterations=200 --copy_mib=512)
: > "$out/bench.log"
run() {  # name binary extra-args...
  local name=$1 binary=$2; shift 2
  echo "==== $name" >> "$out/bench.log"
  timeout 200 "$binary" "${args[@]}" "$@" --json="$out/$name.json" >> "$out/bench.log" 2>&1
  echo "bench $name rc=$?"
}
[ -n "$base" ] && run base "$base"
run whole "$bin/flashsampler-kernel-bench" --tile_parts=9223372036854775807
run auto "$bin/flashsampler-kernel-bench"

# Side by side: DxV B, then fused_ms and fus%fl of each run.
awk '/^==== / {run=$2; next}
     /^[0-9]+x[0-9]+ / {key=$1" "$2; if (!(key in seen)) {seen[key]=1; order[n++]=key}
                        v[key, run]=$5" "$8}
     END {printf "%-18s %-16s %-16s %-16s\n", "DxV B", "base ms %fl", "whole ms %fl", "auto ms %fl";
          for (i = 0; i < n; i++) {k=order[i]; printf "%-18s %-16s %-16s %-16s\n", k,
            ((k, "base") in v ? v[k, "base"] : "-"), v[k, "whole"], v[k, "auto"]}}' "$out/bench.log"

bash "$(dirname "$0")/device_check.sh" "$bin" "$out/chk" tests | tail -20
# The new cut tests under the sanitizers (small cases: every forced cut).
filter='Cuts/TileCutTest.CudaCoresB2:Cuts/TileCutTest.TensorCoresB16:Cuts/TileCutTest.Fp32B3'
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/fused_sample_gpu_test" \
  --gtest_filter="$filter" > "$out/chk/sanitize_cuts.log" 2>&1
echo "memcheck cuts rc=$? $(grep -E 'ERROR SUMMARY' "$out/chk/sanitize_cuts.log" | tail -1)"
timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/fused_sample_gpu_test" \
  --gtest_filter='Cuts/TileCutTest.CudaCoresB2:Cuts/TileCutTest.TensorCoresB16' \
  >> "$out/chk/sanitize_cuts.log" 2>&1
echo "racecheck cuts rc=$? $(grep -E 'RACECHECK SUMMARY' "$out/chk/sanitize_cuts.log" | tail -1)"
