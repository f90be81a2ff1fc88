"""The Python client against a real flashsampler-server (CPU backend)."""
import asyncio

import grpc
import numpy as np
import pytest

import flashsampler
from flashsampler import tensors
from flashsampler.v1 import sampler_pb2

from conftest import HIDDEN, VOCAB


def random_hidden(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, HIDDEN)).astype(np.float32)


def bf16_round(values: np.ndarray) -> np.ndarray:
    return tensors.bf16_bits_to_float32(tensors.float32_to_bf16_bits(values))


def test_bf16_rounding_known_values():
    values = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38, 1e-40], dtype=np.float32)
    bits = tensors.float32_to_bf16_bits(values)
    # 1 + 2^-8 is a tie between 1.0 and 1 + 2^-7: even mantissa (1.0) wins;
    # 1 + 3 * 2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6: even wins (1 + 2^-6).
    assert list(bits[:4]) == [0x3F80, 0xC020, 0x3F80, 0x3F82]
    assert bits[4] == 0x7F62  # 3e38 rounds to 2^127 * 1.765625, still finite
    assert tensors.bf16_bits_to_float32(bits[5:6])[0] == pytest.approx(1e-40, rel=1e-2)


def test_model_info(server):
    with flashsampler.SamplerClient(server["address"]) as client:
        info = client.model_info()
    assert (info.vocab_size, info.hidden_size) == (VOCAB, HIDDEN)
    assert info.weight_dtype == sampler_pb2.DTYPE_BF16
    assert info.backend == "cpu"


def test_greedy_is_float64_argmax(server):
    hidden = random_hidden(64, seed=1)
    logits = bf16_round(hidden).astype(np.float64) @ server["w"].astype(np.float64).T
    with flashsampler.SamplerClient(server["address"]) as client:
        result = client.sample(hidden, {"temperature": 0.0}, return_logz=True)
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3  # fp32 accumulation cannot reorder these
    assert clear.sum() >= 60
    np.testing.assert_array_equal(result.token_ids[clear], logits.argmax(axis=1)[clear])
    ref_logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    np.testing.assert_allclose(result.logz, ref_logz, rtol=1e-5, atol=1e-4)


def test_bf16_wire_equals_fp32_wire_and_seeds_replay(server):
    hidden = random_hidden(16, seed=2)
    params = {"temperature": 0.8, "seed": 1234, "offset": 5}
    with flashsampler.SamplerClient(server["address"]) as client:
        as_fp32 = client.sample(hidden, params, return_logprobs=True)
        as_bf16 = client.sample(hidden, params, dtype="bf16", return_logprobs=True)
        other_seed = client.sample(hidden, dict(params, seed=99))
    np.testing.assert_array_equal(as_fp32.token_ids, as_bf16.token_ids)
    np.testing.assert_array_equal(as_fp32.logprobs, as_bf16.logprobs)
    assert list(as_fp32.seeds) == [1234] * 16
    assert np.all(as_fp32.logprobs <= 0)
    assert not np.array_equal(as_fp32.token_ids, other_seed.token_ids)


def test_stream_in_order_and_equal_to_unary(server):
    requests = [flashsampler.make_request(random_hidden(3, seed=10 + i),
                                          {"temperature": 1.0, "seed": 7, "offset": i},
                                          request_id=f"r{i}") for i in range(5)]
    with flashsampler.SamplerClient(server["address"]) as client:
        streamed = list(client.sample_stream(requests))
        unary = [client.sample(random_hidden(3, seed=10 + i),
                               {"temperature": 1.0, "seed": 7, "offset": i}) for i in range(5)]
    assert [r.request_id for r in streamed] == [f"r{i}" for i in range(5)]
    for got, want in zip(streamed, unary):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)


def test_async_client_matches_sync(server):
    hidden = random_hidden(8, seed=4)
    params = [{"temperature": 0.5 + 0.1 * i, "seed": 100 + i} for i in range(8)]

    async def run():
        async with flashsampler.AsyncSamplerClient(server["address"]) as client:
            assert await client.health() == "SERVING"
            results = await asyncio.gather(*[client.sample(hidden, params) for _ in range(4)])
            streamed = [r async for r in client.sample_stream(
                [flashsampler.make_request(hidden, params)] * 2)]
            return results + streamed

    with flashsampler.SamplerClient(server["address"]) as client:
        want = client.sample(hidden, params).token_ids
    for result in asyncio.run(run()):
        np.testing.assert_array_equal(result.token_ids, want)


