#!/usr/bin/env bash
# Where a single request's time goes (issue 5's 1-in-flight target): the
# server on the CUDA backend (D=4096, V=151936 bf16 demo head), one closed-loop
# client with 1 request in flight for DURATION_S seconds, then the server's
# own histograms scraped and averaged over exactly those requests:
#   client     the load generator's latency (send -> answer), mean and p50
#   request    flashsampler_request_duration_seconds{method="Sample"}: the
#              handler's receipt of the parsed request -> its answer
#   queue      flashsampler_queue_duration_seconds: Submit -> launch start
#   compute    flashsampler_compute_duration_seconds: Engine::Sample (copies,
#              kernels, synchronisation)
# client - request = gRPC both ways and the client; request - queue - compute =
# parsing, hand-offs to the worker and to the completion pool, the response.
#
#   loadtest/gpu_latency_breakdown.sh BIN_DIR OUT_DIR [extra server flags...]
#
# TRANSPORT=tcp (default: loopback TCP) or uds (a Unix domain socket in
# OUT_DIR, as a client on the same host would use).
set -u
bin=$1; out=$2; shift 2
mkdir -p "$out"
case "${TRANSPORT:-tcp}" in
  tcp) listen=127.0.0.1:0 ;;
  uds) listen="unix:$(cd "$out" && pwd)/sampler.sock"; rm -f "${listen#unix:}" ;;
  *) echo "TRANSPORT must be tcp or uds" >&2; exit 2 ;;
esac
"$bin/flashsampler-server" --address="$listen" --backend="${BACKEND:-cuda}" \
  --demo_vocab="${DEMO_VOCAB:-151936}" --demo_hidden="${DEMO_HIDDEN:-4096}" \
  --max_queue_delay_us=0 --metrics_address=127.0.0.1:0 "$@" \
  > "$out/server.out" 2> "$out/server.err" &
server=$!
for _ in $(seq 600); do
  grep -q "serving on the" "$out/server.err" 2>/dev/null && break
  kill -0 $server 2>/dev/null || break
  sleep 0.2
done
address=$(sed -n 's/.*server listening on \(.*\)$/\1/p' "$out/server.out")
metrics=$(sed -n 's/.*metrics on \([^/]*\)\/metrics$/\1/p' "$out/server.out")
scrape() {
  python3 - "$metrics" <<'PY'
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode())
PY
}
# Warm-up requests count in the histograms too: scrape before and after and
# take the difference.
"$bin/flashsampler-load" --address="$address" --mode="${MODE:-unary}" --rows=1 --channels=1 \
  --warmup_s=0 --duration_s=1 --timeout_s=10 --concurrency=1 > /dev/null 2>&1
scrape > "$out/metrics_before.txt"
"$bin/flashsampler-load" --address="$address" --mode="${MODE:-unary}" --rows=1 --channels=1 \
  --warmup_s=0 --duration_s="${DURATION_S:-5}" --timeout_s=10 --concurrency=1 \
  --json_out="$out/closed.json" > "$out/closed.log" 2>&1
scrape > "$out/metrics_after.txt"
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
def read(path):
    vals = {}
    for line in open(path):
        m = re.match(r'^(flashsampler_(?:request|queue|compute)_duration_seconds_(?:sum|count))(\{[^}]*\})? (\S+)$', line)
        if m and (m.group(2) is None or 'method="Sample"' in m.group(2)):
            vals[m.group(1)] = float(m.group(3))
    return vals
a, b = read(f"{out}/metrics_before.txt"), read(f"{out}/metrics_after.txt")
def mean_us(name):
    n = b[name + "_count"] - a[name + "_count"]
    return 1e6 * (b[name + "_sum"] - a[name + "_sum"]) / n if n else float("nan"), n
r = json.load(open(f"{out}/closed.json"))
lat = (r["steps"] if "steps" in r else r)[0]["latency_us"]
req, n = mean_us("flashsampler_request_duration_seconds")
q, _ = mean_us("flashsampler_queue_duration_seconds")
c, _ = mean_us("flashsampler_compute_duration_seconds")
print(f"requests {n:.0f}: client mean {lat['mean']:.1f} us (p50 {lat['p50']:.1f}); server request {req:.1f}; "
      f"queue {q:.1f}; compute {c:.1f}; request - queue - compute {req - q - c:.1f}; "
      f"client - request {lat['mean'] - req:.1f}")
PY
kill -TERM $server; wait $server; echo "server exit $?"
