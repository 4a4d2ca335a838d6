"""``--html FILE`` (issue 15): one self-contained page per lowering, checked as HTML here and opened in a real headless
browser (Debian's chromium, which ``make test`` installs; skipped, saying why, where there is none): every stage is
on the page with its picture, unchanged stages say so, and a screenshot is not blank."""
from __future__ import annotations

import io
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mtlir.cli.main import main
from mtlir.cli.page import stage_changes

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
KV7 = str(TRACES / "symbolic_kv.apple7.json")
PIPELINE = "encode,symbolic,abi{target=arm64},linearize"  # symbolic folds nothing here: an unchanged stage
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def _mtlir(*argv: str) -> tuple[int, str, str]:
    out, log = io.StringIO(), io.StringIO()
    return main(list(argv), out=out, log=log), out.getvalue(), log.getvalue()


class _Sections(HTMLParser):
    """The stage sections of a page: data-stage -> (id, number of <svg> inside, text inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: dict[str, list[object]] = {}
        self.ids: list[str] = []
        self._cur: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag == "section" and a.get("class") == "stage":
            self._cur, self._depth = str(a["data-stage"]), 0
            self.stages[self._cur] = [a["id"], 0, ""]
        if self._cur is not None:
            self._depth += tag == "section"
            if tag == "svg":
                self.stages[self._cur][1] = int(str(self.stages[self._cur][1])) + 1

    def handle_endtag(self, tag: str) -> None:
        if self._cur is not None and tag == "section":
            self._depth -= 1
            if self._depth == 0:
                self._cur = None

    def handle_data(self, data: str) -> None:
        if self._cur is not None:
            self.stages[self._cur][2] = str(self.stages[self._cur][2]) + data


def _sections(text: str) -> _Sections:
    p = _Sections()
    p.feed(text)
    return p


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    path = tmp_path_factory.mktemp("page") / "kv.html"
    code, _, log = _mtlir("lower", KV7, "--target", "arm64", "--pipeline", PIPELINE, "--html", str(path))
    assert code == 0, log
    assert f"mtlir: wrote {path}" in log
    return path


def test_the_page_holds_every_stage_the_setup_the_icb_and_one_submit(page: Path) -> None:
    text = page.read_text()
    p = _sections(text)
    assert list(p.stages) == ["input", "encode", "symbolic", "abi", "linearize"]
    assert all(int(str(svg)) == 1 for _, svg, _ in p.stages.values())  # a picture per stage, inline
    assert "unchanged: symbolic returned the very graph" in str(p.stages["symbolic"][2])
    assert "encode changed the graph:" in str(p.stages["encode"][2])
    assert "turned the graph into a Program" in str(p.stages["linearize"][2])
    assert {"setup", "icb", "submit", "queue"} <= set(p.ids)
    assert re.search(r"setup: \d+ messages link sends once", text)
    assert "[icb[1] setKernelBuffer:offset:atIndex: buffer:3, 256, 0]" in text
    assert "buffer:3+256@0" in text and "start_pos (varbuf @3)" in text  # the ICB table
    assert "[encoder executeCommandsInBuffer:withRange: icb, [0, 5]]" in text  # one submit
    assert "; messages of %" in text  # each stage's text spells out its messages


def test_the_page_needs_no_network(page: Path) -> None:
    text = page.read_text()
    assert "<script" not in text and "<link" not in text and "@import" not in text
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", text)
    assert all(r.startswith("#") for r in refs), [r for r in refs if not r.startswith("#")]
    assert "url(http" not in text


def test_stage_changes_tells_added_from_removed() -> None:
    from mtlir.ir.uop import UOp
    x = UOp.variable("x", 0, 10)
    a, b = UOp.sink(x + 1), UOp.sink(x + 2)
    added, removed = stage_changes(a, b)
    assert len(added) == 3 and b in added and x not in added  # the new constant, the new add, the new sink
    assert len(removed) == 3 and a in removed
    assert stage_changes(a, a) == ([], [])


@needs_dot
def test_run_html_adds_the_result(tmp_path: Path) -> None:
    path = tmp_path / "run.html"
    code, _, log = _mtlir("run", KV7, "--device", "sim", "--html", str(path))
    assert code == 0, log
    text = path.read_text()
    assert 'id="result"' in text and "output matches" in text and "host_s_per_submit" in text


def test_html_to_an_unwritable_place_names_the_flag(tmp_path: Path) -> None:
    code, _, log = _mtlir("lower", KV7, "--html", str(tmp_path / "no" / "such" / "p.html"))
    assert code == 2 and "--html" in log and "cannot write the page" in log


# ---- in a real browser

def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit non-interlaced PNG, unfiltered (PNG spec §9)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def _chromium(browser: str, tmp: Path, *flags: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HOME": str(tmp)}
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp / 'profile'}", "--force-device-scale-factor=1", *flags],
                          capture_output=True, timeout=120, check=False, env=env, cwd=tmp)


def test_the_page_in_a_headless_browser(page: Path, tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no headless browser: install Debian's chromium (make test installs it with apt-get) or Chrome")
    dom = _chromium(browser, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    p = _sections(dom.stdout.decode())
    assert list(p.stages) == ["input", "encode", "symbolic", "abi", "linearize"]  # every stage, as the browser built it
    assert all(int(str(svg)) == 1 for _, svg, _ in p.stages.values())
    shot = tmp_path / "shot.png"
    res = _chromium(browser, tmp_path, f"--screenshot={shot}", "--window-size=480,360", page.as_uri())
    assert res.returncode == 0 and shot.exists(), res.stderr.decode(errors="replace")[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (480, 360)
    colors = {row[i:i + 3] for row in rows[::4] for i in range(0, len(row), 12)}
    dark = sum(1 for row in rows for i in range(0, len(row), 3 if len(row) == width * 3 else 4) if row[i] < 128)
    assert len(colors) > 8 and dark > 200, (len(colors), dark)  # text and boxes drawn, not one blank color
