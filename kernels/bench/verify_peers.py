#!/usr/bin/env python3
"""Times the conventional (materialized) speculative-verification step in
PyTorch, beside flashsampler-verify-bench (same shapes, same law of inputs).

    python3 kernels/bench/verify_peers.py [--hidden=4096] [--vocab=151936]
        [--gammas=1,3,5,7] [--sequences=1,2,4,8,16] [--iterations=100]
        [--warmup=10] [--temperature=1] [--json=verify_peers.json]

One step verifies S sequences of gamma greedy draft tokens: rows = S * (gamma + 1).
The baseline, eager PyTorch, as standard verification does it:
  logits = (H @ W^T).float()                  cuBLAS bf16 GEMM, fp32 logits [rows, V]
  probs = softmax(logits / T)                 [rows, V]
  p_x = probs[draft positions].gather(x)      acceptance probabilities
  accept = rand < p_x; accepted prefix length per sequence
  residual = probs with x zeroed, renormalized (= max(0, p - q) for a one-hot q)
  recovered = multinomial(residual); bonus = multinomial(probs[bonus rows])
  output tokens assembled on the device.
Inputs: W ~ N(0, logit_std^2 / D) bf16, H ~ N(0, 1) bf16, random drafts.
Timing: CUDA events around each step, median / min of --iterations after --warmup
(peers.py's time_fn).
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import commit, time_fn  # noqa: E402


def verify_materialized(h, w, drafts, inv_t: float, seqs: int, gamma: int):
    vocab = w.shape[0]
    logits = torch.matmul(h, w.t()).float()
    probs = torch.softmax(logits * inv_t, dim=-1).view(seqs, gamma + 1, vocab)
    bonus = torch.multinomial(probs[:, gamma], 1)  # [S, 1]
    if gamma == 0:
        return bonus, torch.zeros(seqs, dtype=torch.int64, device=h.device)
    draft_probs = probs[:, :gamma]  # [S, gamma, V]
    p_x = draft_probs.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [S, gamma]
    accepted = torch.rand(seqs, gamma, device=h.device) < p_x
    num_accepted = accepted.to(torch.int64).cumprod(-1).sum(-1)  # [S]
    residual = draft_probs.scatter(-1, drafts.unsqueeze(-1), 0.0)
    residual = residual / residual.sum(-1, keepdim=True)
    recovered = torch.multinomial(residual.reshape(-1, vocab), 1).view(seqs, gamma)
    # Output row s: drafts[:num_accepted], then recovered[num_accepted] or the bonus.
    positions = torch.arange(gamma + 1, device=h.device).unsqueeze(0)
    last = torch.cat([recovered, bonus], dim=-1)  # [S, gamma + 1]
    padded = torch.cat([drafts, bonus], dim=-1)
    tokens = torch.where(positions < num_accepted.unsqueeze(-1), padded, last)
    return tokens, num_accepted


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--gammas", default="1,3,5,7")
    ap.add_argument("--sequences", default="1,2,4,8,16")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--logit-std", type=float, default=2.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    gammas = [int(x) for x in args.gammas.split(",") if x.strip()]
    sequences = [int(x) for x in args.sequences.split(",") if x.strip()]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    d, v = args.hidden, args.vocab
    w = (torch.randn(v, d, device=dev) * (args.logit_std / d ** 0.5)).to(torch.bfloat16)
    max_rows = max(s * (g + 1) for g in gammas for s in sequences)
    h_all = torch.randn(max_rows, d, device=dev).to(torch.bfloat16)
    inv_t = 1.0 / args.temperature
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = torch.cuda.get_device_name()
    print(f"verify_peers.py on {name}, D={d} V={v} bf16, T={args.temperature}, torch {torch.__version__}, "
          f"{args.iterations} runs, {date}, commit {commit()}")
    print(f"{'gamma':>6} {'seqs':>5} {'rows':>5} {'torch_materialized ms':>22}")
    results = []
    for gamma in gammas:
        for seqs in sequences:
            rows = seqs * (gamma + 1)
            h = h_all[:rows]
            drafts = torch.randint(0, v, (seqs, gamma), device=dev)
            stats = time_fn(lambda: verify_materialized(h, w, drafts, inv_t, seqs, gamma),
                            args.warmup, args.iterations)
            print(f"{gamma:>6} {seqs:>5} {rows:>5} {stats['median_ms']:>22.4f}")
            results.append({"gamma": gamma, "sequences": seqs, "rows": rows,
                            "torch_materialized_ms": stats})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "date": date, "commit": commit(), "torch": torch.__version__,
                       "hidden": d, "vocab": v, "temperature": args.temperature,
                       "iterations": args.iterations, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
