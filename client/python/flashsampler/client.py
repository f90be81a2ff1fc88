"""SamplerClient / AsyncSamplerClient: Python clients for flashsampler-server.

One call per decode step: hand over the last hidden states H [B, D] (numpy or
torch, fp32/fp16/bf16), get back one sampled token id per row as numpy arrays.
Sampling parameters are SamplingParams fields given as a dict (one for all rows)
or a list of B dicts (one per row), so fields added to the API need no client
change. Errors are raised as grpc.RpcError with the server's status code
(INVALID_ARGUMENT for a bad request, UNAVAILABLE while loading or draining,
RESOURCE_EXHAUSTED when the server sheds load, UNAUTHENTICATED for a bad token).

Thread safety: a SamplerClient may be shared by threads (gRPC channels are
thread-safe). An AsyncSamplerClient belongs to the event loop it was created on.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Iterable, Iterator, Mapping, Sequence

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flashsampler.tensors import to_wire_tensor
from flashsampler.v1 import sampler_pb2, sampler_pb2_grpc

_MAX_MESSAGE_BYTES = 256 << 20


@dataclasses.dataclass
class SampleResult:
    token_ids: np.ndarray        # [B] int32
    seeds: np.ndarray            # [B] uint64: the seed each row used (for replay)
    logz: np.ndarray | None      # [B] float32 when asked
    logprobs: np.ndarray | None  # [B] float32 when asked
    request_id: str
    response: sampler_pb2.SampleResponse  # the whole message (fields added later)


@dataclasses.dataclass
class VerifyResult:
    """One sequence of a Verify call (see sampler.proto's VerifyRequest)."""
    num_accepted: int
    token_ids: np.ndarray                  # [num_accepted + 1] int32
    seed: int                              # the seed the sequence used
    acceptance_probs: np.ndarray | None    # [gamma] float32 when asked
    logz: np.ndarray | None                # [gamma + 1] float32 when asked


def _read(value) -> bytes | None:
    """PEM given as bytes, or a path to a file holding it."""
    if value is None or isinstance(value, bytes):
        return value
    return pathlib.Path(value).read_bytes()


# round_robin over every address the target resolves to (a "dns:///" name of
# a Kubernetes headless service, or "ipv4:HOST:PORT,HOST:PORT"), so calls
# spread over the servers behind one name; gRPC's default, pick_first, would
# send every call down one connection. With one address: one connection.
SERVICE_CONFIG = '{"loadBalancingConfig": [{"round_robin": {}}]}'


def _channel_args():
    return [
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.service_config", SERVICE_CONFIG),
    ]


def _credentials(tls: bool, root_certificates, private_key, certificate_chain):
    if not tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(root_certificates),
        private_key=_read(private_key),
        certificate_chain=_read(certificate_chain),
    )


def _token(token: str | None, token_file) -> str | None:
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token_file is not None:
        token = pathlib.Path(token_file).read_text().strip()
    return token


def sampling_params(params=None) -> list[sampler_pb2.SamplingParams]:
    """`params` as SampleRequest.params: a SamplingParams, a dict of its fields
    (one entry for all rows), or a list of those (one per row). Default: greedy."""
    if params is None:
        entries = [sampler_pb2.SamplingParams()]
    elif isinstance(params, (Mapping, sampler_pb2.SamplingParams)):
        entries = [params]
    else:
        entries = list(params)
    return [p if isinstance(p, sampler_pb2.SamplingParams) else sampler_pb2.SamplingParams(**p)
            for p in entries]


def make_request(hidden, params=None, *, dtype: str | None = None, return_logz=False,
                 return_logprobs=False, request_id: str = "") -> sampler_pb2.SampleRequest:
    """Builds a SampleRequest (`params` as sampling_params takes them)."""
    return sampler_pb2.SampleRequest(
        hidden_states=to_wire_tensor(hidden, dtype),
        params=sampling_params(params),
        return_logz=return_logz,
        return_logprobs=return_logprobs,
        request_id=request_id,
    )


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def to_result(response: sampler_pb2.SampleResponse, like=None) -> SampleResult:
    """The response as arrays: numpy, or, when `like` is a torch tensor (the
    hidden states the caller passed), torch tensors on its device (token ids
    int32, logz / logprobs float32). Seeds stay a numpy uint64 array."""
    result = SampleResult(
        token_ids=np.asarray(response.token_ids, dtype=np.int32),
        seeds=np.asarray(response.seeds, dtype=np.uint64),
        logz=np.asarray(response.logz, dtype=np.float32) if len(response.logz) else None,
        logprobs=np.asarray(response.logprobs, dtype=np.float32) if len(response.logprobs) else None,
        request_id=response.request_id,
        response=response,
    )
    if like is not None and _is_torch(like):
        import torch  # the caller passed a torch tensor, so torch is there

        def to_torch(array):
            return None if array is None else torch.from_numpy(array).to(like.device)

        result.token_ids = to_torch(result.token_ids)
        result.logz = to_torch(result.logz)
        result.logprobs = to_torch(result.logprobs)
    return result


