#!/usr/bin/env python3
"""Plots LM-head sampling latency against batch size: FlashSampler's kernel and
its peers, from the JSON of one device call.

  python3 kernels/bench/plot_kernel_peers.py --ours OUT/kernel.json --peers OUT/peers.json \
      --shape 4096x151936 --out docs/kernel-peers.png [--table]

`--ours` is flashsampler-kernel-bench --backend=cuda --json; `--peers` is
kernels/bench/peers.py --json (with --paper-ref for the FlashSampling paper's
Triton kernel). Lines (log-log, median ms): FlashSampler as the engine serves a
batch (the fused kernel up to --fused_max_rows rows, default every batch as the
engine's --cuda_fused_max_rows; the cuBLAS-materialized path above), the paper's Triton kernel, torch.compile'd
matmul + softmax + multinomial, vLLM's eager sampler (exponential race), and
the floor (reading W once at the copy bandwidth). The title names the device
and date from the JSON. --table also prints the figures as a Markdown table
with each peer's time over ours.

Needs matplotlib for the plot (Debian: apt-get install python3-matplotlib);
--table alone does not.
"""
import argparse
import json
import sys

FUSED_MAX_ROWS = 1 << 20  # the engine's default --cuda_fused_max_rows: every batch


def rows_of(runs, d, v):
    return {r["batch"]: r for r in runs["results"] if r["hidden"] == d and r["vocab"] == v}


def series(ours, peers, fused_max_rows=FUSED_MAX_ROWS):
    """{name: {batch: ms}} for every line that has data."""
    out = {"FlashSampler (as served)": {}, "FlashSampling paper (Triton)": {},
           "torch.compile": {}, "vLLM sampler (eager)": {}, "floor (read W once)": {}}
    for b, r in ours.items():
        served = r["fused"] if b <= fused_max_rows else r["materialized"]
        out["FlashSampler (as served)"][b] = served["median_ms"]
        out["floor (read W once)"][b] = r["floor_ms"]
    for b, r in peers.items():
        for key, name in (("paper_triton", "FlashSampling paper (Triton)"), ("compiled", "torch.compile"),
                          ("vllm_race", "vLLM sampler (eager)")):
            if key in r:
                out[name][b] = r[key]["median_ms"]
    return {k: v for k, v in out.items() if v}


def print_table(lines):
    ours = lines["FlashSampler (as served)"]
    peers = [n for n in lines if n not in ("FlashSampler (as served)", "floor (read W once)")]
    print("| B | floor ms | FlashSampler ms | " + " | ".join(f"{n} ms (× ours)" for n in peers) + " |")
    print("|---:|---:|---:|" + "---:|" * len(peers))
    for b in sorted(ours):
        cells = []
        for n in peers:
            t = lines[n].get(b)
            cells.append(f"{t:.3f} ({t / ours[b]:.2f}×)" if t is not None else "n/a")
        floor = lines.get("floor (read W once)", {}).get(b)
        print(f"| {b} | {floor:.3f} | {ours[b]:.3f} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True, help="flashsampler-kernel-bench --json output")
    ap.add_argument("--peers", required=True, help="kernels/bench/peers.py --json output")
    ap.add_argument("--shape", default="4096x151936", help="DxV to plot")
    ap.add_argument("--out", default="", help="PNG to write")
    ap.add_argument("--table", action="store_true", help="print a Markdown table")
    ap.add_argument("--fused_max_rows", type=int, default=FUSED_MAX_ROWS,
                    help="the served path: fused up to this batch, materialized above "
                         "(the server's --cuda_fused_max_rows; default every batch)")
    args = ap.parse_args()
    d, v = (int(x) for x in args.shape.split("x"))
    ours_runs = json.load(open(args.ours))
    peers_runs = json.load(open(args.peers))
    lines = series(rows_of(ours_runs, d, v), rows_of(peers_runs, d, v), args.fused_max_rows)
    if "FlashSampler (as served)" not in lines:
        sys.exit(f"plot_kernel_peers.py: no {args.shape} rows in {args.ours}")
    if args.table:
        print_table(lines)
    if not args.out:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        sys.exit("plot_kernel_peers.py needs matplotlib (apt-get install python3-matplotlib)")
    styles = {"FlashSampler (as served)": dict(color="tab:blue", marker="o", linewidth=2.5),
              "FlashSampling paper (Triton)": dict(color="tab:orange", marker="s"),
              "torch.compile": dict(color="tab:green", marker="^"),
              "vLLM sampler (eager)": dict(color="tab:red", marker="v"),
              "floor (read W once)": dict(color="gray", linestyle=":", marker="")}
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for name, points in lines.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], label=name, **styles[name])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2f"))
    ax.set_xlabel("batch (rows sampled together)")
    ax.set_ylabel("median latency (ms)")
    ax.set_title(f"Sampling from an LM head, D={d} V={v} bf16\n"
                 f"{ours_runs.get('device', '?')}, {ours_runs.get('date', '?')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
