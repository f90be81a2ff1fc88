#!/usr/bin/env python3
"""Plots flashsampler-load reports.

  python3 loadtest/plot_load.py --json run.json [more.json ...] [--csv run.csv] --out_dir plots/

Writes
  latency_vs_throughput.png  p50 / p90 / p99 / p99.9 latency (ms, log scale) against the
                             achieved throughput (requests/s), one point per step, one
                             line per percentile and report file;
  latency_histogram.png      (with --csv) the per-step latency histograms of the CSV
                             written by --csv_out, on a log latency axis.

Needs matplotlib (Debian: apt-get install python3-matplotlib). It is optional:
scripts/setup.sh does not install it, and nothing else in the build needs it.
"""
import argparse
import csv
import json
import os
import sys
from collections import defaultdict

PERCENTILES = ["p50", "p90", "p99", "p99.9"]


def step_label(report, step):
    if report.get("loop") == "open":
        return f"{step['target_rps']:g} req/s"
    return f"c={step['concurrency']}"


def plot_latency_vs_throughput(plt, reports, path):
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, report in reports:
        steps = [s for s in report["steps"] if s["latency_us"]["count"] > 0]
        if not steps:
            continue
        xs = [s["achieved_rps"] for s in steps]
        for p in PERCENTILES:
            ys = [s["latency_us"][p] / 1e3 for s in steps]
            (line,) = ax.plot(xs, ys, marker="o", label=f"{name} {p}")
        # Label the points of the last percentile with their step.
        for x, y, s in zip(xs, ys, steps):
            ax.annotate(step_label(report, s), (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=7, color=line.get_color())
    first = reports[0][1]
    ax.set_title(f"flashsampler-load: {first.get('loop')} loop, {first.get('mode')}, "
                 f"{first.get('rows_per_request')} row(s)/request")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_histograms(plt, csv_path, path):
    buckets = defaultdict(list)  # (step, concurrency, target) -> [(lower, upper, count)]
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["step"]), int(row["concurrency"]), float(row["target_rps"]))
            buckets[key].append((float(row["lower_us"]), float(row["upper_us"]), int(row["count"])))
    fig, ax = plt.subplots(figsize=(8, 5))
    for (step, concurrency, target), rows in sorted(buckets.items()):
        rows.sort()
        # A [0, 1) µs bucket cannot sit on a log axis; start it at 0.5 µs.
        edges = [max(rows[0][0], 0.5) / 1e3] + [upper / 1e3 for _, upper, _ in rows]
        counts = [count for _, _, count in rows]
        label = f"{target:g} req/s" if target > 0 else f"c={concurrency}"
        ax.stairs(counts, edges, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("requests")
    ax.set_title("latency histogram per step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", nargs="+", required=True, help="report(s) from flashsampler-load --json_out")
    parser.add_argument("--csv", help="histograms from flashsampler-load --csv_out")
    parser.add_argument("--out_dir", default=".", help="where to write the PNGs")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_load.py needs matplotlib, which is optional and not installed by "
                 "scripts/setup.sh: apt-get install python3-matplotlib (or pip install matplotlib)")
    reports = []
    for path in args.json:
        with open(path) as f:
            reports.append((os.path.splitext(os.path.basename(path))[0], json.load(f)))
    os.makedirs(args.out_dir, exist_ok=True)
    outputs = [os.path.join(args.out_dir, "latency_vs_throughput.png")]
    plot_latency_vs_throughput(plt, reports, outputs[0])
    if args.csv:
        outputs.append(os.path.join(args.out_dir, "latency_histogram.png"))
        plot_histograms(plt, args.csv, outputs[1])
    for path in outputs:
        print(path)


if __name__ == "__main__":
    main()
