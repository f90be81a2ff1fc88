#!/usr/bin/env python3
"""Times PyTorch references for LM-head sampling on the GPU, beside
flashsampler-kernel-bench --backend=cuda (same shapes, batches, inputs' law).

    python3 kernels/bench/peers.py [--shapes=4096x151936,8192x128256]
        [--batches=1,2,4,8,16,32,64,128,256] [--iterations=100] [--warmup=10]
        [--json=peers.json] [--no-compile] [--compile-budget-s=120] [--commit=REV]
        [--paper-ref=../shared/peers/flashsampling-ref]

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
  paper_triton with --paper-ref=DIR: the FlashSampling paper's fused Triton
               kernel, fused_mm_sample_triton(W, H, 1, T, seed) from DIR (the
               reference package in ../shared/peers/flashsampling-ref, imported
               at bench time, never copied into the project). Its autotuner
               runs during the warm-up.

With --controls (all, or a comma list of top_p, top_k, top_k_top_p, min_p) the
script times instead vLLM's way of applying sampling filters, written here
after vLLM v1's sampler (our own code, same algorithm), on fp32 logits
(H @ W^T).float() computed once per (shape, batch) and not timed, beside
flashsampler-kernel-bench --controls (its `filter` column starts from logits
of the same law):

  vllm_filter  logits * (1/T); top-k / top-p as vLLM's apply_top_k_top_p: one
               full ascending sort of every row, the k-th largest gathered
               from the sorted row and everything below it masked, softmax +
               cumsum of the sorted row and every token whose cumulative
               probability is <= 1 - top_p masked (the last one always kept),
               scatter back; min-p as vLLM's: softmax, tokens with probability
               < min_p * max probability masked; then vLLM's random sampling,
               softmax fp32 and the exponential race argmax(probs / Exp(1)).
               Control sets as in the C++ bench: top_p = 0.9, top_k = 50,
               top_k = 50 + top_p = 0.9, min_p = 0.1.

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


# ---- vLLM's sort-based filters (--controls) ----------------------------------------
def vllm_top_k_top_p(logits, k, p):
    """vLLM v1's apply_top_k_top_p: k, p are per-row tensors or None."""
    if k is None and p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        # Per row, the value at ascending position V - k is the k-th largest.
        kth = sorted_logits.gather(1, (sorted_logits.size(1) - k.to(torch.long)).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    if p is not None:
        cum = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)
        drop = cum <= (1 - p).unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits.masked_fill_(drop, float("-inf"))
    return sorted_logits.scatter(dim=-1, index=order, src=sorted_logits)


def vllm_min_p(logits, min_p):
    probs = logits.softmax(dim=-1)
    floor = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < floor, float("-inf"))


def vllm_filter_sample(logits, inv_t, k, p, min_p):
    x = logits * inv_t  # vLLM divides in place; out of place keeps the input for the next run
    if min_p is not None:
        x = vllm_min_p(x, min_p)
    x = vllm_top_k_top_p(x, k, p)
    probs = x.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


CONTROL_SETS = {
    "top_p": dict(k=None, p=0.9, min_p=None),
    "top_k": dict(k=50, p=None, min_p=None),
    "top_k_top_p": dict(k=50, p=0.9, min_p=None),
    "min_p": dict(k=None, p=None, min_p=0.1),
}


