#!/usr/bin/env bash
# A/B of two server builds under the same load, alternating so that drift of
# the machine hits both: for each round, each build in turn serves a closed
# loop at 1 and 64 requests in flight (1-row unary requests, D=4096,
# V=151936 bf16 demo head, CUDA backend). Each device call may land on
# another machine, so only an A/B inside one call compares builds.
#
#   loadtest/gpu_serving_ab.sh A_BIN_DIR B_BIN_DIR OUT_DIR [ROUNDS]
# (each BIN_DIR holds flashsampler-server; A_BIN_DIR also flashsampler-load)
set -u
a=$1; b=$2; out=$3; rounds=${4:-2}
mkdir -p "$out"
for round in $(seq "$rounds"); do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    d="$out/$side$round"; mkdir -p "$d"
    "$bin/flashsampler-server" --address=127.0.0.1:0 --backend=cuda --demo_vocab=151936 \
      --demo_hidden=4096 --max_batch_rows=256 --max_request_rows=64 --max_queue_rows=256 \
      > "$d/server.out" 2> "$d/server.err" &
    server=$!
    for _ in $(seq 600); do
      grep -q "serving on the" "$d/server.err" 2>/dev/null && break
      kill -0 $server 2>/dev/null || break
      sleep 0.2
    done
    address=$(sed -n 's/.*server listening on \(.*\)$/\1/p' "$d/server.out")
    "$a/flashsampler-load" --address="$address" --rows=1 --channels=8 --warmup_s=1 --duration_s=5 \
      --timeout_s=10 --concurrency=1,64 --json_out="$d/closed.json" > "$d/closed.log" 2>&1
    echo "== $side ($bin) round $round"
    grep -E "^(1|64) " "$d/closed.log"
    kill -TERM $server; wait $server
  done
done
