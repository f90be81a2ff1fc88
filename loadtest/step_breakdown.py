"""Where a decode step's time goes, per transport and row count.

Starts flashsampler-server (CUDA backend, demo head D=4096 V=151936 bf16) and,
for grpc, shm and cuda_ipc at 64 and 256 rows, one SampleStream with one
request in flight (flashsampler-load); prints the client's p50 next to the
server's own means over the same run, from /metrics deltas: request (admitted
to answered, parse included), queue wait, and compute (the engine call:
staging, transfers and the kernel).

    python3 loadtest/step_breakdown.py BIN_DIR OUT_DIR

Standard library only (it runs on the GPU machine).
"""
import json
import os
import re
import subprocess
import sys
import urllib.request

from boundary_bench import start  # same folder: the server start and readiness wait

bin_dir, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
srv, addr, maddr = start("server", [f"{bin_dir}/flashsampler-server", "--address=127.0.0.1:0", "--backend=cuda",
                                    "--demo_vocab=151936", "--demo_hidden=4096", "--max_request_rows=1024",
                                    "--metrics_address=127.0.0.1:0"], out, ready="serving on the")


def scrape():
    text = urllib.request.urlopen(f"http://{maddr}/metrics").read().decode()
    agg = {}
    for line in text.splitlines():
        m = re.match(r"(flashsampler_(request|queue|compute)_duration_seconds)_(sum|count)(\{[^}]*\})? (\S+)", line)
        if m: agg[(m.group(2), m.group(3))] = agg.get((m.group(2), m.group(3)), 0.0) + float(m.group(5))
    return agg
for t in ("grpc", "shm", "cuda_ipc"):
    for rows in (64, 256):
        before = scrape()
        subprocess.run([f"{bin_dir}/flashsampler-load", f"--address={addr}", "--mode=stream", "--concurrency=1",
                        f"--rows={rows}", "--dtype=bf16", "--channels=1", "--warmup_s=0.5", "--duration_s=2",
                        f"--transport={t}", f"--json_out={out}/{t}-{rows}.json"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = scrape()
        p50 = json.load(open(f"{out}/{t}-{rows}.json"))["steps"][0]["latency_us"]["p50"] / 1000
        means = {k: 1000 * (after.get((k, "sum"), 0) - before.get((k, "sum"), 0)) /
                 max(1, after.get((k, "count"), 0) - before.get((k, "count"), 0)) for k in ("request", "queue", "compute")}
        print(f"{t:8s} rows={rows:3d}  client p50 {p50:.3f} ms | server means: request {means['request']:.3f}, "
              f"queue {means['queue']:.3f}, compute (engine call) {means['compute']:.3f} ms", flush=True)
srv.terminate(); srv.wait()
