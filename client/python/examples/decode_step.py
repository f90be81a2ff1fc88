"""The per-decode-step call an inference engine makes.

Each step the engine has the last hidden state of every running sequence
(H [B, D], bf16 on its GPU); it sends them with each sequence's sampling
parameters and gets one token per sequence. The seed is fixed per sequence and
the offset is the decode step, so any step can be replayed exactly.

    python examples/decode_step.py --address=127.0.0.1:50051 --steps=4
"""
import argparse

import numpy as np

import flashsampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--token_file", default=None)
    args = parser.parse_args()

    with flashsampler.SamplerClient(args.address, token_file=args.token_file) as client:
        info = client.model_info()
        print(f"model: V={info.vocab_size} D={info.hidden_size} backend={info.backend}")
        rng = np.random.default_rng(0)
        seeds = [1000 + s for s in range(args.batch)]
        for step in range(args.steps):
            # Stand-in for the engine's last-layer hidden states of this step.
            hidden = rng.standard_normal((args.batch, info.hidden_size)).astype(np.float32)
            params = [{"temperature": 0.7, "seed": seed, "offset": step} for seed in seeds]
            result = client.sample(hidden, params, dtype="bf16", return_logprobs=True)
            print(f"step {step}: tokens={result.token_ids.tolist()} "
                  f"logprobs={np.round(result.logprobs, 3).tolist()}")


if __name__ == "__main__":
    main()
