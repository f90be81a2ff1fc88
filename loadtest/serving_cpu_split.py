#!/usr/bin/env python3
"""Where the CPU goes while the server is driven in a closed loop.

For each server configuration, starts flashsampler-server, then runs
flashsampler-load once per concurrency (closed loop, 1-row requests) and
measures over exactly that run:
  - achieved requests/s and the latency percentiles (the load generator's report);
  - the server's CPU time (utime + stime of its process, /proc/PID/stat);
  - the load generator's CPU time (getrusage of the finished child);
  - the whole machine's busy CPU time (/proc/stat);
  - from the server's own histograms (scraped before and after): its mean
    request time (handler receipt -> answer), queue time, launches, rows per
    launch and compute time per launch. Client mean - server request mean is
    the time spent in gRPC (both sides), the transport and the client.
CPU time is printed in cores (CPU seconds per wall second).

The point of the `grpc_only` configuration (CPU backend, an 8-token head,
D = 4096, so a request carries the same 8 KiB of bf16 hidden state as on the
GPU but its compute is negligible; one sampler thread that polls for work
as the CUDA backend's worker does) is the throughput ceiling of the gRPC
front end and the load generator on this machine, whatever the sampler.

  loadtest/serving_cpu_split.py BIN_DIR OUT_DIR [CONFIG ...]

CONFIG: cuda, grpc_only (default: both). MODES (environment) = unary,stream.
Prints one line per step and writes OUT_DIR/cpu_split.json.
"""
import json
import os
import re
import resource
import subprocess
import sys
import time
import urllib.request

SERVER_COMMON = ["--address=127.0.0.1:0", "--metrics_address=127.0.0.1:0", "--max_batch_rows=256",
                 "--max_request_rows=64", "--max_queue_rows=256", "--max_queue_delay_us=0",
                 "--completion_threads=4", "--demo_hidden=4096"]
CONFIGS = {
    "cuda": ["--backend=cuda", "--demo_vocab=151936"],
    # One sampler thread that polls like the CUDA worker: no pool wake-ups.
    "grpc_only": ["--backend=cpu", "--demo_vocab=8", "--threads=1", "--idle_spin_us=1000"],
}
TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def machine_busy_seconds():
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]  # idle, iowait
    return (sum(cpu[:8]) - idle) / TICKS


METRIC = re.compile(r'^(flashsampler_(?:request_duration_seconds|queue_duration_seconds|'
                    r'compute_duration_seconds|batch_rows)_(?:sum|count))(\{[^}]*\})? (\S+)$')


def scrape(metrics_address):
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m and (m.group(2) is None or 'method="Sample' in m.group(2) or
                  "method" not in m.group(2)):
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    return values


def server_means(before, after):
    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)
    def mean_us(name):
        n = delta(name + "_count")
        return round(1e6 * delta(name + "_sum") / n, 1) if n else None
    launches = delta("flashsampler_batch_rows_count")
    return {
        "server_request_mean_us": mean_us("flashsampler_request_duration_seconds"),
        "server_queue_mean_us": mean_us("flashsampler_queue_duration_seconds"),
        "compute_per_launch_us": mean_us("flashsampler_compute_duration_seconds"),
        "launches": int(launches),
        "rows_per_launch": round(delta("flashsampler_batch_rows_sum") / launches, 1) if launches else None,
    }


def start_server(bin_dir, out_dir, name):
    err_path = os.path.join(out_dir, f"{name}-server.err")
    proc = subprocess.Popen([os.path.join(bin_dir, "flashsampler-server")] + SERVER_COMMON +
                            CONFIGS[name], stdout=subprocess.PIPE, stderr=open(err_path, "w"),
                            text=True)
    address = metrics = None
    for line in proc.stdout:
        m = re.search(r"server listening on (\S+)", line)
        if m:
            address = m.group(1)
        m = re.search(r"metrics on ([^/\s]+)/metrics", line)
        if m:
            metrics = m.group(1)
        if address and metrics:
            break
    if address is None or metrics is None:
        raise RuntimeError(f"{name}: the server exited before listening")
    # It listens while the weights load (health NOT_SERVING); wait until it serves.
    for _ in range(1200):
        if "serving on the" in open(err_path).read():
            return proc, address, metrics
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"{name}: the server did not start serving")


def run_step(bin_dir, out_dir, name, pid, address, metrics, mode, concurrency):
    report = os.path.join(out_dir, f"{name}-{mode}-c{concurrency}.json")
    cmd = [os.path.join(bin_dir, "flashsampler-load"), f"--address={address}", f"--mode={mode}",
           "--rows=1", "--channels=8", "--warmup_s=1",
           f"--duration_s={os.environ.get('DURATION_S', '5')}", "--timeout_s=10",
           f"--concurrency={concurrency}", f"--json_out={report}"]
    # The warm-up's requests are in the histograms too: this step's means
    # cover warm-up and measured requests alike.
    hist0 = scrape(metrics)
    server0, machine0 = process_cpu_seconds(pid), machine_busy_seconds()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    server1, machine1 = process_cpu_seconds(pid), machine_busy_seconds()
    hist1 = scrape(metrics)
    load_cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    step = json.load(open(report))["steps"][0]
    result = {
        "config": name, "mode": mode, "concurrency": concurrency,
        "achieved_rps": step["achieved_rps"], "client_mean_us": round(step["latency_us"]["mean"], 1),
        "p50_us": step["latency_us"]["p50"],
        "p99_us": step["latency_us"]["p99"], "errors": step["errors"],
        "wall_s": round(wall, 3),
        "server_cores": round((server1 - server0) / wall, 2),
        "load_cores": round(load_cpu / wall, 2),
        "machine_busy_cores": round((machine1 - machine0) / wall, 2),
    }
    result.update(server_means(hist0, hist1))
    return result


def main():
    bin_dir, out_dir = sys.argv[1], sys.argv[2]
    configs = sys.argv[3:] or ["cuda", "grpc_only"]
    modes = os.environ.get("MODES", "unary,stream").split(",")
    os.makedirs(out_dir, exist_ok=True)
    print(f"cpus: {os.cpu_count()}")
    results = []
    for name in configs:
        proc, address, metrics = start_server(bin_dir, out_dir, name)
        try:
            for mode in modes:
                for concurrency in (1, 64):
                    r = run_step(bin_dir, out_dir, name, proc.pid, address, metrics, mode,
                                 concurrency)
                    results.append(r)
                    print(f"{name:9s} {mode:6s} c={concurrency:3d}: {r['achieved_rps']:9.0f} req/s "
                          f"p50 {r['p50_us']:8.1f} us p99 {r['p99_us']:8.1f} us | cores: server "
                          f"{r['server_cores']:5.2f} load {r['load_cores']:5.2f} machine "
                          f"{r['machine_busy_cores']:5.2f} | errors {r['errors']}", flush=True)
                    print(f"    client mean {r['client_mean_us']} us; server: request mean "
                          f"{r['server_request_mean_us']} us, queue {r['server_queue_mean_us']} us, "
                          f"{r['launches']} launches of {r['rows_per_launch']} rows, compute "
                          f"{r['compute_per_launch_us']} us per launch", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    json.dump(results, open(os.path.join(out_dir, "cpu_split.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
