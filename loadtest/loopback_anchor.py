"""The physical anchor for moving a decode step's bytes: a plain loopback TCP
round trip of the same payload, with no HTTP/2 and no protobuf.

A server thread reads a 4-byte length and then that many bytes, and answers
with 4 * rows bytes (the size of the token ids); the client sends the payload
and waits for the answer, one request in flight, like a decode step over a
stream. For each payload size it reports the median and p99 round trip over
--iterations runs (after a warm-up), so that gRPC's cost for the same bytes
(loadtest/boundary_bench.py's floor column) can be read against what the
kernel's socket path itself costs on that machine.

    python3 loadtest/loopback_anchor.py [--rows=16,64,256] [--hidden=4096] [--iterations=500]

Standard library only; the payload is bf16 (2 bytes per value).
"""
import argparse
import socket
import statistics
import struct
import threading
import time


def recv_exactly(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def serve(listener):
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64 << 20)
    header = bytearray(4)
    try:
        while True:
            recv_exactly(conn, memoryview(header))
            (size,) = struct.unpack("<I", header)
            if size == 0:
                return
            recv_exactly(conn, memoryview(buf)[:size])
            conn.sendall(bytes(4 * max(1, size // 8192)))
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="16,64,256")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    args = ap.parse_args()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    server = threading.Thread(target=serve, args=(listener,), daemon=True)
    server.start()
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print("| rows | bytes | p50 ms | p99 ms |\n|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        size = rows * args.hidden * 2
        payload = struct.pack("<I", size) + bytes(size)
        answer = bytearray(4 * max(1, size // 8192))
        times = []
        for i in range(args.warmup + args.iterations):
            start = time.perf_counter()
            client.sendall(payload)
            recv_exactly(client, memoryview(answer))
            if i >= args.warmup:
                times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        print(f"| {rows} | {size} | {statistics.median(times):.3f} | {times[int(0.99 * (len(times) - 1))]:.3f} |",
              flush=True)
    client.sendall(struct.pack("<I", 0))
    client.close()


if __name__ == "__main__":
    main()
