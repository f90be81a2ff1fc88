"""What a decode step costs an engine at the service boundary, against its anchors.

Runs, in one process on one machine, interleaved so that all see the same
machine:
  floor   the smallest correct gRPC server of our proto (../shared/peers/grpc-floor),
          answering token 0 with no compute: what moving the bytes through gRPC costs;
  ours    flashsampler-server (default: CUDA backend, demo head D=4096 V=151936 bf16);
  kernel  flashsampler-kernel-bench on the same shape: the served kernel path
          alone (fused up to --cuda_fused_max_rows = 128 rows, materialized above).
Per rows-per-request R: closed loop, one SampleStream, one request in flight
(a decode step), median of REPS runs of flashsampler-load's p50 and p99. Then
throughput: STREAMS streams of THROUGHPUT_ROWS rows each, rows/s, against the
kernel's rows/s at the batch the batcher forms (min(STREAMS x rows, 256)).

Prints a table (ours - floor - kernel is what the server itself adds; issue
target <= 0.10 ms) and writes boundary.json; loadtest/plot_boundary.py draws it.

    python3 loadtest/boundary_bench.py --floor_bin=... --server_bin=... \
        --load_bin=... --kernel_bench_bin=... --out=DIR [--rows=16,64,256]

Standard library only (it runs on the GPU machine).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time


def start(name, cmd, out, ready=None):
    """Starts a server; returns (process, address) once it listens (and, if
    `ready` is given, once that text is in its stderr log)."""
    log_path = os.path.join(out, f"{name}.log")
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    address = None
    for line in p.stdout:
        m = re.search(r"listening on (\S+)", line)
        if m:
            address = m.group(1)
            break
    if address is None:
        sys.exit(f"{name} did not start; see {log_path}")
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    deadline = time.time() + 600  # a CUDA head upload takes seconds
    while ready and ready not in open(log_path).read():
        if p.poll() is not None or time.time() > deadline:
            sys.exit(f"{name} did not become ready; see {log_path}")
        time.sleep(0.1)  # poll interval of the bounded readiness wait
    return p, address


def load(args, address, rows, concurrency, tag):
    path = os.path.join(args.out, f"{tag}.json")
    cmd = [args.load_bin, f"--address={address}", "--mode=stream", f"--concurrency={concurrency}",
           f"--rows={rows}", "--dtype=bf16", f"--channels={min(concurrency, 8)}",
           f"--warmup_s={args.warmup_s}", f"--duration_s={args.duration_s}", "--timeout_s=30",
           f"--json_out={path}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    step = json.load(open(path))["steps"][0]
    return {"p50_ms": step["latency_us"]["p50"] / 1e3, "p99_ms": step["latency_us"]["p99"] / 1e3,
            "rps": step["achieved_rps"], "errors": step["errors"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floor_bin", required=True)
    ap.add_argument("--server_bin", required=True)
    ap.add_argument("--load_bin", required=True)
    ap.add_argument("--kernel_bench_bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16,64,256")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--server_args", default="--backend=cuda",
                    help="extra flashsampler-server flags (space-separated)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration_s", type=float, default=3)
    ap.add_argument("--warmup_s", type=float, default=1)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--throughput_rows", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    batch_formed = min(args.streams * args.throughput_rows, 256)

    kernel_json = os.path.join(args.out, "kernel.json")
    batches = sorted(set(rows_list + [batch_formed]))
    subprocess.run([args.kernel_bench_bin, "--backend=cuda", f"--shapes={args.hidden}x{args.vocab}",
                    "--batches=" + ",".join(map(str, batches)), f"--json={kernel_json}"],
                   check=True, stdout=open(os.path.join(args.out, "kernel.txt"), "w"))
    kernel_runs = json.load(open(kernel_json))
    kernel = {}
    for r in kernel_runs["results"]:
        served = r["fused"] if r["batch"] <= 128 else r["materialized"]
        kernel[r["batch"]] = served["median_ms"]

    servers = {
        "floor": start("floor", [args.floor_bin, "--address=127.0.0.1:0", f"--hidden={args.hidden}",
                                 f"--vocab={args.vocab}", "--max_rows=1024"], args.out),
        "ours": start("ours", [args.server_bin, "--address=127.0.0.1:0", f"--demo_vocab={args.vocab}",
                               f"--demo_hidden={args.hidden}", "--max_request_rows=1024"]
                      + args.server_args.split(), args.out, ready="serving on the"),
    }
    results = {"info": {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "nproc": os.cpu_count(), "device": kernel_runs.get("device"),
                        "shape": [args.hidden, args.vocab], "server_args": args.server_args,
                        "reps": args.reps, "duration_s": args.duration_s},
               "kernel_ms": kernel, "latency": [], "throughput": {}}
    try:
        for rows in rows_list:
            per = {"floor": [], "ours": []}
            for rep in range(args.reps):
                order = ["floor", "ours"] if rep % 2 == 0 else ["ours", "floor"]
                for who in order:
                    per[who].append(load(args, servers[who][1], rows, 1, f"{who}-r{rows}-{rep}"))
            row = {"rows": rows, "kernel_ms": kernel[rows]}
            for who in ("floor", "ours"):
                row[f"{who}_p50_ms"] = statistics.median(x["p50_ms"] for x in per[who])
                row[f"{who}_p99_ms"] = statistics.median(x["p99_ms"] for x in per[who])
                row[f"{who}_errors"] = [x["errors"] for x in per[who] if x["errors"]]
            row["added_ms"] = row["ours_p50_ms"] - row["floor_p50_ms"] - row["kernel_ms"]
            results["latency"].append(row)
            print(json.dumps(row), flush=True)
        tput = [load(args, servers["ours"][1], args.throughput_rows, args.streams, f"ours-tput-{rep}")
                for rep in range(args.reps)]
        rows_per_s = statistics.median(t["rps"] for t in tput) * args.throughput_rows
        kernel_rows_per_s = batch_formed / (kernel[batch_formed] / 1e3)
        results["throughput"] = {"streams": args.streams, "rows": args.throughput_rows,
                                 "rows_per_s": rows_per_s, "kernel_batch": batch_formed,
                                 "kernel_rows_per_s": kernel_rows_per_s,
                                 "ratio": rows_per_s / kernel_rows_per_s}
    finally:
        for p, _ in servers.values():
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    json.dump(results, open(os.path.join(args.out, "boundary.json"), "w"), indent=1)
    print(f"\n{results['info']}")
    print("| rows | floor p50 ms | ours p50 ms | kernel ms | ours - floor - kernel ms | floor p99 | ours p99 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results["latency"]:
        print(f"| {r['rows']} | {r['floor_p50_ms']:.3f} | {r['ours_p50_ms']:.3f} | {r['kernel_ms']:.3f} | "
              f"{r['added_ms']:+.3f} | {r['floor_p99_ms']:.3f} | {r['ours_p99_ms']:.3f} |")
    t = results["throughput"]
    print(f"\nthroughput: {t['streams']} streams x {t['rows']} rows: {t['rows_per_s']:,.0f} rows/s; "
          f"kernel at B={t['kernel_batch']}: {t['kernel_rows_per_s']:,.0f} rows/s; ratio {t['ratio']:.2f}")


if __name__ == "__main__":
    main()
