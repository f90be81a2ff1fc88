"""A small Hugging Face Llama (random weights, no download) and a
flashsampler-server serving its LM head from the save_pretrained folder.

The server binary comes from FLASHSAMPLER_SERVER_BIN (set by ctest). The
example's functions (client/python/examples/hf_generate.py) build the model,
start the server and run the generation loop, so the test runs what the
example shows.
"""
import os
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import hf_generate  # noqa: E402


def _server_bin() -> str:
    path = os.environ.get("FLASHSAMPLER_SERVER_BIN")
    if not path or not pathlib.Path(path).is_file():
        raise RuntimeError(f"FLASHSAMPLER_SERVER_BIN must name the built server (ctest sets it), got {path!r}")
    return path


def _served(tmp_path_factory, name, **model_args):
    folder = tmp_path_factory.mktemp(name)
    model = hf_generate.build_model(str(folder), **model_args)
    proc, address = hf_generate.start_server(_server_bin(), str(folder))
    return model, proc, address, folder


@pytest.fixture(scope="session")
def fp32_llama(tmp_path_factory):
    """fp32 weights, an untied lm_head.weight, sharded with an index."""
    model, proc, address, folder = _served(tmp_path_factory, "llama-fp32")
    yield {"model": model, "address": address, "folder": folder}
    proc.terminate()
    assert proc.wait(timeout=60) == 0


@pytest.fixture(scope="session")
def bf16_tied_llama(tmp_path_factory):
    """bf16 weights, the head tied to the embeddings (model.embed_tokens.weight)."""
    model, proc, address, folder = _served(tmp_path_factory, "llama-bf16-tied", dtype=torch.bfloat16,
                                           tie_embeddings=True, seed=1)
    yield {"model": model, "address": address, "folder": folder}
    proc.terminate()
    assert proc.wait(timeout=60) == 0