def make_verify_request(sequences, *, dtype: str | None = None, return_acceptance_probs=False,
                        return_logz=False, request_id: str = "") -> sampler_pb2.VerifyRequest:
    """Builds a VerifyRequest. `sequences`: an iterable of (hidden, draft_token_ids,
    params) with hidden [gamma + 1, D], gamma draft ids and params a dict of
    SamplingParams fields, a SamplingParams or None (greedy)."""
    built = []
    for hidden, drafts, params in sequences:
        if params is None:
            params = sampler_pb2.SamplingParams()
        elif not isinstance(params, sampler_pb2.SamplingParams):
            params = sampler_pb2.SamplingParams(**params)
        built.append(sampler_pb2.VerifySequence(
            hidden_states=to_wire_tensor(hidden, dtype),
            draft_token_ids=[int(x) for x in drafts],
            params=params))
    return sampler_pb2.VerifyRequest(sequences=built,
                                     return_acceptance_probs=return_acceptance_probs,
                                     return_logz=return_logz, request_id=request_id)


def to_verify_results(response: sampler_pb2.VerifyResponse) -> list[VerifyResult]:
    return [VerifyResult(
        num_accepted=s.num_accepted,
        token_ids=np.asarray(s.token_ids, dtype=np.int32),
        seed=s.seed,
        acceptance_probs=(np.asarray(s.acceptance_probs, dtype=np.float32)
                          if len(s.acceptance_probs) else None),
        logz=np.asarray(s.logz, dtype=np.float32) if len(s.logz) else None,
    ) for s in response.sequences]


class _ClientBase:
    def __init__(self, token, token_file):
        token = _token(token, token_file)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None


class SamplerClient(_ClientBase):
    """Blocking client. `tls=True` uses TLS (with `root_certificates` to trust a
    private CA, and `private_key` + `certificate_chain` for mTLS; each bytes or a
    file path); `token`/`token_file` sends `authorization: Bearer <token>`."""

    def __init__(self, address: str, *, tls: bool = False, root_certificates=None,
                 private_key=None, certificate_chain=None, token: str | None = None,
                 token_file=None):
        super().__init__(token, token_file)
        creds = _credentials(tls, root_certificates, private_key, certificate_chain)
        if creds is None:
            self._channel = grpc.insecure_channel(address, options=_channel_args())
        else:
            self._channel = grpc.secure_channel(address, creds, options=_channel_args())
        self._stub = sampler_pb2_grpc.SamplerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def sample(self, hidden, params=None, *, dtype=None, return_logz=False,
               return_logprobs=False, request_id="", timeout: float | None = 60.0) -> SampleResult:
        request = make_request(hidden, params, dtype=dtype, return_logz=return_logz,
                               return_logprobs=return_logprobs, request_id=request_id)
        return to_result(self.call_sample(request, timeout=timeout), like=hidden)

    def call_sample(self, request: sampler_pb2.SampleRequest,
                    timeout: float | None = 60.0) -> sampler_pb2.SampleResponse:
        """One Sample call with a request built by the caller (make_request, or
        one naming memory regions: flashsampler.regions)."""
        return self._stub.Sample(request, timeout=timeout, metadata=self._metadata)

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0,
                                      timeout: float | None = 10.0) -> None:
        """Registers [offset, offset + byte_size) of POSIX shared-memory object
        `key` ("/name", as shm_open takes it) as region `name`."""
        self._stub.RegisterRegion(sampler_pb2.RegisterRegionRequest(
            name=name, byte_size=byte_size,
            system=sampler_pb2.SystemSharedMemory(key=key, offset=offset)),
            timeout=timeout, metadata=self._metadata)

    def register_cuda_ipc(self, name: str, ipc_handle: bytes, device_id: int, byte_size: int,
                          offset: int = 0, timeout: float | None = 10.0) -> None:
        """Registers [offset, offset + byte_size) of the GPU allocation a
        cudaIpcMemHandle_t (64 bytes) names, on the server's device `device_id`."""
        self._stub.RegisterRegion(sampler_pb2.RegisterRegionRequest(
            name=name, byte_size=byte_size,
            cuda_ipc=sampler_pb2.CudaIpcMemory(ipc_handle=ipc_handle, device_id=device_id,
                                               offset=offset)),
            timeout=timeout, metadata=self._metadata)

    def unregister_region(self, name: str, timeout: float | None = 10.0) -> None:
        self._stub.UnregisterRegion(sampler_pb2.UnregisterRegionRequest(name=name),
                                    timeout=timeout, metadata=self._metadata)

    def list_regions(self, timeout: float | None = 10.0) -> list[sampler_pb2.RegionInfo]:
        return list(self._stub.ListRegions(sampler_pb2.ListRegionsRequest(), timeout=timeout,
                                           metadata=self._metadata).regions)

    def verify(self, sequences, *, dtype=None, return_acceptance_probs=False, return_logz=False,
               request_id="", timeout: float | None = 60.0) -> list[VerifyResult]:
        """Speculative verification of greedy drafts; one VerifyResult per sequence
        (see make_verify_request for `sequences`)."""
        request = make_verify_request(sequences, dtype=dtype,
                                      return_acceptance_probs=return_acceptance_probs,
                                      return_logz=return_logz, request_id=request_id)
        return to_verify_results(self._stub.Verify(request, timeout=timeout,
                                                   metadata=self._metadata))

    def sample_stream(self, requests: Iterable[sampler_pb2.SampleRequest],
                      timeout: float | None = None) -> Iterator[SampleResult]:
        """One SampleStream; yields results in request order as they arrive."""
        for response in self._stub.SampleStream(iter(requests), timeout=timeout,
                                                metadata=self._metadata):
            yield to_result(response)

    def model_info(self, timeout: float | None = 10.0) -> sampler_pb2.ModelInfo:
        return self._stub.GetModelInfo(sampler_pb2.GetModelInfoRequest(), timeout=timeout,
                                       metadata=self._metadata)

    def health(self, service: str = "", timeout: float | None = 10.0) -> str:
        """'SERVING', 'NOT_SERVING', ... for `service` ('' = the whole server)."""
        reply = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


