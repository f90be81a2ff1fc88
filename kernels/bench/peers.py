#!/usr/bin/env python3
"""Times PyTorch references for LM-head sampling on the GPU, beside
flashsampler-kernel-bench --backend=cuda (same shapes, batches, inputs' law).

    python3 kernels/bench/peers.py [--shapes=4096x151936,8192x128256]
        [--batches=1,2,4,8,16,32,64,128,256] [--iterations=100] [--warmup=10]
        [--json=peers.json] [--no-compile] [--compile-budget-s=120] [--commit=REV]

Inputs: W ~ N(0, logit_std^2 / D) in bf16 [V, D], H ~ N(0, 1) in bf16 [B, D],
temperature --temperature (1 by default). Variants, each from H to a token per
row (except the matmuls):

  compiled     torch.compile(dynamic=False) of: logits = (H @ W^T).float()
               (cuBLAS bf16 GEMM with fp32 accumulation and bf16 output, as an
               LM head nn.Linear in bf16 gives it, then upcast to fp32 as
               HF / vLLM do), probs = softmax(logits / T) in fp32,
               torch.multinomial(probs, 1). Compiled once per (shape, batch)
               after torch._dynamo.reset(); the first call (the compilation) is
               timed separately with a wall clock and is not in the figures. If
               compilation fails, or the compile budget is spent, the eager
               function is timed instead and the row says so.
  vllm_race    eager, as vLLM's sampler does it: logits = (H @ W^T).float(),
               logits / T, probs = softmax(fp32), then the exponential race
               probs.div_(torch.empty_like(probs).exponential_()).argmax(-1).
  mm_bf16      torch.matmul(H, W^T) alone (bf16 output).
  mm_fp32out   torch.mm(H, W^T, out_dtype=torch.float32) alone (fp32 logits, the
               output cublasGemmEx writes in the C++ bench), where this PyTorch
               has out_dtype; otherwise reported as unavailable.

Timing: CUDA events around every run, variants round-robin (one run of each per
round), all enqueued without host synchronization (an op that synchronizes
inside, if any, is charged its own stall); warm-up first; median and minimum of
--iterations runs. W rotates among ceil(3 * L2 / W bytes) copies (at most 64)
when it is small enough to stay in L2; for the default shapes (>= 1.2 GB) one
copy. The copy bandwidth (bytes read + bytes written per second of a 2 GiB
device-to-device copy) gives floor_ms = W bytes / copy bandwidth, as in the C++
bench.
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch
import torch._dynamo


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        d, v = item.split("x")
        shapes.append((int(d), int(v)))
    return shapes


def parse_batches(text):
    return [int(x) for x in text.split(",") if x.strip()]


def commit():
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:  # no git on the device machine, or not a checkout
        return "unknown"


def summarize(ms):
    ms = sorted(ms)
    n = len(ms)
    median = ms[n // 2] if n % 2 else 0.5 * (ms[n // 2 - 1] + ms[n // 2])
    return {"median_ms": median, "min_ms": ms[0]}


def time_fn(fn, warmup, iterations):
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iterations)]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in events])


def copy_bandwidth(nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0x5A)
    dst = torch.empty_like(src).fill_(0x33)
    stats = time_fn(lambda: dst.copy_(src), 3, 30)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * nbytes / (stats["median_ms"] * 1e-3), stats


# ---- The variants -----------------------------------------------------------------
def sample_multinomial(h, w, inv_t: float):
    logits = torch.matmul(h, w.t()).float()
    probs = torch.softmax(logits * inv_t, dim=-1)
    return torch.multinomial(probs, 1)


def vllm_race(h, w, inv_t):
    logits = torch.matmul(h, w.t()).float()
    logits.mul_(inv_t)  # vLLM divides by the temperature tensor; T = 1 here
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def mm_bf16(h, w):
    return torch.matmul(h, w.t())


def mm_fp32_out(h, w):
    return torch.mm(h, w.t(), out_dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x151936,8192x128256", help="DxV[,DxV...]")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--logit-std", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--copy-mib", type=int, default=2048)
    ap.add_argument("--no-compile", action="store_true", help="time the compiled variant eagerly")
    ap.add_argument("--compile-budget-s", type=float, default=120.0,
                    help="after this many seconds spent compiling, run the rest eagerly")
    ap.add_argument("--json", default="")
    ap.add_argument("--commit", default="",
                    help="commit recorded in the JSON (default: git describe, where git works)")
    args = ap.parse_args()
    if args.iterations < 100:
        sys.exit("peers.py: --iterations must be at least 100")
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device visible to PyTorch")
    shapes = parse_shapes(args.shapes)
    batches = parse_batches(args.batches)
    inv_t = 1.0 / args.temperature if args.temperature > 0 else 1.0

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(256, getattr(torch._dynamo.config, name)))

    torch.manual_seed(args.seed)
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"peers.py: {props.name}, {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MB, "
          f"torch {torch.__version__}", file=sys.stderr, flush=True)

    bw, bw_stats = copy_bandwidth(args.copy_mib << 20)
    result = {
        "backend": "pytorch",
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": l2_bytes,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": None,
        "date": date,
        "commit": args.commit or commit(),
        "temperature": args.temperature,
        "logit_std": args.logit_std,
        "iterations": args.iterations,
        "warmup": args.warmup,
        "copy_bandwidth": {"bytes_per_s": bw, "counted_as": "(bytes read + bytes written) / time",
                           "buffer_bytes": args.copy_mib << 20, **bw_stats},
        "floor": "W bytes (V * D * 2) / copy bandwidth",
        "shapes": [{"hidden": d, "vocab": v} for d, v in shapes],
        "batches": batches,
        "variants": {
            "compiled": "torch.compile(dynamic=False): (H@W^T bf16).float() -> softmax -> multinomial",
            "vllm_race": "eager: (H@W^T bf16).float() -> /T -> softmax fp32 -> "
                         "probs.div_(exponential_()).argmax(-1)",
            "mm_bf16": "torch.matmul(H, W^T), bf16 out",
            "mm_fp32out": "torch.mm(H, W^T, out_dtype=torch.float32)",
        },
        "results": [],
    }
    try:
        import triton
        result["triton"] = triton.__version__
    except Exception:
        pass

    def write_json():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)

    compile_spent = 0.0
    have_fp32_out = True
    rows = []
    def measure_row(row, h, ws):
        nonlocal compile_spent, have_fp32_out
        d, v, b, copies = row["hidden"], row["vocab"], row["batch"], row["w_copies"]
        # -- compile (once per shape and batch)
        compiled_fn, compiled_note = None, ""
        if args.no_compile:
            compiled_note = "eager (--no-compile)"
        elif compile_spent > args.compile_budget_s:
            compiled_note = "eager (compile budget spent)"
        else:
            try:
                torch._dynamo.reset()
                cfn = torch.compile(sample_multinomial, dynamic=False)
                t0 = time.perf_counter()
                out = cfn(h, ws[0], inv_t)
                torch.cuda.synchronize()
                row["compile_s"] = time.perf_counter() - t0
                compile_spent += row["compile_s"]
                if out.shape[0] != b:
                    raise RuntimeError(f"compiled output shape {tuple(out.shape)}")
                compiled_fn = cfn
                compiled_note = "compiled"
            except Exception as e:  # report and continue eagerly
                compiled_note = f"eager (compile failed: {type(e).__name__}: {str(e)[:200]})"
                print(f"peers.py: D={d} V={v} B={b}: torch.compile failed:\n"
                      + traceback.format_exc(limit=3), file=sys.stderr, flush=True)
        row["compiled_note"] = compiled_note
        if compiled_fn is None:
            compiled_fn = sample_multinomial

        variants = {
            "compiled": lambda w: compiled_fn(h, w, inv_t),
            "vllm_race": lambda w: vllm_race(h, w, inv_t),
            "mm_bf16": lambda w: mm_bf16(h, w),
        }
        if have_fp32_out:
            try:
                out = mm_fp32_out(h, ws[0])
                assert out.dtype == torch.float32 and out.shape == (b, v)
                variants["mm_fp32out"] = lambda w: mm_fp32_out(h, w)
            except Exception as e:
                have_fp32_out = False
                result["mm_fp32out_unavailable"] = f"{type(e).__name__}: {str(e)[:200]}"
        # -- sanity: every sampler's tokens are in range
        for name in ("compiled", "vllm_race"):
            tok = variants[name](ws[0]).view(-1)
            torch.cuda.synchronize()
            lo, hi = int(tok.min()), int(tok.max())
            if tok.numel() != b or lo < 0 or hi >= v:
                raise RuntimeError(f"{name} gave tokens out of range [{lo}, {hi}] at D={d} V={v} B={b}")

        # -- warm-up, then round-robin timing with one event pair per run
        names = list(variants)
        counter = [0]

        def run(name):
            counter[0] += 1
            return variants[name](ws[counter[0] % copies])

        for name in names:
            for _ in range(args.warmup):
                run(name)
        events = {n: [] for n in names}
        for _ in range(args.iterations):
            for name in names:
                s = torch.cuda.Event(enable_timing=True)
                e = torch.cuda.Event(enable_timing=True)
                s.record()
                run(name)
                e.record()
                events[name].append((s, e))
        torch.cuda.synchronize()
        for name in names:
            row[name] = summarize([s.elapsed_time(e) for s, e in events[name]])
        print(f"  D={d} V={v} B={b}: " + " ".join(
            f"{n} {row[n]['median_ms']:.3f}" for n in names) + f" ms [{compiled_note[:40]}]",
            file=sys.stderr, flush=True)

    for d, v in shapes:
        w_bytes = v * d * 2
        copies = max(1, min(64, math.ceil(3 * l2_bytes / w_bytes)))
        scale = args.logit_std / math.sqrt(d)
        ws = [(torch.randn(v, d, device="cuda", dtype=torch.bfloat16) * scale) for _ in range(copies)]
        bmax = max(batches)
        h_all = torch.randn(bmax, d, device="cuda", dtype=torch.bfloat16)
        floor_ms = w_bytes / bw * 1e3
        for b in batches:
            row = {"hidden": d, "vocab": v, "batch": b, "w_copies": copies, "floor_ms": floor_ms}
            try:
                measure_row(row, h_all[:b], ws)
            except Exception as e:  # report, keep the row, go on with the next
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"peers.py: D={d} V={v} B={b} failed:\n" + traceback.format_exc(limit=4),
                      file=sys.stderr, flush=True)
            rows.append(row)
            result["results"].append(row)
            write_json()
        del ws, h_all
        torch.cuda.empty_cache()

    write_json()
    print(f"peers.py  {props.name}  {date}  torch {torch.__version__}  triton {result['triton']}  "
          f"commit {result['commit']}")
    print(f"copy bandwidth {bw * 1e-12:.3f} TB/s ((read + write) bytes / time, "
          f"{args.copy_mib} MiB D2D copy); floor_ms = bf16 W bytes / copy bandwidth; "
          f"median of {args.iterations} runs, CUDA events; T={args.temperature}")
    cols = ["compiled", "vllm_race", "mm_bf16", "mm_fp32out"]
    print(f"{'DxV':<12} {'B':>4} {'floor_ms':>8} " + " ".join(f"{c + '_ms':>13}" for c in cols)
          + f" {'race%fl':>7} {'mmbf%fl':>7} {'compile_s':>9}  note")
    def pct(r, c):
        return f"{100 * r['floor_ms'] / r[c]['median_ms']:>6.1f}%" if c in r else f"{'n/a':>7}"

    for r in rows:
        cells = " ".join(f"{r[c]['median_ms']:>13.3f}" if c in r else f"{'n/a':>13}" for c in cols)
        note = r.get("error", r.get("compiled_note", ""))
        print(f"{str(r['hidden']) + 'x' + str(r['vocab']):<12} {r['batch']:>4} {r['floor_ms']:>8.3f} "
              f"{cells} {pct(r, 'vllm_race')} {pct(r, 'mm_bf16')} "
              f"{r.get('compile_s', float('nan')):>9.1f}  {note[:60]}")
    if "mm_fp32out_unavailable" in result:
        print(f"mm_fp32out unavailable: {result['mm_fp32out_unavailable']}")


if __name__ == "__main__":
    main()
