"""LocalChannel: the server's local channel (flashsampler-server --local_socket).

For an engine on the same host: the same SampleRequest / SampleResponse
messages as `SamplerClient.call_sample`, over a Unix-domain socket instead of
gRPC. Its use is a request that names memory regions (flashsampler.regions):
such a request is a few hundred bytes, and a gRPC round trip costs more than
the kernel's budget for the whole service. Pass a LocalChannel to a
transport (`SharedMemoryTransport(client, size, local=channel)`) and its
requests go this way; regions are still registered over gRPC.

The frames (client/local_frame.h): a 24-byte little-endian header (magic
"FSL1", kind, call id, argument, payload length), then the serialized
message. Kinds: 1 SampleRequest (argument: the deadline in microseconds, 0 for
none), 2 SampleResponse, 3 Status (argument: the status code, payload: the
message). Requests on one connection are answered one at a time, in order.

Errors are raised as LocalChannelError, whose code() and details() read like
grpc.RpcError's. A request's own error leaves the channel usable; a broken
or drained connection (UNAVAILABLE) does not: open a new LocalChannel.

Thread safety: one request at a time per channel (a lock serializes calls);
open one channel per thread that samples concurrently.
"""
from __future__ import annotations

import socket
import struct
import threading

import grpc

from flashsampler.v1 import sampler_pb2

_MAGIC = 0x314C5346
_HEADER = struct.Struct("<IIQII")  # magic, kind, call id, argument, payload bytes
_REQUEST, _RESPONSE, _STATUS = 1, 2, 3
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class LocalChannelError(Exception):
    """A status from the local channel (or its failure), shaped like grpc.RpcError."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class LocalChannel:
    """A connection to the server's local channel at socket path `path`."""

    def __init__(self, path: str):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise LocalChannelError(grpc.StatusCode.UNAVAILABLE,
                                    f"cannot connect to the local channel {path}: {e}") from e
        self._lock = threading.Lock()
        self._next_id = 1
        self._broken: LocalChannelError | None = None

    def close(self) -> None:
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call_sample(self, request: sampler_pb2.SampleRequest,
                    timeout: float | None = 60.0) -> sampler_pb2.SampleResponse:
        """One request (built as for SamplerClient.call_sample), its response."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            call_id = self._next_id
            self._next_id += 1
            payload = request.SerializeToString()
            deadline_us = 0 if timeout is None else min(max(int(timeout * 1e6), 1), 0xFFFFFFFF)
            # The wait for the answer: the server's deadline and a second more.
            self._sock.settimeout(None if timeout is None else timeout + 1.0)
            try:
                try:
                    self._sock.sendall(_HEADER.pack(_MAGIC, _REQUEST, call_id, deadline_us, len(payload))
                                       + payload)
                except OSError:
                    pass  # a server that closed the connection said why first: read that
                kind, answer_id, arg, body = self._read_frame()
            except socket.timeout:
                raise self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer from the local channel in time")
            except OSError as e:
                raise self._fail(grpc.StatusCode.UNAVAILABLE, f"local channel: {e}")
            if answer_id != call_id:
                if answer_id == 0 and kind == _STATUS:  # the server speaks of the connection
                    raise self._fail(_CODES.get(arg, grpc.StatusCode.UNKNOWN), body.decode(errors="replace"))
                raise self._fail(grpc.StatusCode.INTERNAL, f"answer to call {answer_id}, not {call_id}")
            if kind == _STATUS:
                raise LocalChannelError(_CODES.get(arg, grpc.StatusCode.UNKNOWN), body.decode(errors="replace"))
            response = sampler_pb2.SampleResponse()
            response.ParseFromString(body)
            return response

    def _fail(self, code: grpc.StatusCode, details: str) -> LocalChannelError:
        self._broken = LocalChannelError(code, details)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return self._broken

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n > 0:
            chunk = self._sock.recv(min(n, 1 << 20))
            if not chunk:
                raise OSError("the server closed the local channel")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _read_frame(self):
        magic, kind, call_id, arg, length = _HEADER.unpack(self._read_exactly(_HEADER.size))
        if magic != _MAGIC or kind not in (_RESPONSE, _STATUS):
            raise OSError("not a local-channel answer")
        return kind, call_id, arg, self._read_exactly(length)
