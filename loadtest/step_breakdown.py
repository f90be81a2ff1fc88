"""Where a request's time goes, per case, from the server's own metrics.

Starts flashsampler-server (by default the CUDA backend with the demo head
D=4096 V=151936 bf16) and, for each case (transport, rows per request, requests
in flight, unary or stream), drives it with flashsampler-load; prints the
client's p50 next to the server's own means over the same run, from /metrics
deltas: request (admitted to answered, parse included), queue wait, compute
(the engine call: staging, transfers and the kernel), the mean rows per
launch, and the server's CPU per answered request (/proc/PID/stat).

    python3 loadtest/step_breakdown.py BIN_DIR OUT_DIR
    python3 loadtest/step_breakdown.py BIN_DIR OUT_DIR \\
        --server_args="--backend=cpu --demo_vocab=128 --demo_hidden=4096 --threads=1" \\
        --cases=grpc:1:1:stream,grpc:1:64:stream,grpc:1:1:unary,grpc:1:64:unary

Standard library only (it runs on the GPU machine).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import time
import urllib.request

# Same folder: the server start and readiness wait, the transports' load flags.
from boundary_bench import load_transport, start

parser = argparse.ArgumentParser()
parser.add_argument("bin_dir")
parser.add_argument("out")
parser.add_argument("--server_args", default="--backend=cuda --demo_vocab=151936 --demo_hidden=4096 "
                                             "--max_request_rows=1024")
parser.add_argument("--cases", default="grpc:64:1:stream,grpc:256:1:stream,shm:64:1:stream,shm:256:1:stream,"
                                       "cuda_ipc:64:1:stream,cuda_ipc:256:1:stream",
                    help="comma-separated transport:rows:in_flight:mode; transport as "
                         "boundary_bench.py's --transports (local_cuda_ipc+poll, ...)")
parser.add_argument("--local_busy_poll_us", type=int, default=5000)
parser.add_argument("--duration_s", type=float, default=2.0)
parser.add_argument("--warmup_s", type=float, default=0.5)
parser.add_argument("--tag", default="", help="prefix of the printed lines and the JSON files")
args = parser.parse_args()
os.makedirs(args.out, exist_ok=True)
TICKS = os.sysconf("SC_CLK_TCK")
LOCAL_SOCKET = os.path.join(args.out, "flashsampler.sock")
srv, addr, maddr = start(f"server{args.tag}", [f"{args.bin_dir}/flashsampler-server", "--address=127.0.0.1:0",
                                              "--metrics_address=127.0.0.1:0", f"--local_socket={LOCAL_SOCKET}"]
                         + shlex.split(args.server_args),
                         args.out, ready="serving on the")


def scrape():
    text = urllib.request.urlopen(f"http://{maddr}/metrics").read().decode()
    agg = {}
    for line in text.splitlines():
        m = re.match(r"flashsampler_(request|queue|compute)_duration_seconds_(sum|count)(\{[^}]*\})? (\S+)", line)
        if m: agg[(m.group(1), m.group(2))] = agg.get((m.group(1), m.group(2)), 0.0) + float(m.group(4))
        m = re.match(r"flashsampler_batch_rows_(sum|count)(\{[^}]*\})? (\S+)", line)
        if m: agg[("batch_rows", m.group(1))] = agg.get(("batch_rows", m.group(1)), 0.0) + float(m.group(3))
    return agg


def server_cpu_s():
    with open(f"/proc/{srv.pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / TICKS


results = []
for case in args.cases.split(","):
    transport, rows, in_flight, mode = case.split(":")
    tag = f"{args.tag}{transport}-{rows}-c{in_flight}-{mode}"
    transport, local = load_transport(transport, LOCAL_SOCKET, args.local_busy_poll_us)
    before, cpu0, t0 = scrape(), server_cpu_s(), time.monotonic()
    subprocess.run([f"{args.bin_dir}/flashsampler-load", f"--address={addr}", f"--mode={mode}",
                    f"--concurrency={in_flight}", f"--rows={rows}", "--dtype=bf16",
                    f"--channels={min(int(in_flight), 8)}", f"--warmup_s={args.warmup_s:g}",
                    f"--duration_s={args.duration_s:g}", f"--transport={transport}",
                    f"--json_out={args.out}/{tag}.json"] + local, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after, cpu1 = scrape(), server_cpu_s()
    step = json.load(open(f"{args.out}/{tag}.json"))["steps"][0]
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    mean = lambda k: d.get((k, "sum"), 0) / max(1, d.get((k, "count"), 0))
    answered = d.get(("request", "count"), 0)
    r = {"case": case, "client_p50_ms": step["latency_us"]["p50"] / 1000, "rps": step["achieved_rps"],
         "request_ms": 1000 * mean("request"), "queue_ms": 1000 * mean("queue"),
         "compute_ms": 1000 * mean("compute"), "rows_per_launch": mean("batch_rows"),
         "server_cpu_us_per_req": 1e6 * (cpu1 - cpu0) / max(1, answered),
         "server_cores": (cpu1 - cpu0) / (time.monotonic() - t0), "errors": step["errors"]}
    results.append(r)
    print(f"{args.tag}{case:24s} client p50 {r['client_p50_ms']:.3f} ms {r['rps']:9.0f} req/s | server means: "
          f"request {r['request_ms']:.3f}, queue {r['queue_ms']:.3f}, compute (engine call) {r['compute_ms']:.3f} ms, "
          f"{r['rows_per_launch']:.1f} rows/launch, CPU {r['server_cpu_us_per_req']:.0f} us/req "
          f"({r['server_cores']:.2f} cores incl. warm-up)"
          + (f"; WARNING: requests failed {r['errors']}, the p50 is of the answered ones" if r["errors"] else ""),
          flush=True)
json.dump({"server_args": args.server_args, "results": results},
          open(os.path.join(args.out, f"{args.tag}breakdown.json"), "w"), indent=1)
srv.terminate(); srv.wait()
