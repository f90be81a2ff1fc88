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


def start_server(flags, wait_health=True):
    """Starts flashsampler-server with `flags`; returns (process, address,
    health address or None) once health answers SERVING."""
    proc = subprocess.Popen([_binary("FLASHSAMPLER_SERVER_BIN"), "--address=127.0.0.1:0",
                             "--backend=cpu", "--threads=2", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    address = health = None
    wants_health = any(f.startswith("--health_address=") for f in flags)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (address is None or (wants_health and health is None)):
        line = proc.stdout.readline()
        if not line:
            break
        if match := re.search(r"health listening on (\S+)", line):
            health = match.group(1)
        elif match := re.search(r"server listening on (\S+)", line):
            address = match.group(1)
    if address is None or (wants_health and health is None):
        proc.kill()
        raise RuntimeError(f"server did not start: {proc.stderr.read()}")
    import flashsampler

    with flashsampler.SamplerClient(health or address) as probe:
        while probe.health() != "SERVING":
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("server never became SERVING")
            time.sleep(0.05)
    return proc, address, health


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="session")
def head_file(tmp_path_factory):
    weights = tmp_path_factory.mktemp("head") / "head.safetensors"
    subprocess.run([_binary("FLASHSAMPLER_DEMO_HEAD_BIN"), f"--out={weights}",
                    f"--vocab={VOCAB}", f"--hidden={HIDDEN}", "--seed=7", "--dtype=bf16"],
                   check=True, capture_output=True)
    return weights


@pytest.fixture(scope="session")
def server(head_file, tmp_path_factory):
    local_socket = tmp_path_factory.mktemp("local") / "fs.sock"
    proc, address, _ = start_server([f"--weights={head_file}", f"--local_socket={local_socket}"])
    yield {"address": address, "w": read_safetensors_bf16(head_file, "lm_head.weight"),
           "local_socket": str(local_socket)}
    stop_server(proc)


@pytest.fixture(scope="session")
def secure_server(head_file, tmp_path_factory):
    """mTLS + bearer token, with the plaintext health-only port."""
    pki = tmp_path_factory.mktemp("pki")
    subprocess.run(["bash", _binary("FLASHSAMPLER_MAKE_TEST_CERTS"), str(pki)], check=True)
    (pki / "token").write_text("s3cret-token\n")
    proc, address, health = start_server([
        f"--weights={head_file}", f"--tls_cert={pki / 'server.pem'}",
        f"--tls_key={pki / 'server.key'}", f"--tls_client_ca={pki / 'ca.pem'}",
        f"--auth_token_file={pki / 'token'}", "--health_address=127.0.0.1:0"])
    yield {"address": address, "health": health, "pki": pki}
    stop_server(proc)
