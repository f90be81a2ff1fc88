"""Tensors that do not travel through gRPC: memory regions shared with a
server on the same host (sampler.proto's RegisterRegion).

Two transports, each owning one registered region laid out as
[hidden states | results], for one request at a time:

- `SharedMemoryTransport`: a POSIX shared-memory object (numpy arrays or CPU
  torch tensors in, numpy results out). The hidden states are copied into
  the region instead of being serialised into the message.
- `CudaIpcTransport`: a GPU buffer shared by CUDA IPC (torch CUDA tensors in;
  the results stay on the GPU as torch tensors). The server copies the
  hidden states device-to-host itself; the engine never moves them.

Both return the same `SampleResult` as `SamplerClient.sample` and give the
same tokens for the same request. Given `local=` (a flashsampler.LocalChannel
to the server's --local_socket), a transport sends its requests over the local
channel instead of gRPC; the region is still registered over gRPC. Use a transport from one thread at a time
(a request's slices are reused by the next); create one per thread or per
asyncio task that samples concurrently. `close()` (or the context manager)
unregisters the region and frees the memory.
"""
from __future__ import annotations

import ctypes
import os
import uuid
from multiprocessing import shared_memory

import numpy as np

from flashsampler.client import SampleResult, SamplerClient, make_request, sampling_params
from flashsampler.v1 import sampler_pb2

# The results follow the hidden states at this alignment.
_ALIGN = 256


def _results_bytes(rows: int, return_logz: bool, return_logprobs: bool) -> int:
    return rows * (4 + 4 * return_logz + 4 * return_logprobs)


def _unpack_results(raw, rows: int, return_logz: bool, return_logprobs: bool,
                    response: sampler_pb2.SampleResponse, int32, float32) -> SampleResult:
    """Token ids, then logz and logprobs when asked (sampler.proto's
    output_region layout), from `raw`: uint8 bytes as a numpy array or a torch
    tensor, viewed as `int32` / `float32` of the same library."""
    tokens = raw[:4 * rows].view(int32)
    at = 4 * rows
    logz = logprobs = None
    if return_logz:
        logz = raw[at:at + 4 * rows].view(float32)
        at += 4 * rows
    if return_logprobs:
        logprobs = raw[at:at + 4 * rows].view(float32)
    return SampleResult(token_ids=tokens, seeds=np.asarray(response.seeds, dtype=np.uint64),
                        logz=logz, logprobs=logprobs, request_id=response.request_id,
                        response=response)


def _slices(request: sampler_pb2.SampleRequest, name: str, in_bytes: int, out_bytes: int) -> int:
    """Points `request` at region `name`: hidden states at 0, results after
    them. Returns the results' offset."""
    out_offset = (in_bytes + _ALIGN - 1) // _ALIGN * _ALIGN
    request.hidden_states_region.region = name
    request.hidden_states_region.offset = 0
    request.hidden_states_region.byte_size = in_bytes
    request.output_region.region = name
    request.output_region.offset = out_offset
    request.output_region.byte_size = out_bytes
    return out_offset


class _RegionTransport:
    """What both transports share: the region's name and its unregistering."""

    _buf = None
    _client: SamplerClient
    _local = None
    name: str

    def _call(self, request, timeout):
        if self._local is not None:
            return self._local.call_sample(request, timeout=timeout)
        return self._client.call_sample(request, timeout=timeout)

    def _free(self) -> None:
        self._buf = None

    def close(self) -> None:
        if self._buf is None:
            return
        try:
            self._client.unregister_region(self.name)
        finally:
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _take_pages(shm_name: str, byte_size: int) -> None:
    """Takes the object's pages now (posix_fallocate): on a tmpfs without room
    (a container's 64 MiB /dev/shm) sizing alone succeeds, and the first write
    would kill the process with SIGBUS instead of raising."""
    fd = os.open(f"/dev/shm/{shm_name}", os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, byte_size)
    except OSError as e:
        raise MemoryError(f"no room for {byte_size} bytes of shared memory in /dev/shm: {e}") from e
    finally:
        os.close(fd)


class SharedMemoryTransport(_RegionTransport):
    """A registered POSIX shared-memory region of `byte_size` bytes (enough
    for the largest request's hidden states plus 12 bytes per row and
    alignment) on the server `client` talks to."""

    def __init__(self, client: SamplerClient, byte_size: int, name: str | None = None, local=None):
        self._client = client
        self._local = local
        self.name = name or f"py-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._shm = shared_memory.SharedMemory(create=True, size=byte_size)
        self._buf = np.ndarray((byte_size,), dtype=np.uint8, buffer=self._shm.buf)
        try:
            _take_pages(self._shm.name, byte_size)
            client.register_system_shared_memory(self.name, "/" + self._shm.name, byte_size)
        except BaseException:
            self._free()
            raise

    def sample(self, hidden, params=None, *, dtype=None, return_logz=False, return_logprobs=False,
               request_id="", timeout: float | None = 60.0) -> SampleResult:
        request = make_request(hidden, params, dtype=dtype, return_logz=return_logz,
                               return_logprobs=return_logprobs, request_id=request_id)
        data = request.hidden_states.data
        rows = request.hidden_states.shape[0]
        out_bytes = _results_bytes(rows, return_logz, return_logprobs)
        out_offset = _slices(request, self.name, len(data), out_bytes)
        if out_offset + out_bytes > len(self._buf):
            raise ValueError(f"request needs {out_offset + out_bytes} bytes of the region, "
                             f"which has {len(self._buf)}")
        self._buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        request.hidden_states.data = b""
        response = self._call(request, timeout)
        raw = self._buf[out_offset:out_offset + out_bytes].copy()
        return _unpack_results(raw, rows, return_logz, return_logprobs, response, np.int32, np.float32)

    def _free(self) -> None:
        self._buf = None
        self._shm.close()
        self._shm.unlink()


