"""The kernel server of the fake Metal (fakemetal.m): compiles MSL and runs dispatches on real bytes with the
simulator's ``KernelRunner`` (PoCL), over a Unix socket, so the fake's commit computes what Metal would.

The fake connects once per process (``FAKE_METAL_KERNELS`` names the socket); the protocol is fakemetal.m's
(little-endian uint64 words, the same on x86_64 and AArch64). Under qemu the fake runs in an AArch64 process and
this server in an x86_64 one, since PoCL does not run under qemu. Every dispatch is recorded: ``{"function",
"grid", "threadgroup", "bindings": [[index, buffer handle, offset, buffer length], ...], "run": LABEL}`` (only the
indices the kernel declares); a client other than the fake may send ``OP_LABEL`` (``label``) to tag the records
of the runs that follow.

Run alone: ``python kernel_server.py SOCKET [RECORDS.jsonl]`` serves until killed, appending each record as a
JSON line to RECORDS.jsonl.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
from typing import Any, Callable

import numpy as np

from mtlir.runtime.sim.kernels.runner import KernelRunner
from mtlir.runtime.sim.msl.translate import translate

OP_COMPILE, OP_DISPATCH, OP_LABEL = 1, 2, 3


def _exact(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        got = conn.recv(min(left, 1 << 20))
        if not got:
            raise EOFError
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


def _u64(conn: socket.socket) -> int:
    return int(struct.unpack("<Q", _exact(conn, 8))[0])


def _text(conn: socket.socket) -> str:
    return _exact(conn, _u64(conn)).decode("utf-8", errors="replace")


def _answer(conn: socket.socket, status: int, text: str = "") -> None:
    raw = text.encode()
    conn.sendall(struct.pack("<QQ", status, len(raw)) + raw)


class KernelServer:
    """Serves the fake Metal's requests on ``path`` (a Unix socket) from a thread per connection.

    ``runner``: the KernelRunner (None: one made at the first request); ``record``: called with each dispatch's
    record. ``close()`` stops listening."""

    def __init__(self, path: str, runner: KernelRunner | None = None,
                 record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self._runner = runner
        self.record = record or (lambda rec: None)
        self.label = ""
        self._lock = threading.Lock()
        if os.path.exists(path):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def runner(self) -> KernelRunner:
        if self._runner is None:
            self._runner = KernelRunner()
        return self._runner

    def close(self) -> None:
        self.sock.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    op = _u64(conn)
                except (EOFError, OSError):
                    return
                with self._lock:
                    if op == OP_COMPILE:
                        self._compile(conn)
                    elif op == OP_DISPATCH:
                        self._dispatch(conn)
                    elif op == OP_LABEL:
                        self.label = _text(conn)
                        _answer(conn, 0)
                    else:
                        _answer(conn, 2, f"unknown request {op}")
                        return

    def _compile(self, conn: socket.socket) -> None:
        msl = _text(conn)
        try:
            for name in translate(msl).kernels:
                self.runner.compile(msl, name)
        except Exception as e:  # what Metal's compiler says goes back as the NSError's text
            _answer(conn, 1, f"{type(e).__name__}: {e}")
            return
        _answer(conn, 0)

    def _dispatch(self, conn: socket.socket) -> None:
        msl, function = _text(conn), _text(conn)
        sizes = [_u64(conn) for _ in range(6)]
        grid, group = (sizes[0], sizes[1], sizes[2]), (sizes[3], sizes[4], sizes[5])
        storages: list[tuple[int, np.ndarray]] = []
        for _ in range(_u64(conn)):
            handle, length = _u64(conn), _u64(conn)
            storages.append((handle, np.frombuffer(bytearray(_exact(conn, length)), np.uint8)))
        bound = [(_u64(conn), _u64(conn), _u64(conn)) for _ in range(_u64(conn))]
        try:
            kernel = self.runner.compile(msl, function)
            # an encoder's bindings stay from earlier dispatches (Metal's state is sticky): the kernel gets the
            # indices it declares, as on the simulated device
            used = {b.arg.index for b in kernel.info.bindings}
            bindings = {i: (storages[k][1], off) for i, k, off in bound if i in used}
            self.record({"function": function, "grid": list(grid), "threadgroup": list(group),
                         "bindings": [[i, storages[k][0], off, storages[k][1].nbytes] for i, k, off in bound
                                      if i in used], "run": self.label})
            kernel.run(bindings, grid, group)
        except Exception as e:
            _answer(conn, 1, f"{type(e).__name__}: {e}")
            return
        _answer(conn, 0)
        conn.sendall(b"".join(s.tobytes() for _, s in storages))


def label(path: str, text: str) -> None:
    """Tag the records of what follows with ``text`` (the server at ``path``)."""
    raw = text.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        conn.sendall(struct.pack("<QQ", OP_LABEL, len(raw)) + raw)
        _exact(conn, 16)


def main(argv: list[str]) -> int:
    """``kernel_server.py SOCKET [RECORDS.jsonl]``: serve until killed."""
    records = open(argv[1], "a") if len(argv) > 1 else None

    def record(rec: dict[str, Any]) -> None:
        if records is not None:
            records.write(json.dumps(rec) + "\n")
            records.flush()
    server = KernelServer(argv[0], record=record)
    print(f"kernel server on {argv[0]}", flush=True)
    server.thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
