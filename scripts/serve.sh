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
# The server takes the last --address given; the CLI must talk to that one.
cli_address=$address
for arg in "$@"; do
  case "$arg" in --address=*) cli_address=${arg#--address=} ;; esac
done
cli_address=${cli_address/#0.0.0.0:/127.0.0.1:}
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
cli=(build/bin/flashsampler-cli --address="$cli_address")
# Loading real weights can take minutes: wait while the server runs, up to
# FLASHSAMPLER_READY_TIMEOUT_S (default 30 minutes).
ready_deadline=$((SECONDS + ${FLASHSAMPLER_READY_TIMEOUT_S:-1800}))
until "${cli[@]}" health >/dev/null 2>&1; do
  kill -0 $server 2>/dev/null || { echo "serve.sh: the server exited" >&2; wait $server; exit 1; }
  if [ $SECONDS -ge $ready_deadline ]; then
    echo "serve.sh: the server did not become ready within ${FLASHSAMPLER_READY_TIMEOUT_S:-1800} s" >&2
    exit 1
  fi
  sleep 0.1
done
echo "--- flashsampler-cli health";  "${cli[@]}" health
echo "--- flashsampler-cli info";    "${cli[@]}" info
echo "--- flashsampler-cli sample --rows=4 --temperature=0.8 --logz --logprobs"
"${cli[@]}" sample --rows=4 --temperature=0.8 --logz --logprobs
echo "--- serving on $cli_address; Ctrl-C stops the server"
wait $server
