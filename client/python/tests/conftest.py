"""Starts a real flashsampler-server (CPU backend) on a free loopback port.

The binaries come from the environment (set by ctest): FLASHSAMPLER_SERVER_BIN
and FLASHSAMPLER_DEMO_HEAD_BIN. The LM head is written to a safetensors file
first, so the tests can read W back and compute references in float64.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import numpy as np
import pytest

VOCAB = 2048
HIDDEN = 64


def _binary(name: str) -> str:
    path = os.environ.get(name)
    if not path or not pathlib.Path(path).is_file():
        raise RuntimeError(f"{name} must name the built binary (ctest sets it), got {path!r}")
    return path


def read_safetensors_bf16(path: pathlib.Path, tensor: str) -> np.ndarray:
    """W as float32 from a bf16 safetensors file (8-byte length, JSON header, data)."""
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    entry = header[tensor]
    assert entry["dtype"] == "BF16", entry
    begin, end = entry["data_offsets"]
    bits = np.frombuffer(raw[8 + header_len + begin:8 + header_len + end], dtype="<u2")
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    weights = tmp_path_factory.mktemp("head") / "head.safetensors"
    subprocess.run([_binary("FLASHSAMPLER_DEMO_HEAD_BIN"), f"--out={weights}",
                    f"--vocab={VOCAB}", f"--hidden={HIDDEN}", "--seed=7", "--dtype=bf16"],
                   check=True, capture_output=True)
    proc = subprocess.Popen([_binary("FLASHSAMPLER_SERVER_BIN"), "--address=127.0.0.1:0",
                             "--backend=cpu", "--threads=2", f"--weights={weights}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    address = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"listening on (\S+)", line)
        if match:
            address = match.group(1)
            break
    if address is None:
        proc.kill()
        raise RuntimeError(f"server did not start: {proc.stderr.read()}")
    import flashsampler

    with flashsampler.SamplerClient(address) as probe:
        while probe.health() != "SERVING":
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("server never became SERVING")
            time.sleep(0.05)
    w = read_safetensors_bf16(weights, "lm_head.weight")
    yield {"address": address, "w": w}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
