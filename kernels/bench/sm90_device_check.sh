#!/usr/bin/env bash
# One device-machine session for the Hopper WGMMA stage 1 (issue 22,
# kernels/cuda/fused_sample_sm90.cu), run where binaries built elsewhere were
# unpacked (kernels/cuda/NOTES-fused.md says how they travel):
#
#   sm90_device_check.sh BIN_DIR OUT_DIR
#
# BIN_DIR must hold fused_sample_sm90_gpu_test, fused_sample_exactness_gpu_test,
# fused_sample_gpu_test and flashsampler-kernel-bench (a build with
# FLASHSAMPLER_CUTLASS, sm_90a), with their libraries on LD_LIBRARY_PATH.
# Steps, each logged under OUT_DIR, a compact summary printed last:
#   1. nvidia-smi, and the SASS of the WGMMA kernels (HGMMA, UTMALDG, local
#      memory instruction counts);
#   2. fused_sample_sm90_gpu_test (agreement with float64 and mma.sync, batch
#      invariance, chi-square, refusals), then the existing tensor-core tests
#      (the shared stage-1 helpers moved: fused_sample_gpu_test and
#      fused_sample_exactness_gpu_test must still pass);
#   3. compute-sanitizer memcheck and racecheck of the WGMMA path on small
#      shapes (D = 4096, V = 1100: batches 7 and 300, and the refusals);
#   4. flashsampler-kernel-bench, D=4096 V=151936 bf16, B = 1, 16, 32, 64, 128,
#      256, 512, 1024, once with --stage1=mma_sync and once with --stage1=wgmma
#      (each run also times cuBLAS GEMM-only, the `gemm_ms` column, and the
#      materialized path, in the same process). BENCH_ITERATIONS (default 100).
set -u
bin=$1; out=$2
mkdir -p "$out"
summary=()

# ---- 1. Device and SASS
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw \
    --format=csv
  echo "kernel HGMMA UTMALDG LDL STL"
  cuobjdump -sass "$bin/fused_sample_sm90_gpu_test" | awk '
    /Function :/ { if (name != "" && name ~ /Wgmma/) print name, h, t, ld, st; name=$3; h=t=ld=st=0 }
    /HGMMA/ {h++} /UTMALDG/ {t++} /LDL/ {ld++} /STL/ {st++}
    END { if (name ~ /Wgmma/) print name, h, t, ld, st }'
} > "$out/info.txt" 2>&1
summary+=("device: $(sed -n 2p "$out/info.txt")")

# ---- 2. Tests
: > "$out/tests.log"
for t in fused_sample_sm90_gpu_test fused_sample_gpu_test fused_sample_exactness_gpu_test; do
  if [ ! -x "$bin/$t" ]; then summary+=("test $t: not in $bin"); continue; fi
  echo "==== $t" >> "$out/tests.log"
  timeout 600 "$bin/$t" >> "$out/tests.log" 2>&1
  rc=$?
  summary+=("test $t rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \]' "$out/tests.log" | tail -1)")
done
grep -E '^\[ info \]|^\[  FAILED  \]' "$out/tests.log" | sort | uniq -c | head -40 > "$out/tests_digest.txt"

# ---- 3. Sanitizers (small shapes). Test indices of the agreement suite:
# ((dtype * 2 + shape) * 5 + batch index): /1 = bf16, D 4096, B 7 (32-row
# blocks); /4 = bf16, D 4096, B 300 (two 256-row chunks).
small='Shapes/FusedSampleSm90Agreement.MatchesFloat64AndMmaSync/1:Shapes/FusedSampleSm90Agreement.MatchesFloat64AndMmaSync/4:FusedSampleSm90Test.*'
for tool in memcheck racecheck; do
  echo "==== compute-sanitizer --tool $tool" >> "$out/sanitizers.log"
  timeout 900 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$bin/fused_sample_sm90_gpu_test" --gtest_filter="$small" >> "$out/sanitizers.log" 2>&1
  rc=$?
  summary+=("$tool rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizers.log" | tail -1)")
done

# ---- 4. Kernel bench, both tensor-core stage 1s
iters=${BENCH_ITERATIONS:-100}
for s in mma_sync wgmma; do
  timeout 900 "$bin/flashsampler-kernel-bench" --backend=cuda --shapes=4096x151936 \
    --batches=1,16,32,64,128,256,512,1024 --iterations="$iters" --stage1="$s" \
    --json="$out/bench_$s.json" > "$out/bench_$s.txt" 2>&1
  rc=$?
  summary+=("bench --stage1=$s rc=$rc")
done

# ---- Summary: fused (per stage 1) and cuBLAS GEMM-only medians per B.
echo
echo "==== sm90 device check summary"
printf '%s\n' "${summary[@]}"
echo
echo "D=4096 V=151936 bf16, medians in ms (gemm = cuBLAS GEMM-only from the wgmma run)"
printf '%6s %10s %10s %10s %12s %12s\n' B mma_sync wgmma gemm wgmma/mma wgmma/gemm
join <(awk '$1 ~ /^4096x151936$/ {print $2, $5}' "$out/bench_mma_sync.txt" | sort -k1,1) \
     <(awk '$1 ~ /^4096x151936$/ {print $2, $5, $6}' "$out/bench_wgmma.txt" | sort -k1,1) |
  sort -n | awk '{ printf "%6s %10.3f %10.3f %10.3f %12.3f %12.3f\n", $1, $2, $3, $4, $3/$2, $3/$4 }'
echo
echo "agree columns (fused vs materialized tokens) of the wgmma run:"
awk '$1 ~ /^4096x151936$/ {print "  B=" $2, $NF}' "$out/bench_wgmma.txt"