def test_verify_sync_and_async(server):
    """Greedy drafts equal to the argmax chain are all accepted (plus the bonus
    token); gamma = 0 equals sample(); async equals sync; bad drafts raise."""
    hidden = random_hidden(4, seed=21)
    with flashsampler.SamplerClient(server["address"]) as client:
        chain = client.sample(hidden, {"temperature": 0.0}).token_ids
        sampled = client.sample(hidden[:1], [{"temperature": 0.9, "seed": 5, "offset": 3}])
        sequences = [(hidden, chain[:3], {"temperature": 0.0}),
                     (hidden[:1], [], {"temperature": 0.9, "seed": 5, "offset": 3}),
                     (hidden[:3], [1, 2], {"temperature": 1.0, "seed": 8})]
        results = client.verify(sequences, return_acceptance_probs=True, return_logz=True)
        with pytest.raises(grpc.RpcError) as error:
            client.verify([(hidden[:2], [VOCAB], None)])
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert results[0].num_accepted == 3
    np.testing.assert_array_equal(results[0].token_ids, chain)
    assert results[0].acceptance_probs.shape == (3,) and results[0].logz.shape == (4,)
    assert results[1].num_accepted == 0 and results[1].seed == 5
    np.testing.assert_array_equal(results[1].token_ids, sampled.token_ids)
    assert len(results[2].token_ids) == results[2].num_accepted + 1

    async def run():
        async with flashsampler.AsyncSamplerClient(server["address"]) as client:
            return await client.verify(sequences, return_acceptance_probs=True)

    for got, want in zip(asyncio.run(run()), results):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_array_equal(got.acceptance_probs, want.acceptance_probs)


def test_bad_request_raises_invalid_argument(server):
    with flashsampler.SamplerClient(server["address"]) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.sample(np.zeros((2, HIDDEN + 1), np.float32))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_torch_tensors_bit_exact(server):
    torch = pytest.importorskip("torch")  # optional extra; not installed in CI
    hidden = random_hidden(4, seed=5)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    with flashsampler.SamplerClient(server["address"]) as client:
        from_numpy = client.sample(hidden, {"temperature": 1.0, "seed": 3}, dtype="bf16",
                                   return_logz=True)
        for device in devices:
            h = torch.from_numpy(hidden).to(torch.bfloat16).to(device)
            from_torch = client.sample(h, {"temperature": 1.0, "seed": 3}, return_logz=True)
            # Given torch, the results are torch tensors on the input's device.
            assert isinstance(from_torch.token_ids, torch.Tensor)
            assert from_torch.token_ids.device.type == device
            assert from_torch.token_ids.dtype == torch.int32
            np.testing.assert_array_equal(from_numpy.token_ids, from_torch.token_ids.cpu().numpy())
            np.testing.assert_array_equal(from_numpy.logz, from_torch.logz.cpu().numpy())
    async def run_async():
        async with flashsampler.AsyncSamplerClient(server["address"]) as client:
            return await client.sample(torch.from_numpy(hidden).to(torch.bfloat16),
                                       {"temperature": 1.0, "seed": 3})
    from_async = asyncio.run(run_async())
    assert isinstance(from_async.token_ids, torch.Tensor)
    np.testing.assert_array_equal(from_numpy.token_ids, from_async.token_ids.numpy())


def test_shared_memory_transport_matches_grpc(server):
    hidden = random_hidden(33, seed=8)
    params = {"temperature": 0.7, "seed": 11, "offset": 2}
    with flashsampler.SamplerClient(server["address"]) as client:
        want = client.sample(hidden, params, dtype="bf16", return_logz=True, return_logprobs=True)
        with flashsampler.SharedMemoryTransport(client, 1 << 16) as shm:
            (region,) = client.list_regions()
            assert region.name == shm.name and region.byte_size == 1 << 16
            got = shm.sample(hidden, params, dtype="bf16", return_logz=True, return_logprobs=True)
            # Twice: the region's slices are reused by the next request.
            again = shm.sample(hidden[:5], params, dtype="bf16")
        assert client.list_regions() == []
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    np.testing.assert_array_equal(got.logz, want.logz)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)
    np.testing.assert_array_equal(got.seeds, want.seeds)
    assert len(got.response.token_ids) == 0  # the tokens came through the region
    np.testing.assert_array_equal(again.token_ids, want.token_ids[:5])
    assert again.logz is None


