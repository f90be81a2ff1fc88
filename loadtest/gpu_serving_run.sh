#!/usr/bin/env bash
# Issue-5 serving figures on a GPU machine: flashsampler-server on the CUDA
# backend with a D=4096, V=151936 bf16 demo head, driven over loopback by
# flashsampler-load with 1-row requests:
#   1. closed loop at 1 and 64 requests in flight;
#   2. open loop at 2x the capacity measured in step 1 (constant rate).
#
#   loadtest/gpu_serving_run.sh BIN_DIR OUT_DIR
#
# MODE=stream drives SampleStream instead of unary Sample calls. ROWS (default
# 1) rows per request. FLOOR_BIN=path/to/grpc-floor-server adds the anchor:
# the floor server (../shared/peers/grpc-floor: no queue, no compute) driven
# at the same offered rate, so the open loop's latency can be read against
# what the transport and this load generator do at that rate on this host.
#
# FS_ARGS: more flashsampler-server flags (e.g. --cuda_upload_min_bytes=0).
#
# The server's queue is bounded (--max_queue_rows) so that overload is refused
# with RESOURCE_EXHAUSTED instead of queueing without bound. Prints a short
# summary last; JSON reports go to OUT_DIR.
set -u
bin=$1; out=$2
mkdir -p "$out"
"$bin/flashsampler-server" --address=127.0.0.1:0 --backend=cuda --demo_vocab=151936 \
  --demo_hidden=4096 --max_batch_rows=256 --max_request_rows=64 \
  --max_queue_rows="${MAX_QUEUE_ROWS:-256}" \
  --max_queue_delay_us="${QUEUE_DELAY_US:-0}" --completion_threads="${COMPLETION_THREADS:-4}" \
  --metrics_address=127.0.0.1:0 ${FS_ARGS:-} \
  > "$out/server.out" 2> "$out/server.err" &
server=$!
for _ in $(seq 600); do
  grep -q "serving on the" "$out/server.err" 2>/dev/null && break
  kill -0 $server 2>/dev/null || break
  sleep 0.2
done
address=$(sed -n 's/.*server listening on \(.*\)$/\1/p' "$out/server.out")
metrics=$(sed -n 's/.*metrics on \([^/]*\)\/metrics$/\1/p' "$out/server.out")
echo "server at $address, metrics at $metrics"
tail -2 "$out/server.err"
rows=${ROWS:-1}
load=("$bin/flashsampler-load" --address="$address" --mode="${MODE:-unary}" --rows="$rows" --channels=8 --warmup_s=1
      --duration_s="${DURATION_S:-5}" --timeout_s=10)
"${load[@]}" --concurrency=1,64 --json_out="$out/closed.json" > "$out/closed.log" 2>&1
cat "$out/closed.log" | tail -8
capacity=$(python3 -c "
import json; r=json.load(open('$out/closed.json'))
steps=r['steps'] if 'steps' in r else r
best=max(s.get('achieved_rate', s.get('achieved_rps', 0)) for s in steps)
print(int(best))")
echo "capacity (best closed-loop rate) = $capacity req/s; open loop at $((2 * capacity))"
"${load[@]}" --rate=$((2 * capacity)) --max_in_flight=100000 --json_out="$out/open.json" \
  > "$out/open.log" 2>&1
tail -8 "$out/open.log"
python3 - "$metrics" > "$out/metrics.txt" <<'PY'
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode())
PY
grep -E "^flashsampler_(batch_rows_(sum|count)|requests_total|device_memory)" "$out/metrics.txt" | head -20
kill -TERM $server; wait $server; echo "server exit $?"
if [ -n "${FLOOR_BIN:-}" ]; then
  "$FLOOR_BIN" --address=127.0.0.1:0 --hidden=4096 --vocab=151936 --max_rows=64 \
    > "$out/floor.out" 2> "$out/floor.err" &
  floor=$!
  for _ in $(seq 100); do grep -q "listening on" "$out/floor.out" 2>/dev/null && break; sleep 0.1; done
  floor_address=$(sed -n 's/^grpc-floor listening on \(.*\)$/\1/p' "$out/floor.out")
  echo "floor at $floor_address: open loop at $((2 * capacity)) req/s (our 2 x capacity)"
  floor_load=("${load[@]}")
  floor_load[1]=--address="$floor_address"
  "${floor_load[@]}" --rate=$((2 * capacity)) --max_in_flight=100000 --json_out="$out/floor_open.json" \
    > "$out/floor_open.log" 2>&1
  tail -8 "$out/floor_open.log"
  kill -TERM $floor; wait $floor
fi