class _CudaDriver:
    """The two CUDA driver calls CUDA IPC needs, through ctypes (libcuda)."""

    def __init__(self):
        self._lib = ctypes.CDLL("libcuda.so.1")

    def ipc_handle(self, ptr: int) -> bytes:
        handle = (ctypes.c_char * 64)()
        self._check(self._lib.cuIpcGetMemHandle(handle, ctypes.c_uint64(ptr)), "cuIpcGetMemHandle")
        return bytes(handle)

    def allocation_base(self, ptr: int) -> int:
        base = ctypes.c_uint64()
        size = ctypes.c_size_t()
        self._check(self._lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                      ctypes.c_uint64(ptr)), "cuMemGetAddressRange")
        return base.value

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed (CUresult {rc})")


# GPU buffers of closed CudaIpcTransports that a request may still write:
# kept for the life of the process (see CudaIpcTransport._free).
_BUFFERS_IN_DOUBT: list = []


class CudaIpcTransport(_RegionTransport):
    """A registered GPU buffer of `byte_size` bytes on torch device `device`
    (default: the current CUDA device), shared with the server by CUDA IPC.
    `device_id` is the ordinal the server sees (default: the same index)."""

    _in_doubt = False

    def _free(self) -> None:
        # Unregistering forgets the name, but a request the server already
        # admitted keeps the region and writes its results when it finishes.
        # After a request that failed on this side (a timeout, a broken
        # connection) the server may still do so: the buffer is then never
        # handed back to the allocator, where another tensor could take it.
        if self._in_doubt and self._buf is not None:
            _BUFFERS_IN_DOUBT.append(self._buf)
        self._buf = None

    def __init__(self, client: SamplerClient, byte_size: int, device=None, device_id: int | None = None,
                 name: str | None = None, local=None):
        import torch  # CUDA IPC needs torch CUDA tensors

        self._torch = torch
        self._client = client
        self._local = local
        self.name = name or f"py-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._buf = torch.empty(byte_size, dtype=torch.uint8, device="cuda" if device is None else device)
        ptr = self._buf.data_ptr()
        driver = _CudaDriver()
        # The driver calls act on the current context: the buffer's device's.
        with torch.cuda.device(self._buf.device):
            # A caching allocator hands out slices of larger allocations: the
            # handle names the allocation (cuIpcGetMemHandle takes its base),
            # the offset where this buffer starts in it.
            base = driver.allocation_base(ptr)
            handle = driver.ipc_handle(base)
        offset = ptr - base
        ordinal = self._buf.device.index if device_id is None else device_id
        client.register_cuda_ipc(self.name, handle, ordinal, byte_size, offset=offset)

    def sample(self, hidden, params=None, *, return_logz=False, return_logprobs=False,
               request_id="", timeout: float | None = 60.0) -> SampleResult:
        """`hidden`: a [B, D] torch tensor (bf16, fp16 or fp32; any device).
        The results are torch tensors on this transport's GPU."""
        torch = self._torch
        wire = {torch.bfloat16: sampler_pb2.DTYPE_BF16, torch.float16: sampler_pb2.DTYPE_FP16,
                torch.float32: sampler_pb2.DTYPE_FP32}.get(hidden.dtype)
        if wire is None or hidden.dim() != 2:
            raise ValueError("hidden must be a [B, D] bf16, fp16 or fp32 torch tensor")
        rows = hidden.shape[0]
        raw = hidden.contiguous().view(torch.uint8).reshape(-1)
        request = sampler_pb2.SampleRequest(
            hidden_states=sampler_pb2.Tensor(dtype=wire, shape=list(hidden.shape)),
            params=sampling_params(params), return_logz=return_logz, return_logprobs=return_logprobs,
            request_id=request_id)
        out_bytes = _results_bytes(rows, return_logz, return_logprobs)
        out_offset = _slices(request, self.name, raw.numel(), out_bytes)
        if out_offset + out_bytes > self._buf.numel():
            raise ValueError(f"request needs {out_offset + out_bytes} bytes of the region, "
                             f"which has {self._buf.numel()}")
        self._buf[:raw.numel()].copy_(raw)
        # The server reads the buffer from its own process: the copy must
        # have finished on the device before the request leaves.
        torch.cuda.current_stream(self._buf.device).synchronize()
        try:
            response = self._call(request, timeout)
        except BaseException:
            # The server may still run this request (a timeout, a broken
            # connection) and write its results into the buffer later.
            self._in_doubt = True
            raise
        out = self._buf[out_offset:out_offset + out_bytes].clone()
        return _unpack_results(out, rows, return_logz, return_logprobs, response, torch.int32,
                               torch.float32)
