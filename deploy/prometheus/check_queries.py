"""Checks the dashboard's and the rules' PromQL against a real Prometheus.

Starts flashsampler-server (CPU backend, small demo head) with /metrics on a
loopback port, a real Prometheus (Debian's package) scraping it every second
and evaluating deploy/prometheus/rules.yml, sends traffic through the Python
client (successes and rejected requests), then evaluates every expression of
deploy/grafana/flashsampler-dashboard.json and of the rules through
Prometheus' HTTP API. Fails when `promtool check` rejects the config or the
rules, when any expression fails to evaluate, or when an expression about
traffic returns no data. Expressions about the GPU (flashsampler_device_*)
may be empty on the CPU backend; alerts are built on the recording rules,
which must have data, and need only evaluate (they are not expected to fire).

    python deploy/prometheus/check_queries.py --server_bin=build/bin/flashsampler-server
"""
import argparse
import json
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
import yaml

HERE = pathlib.Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
SCRAPE_CONFIG = HERE / "prometheus.yml"
DASHBOARD = HERE.parent / "grafana" / "flashsampler-dashboard.json"
# Grafana's template variables, replaced by what a user would pick.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m",
                "$instance": ".*", "$job": "flashsampler"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, ready, timeout_s: float = 120.0, poll_s: float = 0.05):
    """Polls ready() until it returns a true value (returned), or exits after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            sys.exit(f"check_queries: {what} did not happen within {timeout_s:g} s")
        time.sleep(poll_s)  # poll interval, not a synchronisation


def promtool(*args) -> None:
    result = subprocess.run(["promtool", *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}")


def start_server(server_bin: str):
    """Starts the server on port 0 for both listeners; returns (process, address, metrics address)."""
    proc = subprocess.Popen([server_bin, "--address=127.0.0.1:0", "--backend=cpu", "--threads=2",
                             "--demo_vocab=4096", "--demo_hidden=128", "--metrics_address=127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = None
    for line in proc.stdout:  # "metrics on H:P/metrics", then "server listening on H:P"
        match = re.search(r"metrics on (\S+)/metrics", line)
        if match:
            metrics = match.group(1)
        match = re.search(r"listening on (\S+)", line)
        if match and metrics:
            return proc, match.group(1), metrics
    proc.kill()
    sys.exit(f"server did not start: {proc.stderr.read()}")


def start_prometheus(config: pathlib.Path, data: pathlib.Path, log: pathlib.Path):
    """Prometheus cannot report a port it picked, so a free one is chosen and
    the start retried on another if Prometheus exits (the port was taken in
    between). Returns (process, base URL) once /-/ready answers."""
    for _ in range(5):
        port = free_port()
        prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=open(log, "a"))
        base = f"http://127.0.0.1:{port}"

        def ready():
            if prom.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as reply:
                    return "ready" if reply.status == 200 else None
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None

        if wait_until("Prometheus readiness", ready) == "ready":
            return prom, base
    sys.exit(f"check_queries: Prometheus did not start on a free port:\n{log.read_text()[-3000:]}")


def send_traffic(address: str, seconds: float) -> None:
    import grpc
    import flashsampler

    rng = np.random.default_rng(0)
    with flashsampler.SamplerClient(address) as client:
        wait_until("the server's health SERVING", lambda: client.health() == "SERVING")
        hidden = client.model_info().hidden_size
        end = time.monotonic() + seconds
        step = 0
        while time.monotonic() < end:
            rows = int(rng.integers(1, 9))
            client.sample(rng.standard_normal((rows, hidden)).astype(np.float32),
                          {"temperature": 0.8, "seed": step, "offset": step})
            requests = [flashsampler.make_request(rng.standard_normal((2, hidden)),
                                                  {"temperature": 1.0}) for _ in range(3)]
            list(client.sample_stream(requests))
            if step % 5 == 0:  # a rejected request: wrong hidden size
                try:
                    client.sample(np.zeros((1, hidden + 1), np.float32))
                except grpc.RpcError:
                    pass
            step += 1
            time.sleep(0.02)


def query(base: str, expr: str) -> dict:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)
    except urllib.error.HTTPError as error:  # Prometheus answers 400 for a bad query
        return json.load(error)


def expressions() -> list:
    """(origin, expr, must_have_data) for every PromQL expression we ship."""
    found = []
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            found.append((f"panel '{panel['title']}'", expr, "flashsampler_device_" not in expr))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                found.append((f"record {rule['record']}", rule["expr"], True))
            else:
                # Alerts compare recording rules (checked for data above) with a
                # threshold; they are not expected to fire, only to evaluate.
                found.append((f"alert {rule['alert']}", rule["expr"], False))
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server_bin", required=True)
    parser.add_argument("--traffic_s", type=float, default=20)
    args = parser.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        sys.exit("check_queries: prometheus and promtool are needed (Debian package prometheus)")

    promtool("check", "rules", str(RULES))
    server, address, metrics_address = start_server(args.server_bin)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        # The shipped scrape config, pointed at the loopback server.
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [str(RULES)]
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [metrics_address]}]
            job.pop("dns_sd_configs", None)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        promtool("check", "config", str(SCRAPE_CONFIG))
        promtool("check", "config", str(tmp / "prometheus.yml"))

        prom, base = start_prometheus(tmp / "prometheus.yml", tmp / "data", tmp / "prom.log")
        failures = 0
        try:
            def scraped():
                up = query(base, 'up{job="flashsampler"}')
                return bool(up["data"]["result"]) and up["data"]["result"][0]["value"][1] == "1"
            wait_until("Prometheus' first scrape of the server", scraped)
            send_traffic(address, args.traffic_s)
            found = expressions()

            # Rates and recording rules have data once enough scrapes and rule
            # evaluations followed the traffic: wait for that state, bounded.
            def all_have_data():
                return all(query(base, expr).get("data", {}).get("result")
                           for _, expr, must_have_data in found if must_have_data)
            deadline = time.monotonic() + 60
            while not all_have_data() and time.monotonic() < deadline:
                time.sleep(0.5)  # poll interval; what is still empty then fails below
            for origin, expr, must_have_data in found:
                reply = query(base, expr)
                if reply.get("status") != "success":
                    failures += 1
                    print(f"FAIL {origin}: {reply.get('error')}\n     {expr}")
                elif must_have_data and not reply["data"]["result"]:
                    failures += 1
                    print(f"FAIL {origin}: no data\n     {expr}")
                else:
                    print(f"ok   {origin}: {len(reply['data']['result'])} series")
        finally:
            prom.send_signal(signal.SIGTERM)
            server.send_signal(signal.SIGTERM)
            prom.wait(timeout=30)
            server.wait(timeout=30)
        if failures:
            print((tmp / "prom.log").read_text()[-3000:])
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
