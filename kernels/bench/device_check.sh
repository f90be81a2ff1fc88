#!/usr/bin/env bash
# One device-machine session of checks and timings for the CUDA kernels, run
# where binaries built elsewhere were unpacked (see kernels/cuda/NOTES-fused.md
# for how they travel):
#
#   device_check.sh BIN_DIR OUT_DIR PHASE...
#
# PHASE: info (GPU, SASS instruction counts of the stage-1 kernels), tests (all
# gpu-labelled test binaries, then compute-sanitizer memcheck on small cases),
# bench (flashsampler-kernel-bench, both shapes, B = 1..256), controls (the
# controlled materialized path and vLLM's sort-based filters), peers
# (kernels/bench/peers.py, needs PyTorch; PEERS=path to peers.py, PEERS_ARGS), verify
# (flashsampler-verify-bench + kernels/bench/verify_peers.py, VERIFY_ARGS), ncu (Nsight
# Compute on the stage-1 kernel at NCU_BATCHES and NCU_SHAPE, default D=4096 V=151936;
# NCU_KERNELS: a regex of kernel names, default every stage-1 kernel), shard_bench
# (flashsampler-kernel-bench --backend=cuda_sharded: 1 vs all visible GPUs,
# both issue shapes, B = 1..256, the summary exchange and the all-gather-logits
# baseline; SHARD_BENCH_ARGS; needs >= 2 GPUs and a build with NCCL; both
# exchanges, NCCL and peer), shard_controls (the same with --controls=all: the
# controlled launchers over the shards against one GPU; SHARD_CONTROLS_ARGS).
# The tests phase also runs the sharding tests (labels gpu, multi_gpu): their
# two-GPU cases are skipped on one GPU.
# Each phase appends to one log under OUT_DIR (the device tool returns at most
# 8 files); the last lines printed are a short summary.
set -u
bin=$1; out=$2; shift 2
mkdir -p "$out"
summary=()

