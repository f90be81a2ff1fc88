"""A Hugging Face transformers model decoding through FlashSampler.

The model's forward pass up to the final norm runs here, in the engine; the LM
head lives in flashsampler-server, which picks each token. The model is a small
Llama built from a config with random weights (nothing is downloaded), saved
with save_pretrained (sharded, so the server reads the index), and served with
`flashsampler-server --weights=FOLDER`.

    python examples/hf_generate.py --server_bin=build/bin/flashsampler-server

prints the greedy continuation of a few prompts from FlashSampler next to
`model.generate(do_sample=False)`, then a sampled one (T = 0.8, top-k 50,
top-p 0.9) that replays exactly from its seed. Needs torch and transformers.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time

import numpy as np
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import flashsampler


def _allow_generate_on_debian_torch() -> None:
    """Debian 12's torch 1.13 cannot import torch.distributed.fsdp on Python
    3.11 (a dataclass with a mutable default, fixed in torch 2.0), and
    transformers' generate() imports it only to ask whether the model is
    FSDP-managed. A model built here never is: answer that directly."""
    try:
        import torch.distributed.fsdp  # noqa: F401
    except (ImportError, TypeError, ValueError):
        import transformers.generation.utils as generation_utils
        generation_utils.is_fsdp_managed_module = lambda module: False


_allow_generate_on_debian_torch()


def build_model(folder: str, *, dtype=torch.float32, tie_embeddings=False, seed=0,
                vocab=32000, hidden=512, layers=2) -> LlamaForCausalLM:
    """A random Llama, saved to `folder` in shards of 20 MB (so with an index)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, tie_word_embeddings=tie_embeddings,
                         # No end-of-sequence token: generate() then never stops
                         # early nor masks a token, so it compares step for step.
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(dtype).eval()
    # Random init (std 0.02) gives logits of std ~0.45 over a normalised
    # hidden state: nearly flat over 32k tokens. Four times that (std ~2) is
    # closer to a trained model's: greedy has clear winners, and at T = 0.8
    # top-k 50 / top-p 0.9 keep a few dozen tokens.
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(folder, max_shard_size="20MB", safe_serialization=True)
    return model


def start_server(server_bin: str, folder: str, extra=()) -> tuple[subprocess.Popen, str]:
    """flashsampler-server on a free loopback port, CPU backend; (process, address)."""
    proc = subprocess.Popen([server_bin, "--address=127.0.0.1:0", "--backend=cpu", f"--weights={folder}",
                             "--max_request_rows=4096", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        match = re.search(r"server listening on (\S+)", line)
        if match:
            address = match.group(1)
            break
    else:
        raise RuntimeError(f"server did not start: {proc.stderr.read()}")
    with flashsampler.SamplerClient(address) as probe:
        deadline = time.monotonic() + 120
        while probe.health() != "SERVING":
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("server never became SERVING")
            time.sleep(0.05)  # poll interval of the bounded readiness wait
    return proc, address


@torch.no_grad()
def last_hidden(model: LlamaForCausalLM, input_ids: torch.Tensor, past=None):
    """The final-norm hidden state of the last position [B, D], and the cache."""
    out = model.model(input_ids=input_ids, past_key_values=past, use_cache=True)
    return out.last_hidden_state[:, -1, :], out.past_key_values


def generate(model, client, prompt: list[int], steps: int, params=None) -> list[int]:
    """Decodes `steps` tokens after `prompt`: the model runs here, FlashSampler
    samples. `params` is SamplingParams fields (default greedy); the step is
    the Philox offset, so a seed replays the whole sequence."""
    tokens = list(prompt)
    h, past = last_hidden(model, torch.tensor([prompt]), DynamicCache())
    for step in range(steps):
        step_params = dict(params or {"temperature": 0.0})
        step_params["offset"] = step
        token = int(client.sample(h, step_params).token_ids[0])
        tokens.append(token)
        h, past = last_hidden(model, torch.tensor([[token]]), past)
    return tokens[len(prompt):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server_bin", required=True)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = build_model(folder)
        proc, address = start_server(args.server_bin, folder)
        try:
            with flashsampler.SamplerClient(address) as client:
                info = client.model_info()
                print(f"served: V={info.vocab_size} D={info.hidden_size} from {folder}")
                for prompt in ([1, 15, 300, 42], [7, 7, 7], [31999, 5]):
                    ours = generate(model, client, prompt, args.steps)
                    hf = model.generate(torch.tensor([prompt]), do_sample=False,
                                        max_new_tokens=args.steps)[0, len(prompt):].tolist()
                    print(f"prompt {prompt}: FlashSampler {ours}\n{'':>{len(str(prompt)) + 8}}generate     {hf}"
                          f"  {'same' if ours == hf else 'DIFFERENT'}")
                params = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 1234}
                first = generate(model, client, [1, 15, 300, 42], args.steps, params)
                again = generate(model, client, [1, 15, 300, 42], args.steps, params)
                print(f"sampled (T=0.8, top_k=50, top_p=0.9, seed 1234): {first}; replayed: "
                      f"{'same' if first == again else 'DIFFERENT'}")
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