def test_local_channel_matches_grpc(server):
    hidden = random_hidden(17, seed=12)
    params = {"temperature": 0.9, "seed": 5, "offset": 1}
    with flashsampler.SamplerClient(server["address"]) as client, \
            flashsampler.LocalChannel(server["local_socket"]) as local:
        want = client.sample(hidden, params, dtype="bf16", return_logz=True, return_logprobs=True)
        # The same message over the local channel, and through a region.
        request = flashsampler.make_request(hidden, params, dtype="bf16", return_logz=True,
                                            return_logprobs=True)
        direct = local.call_sample(request)
        with flashsampler.SharedMemoryTransport(client, 1 << 16, local=local) as shm:
            got = shm.sample(hidden, params, dtype="bf16", return_logz=True, return_logprobs=True)
        # A request's error is raised with its code, and the channel goes on.
        bad = flashsampler.make_request(random_hidden(2, seed=1))
        bad.hidden_states.shape[1] = HIDDEN + 1
        with pytest.raises(flashsampler.LocalChannelError) as error:
            local.call_sample(bad)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        again = local.call_sample(request)
    np.testing.assert_array_equal(direct.token_ids, want.token_ids)
    np.testing.assert_array_equal(direct.logz, want.logz)
    np.testing.assert_array_equal(direct.logprobs, want.logprobs)
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    np.testing.assert_array_equal(got.logprobs, want.logprobs)
    np.testing.assert_array_equal(again.token_ids, want.token_ids)
    with pytest.raises(flashsampler.LocalChannelError) as error:
        flashsampler.LocalChannel(server["local_socket"] + ".missing")
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_region_errors_are_raised_with_their_codes(server):
    with flashsampler.SamplerClient(server["address"]) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.register_system_shared_memory("x", "/flashsampler-no-such-object", 64)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as error:
            client.unregister_region("x")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        request = flashsampler.make_request(random_hidden(2, seed=1))
        request.hidden_states.data = b""
        request.hidden_states_region.region = "x"
        request.hidden_states_region.byte_size = 2 * HIDDEN * 4
        with pytest.raises(grpc.RpcError) as error:
            client.call_sample(request)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        with flashsampler.SharedMemoryTransport(client, 1024) as shm:
            with pytest.raises(ValueError, match="needs"):
                shm.sample(random_hidden(8, seed=1))  # 2 KiB of fp32 does not fit


