"""Soak: N minutes of mixed traffic against a real flashsampler-server (CPU backend).

Traffic, from several threads at once: unary Sample calls (1-8 rows, random
params), SampleStream calls (5 requests each), bad requests (wrong hidden
size: must be INVALID_ARGUMENT), calls cancelled by the client while in flight
(CANCELLED, or OK when the answer won the race), and calls with a deadline too
short to meet (DEADLINE_EXCEEDED, or OK when it was met). Any other outcome is
an unexpected error. Every minute it records the server's RSS and the p99 of
successful unary calls. The first minute is warm-up: RSS growth is measured
from its end to the end of the run.

    python loadtest/soak.py --server_bin=build/bin/flashsampler-server --minutes=10 \
        --json_out=soak.json

Exit status 0 when there was no unexpected error and RSS grew < 5% after
warm-up; the report says which failed. Needs the flashsampler Python package
(scripts/python_env.sh). A program, not a CI test.
"""
import argparse
import collections
import json
import re
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

import flashsampler


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(r"VmRSS:\s+(\d+)", status.read()).group(1))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.codes = collections.Counter()   # (kind, code) -> count
        self.unexpected = collections.Counter()
        self.latencies = []                  # seconds of OK unary calls this minute

    def record(self, kind, code, allowed, latency=None):
        with self.lock:
            self.codes[f"{kind}:{code.name}"] += 1
            if code not in allowed:
                self.unexpected[f"{kind}:{code.name}"] += 1
            if latency is not None and code == grpc.StatusCode.OK:
                self.latencies.append(latency)

    def take_latencies(self):
        with self.lock:
            taken, self.latencies = self.latencies, []
        return taken


def traffic(kind, address, hidden_size, stop, tally, seed):
    rng = np.random.default_rng(seed)
    OK = grpc.StatusCode.OK
    with flashsampler.SamplerClient(address) as client:
        while not stop.is_set():
            rows = int(rng.integers(1, 9))
            hidden = rng.standard_normal((rows, hidden_size)).astype(np.float32)
            params = {"temperature": float(rng.uniform(0.0, 1.5)), "seed": int(rng.integers(1 << 62))}
            start = time.monotonic()
            try:
                if kind == "unary":
                    client.sample(hidden, params, return_logz=bool(rng.integers(2)))
                    tally.record(kind, OK, {OK}, time.monotonic() - start)
                elif kind == "stream":
                    requests = [flashsampler.make_request(hidden, params) for _ in range(5)]
                    got = list(client.sample_stream(requests, timeout=30))
                    tally.record(kind, OK if len(got) == 5 else grpc.StatusCode.DATA_LOSS, {OK})
                elif kind == "bad":
                    client.sample(np.zeros((rows, hidden_size + 1), np.float32), timeout=30)
                    tally.record(kind, OK, {grpc.StatusCode.INVALID_ARGUMENT})
                elif kind == "cancel":
                    request = flashsampler.make_request(hidden, params)
                    future = client._stub.Sample.future(request, timeout=30)
                    time.sleep(float(rng.uniform(0, 0.002)))
                    future.cancel()
                    try:
                        future.result()
                        tally.record(kind, OK, {OK, grpc.StatusCode.CANCELLED})
                    except grpc.FutureCancelledError:
                        tally.record(kind, grpc.StatusCode.CANCELLED, {OK, grpc.StatusCode.CANCELLED})
                elif kind == "deadline":
                    client.sample(hidden, params, timeout=float(rng.uniform(1e-5, 5e-4)))
                    tally.record(kind, OK, {OK, grpc.StatusCode.DEADLINE_EXCEEDED})
            except grpc.RpcError as error:
                allowed = {"bad": {grpc.StatusCode.INVALID_ARGUMENT},
                           "cancel": {OK, grpc.StatusCode.CANCELLED},
                           "deadline": {OK, grpc.StatusCode.DEADLINE_EXCEEDED}}.get(kind, {OK})
                tally.record(kind, error.code(), allowed)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server_bin", required=True)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--json_out", default="")
    parser.add_argument("--server_flags", default="--demo_vocab=8192 --demo_hidden=256 --threads=2")
    args = parser.parse_args()

    server = subprocess.Popen([args.server_bin, "--address=127.0.0.1:0", "--backend=cpu",
                               *args.server_flags.split()],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    address = None
    while address is None:
        line = server.stdout.readline()
        if not line:
            sys.exit("soak: the server did not start")
        if match := re.search(r"server listening on (\S+)", line):
            address = match.group(1)
    with flashsampler.SamplerClient(address) as probe:
        while probe.health() != "SERVING":
            time.sleep(0.05)
        hidden_size = probe.model_info().hidden_size

    tally, stop = Tally(), threading.Event()
    kinds = ["unary", "unary", "unary", "stream", "bad", "cancel", "deadline"]
    threads = [threading.Thread(target=traffic, args=(k, address, hidden_size, stop, tally, i))
               for i, k in enumerate(kinds)]
    for t in threads:
        t.start()
    minutes = []
    rss_start = rss_kb(server.pid)
    for minute in range(int(np.ceil(args.minutes))):
        time.sleep(60 * min(1.0, args.minutes - minute))
        latencies = tally.take_latencies()
        rss = rss_kb(server.pid)
        p99 = float(np.percentile(latencies, 99)) * 1e3 if latencies else None
        minutes.append({"minute": minute + 1, "rss_kb": rss, "unary_ok": len(latencies),
                        "unary_p99_ms": p99})
        print(f"minute {minute + 1}: rss {rss} kB, unary ok {len(latencies)}, "
              f"p99 {p99 if p99 is None else round(p99, 3)} ms", flush=True)
    stop.set()
    for t in threads:
        t.join()
    alive = server.poll() is None
    server.send_signal(signal.SIGTERM)
    exit_code = server.wait(timeout=60)
    warm_rss = minutes[0]["rss_kb"] if minutes else rss_start
    growth = (minutes[-1]["rss_kb"] - warm_rss) / warm_rss if minutes else 0.0
    report = {"minutes": minutes, "codes": dict(tally.codes), "unexpected": dict(tally.unexpected),
              "rss_start_kb": rss_start, "rss_after_warmup_kb": warm_rss,
              "rss_end_kb": minutes[-1]["rss_kb"] if minutes else rss_start,
              "rss_growth_after_warmup": growth, "server_alive_at_end": alive,
              "server_exit_code": exit_code}
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(report, out, indent=2)
    ok = not tally.unexpected and growth < 0.05 and alive and exit_code == 0
    print("soak:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