def run_controls(args, shapes, batches, inv_t):
    names = list(CONTROL_SETS) if args.controls == "all" else [
        c for c in args.controls.split(",") if c in CONTROL_SETS]
    if not names:
        sys.exit("peers.py: --controls wants all or a list of " + ", ".join(CONTROL_SETS))
    props = torch.cuda.get_device_properties(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = {"backend": "pytorch", "mode": "controls", "device": props.name,
              "torch": torch.__version__, "date": date, "commit": args.commit or commit(),
              "temperature": args.temperature, "logit_std": args.logit_std,
              "iterations": args.iterations, "warmup": args.warmup,
              "variant": "vllm_filter: vLLM v1 apply_top_k_top_p / min_p (sort-based) + "
                         "exponential-race sampling, on fp32 logits computed once",
              "results": []}
    print(f"peers.py --controls  {props.name}  {date}  torch {torch.__version__}  "
          f"median of {args.iterations} runs, CUDA events; T={args.temperature}")
    print(f"{'DxV':<12} {'B':>4} {'controls':<12} {'vllm_filter_ms':>14}")
    for d, v in shapes:
        w = torch.randn(v, d, device="cuda", dtype=torch.bfloat16) * (args.logit_std / math.sqrt(d))
        h_all = torch.randn(max(batches), d, device="cuda", dtype=torch.bfloat16)
        for b in batches:
            logits = torch.matmul(h_all[:b], w.t()).float()
            for name in names:
                cs = CONTROL_SETS[name]
                k = torch.full((b,), cs["k"], device="cuda", dtype=torch.int32) if cs["k"] else None
                p = torch.full((b,), cs["p"], device="cuda") if cs["p"] else None
                mp = torch.full((b,), cs["min_p"], device="cuda") if cs["min_p"] else None
                fn = lambda: vllm_filter_sample(logits, inv_t, k, p, mp)
                tok = fn()
                torch.cuda.synchronize()
                if tok.numel() != b or int(tok.min()) < 0 or int(tok.max()) >= v:
                    raise RuntimeError(f"vllm_filter gave tokens out of range at B={b}")
                stats = time_fn(fn, args.warmup, args.iterations)
                row = {"hidden": d, "vocab": v, "batch": b, "controls": name, "vllm_filter": stats}
                result["results"].append(row)
                print(f"{str(d) + 'x' + str(v):<12} {b:>4} {name:<12} {stats['median_ms']:>14.3f}",
                      flush=True)
            del logits
        del w, h_all
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


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
    ap.add_argument("--controls", default="",
                    help="time vLLM's sort-based filters instead (all, or top_p,top_k,top_k_top_p,min_p)")
    ap.add_argument("--commit", default="",
                    help="commit recorded in the JSON (default: git describe, where git works)")
    ap.add_argument("--paper-ref", default="",
                    help="folder of the FlashSampling reference package (with stubs/): time its Triton kernel too")
    args = ap.parse_args()
    if args.iterations < 100:
        sys.exit("peers.py: --iterations must be at least 100")
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device visible to PyTorch")
    shapes = parse_shapes(args.shapes)
    batches = parse_batches(args.batches)
    inv_t = 1.0 / args.temperature if args.temperature > 0 else 1.0
    if args.controls:
        torch.manual_seed(args.seed)
        run_controls(args, shapes, batches, inv_t)
        return

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
    paper_sample = None
    if args.paper_ref:
        sys.path[:0] = [os.path.join(args.paper_ref, "stubs"), args.paper_ref]
        from fused_mm_sampling.core import fused_mm_sample_triton as paper_sample
        result["variants"]["paper_triton"] = ("FlashSampling reference: fused_mm_sample_triton(W, H, 1, T, seed) "
                                              f"from {args.paper_ref}")
        paper_temperature = torch.tensor(args.temperature if args.temperature > 0 else 1.0, device="cuda")

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
        if paper_sample is not None:
            variants["paper_triton"] = lambda w: paper_sample(w, h, 1, paper_temperature, seed=0)
        if have_fp32_out:
            try:
                out = mm_fp32_out(h, ws[0])
                assert out.dtype == torch.float32 and out.shape == (b, v)
                variants["mm_fp32out"] = lambda w: mm_fp32_out(h, w)
            except Exception as e:
                have_fp32_out = False
                result["mm_fp32out_unavailable"] = f"{type(e).__name__}: {str(e)[:200]}"
        # -- sanity: every sampler's tokens are in range
        for name in [n for n in ("compiled", "vllm_race", "paper_triton") if n in variants]:
            tok = variants[name](ws[0]).reshape(-1)
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
    cols = ["compiled", "vllm_race", "mm_bf16", "mm_fp32out"] + (["paper_triton"] if paper_sample else [])
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