def test_cuda_ipc_transport_matches_grpc(server):
    torch = pytest.importorskip("torch")  # optional extra; not installed in CI
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # The suite's server runs the CPU backend, which refuses CUDA IPC regions
    # (tests/gpu/cuda_ipc_e2e_gpu_test.cc covers the transport on a GPU server).
    with flashsampler.SamplerClient(server["address"]) as client:
        with pytest.raises(grpc.RpcError) as error:
            flashsampler.CudaIpcTransport(client, 1 << 16)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cuda_ipc_transport_on_a_cuda_server_matches_grpc(monkeypatch):
    """A CUDA server of its own (needs a GPU and torch with CUDA; skipped
    elsewhere, i.e. in CI): tokens, logz and logprobs through a CUDA IPC
    buffer equal the gRPC path's, on the default device and on device=0; and a
    buffer whose request failed on this side is kept, not freed, on close."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from conftest import start_server, stop_server
    from flashsampler import regions
    proc, address, _ = start_server(["--backend=cuda", f"--demo_hidden={HIDDEN}"])
    try:
        hidden = torch.from_numpy(random_hidden(9, seed=21)).to(torch.bfloat16)
        params = {"temperature": 0.8, "seed": 7, "offset": 4}
        with flashsampler.SamplerClient(address) as client:
            want = client.sample(hidden, params, return_logz=True, return_logprobs=True)
            for device in (None, 0):
                with flashsampler.CudaIpcTransport(client, 1 << 16, device=device) as ipc:
                    got = ipc.sample(hidden.cuda(), params, return_logz=True, return_logprobs=True)
                assert got.token_ids.device.type == "cuda"
                assert got.token_ids.cpu().tolist() == want.token_ids.tolist()
                assert torch.equal(got.logz.cpu(), want.logz)
                assert torch.equal(got.logprobs.cpu(), want.logprobs)
            # A call that fails on this side (here: made to fail) may still
            # run on the server: closing keeps its buffer out of the allocator.
            kept = len(regions._BUFFERS_IN_DOUBT)
            with flashsampler.CudaIpcTransport(client, 1 << 16) as ipc:
                def lost(request, timeout):
                    raise ConnectionError("connection lost mid-call")
                monkeypatch.setattr(ipc, "_call", lost)
                with pytest.raises(ConnectionError):
                    ipc.sample(hidden.cuda(), params)
                buffer = ipc._buf
            assert len(regions._BUFFERS_IN_DOUBT) == kept + 1
            assert regions._BUFFERS_IN_DOUBT[-1] is buffer
            with flashsampler.CudaIpcTransport(client, 1 << 16) as ipc:
                ipc.sample(hidden.cuda(), params)  # a call that succeeds: freed on close
            assert len(regions._BUFFERS_IN_DOUBT) == kept + 1
            assert client.list_regions() == []
    finally:
        stop_server(proc)


def test_calls_to_a_name_of_two_servers_reach_both():
    """round_robin (flashsampler.client.SERVICE_CONFIG): a target that resolves
    to two servers gets calls to both. The servers hold different demo heads,
    so the greedy token of one request tells which one answered."""
    from conftest import start_server, stop_server
    procs = [start_server([f"--demo_seed={seed}", f"--demo_hidden={HIDDEN}"]) for seed in (1, 2)]
    try:
        hidden = random_hidden(1, seed=4)
        direct = []
        for _, address, _ in procs:
            with flashsampler.SamplerClient(address) as client:
                direct.append(int(client.sample(hidden).token_ids[0]))
        assert direct[0] != direct[1], "the two demo heads must answer differently"
        target = "ipv4:" + ",".join(address for _, address, _ in procs)
        seen = set()
        with flashsampler.SamplerClient(target) as client:
            for _ in range(1000):  # round_robin alternates once both connections are up
                seen.add(int(client.sample(hidden).token_ids[0]))
                if len(seen) == 2:
                    break
        assert seen == set(direct)
    finally:
        for proc, _, _ in procs:
            stop_server(proc)


def test_mtls_and_token(secure_server):
    pki = secure_server["pki"]
    hidden = random_hidden(2, seed=6)
    good = dict(tls=True, root_certificates=pki / "ca.pem", private_key=pki / "client.key",
                certificate_chain=pki / "client.pem")
    with flashsampler.SamplerClient(secure_server["address"], token_file=pki / "token",
                                    **good) as client:
        assert client.sample(hidden, {"temperature": 0.0}).token_ids.shape == (2,)
    with flashsampler.SamplerClient(secure_server["address"], token="wrong", **good) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.sample(hidden)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # No client certificate under mTLS: the handshake fails.
    with flashsampler.SamplerClient(secure_server["address"], token_file=pki / "token", tls=True,
                                    root_certificates=pki / "ca.pem") as client:
        with pytest.raises(grpc.RpcError) as error:
            client.sample(hidden, timeout=60)  # fails at the handshake; 60 s only bounds a busy machine
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    # Probes use the plaintext health-only port.
    with flashsampler.SamplerClient(secure_server["health"]) as probe:
        assert probe.health() == "SERVING"


def test_async_client_with_tls_and_token(secure_server):
    pki = secure_server["pki"]
    hidden = random_hidden(3, seed=8)

    async def run():
        async with flashsampler.AsyncSamplerClient(
                secure_server["address"], tls=True, root_certificates=pki / "ca.pem",
                private_key=pki / "client.key", certificate_chain=pki / "client.pem",
                token_file=pki / "token") as client:
            return [r async for r in client.sample_stream(
                [flashsampler.make_request(hidden, {"temperature": 1.0, "seed": 5})] * 2)]

    first, second = asyncio.run(run())
    np.testing.assert_array_equal(first.token_ids, second.token_ids)
