#!/usr/bin/env python3
"""Plots what a decode step costs at the service boundary (boundary_bench.py's JSON).

  python3 loadtest/plot_boundary.py --json OUT/boundary.json --out docs/boundary.png

One line per series against rows per request (log-log): the kernel alone, the
gRPC floor (moving the bytes, no compute), the floor plus the kernel (what a
server that added nothing would take), and our server over each transport it
was measured with (p50 of one request in flight). The title names the device,
date and shape recorded in the JSON.

Needs matplotlib (Debian: apt-get install python3-matplotlib). It is optional:
scripts/setup.sh does not install it, and nothing else in the build needs it.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="boundary.json written by boundary_bench.py")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        sys.exit("plot_boundary.py needs matplotlib (apt-get install python3-matplotlib)")

    data = json.load(open(args.json))
    rows = [r["rows"] for r in data["latency"]]
    kernel = [r["kernel_ms"] for r in data["latency"]]
    floor = [r["floor_p50_ms"] for r in data["latency"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rows, kernel, "k--o", label="kernel alone")
    ax.plot(rows, floor, ":s", color="gray", label="gRPC floor (bytes only)")
    ax.plot(rows, [f + k for f, k in zip(floor, kernel)], "-", color="lightgray", linewidth=4,
            label="floor + kernel")
    transports = sorted({k[len("ours_"):-len("_p50_ms")] for r in data["latency"] for k in r
                         if k.startswith("ours_") and k.endswith("_p50_ms")})
    for t in transports:
        ax.plot(rows, [r[f"ours_{t}_p50_ms"] for r in data["latency"]], "-o", label=f"FlashSampler, {t}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(rows, [str(r) for r in rows])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("rows per request (one request in flight)")
    ax.set_ylabel("p50 latency per step (ms)")
    info = data["info"]
    ax.set_title(f"Decode step, D={info['shape'][0]} V={info['shape'][1]} bf16\n"
                 f"{info.get('device')}, {info['date_utc']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)


if __name__ == "__main__":
    main()
