#!/usr/bin/env bash
# The README's serve command: builds flashsampler-server and flashsampler-cli,
# starts the server on its embedded default (demo LM head; CUDA when present,
# else CPU), shows a real round trip with the CLI, then keeps serving until
# Ctrl-C (SIGINT drains in-flight requests and exits 0).
#   scripts/serve.sh [server flags...]     e.g. --weights=/models/llama --address=0.0.0.0:50051
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target flashsampler-server flashsampler-cli
address=127.0.0.1:${FLASHSAMPLER_PORT:-50051}
# In a session of its own, so that a terminal's Ctrl-C reaches this script
# alone: the server gets exactly one SIGINT, from stop_server. (A second
# signal during its drain would end it at once, undrained.)
setsid build/bin/flashsampler-server --address="$address" "$@" &
server=$!
status=0
stop_server() {  # one SIGINT: the server drains in-flight requests, then exits
  kill -INT $server 2>/dev/null || true
  wait $server || status=$?
}
# However this script ends (Ctrl-C, a failing step), the server is drained and
# stopped; on Ctrl-C or SIGTERM the script exits with the server's status.
trap 'stop_server' EXIT
trap 'trap - EXIT; stop_server; exit $status' INT TERM
cli=(build/bin/flashsampler-cli --address="$address")
for _ in $(seq 1 600); do
  if "${cli[@]}" health >/dev/null 2>&1; then break; fi
  kill -0 $server 2>/dev/null || { echo "serve.sh: the server exited" >&2; wait $server; exit 1; }
  sleep 0.1
done
echo "--- flashsampler-cli health";  "${cli[@]}" health
echo "--- flashsampler-cli info";    "${cli[@]}" info
echo "--- flashsampler-cli sample --rows=4 --temperature=0.8 --logz --logprobs"
"${cli[@]}" sample --rows=4 --temperature=0.8 --logz --logprobs
echo "--- serving on $address; Ctrl-C stops the server"
wait $server
