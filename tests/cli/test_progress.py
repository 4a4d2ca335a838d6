"""Issue 9: progress on a terminal (a tqdm bar on stderr while ``mtlir run --repeat N`` submits, a clock while a
queue lowers; never with --json, never off a terminal) and Ctrl-C (exit 130, one line saying how many submits
completed, with --json still the one object)."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtlir.cli.main import main
from mtlir.cli.progress import activity, wanted

ROOT = Path(__file__).resolve().parents[2]
MLP7 = str(ROOT / "examples" / "traces" / "mlp.apple7.json")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run(*argv: str, log: io.StringIO) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out, log=log)
    return code, out.getvalue()


def test_a_long_run_shows_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1500 submits now take well under DELAY_S on a quiet machine (the bar is drawn only for what lasts longer):
    # a zero delay makes this run count as long whatever the machine's speed
    monkeypatch.setattr("mtlir.cli.progress.DELAY_S", 0.0)
    log = Terminal()
    code, out = run("run", MLP7, "--device", "sim", "--repeat", "1500", log=log)
    assert code == 0
    assert "submits: " in log.getvalue() and "/1500 [" in log.getvalue() and "submit/s" in log.getvalue()
    assert "submit/s" not in out and out.rstrip().endswith("result: match (max abs err 5.82e-11)")


@pytest.mark.parametrize("json_mode, log", [(True, Terminal()), (False, io.StringIO())], ids=["json", "not-a-tty"])
def test_no_bar_with_json_or_off_a_terminal(json_mode: bool, log: io.StringIO) -> None:
    code, out = run("run", MLP7, "--device", "sim", "--repeat", "1500", *(["--json"] if json_mode else []), log=log)
    assert code == 0 and "submit/s" not in log.getvalue() and "submit/s" not in out
    assert "\r" not in log.getvalue() + out
    if json_mode:
        assert json.loads(out)["submits"] == 1500


def test_wanted_only_on_a_terminal_without_json() -> None:
    assert wanted(Terminal(), False) and not wanted(Terminal(), True) and not wanted(io.StringIO(), False)


def test_activity_draws_a_clock_only_for_what_lasts() -> None:
    log = Terminal()
    with activity("lowering", log, True):
        time.sleep(1.0)
    assert "lowering: 00:00" in log.getvalue()
    quick = Terminal()
    with activity("lowering", quick, True):
        pass
    assert quick.getvalue() == ""
    off = Terminal()
    with activity("lowering", off, False):
        time.sleep(0.8)
    assert off.getvalue() == ""


# Ctrl-C: a child process whose SIGINT raises KeyboardInterrupt (a background shell, such as make's, starts its
# children with SIGINT ignored)
_CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "from mtlir.cli.main import main; sys.exit(main())")


@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "plain"])
def test_ctrl_c_exits_130_saying_how_many_submits_completed(tmp_path: Path, json_mode: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, "run", MLP7, "--device", "sim", "--repeat", "10000000",
                             *(["--json"] if json_mode else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    time.sleep(3.0)  # lowered and linked by now (about 1 s), submitting
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    line = err.splitlines()[-1]
    assert line.startswith("mtlir: interrupted: ") and line.endswith(" of 10000000 submits completed"), err
    done = int(line.split()[2])
    assert "Traceback" not in err
    if json_mode:
        doc = json.loads(out)
        assert doc["interrupted"] is True and doc["exit_code"] == 130 and doc["submits_completed"] == done
    else:
        assert out == "" and done >= 0


def test_lower_shows_the_lowering_clock_on_a_terminal() -> None:
    """A stand-in lowering that takes a second (a 100k-command queue takes longer): the clock is drawn on a
    terminal's stderr, never on stdout, and not with --json."""
    from mtlir.cli.lower import lower_trace

    def slow(*args: object, **kwargs: object) -> object:
        time.sleep(1.0)
        return lower_trace(*args, **kwargs)
    log, out = Terminal(), io.StringIO()
    assert main(["lower", MLP7, "--target", "arm64"], out=out, log=log, lower_trace=slow) == 0
    assert "lowering: 00:0" in log.getvalue() and "lowering:" not in out.getvalue()
    log, out = Terminal(), io.StringIO()
    assert main(["lower", MLP7, "--target", "arm64", "--json"], out=out, log=log, lower_trace=slow) == 0
    assert "lowering:" not in log.getvalue() + out.getvalue()
