"""A Hugging Face transformers model decoding through FlashSampler: do we get
the tokens the model itself would produce?"""
import json
import math

import numpy as np
import torch

import flashsampler
import hf_generate

PROMPTS = ([1, 15, 300, 42], [7, 7, 7], [31999, 5], [2, 1000, 20000, 3, 17])
STEPS = 16


def hf_greedy(model, prompt, steps):
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=steps)
    return out[0, len(prompt):].tolist()


def test_the_server_read_the_sharded_folder(fp32_llama):
    index = json.loads((fp32_llama["folder"] / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "save_pretrained wrote one shard"
    with flashsampler.SamplerClient(fp32_llama["address"]) as client:
        info = client.model_info()
    head = fp32_llama["model"].lm_head.weight
    assert (info.vocab_size, info.hidden_size) == tuple(head.shape)
    assert info.weight_dtype == flashsampler.v1.sampler_pb2.DTYPE_FP32


def test_greedy_fp32_equals_generate(fp32_llama):
    model = fp32_llama["model"]
    with flashsampler.SamplerClient(fp32_llama["address"]) as client:
        for prompt in PROMPTS:
            assert hf_generate.generate(model, client, prompt, STEPS) == hf_greedy(model, prompt, STEPS), prompt


def test_greedy_bf16_tied_equals_generate_up_to_ties(bf16_tied_llama):
    """bf16: HF's logits are bf16, so several tokens can share the top value
    (HF then takes the lowest id), or two nearly equal dot products summed in
    different orders can round to neighbouring bf16 values, while the server
    ranks fp32 dot products of the same bf16 operands. Teacher-forced on HF's
    sequence, every step must agree or be such a near-tie: our token's bf16
    logit within one bf16 ulp of the maximum."""
    model = bf16_tied_llama["model"]
    steps = ties = 0
    with flashsampler.SamplerClient(bf16_tied_llama["address"]) as client:
        for prompt in PROMPTS:
            sequence = prompt + hf_greedy(model, prompt, STEPS)
            with torch.no_grad():
                out = model(torch.tensor([sequence]))
                hidden = model.model(torch.tensor([sequence])).last_hidden_state[0]
            for pos in range(len(prompt) - 1, len(sequence) - 1):
                ours = int(client.sample(hidden[pos:pos + 1], {"temperature": 0.0}).token_ids[0])
                logits = out.logits[0, pos]
                steps += 1
                if ours != sequence[pos + 1]:
                    ties += 1
                    top = float(logits.max())
                    ulp = 2.0 ** (math.floor(math.log2(abs(top))) - 7)
                    assert float(logits[ours]) >= top - ulp, (prompt, pos, ours, sequence[pos + 1])
    print(f"bf16 tied head: {steps - ties} of {steps} greedy steps equal, {ties} near-ties broken differently")


def _chi_square_p(statistic, dof):
    """Upper tail of chi-square by the Wilson-Hilferty cube-root normal approximation."""
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_first_token_distribution_matches_the_models_softmax(fp32_llama):
    """T = 0.8, top_k = 50, top_p = 0.9: 20 000 first tokens (one seed each)
    against softmax(logits / T) of the HF model itself, in float64, cut as
    sampler.proto documents (top-k, then the shortest prefix reaching top_p)."""
    model = fp32_llama["model"]
    prompt = [1, 15, 300, 42]
    h, _ = hf_generate.last_hidden(model, torch.tensor([prompt]))
    with torch.no_grad():
        logits = (h.double() @ model.lm_head.weight.double().T)[0] / 0.8
    order = torch.argsort(logits, descending=True, stable=True)[:50]
    p = torch.softmax(logits[order], dim=0)
    before = torch.cumsum(p, 0) - p
    kept = order[before < 0.9]
    expected = torch.softmax(logits[kept], dim=0).numpy()
    counts = {int(t): 0 for t in kept}
    rows = 2000
    with flashsampler.SamplerClient(fp32_llama["address"]) as client:
        for call in range(10):
            params = [{"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": call * rows + r} for r in range(rows)]
            tokens = client.sample(h.expand(rows, -1), params).token_ids
            for t in tokens.tolist():
                assert t in counts, f"token {t} is outside the top-k / top-p set"
                counts[t] += 1
    n = rows * 10
    observed = np.array([counts[int(t)] for t in kept], dtype=np.float64)
    statistic = float(((observed - n * expected) ** 2 / (n * expected)).sum())
    dof = len(kept) - 1
    assert dof >= 5, f"only {len(kept)} tokens kept: the test would say little"
    # The same counts against T = 1 (the temperature ignored): must be rejected,
    # or 20 000 samples could not tell the distributions apart.
    with torch.no_grad():
        wrong = torch.softmax(logits[kept] * 0.8, dim=0).numpy()
    wrong_statistic = float(((observed - n * wrong) ** 2 / (n * wrong)).sum())
    print(f"first token: {len(kept)} tokens kept, chi-square {statistic:.1f} on {dof} dof "
          f"(p = {_chi_square_p(statistic, dof):.3f}); against T = 1: p = {_chi_square_p(wrong_statistic, dof):.2g}")
    assert _chi_square_p(statistic, dof) > 1e-3, (statistic, dof)
    assert _chi_square_p(wrong_statistic, dof) < 1e-6, (wrong_statistic, dof)


def test_a_seed_replays_the_sampled_sequence(fp32_llama):
    model = fp32_llama["model"]
    params = {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 1234}
    with flashsampler.SamplerClient(fp32_llama["address"]) as client:
        first = hf_generate.generate(model, client, PROMPTS[0], STEPS, params)
        again = hf_generate.generate(model, client, PROMPTS[0], STEPS, params)
        other = hf_generate.generate(model, client, PROMPTS[0], STEPS, dict(params, seed=99))
    assert first == again
    assert first != other


def test_verify_accepts_the_models_own_greedy_draft(fp32_llama):
    """The draft is generate's own greedy continuation: every draft token is
    accepted and the bonus token is generate's next one."""
    model = fp32_llama["model"]
    gamma = 5
    with flashsampler.SamplerClient(fp32_llama["address"]) as client:
        for prompt in PROMPTS:
            greedy = hf_greedy(model, prompt, gamma + 1)
            draft = greedy[:gamma]
            with torch.no_grad():
                hidden = model.model(torch.tensor([prompt + draft])).last_hidden_state[0]
            rows = hidden[len(prompt) - 1:]  # the gamma + 1 positions that predict x_0 .. x_gamma
            (result,) = client.verify([(rows, draft, {"temperature": 0.0})])
            assert result.num_accepted == gamma, prompt
            assert result.token_ids.tolist() == greedy, prompt
