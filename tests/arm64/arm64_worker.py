"""The AArch64 half of ``make test-arm64``: runs in an AArch64 Python under qemu-user (run_arm64.py starts it).

``arm64_worker.py LIBOBJC METAL SOCKET OUT.json`` runs every Apple7 trace, three lowerings each, with ``mtlir run
--device metal`` on an unmodified ``MetalBridge`` over the AArch64 build of the fake Metal (tests/native), its
kernels on the x86_64 kernel server at SOCKET; checks that the fake received exactly what ``mtlir lower --json
--target arm64`` lists, and that struct arguments arrive intact (MTLSize behind a pointer, NSRange in two
registers). The results go to OUT.json; the dispatch records stay with the server, labelled per run.

``arm64_worker.py --negative LIBOBJC METAL SOCKET OUT.json``: the negative control. It sends
``dispatchThreadgroups:threadsPerThreadgroup:`` with each MTLSize by value as three words (x86_64's layout, wrong
on arm64) and checks what arrived the same way: the check must fail (exit 3, or the method dereferences a word as
a pointer and the process dies).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from fake_metal import APPLE7, FLAGS, Libs, lowered_messages, run_on_fake
from kernel_server import label
from mtlir.ir.dtypes import dtypes
from mtlir.metal import Prototype, abi_prototype, c_prototype
from mtlir.runtime.metal.bridge import MetalBridge

GRID, GROUP = ((1 << 33) + 1, 7, (1 << 64) - 1), (32, (1 << 63) + 5, 1)


def _logged(log: Path, selector: str) -> list[Any]:
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    return list(next(m["args"] for m in reversed(lines) if m["sel"] == selector))


def structs(libs: Libs, log: Path, by_value_words: bool) -> dict[str, Any]:
    """Send an MTLSize pair and an NSRange to a fake encoder; what was sent and what arrived."""
    import os
    os.environ["FAKE_METAL_LOG"] = str(log)
    b = MetalBridge(libobjc=libs.libobjc, metal=libs.metal, coregraphics=None)

    def send(selector: str, receiver: int, *args: Any) -> Any:
        return b.msg_send(abi_prototype(selector, b.target), (receiver, b.sel_registerName(selector), *args))
    device = b.c_call("MTLCreateSystemDefaultDevice", c_prototype("MTLCreateSystemDefaultDevice"), ())
    enc = send("computeCommandEncoder", send("commandBuffer", send("newCommandQueueWithMaxCommandBufferCount:",
                                                                   device, 4)))
    sel = b.sel_registerName("dispatchThreadgroups:threadsPerThreadgroup:")
    if by_value_words:  # the negative control: x86_64's by-value layout, three words per MTLSize
        print("negative control: sending MTLSize by value as three words", flush=True)
        words = Prototype(dtypes.void, (dtypes.id, dtypes.SEL) + (dtypes.uint64,) * 6)
        b.msg_send(words, (enc, sel, *GRID, *GROUP))
    else:
        grid, group = b.malloc(24), b.malloc(24)
        b.store(grid, dtypes.MTLSize, GRID)
        b.store(group, dtypes.MTLSize, GROUP)
        b.msg_send(abi_prototype("dispatchThreadgroups:threadsPerThreadgroup:", "arm64"), (enc, sel, grid, group))
    mtlsize = _logged(log, "dispatchThreadgroups:threadsPerThreadgroup:")
    send("executeCommandsInBuffer:withRange:", enc, device, 1 << 35, (1 << 64) - 2)
    nsrange = _logged(log, "executeCommandsInBuffer:withRange:")
    return {"mtlsize": {"sent": [list(GRID), list(GROUP)], "arrived": mtlsize},
            "nsrange": {"sent": [device, [1 << 35, (1 << 64) - 2]], "arrived": nsrange}}


def main(argv: list[str]) -> int:
    negative = argv[:1] == ["--negative"]
    libobjc, metal, sock, out = argv[1:] if negative else argv
    libs = Libs(libobjc, metal)
    tmp = Path(tempfile.mkdtemp(prefix="mtlir-arm64-"))
    if negative:
        got = structs(libs, tmp / "negative.jsonl", by_value_words=True)
        Path(out).write_text(json.dumps(got))
        return 0 if got["mtlsize"]["sent"] == got["mtlsize"]["arrived"] else 3
    results: dict[str, Any] = {"machine": __import__("platform").machine(), "runs": []}
    for trace in APPLE7:
        for how, flags in FLAGS.items():
            name = f"{Path(trace).name} {how}"
            label(sock, f"arm64 {name}")
            run = run_on_fake(trace, flags, libs, sock, tmp / "run.jsonl")
            listing = lowered_messages(trace, flags, "arm64")
            got = run.first_submit(len(listing)) if run.log else []
            diff = next(([g, w] for g, w in zip(got, listing) if g != w), None)
            results["runs"].append({"trace": trace, "how": how, "code": run.code, "doc": run.doc,
                                    "messages_equal": got == listing, "messages": len(listing), "first_diff": diff,
                                    "stderr": run.stderr[-2000:]})
            print(f"arm64 {name}: exit {run.code}, match {run.doc.get('match')}, "
                  f"messages as listed: {got == listing}", flush=True)
    results["structs"] = structs(libs, tmp / "structs.jsonl", by_value_words=False)
    Path(out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
