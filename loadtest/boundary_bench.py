"""What a decode step costs an engine at the service boundary, against its anchors.

Runs, in one process on one machine, interleaved so that all see the same
machine:
  floor   the smallest correct gRPC server of our proto (../shared/peers/grpc-floor),
          answering token 0 with no compute: what moving the bytes through gRPC costs;
  ours    flashsampler-server (default: CUDA backend, demo head D=4096 V=151936 bf16),
          once per transport (--transports): grpc (the bytes in the messages), shm
          (a registered POSIX shared-memory region), cuda_ipc (a registered GPU
          buffer of the load generator, shared by CUDA IPC); local, local_shm,
          local_cuda_ipc: the same three with the requests sent over the server's
          local channel (--local_socket, a Unix-domain socket) instead of gRPC,
          and with "+poll" (e.g. local_cuda_ipc+poll) the client busy-polls the
          socket for its answer instead of sleeping in a read;
  kernel  flashsampler-kernel-bench on the same shape: the served kernel path
          alone (the fused kernel at every batch, the server's default
          --cuda_fused_max_rows).
Per rows-per-request R: closed loop, one SampleStream, one request in flight
(a decode step), median of REPS runs of flashsampler-load's p50 and p99. Then
throughput: STREAMS streams of THROUGHPUT_ROWS rows each, rows/s, against the
kernel's rows/s at the batch the batcher forms (min(STREAMS x rows, 256)).

Prints a table (over gRPC, ours - floor - kernel is what the server itself
adds, issue target <= 0.10 ms; over shm / CUDA IPC, ours - kernel, target
<= 0.08 ms) and writes boundary.json; loadtest/plot_boundary.py draws it.

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
    """Starts a server; returns (process, address, metrics address or None) once
    it listens (and, if `ready` is given, once that text is in its stderr log)."""
    log_path = os.path.join(out, f"{name}.log")
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    address = metrics = None
    for line in p.stdout:
        m = re.search(r"metrics on (\S+)/metrics", line)
        if m:
            metrics = m.group(1)
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
    return p, address, metrics


def load_transport(transport, local_socket, busy_poll_us):
    """flashsampler-load's --transport and extra flags for a transport name:
    grpc, shm, cuda_ipc, or local, local_shm, local_cuda_ipc (the local
    channel), each local one optionally with "+poll" (the client busy-polls)."""
    if not transport.startswith("local"):
        return transport, []
    poll = transport.endswith("+poll")
    transport = transport[:-len("+poll")] if poll else transport
    flags = [f"--local_socket={local_socket}", f"--local_busy_poll_us={busy_poll_us if poll else 0}"]
    return (transport[len("local_"):] if transport != "local" else "grpc"), flags


def load(args, address, rows, concurrency, tag, transport="grpc"):
    path = os.path.join(args.out, f"{tag}.json")
    transport, local = load_transport(transport, args.local_socket, args.local_busy_poll_us)
    cmd = [args.load_bin, f"--address={address}", "--mode=stream", f"--concurrency={concurrency}",
           f"--transport={transport}"] + local + [
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
    ap.add_argument("--transports", default="grpc,shm,cuda_ipc",
                    help="any of grpc, shm, cuda_ipc, local, local_shm, local_cuda_ipc; a local "
                         "one with +poll: the client busy-polls for its answer")
    ap.add_argument("--local_busy_poll_us", type=int, default=5000,
                    help="a +poll transport's busy poll per request (flashsampler-load --local_busy_poll_us)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration_s", type=float, default=3)
    ap.add_argument("--warmup_s", type=float, default=1)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--throughput_rows", type=int, default=64)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows_list = [int(r) for r in args.rows.split(",")]
    transports = args.transports.split(",")
    batch_formed = min(args.streams * args.throughput_rows, 256)

    kernel_json = os.path.join(args.out, "kernel.json")
    batches = sorted(set(rows_list + [batch_formed]))
    subprocess.run([args.kernel_bench_bin, "--backend=cuda", f"--shapes={args.hidden}x{args.vocab}",
                    "--batches=" + ",".join(map(str, batches)), f"--json={kernel_json}"],
                   check=True, stdout=open(os.path.join(args.out, "kernel.txt"), "w"))
    kernel_runs = json.load(open(kernel_json))
    kernel = {}
    for r in kernel_runs["results"]:
        kernel[r["batch"]] = r["fused"]["median_ms"]
    args.local_socket = os.path.join(args.out, "flashsampler.sock")
    local_flags = [f"--local_socket={args.local_socket}"] if any(t.startswith("local") for t in transports) else []

    servers = {
        "floor": start("floor", [args.floor_bin, "--address=127.0.0.1:0", f"--hidden={args.hidden}",
                                 f"--vocab={args.vocab}", "--max_rows=1024"], args.out),
        "ours": start("ours", [args.server_bin, "--address=127.0.0.1:0", f"--demo_vocab={args.vocab}",
                               f"--demo_hidden={args.hidden}", "--max_request_rows=1024"]
                      + local_flags + args.server_args.split(), args.out, ready="serving on the"),
    }
    results = {"info": {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "nproc": os.cpu_count(), "device": kernel_runs.get("device"),
                        "shape": [args.hidden, args.vocab], "server_args": args.server_args,
                        "reps": args.reps, "duration_s": args.duration_s},
               "kernel_ms": kernel, "latency": [], "throughput": {}}
    try:
        who_list = ["floor"] + [f"ours_{t}" for t in transports]
        regions = [t for t in transports if t != "grpc"]
        if regions:
            # A region request carries a descriptor, not the rows: the floor's
            # round trip with one row is what it cannot go below.
            tiny = [load(args, servers["floor"][1], 1, 1, f"floor-r1-{rep}", "grpc") for rep in range(args.reps)]
            results["floor_1row_p50_ms"] = statistics.median(x["p50_ms"] for x in tiny)
        for rows in rows_list:
            per = {who: [] for who in who_list}
            for rep in range(args.reps):
                order = who_list if rep % 2 == 0 else who_list[::-1]
                for who in order:
                    transport = who[len("ours_"):] if who.startswith("ours_") else "grpc"
                    server = servers["floor" if who == "floor" else "ours"][1]
                    per[who].append(load(args, server, rows, 1, f"{who}-r{rows}-{rep}", transport))
            row = {"rows": rows, "kernel_ms": kernel[rows]}
            for who in who_list:
                row[f"{who}_p50_ms"] = statistics.median(x["p50_ms"] for x in per[who])
                row[f"{who}_p99_ms"] = statistics.median(x["p99_ms"] for x in per[who])
                row[f"{who}_errors"] = [x["errors"] for x in per[who] if x["errors"]]
            if "grpc" in transports:
                row["added_ms"] = row["ours_grpc_p50_ms"] - row["floor_p50_ms"] - row["kernel_ms"]
            for t in regions:
                row[f"{t}_added_ms"] = row[f"ours_{t}_p50_ms"] - row["kernel_ms"]
                row[f"{t}_over_anchor_ms"] = row[f"{t}_added_ms"] - results["floor_1row_p50_ms"]
            results["latency"].append(row)
            print(json.dumps(row), flush=True)
        kernel_rows_per_s = batch_formed / (kernel[batch_formed] / 1e3)
        for t in transports:
            tput = [load(args, servers["ours"][1], args.throughput_rows, args.streams, f"ours-{t}-tput-{rep}", t)
                    for rep in range(args.reps)]
            rows_per_s = statistics.median(x["rps"] for x in tput) * args.throughput_rows
            results["throughput"][t] = {"errors": [x["errors"] for x in tput if x["errors"]],
                                        "streams": args.streams, "rows": args.throughput_rows,
                                        "rows_per_s": rows_per_s, "kernel_batch": batch_formed,
                                        "kernel_rows_per_s": kernel_rows_per_s,
                                        "ratio": rows_per_s / kernel_rows_per_s}
    finally:
        for p, _, _ in servers.values():
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    json.dump(results, open(os.path.join(args.out, "boundary.json"), "w"), indent=1)
    print(f"\n{results['info']}")
    if "floor_1row_p50_ms" in results:
        print(f"floor p50 at 1 row (a region request's anchor): {results['floor_1row_p50_ms']:.3f} ms")
    head = "| rows | kernel ms | floor p50 ms |" + "".join(f" {t} p50 ms |" for t in transports)
    head += " grpc - floor - kernel ms |" if "grpc" in transports else ""
    head += "".join(f" {t} - kernel ms | {t} - kernel - floor(1 row) ms |" for t in regions)
    print(head)
    print("|" + "---:|" * (head.count("|") - 1))
    for r in results["latency"]:
        line = f"| {r['rows']} | {r['kernel_ms']:.3f} | {r['floor_p50_ms']:.3f} |"
        line += "".join(f" {r[f'ours_{t}_p50_ms']:.3f} |" for t in transports)
        line += f" {r['added_ms']:+.3f} |" if "grpc" in transports else ""
        line += "".join(f" {r[f'{t}_added_ms']:+.3f} | {r[f'{t}_over_anchor_ms']:+.3f} |" for t in regions)
        print(line)
    # A p50 counts answered requests only: a run with errors is not a figure.
    for r in results["latency"]:
        failed = {k[:-len("_errors")]: v for k, v in r.items() if k.endswith("_errors") and v}
        if failed:
            print(f"WARNING: {r['rows']} rows: requests failed {failed}; that row's p50s are of the answered ones only")
    for t, x in results["throughput"].items():
        print(f"throughput {t}: {x['streams']} streams x {x['rows']} rows: {x['rows_per_s']:,.0f} rows/s; "
              f"kernel at B={x['kernel_batch']}: {x['kernel_rows_per_s']:,.0f} rows/s; ratio {x['ratio']:.2f}"
              + (f"; WARNING: requests failed {x['errors']}" if x["errors"] else ""))


if __name__ == "__main__":
    main()