for phase in "$@"; do
  case "$phase" in
    info)
      {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw \
          --format=csv
        # Per stage-1 kernel: tensor-core, ldmatrix, cp.async and local-memory
        # instruction counts in the SASS.
        cuobjdump -sass "$bin/fused_sample_gpu_test" | awk '
          /Function :/ { if (name != "") print name, h, l, g, ld, st, lg; name=$3; h=l=g=ld=st=lg=0 }
          /HMMA/ {h++} /LDSM/ {l++} /LDGSTS/ {g++} /LDL/ {ld++} /STL/ {st++} /LDG\.E\.128/ {lg++}
          END { print name, h, l, g, ld, st, lg }' |
          awk 'BEGIN{print "kernel HMMA LDSM LDGSTS LDL STL LDG.128"} /Tile|Convert|Merge|Gumbel/'
      } > "$out/info.txt" 2>&1
      summary+=("info: $(head -2 "$out/info.txt" | tail -1)")
      ;;
    tests)
      : > "$out/tests.log"
      # Every binary of the ctest label gpu (ctest -L gpu -N lists them).
      for t in fused_sample_gpu_test fused_sample_exactness_gpu_test fused_sample_sm90_gpu_test \
               materialized_sample_gpu_test logits_gemm_gpu_test hidden_states_gpu_test \
               draft_sample_gpu_test cuda_engine_gpu_test controlled_sample_gpu_test \
               cuda_engine_controls_gpu_test fused_controlled_sample_gpu_test sharded_sample_gpu_test \
               sharded_cuda_engine_gpu_test cuda_ipc_e2e_gpu_test \
               sharded_server_e2e_gpu_test; do
        if [ ! -x "$bin/$t" ]; then summary+=("test $t: not built"); continue; fi
        FLASHSAMPLER_SERVER_BIN="$bin/flashsampler-server" timeout 300 "$bin/$t" >> "$out/tests.log" 2>&1
        rc=$?
        summary+=("test $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/tests.log" | tail -1)")
      done
      # memcheck on small cases of both stage-1 paths (B = 3..257, D = 16 / 1024).
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/fused_sample_gpu_test" \
        --gtest_filter='Shapes/FusedSampleMmaTest.*D16*:Shapes/FusedSampleMmaTest.*B3_D1024*:FusedSampleTest.*' \
        >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("memcheck rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      # The sharded launcher's peer exchange with its shards on one GPU.
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/sharded_sample_gpu_test" \
        --gtest_filter='ShardedSampleTest.PeerExchange*:ShardedSampleTest.AllGatherWithout*' \
        >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("memcheck sharded peer rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      # The Hopper stage 1 with separate epilogue warps (persistent, named-barrier
      # hand-off of the dot tile): memcheck and racecheck at 1, 33, 100, 300,
      # 160 and 80 rows (cases 84-90 of the agreement test are that schedule's
      # bf16 cases of the first shape, index ((schedule 3 x 2 + dtype) x 2 +
      # shape) x 7 + batch; 300 and 160 rows load balanced chunks, 160 and 80
      # in 96-row boxes), and at 100, 300, 160 and 80 rows of the D = 8192
      # shape (94-97; 100 rows take the five-stage ring of plain sampling at
      # D >= 8192, 300 rows the four-stage one, 160 and 80 the 96-row boxes;
      # all four as tile pairs, 2-block clusters sharing Hr through TMA
      # multicast, whose last pair of 9 tiles has a phantom second tile), and
      # OneTile's pairs (one tile: every second block's items are phantoms).
      # In these cases each block folds at most one item. Where a block folds
      # several, racecheck reports the dot-tile hand-off between the MMA and
      # epilogue warps (a named-barrier arrive on one side, a sync on the
      # other) as hazards; the PTX ISA has the arrive order the arriving
      # threads' earlier accesses, and the bit-exact multi-item tests pass,
      # so we read those as false positives (NOTES-fused.md v36).
      if [ -x "$bin/fused_sample_sm90_gpu_test" ]; then
        a='Shapes/FusedSampleSm90Agreement.MatchesFloat64AndMmaSync'
        sep="$a/84:$a/86:$a/87:$a/88:$a/89:$a/90:$a/94:$a/95:$a/96:$a/97:OneTile/FusedSampleSm90Agreement.*"
        for tool in memcheck racecheck; do
          timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$bin/fused_sample_sm90_gpu_test" \
            --gtest_filter="$sep" >> "$out/tests.log" 2>&1
          rc=$?
          summary+=("$tool sm90 separate epilogue rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/tests.log" | tail -1)")
        done
      fi
      # The cross-tile bound (global atomics on the rows' keys) on a 151936-token
      # head at 160 rows with log Z and drafts: two-blocks-per-SM (case 3) and
      # separate epilogue warps (case 15; index (schedule x 3 + batch) x 2 + lse).
      if [ -x "$bin/fused_sample_sm90_gpu_test" ]; then
        b='Schedules/FusedSampleSm90CrossTileBound.RowsExactAndLaterTilesPruned'
        timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/fused_sample_sm90_gpu_test" \
          --gtest_filter="$b/3:$b/15" >> "$out/tests.log" 2>&1
        rc=$?
        summary+=("memcheck sm90 cross-tile bound rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      fi
      # Draft rows (speculative verification) on every launch path, small shapes.
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/draft_sample_gpu_test" \
        --gtest_filter='Paths/DraftRowsTest.*:DraftArgsTest.*' >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("memcheck draft rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      # The controlled path: memcheck on small cases (chunks, ties, a masked
      # row), racecheck (shared-memory histograms and broadcasts) on a small one.
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/controlled_sample_gpu_test" \
        --gtest_filter='ControlledSampleTest.TopK*:ControlledSampleTest.Row*:ControlledSampleTest.Neutral*:ControlledSampleTest.MatchesTheCpuBackendAcrossChunks' \
        >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("memcheck controlled rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      timeout 300 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/controlled_sample_gpu_test" \
        --gtest_filter='ControlledSampleTest.RowWithEveryTokenMaskedReportsItsStatus' \
        >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("racecheck controlled rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/tests.log" | tail -1)")
      # The fused controlled stage 1 with the tile-head bound (global atomics
      # on the slots, 2048 tiles, mma.sync and both WGMMA choices).
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/fused_controlled_sample_gpu_test" \
        --gtest_filter='FusedControlledSampleTest.TilesStopAtTheTileHeadBound' >> "$out/tests.log" 2>&1
      rc=$?
      summary+=("memcheck fused controlled rc=$rc $(grep -E 'ERROR SUMMARY' "$out/tests.log" | tail -1)")
      ;;
    bench)
      # BENCH_TAG names the output files (bench${BENCH_TAG}.log / .json).
      timeout 400 "$bin/flashsampler-kernel-bench" --backend=cuda \
        --json="$out/bench${BENCH_TAG:-}.json" ${BENCH_ARGS:-} > "$out/bench${BENCH_TAG:-}.log" 2>&1
      summary+=("bench${BENCH_TAG:-} rc=$?")
      ;;
    verify)
      # The speculative-verification step: flashsampler-verify-bench, then the
      # PyTorch materialized baseline (kernels/bench/verify_peers.py) on the same shapes.
      timeout 300 "$bin/flashsampler-verify-bench" --json="$out/verify.json" ${VERIFY_ARGS:-} \
        > "$out/verify.log" 2>&1
      summary+=("verify rc=$?")
      PYTHONUNBUFFERED=1 timeout 300 python3 kernels/bench/verify_peers.py \
        --json="$out/verify_peers.json" ${VERIFY_ARGS:-} > "$out/verify_peers.log" 2>&1
      summary+=("verify_peers rc=$?")
      ;;
    controls)
      # The materialized controlled path (flashsampler-kernel-bench --controls)
      # and vLLM's sort-based filters (peers.py --controls), D=4096 V=151936.
      timeout 300 "$bin/flashsampler-kernel-bench" --backend=cuda --controls=all \
        --shapes=4096x151936 --batches=1,2,4,8,16,32,64,128,256 \
        --json="$out/bench_controls.json" > "$out/bench_controls.log" 2>&1
      summary+=("bench_controls rc=$?")
      PYTHONUNBUFFERED=1 timeout 300 python3 "${PEERS:-kernels/bench/peers.py}" --controls=all \
        --shapes=4096x151936 --batches=1,2,4,8,16,32,64,128,256 \
        --json="$out/peers_controls.json" > "$out/peers_controls.log" 2>&1
      summary+=("peers_controls rc=$?")
      ;;
    shard_bench)
      timeout 500 "$bin/flashsampler-kernel-bench" --backend=cuda_sharded \
        --json="$out/shard_bench.json" ${SHARD_BENCH_ARGS:-} > "$out/shard_bench.log" 2>&1
      summary+=("shard_bench rc=$?")
      ;;
    shard_controls)
      timeout 500 "$bin/flashsampler-kernel-bench" --backend=cuda_sharded --controls=all \
        --batches=1,4,16,64,128 --json="$out/shard_controls.json" ${SHARD_CONTROLS_ARGS:-} \
        > "$out/shard_controls.log" 2>&1
      summary+=("shard_controls rc=$?")
      ;;
    peers)
      PYTHONUNBUFFERED=1 timeout 420 python3 "${PEERS:-kernels/bench/peers.py}" \
        --json="$out/peers.json" ${PEERS_ARGS:-} > "$out/peers.log" 2>&1
      summary+=("peers rc=$?")
      ;;
    ncu)
      touch "$out/ncu.txt"
      for b in ${NCU_BATCHES:-1 16 64 256}; do
        echo "==== B=$b" >> "$out/ncu.txt"
        timeout 200 ncu --clock-control none -k regex:"${NCU_KERNELS:-MmaTileKernel|FusedSampleTileKernel|Wgmma[A-Za-z]*Kernel}" \
          --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section LaunchStats --section SchedulerStats \
          --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
          "$bin/flashsampler-kernel-bench" --backend=cuda --shapes="${NCU_SHAPE:-4096x151936}" --batches="$b" \
          --iterations=100 --warmup=1 --copy_mib=256 >> "$out/ncu.txt" 2>&1
        summary+=("ncu B=$b rc=$?")
      done
      ;;
  esac
done
for f in "$out"/bench*.log "$out"/shard_bench.log "$out"/shard_controls.log; do [ -f "$f" ] && grep -E '^[0-9]+x[0-9]+ ' "$f"; done
printf '%s\n' "${summary[@]}"