class AsyncSamplerClient(_ClientBase):
    """asyncio client (grpc.aio) with the same options and methods as
    SamplerClient; create it inside the running event loop."""

    def __init__(self, address: str, *, tls: bool = False, root_certificates=None,
                 private_key=None, certificate_chain=None, token: str | None = None,
                 token_file=None):
        super().__init__(token, token_file)
        creds = _credentials(tls, root_certificates, private_key, certificate_chain)
        if creds is None:
            self._channel = grpc.aio.insecure_channel(address, options=_channel_args())
        else:
            self._channel = grpc.aio.secure_channel(address, creds, options=_channel_args())
        self._stub = sampler_pb2_grpc.SamplerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def sample(self, hidden, params=None, *, dtype=None, return_logz=False,
                     return_logprobs=False, request_id="",
                     timeout: float | None = 60.0) -> SampleResult:
        request = make_request(hidden, params, dtype=dtype, return_logz=return_logz,
                               return_logprobs=return_logprobs, request_id=request_id)
        return to_result(await self._stub.Sample(request, timeout=timeout,
                                                 metadata=self._metadata), like=hidden)

    async def verify(self, sequences, *, dtype=None, return_acceptance_probs=False,
                     return_logz=False, request_id="",
                     timeout: float | None = 60.0) -> list[VerifyResult]:
        request = make_verify_request(sequences, dtype=dtype,
                                      return_acceptance_probs=return_acceptance_probs,
                                      return_logz=return_logz, request_id=request_id)
        return to_verify_results(await self._stub.Verify(request, timeout=timeout,
                                                         metadata=self._metadata))

    async def sample_stream(self, requests, timeout: float | None = None):
        """Async iterator over the results of one SampleStream, in request order.
        `requests` may be a list or an async iterator of SampleRequest."""
        call = self._stub.SampleStream(requests, timeout=timeout, metadata=self._metadata)
        async for response in call:
            yield to_result(response)

    async def model_info(self, timeout: float | None = 10.0) -> sampler_pb2.ModelInfo:
        return await self._stub.GetModelInfo(sampler_pb2.GetModelInfoRequest(),
                                             timeout=timeout, metadata=self._metadata)

    async def health(self, service: str = "", timeout: float | None = 10.0) -> str:
        reply = await self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                         timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
