"""``--html FILE``: one self-contained HTML page per lowering (tinygrad's VIZ viewer and mlir-opt's
``--mlir-print-ir-after-all`` on one page).

The page holds, in order: the queue (the input graph), every stage of the lowering (its picture as inline SVG, what
its pass changed: nodes added, drawn with a thick red border, and removed, or ``unchanged`` when the pass returned
the very graph it was given, and its text with the messages and ICB commands spelled out,
``mtlir.program.tables.describe``), the setup messages link sends once, the ICB table, the messages of one submit,
and after ``mtlir run`` its result. Everything is inline (CSS, SVG): the page opens without network access. Each
stage is a ``<section class="stage" id="stage-N">`` whose ``data-stage`` is the pass's name, so a test (or a reader's
browser) can find every stage.

``write_page`` takes what the command line has at hand: the ``Lowered`` of ``mtlir.passes`` (its ``stages``,
``pipeline`` and ``unchanged``), the recorded setup and submit messages (``mtlir.cli.lower.record_setup``,
``record_one_submit``) and an optional result mapping.
"""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlir.cli.report import UsageError

__all__ = ["stage_changes", "render_page", "write_page"]

_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
nav a { margin-right: 1em; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 12px; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0; }
td, th { border: 1px solid #bbb; padding: 2px 6px; text-align: left; font-family: monospace; vertical-align: top; }
th { background: #eef; font-family: Helvetica, Arial, sans-serif; }
.picture { overflow: auto; max-height: 90vh; border: 1px solid #ddd; padding: 0.5em; }
.picture svg { max-width: 100%; height: auto; }
.unchanged { color: #555; background: #f3f3f3; padding: 0.3em 0.6em; display: inline-block; }
.changed { color: #8a0000; background: #fff0f0; padding: 0.3em 0.6em; display: inline-block; }
.match { color: #06610c; font-weight: bold; } .mismatch { color: #b00000; font-weight: bold; }
"""


def stage_changes(before: Any, after: Any) -> tuple[list[Any], list[Any]]:
    """What a pass changed between two graphs (UOps): the nodes of ``after`` that ``before`` lacks (added or
    rewritten) and the nodes of ``before`` that ``after`` lacks (removed or replaced), each in toposort order. Graphs
    are hash-consed, so a node both hold is the same object. Two empty lists when the graphs are the same."""
    if before is after:
        return [], []
    old, new = before.toposort(), after.toposort()
    old_set, new_set = set(old), set(new)
    return [u for u in new if u not in old_set], [u for u in old if u not in new_set]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _svg(stage: Any, title: str, highlight: Sequence[Any], setup: Sequence[str], where: str,
         failures: list[tuple[str, Any]] | None) -> str:
    """The stage's picture as inline SVG, or a note saying why there is none: no Graphviz, or ``dot`` failed or
    took too long for this stage (``where``, e.g. ``03-abi``; the error is appended to ``failures``)."""
    from mtlir.viz import GraphvizError, GraphvizNotFoundError, to_dot, to_svg
    try:
        return to_svg(to_dot(stage, name=title, highlight=highlight, setup=setup))
    except GraphvizNotFoundError as e:
        return f'<p class="unchanged">no picture: {_e(e)}</p>'
    except GraphvizError as e:
        if failures is not None:
            failures.append((where, e))
        return f'<p class="mismatch">no picture of stage {_e(where)}: {_e(e)}</p>'


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _change_text(lowered: Any, i: int) -> tuple[str, list[Any]]:
    """The change line of stage ``i`` (HTML) and the nodes to highlight in its picture."""
    from mtlir.ir.uop import UOp
    from mtlir.ir.render import listing
    stages = lowered.stages
    name, stage = stages[i]
    if i == 0:
        return '<p class="unchanged">the input: the queue graph as built</p>', []
    if lowered.unchanged(i):
        return (f'<p class="unchanged">unchanged: {_e(name)} returned the very graph it was given (the picture and '
                f'text are those of stage {i - 1})</p>'), []
    before = stages[i - 1][1]
    if not isinstance(stage, UOp) or not isinstance(before, UOp):
        return (f'<p class="changed">{_e(name)} turned the graph into a Program: {len(stage.instrs)} instructions, '
                f'{stage.nregs} registers</p>'), []
    added, removed = stage_changes(before, stage)
    text = (f'<p class="changed">{_e(name)} changed the graph: {len(added)} nodes added or rewritten (thick red '
            f'border), {len(removed)} removed, {len(stage.toposort()) - len(added)} kept</p>')
    if removed:
        shown = "\n".join(listing(u, width=100).rstrip("\n").splitlines()[-1] for u in removed[:200])
        more = f"\n… {len(removed) - 200} more" if len(removed) > 200 else ""
        text += (f"<details><summary>{len(removed)} nodes removed (each as the last line of its own listing)"
                 f"</summary><pre>{_e(shown + more)}</pre></details>")
    return text, added


def render_page(lowered: Any, *, title: str, setup: Sequence[Mapping[str, Any]],
                messages: Sequence[Mapping[str, Any]], result: Mapping[str, Any] | None = None,
                failures: list[tuple[str, Any]] | None = None) -> str:
    """The page (module docstring) as one HTML string. ``setup`` and ``messages`` are recorded messages
    (``{"receiver", "selector", "args"}``); ``result`` the fields of a run's result (``mtlir run --json``'s). Each
    stage's picture is made on its own: a stage ``dot`` cannot draw (a ``GraphvizError``) gets a note naming it in
    place of its picture, and (stage, error) is appended to ``failures``."""
    from mtlir.cli.lower import format_message
    from mtlir.program.program import Program
    from mtlir.program.payloads import IcbSpec
    from mtlir.program.tables import ICB_COLUMNS, describe, icb_rows
    setup_lines = [format_message(dict(m)) for m in setup]
    stages = lowered.stages
    nav = ['<a href="#queue">queue</a>']
    nav += [f'<a href="#stage-{i}">{i}. {_e(name)}</a>' for i, (name, _) in enumerate(stages) if i]
    nav += ['<a href="#setup">setup</a>', '<a href="#icb">ICB</a>', '<a href="#submit">one submit</a>']
    if result is not None:
        nav.append('<a href="#result">result</a>')
    body = [f"<h1>{_e(title)}</h1>", f"<p>pipeline <code>{_e(lowered.pipeline)}</code></p>",
            "<nav>" + "".join(nav) + "</nav>"]
    for i, (name, stage) in enumerate(stages):
        change, added = _change_text(lowered, i)
        heading = "the queue (input)" if i == 0 else f"{i}. after {name}"
        label = f"{name} (unchanged)" if lowered.unchanged(i) else name
        anchor = ' id="queue"' if i == 0 else ""
        picture = _svg(stage, label, added, setup_lines if isinstance(stage, Program) else (), f"{i:02d}-{name}",
                       failures)
        body.append(f'<section class="stage" id="stage-{i}" data-stage="{_e(name)}"><h2{anchor}>{_e(heading)}</h2>'
                    f'{change}<div class="picture">{picture}</div><details><summary>text</summary>'
                    f"<pre>{_e(describe(stage))}</pre></details></section>")
    body.append(f'<section id="setup"><h2>setup: {len(setup_lines)} messages link sends once</h2>'
                + _table(("#", "message"), list(enumerate(setup_lines))) + "</section>")
    icbs = []
    program = stages[-1][1] if stages else None
    if isinstance(program, Program):
        for obj in program.objects.values():
            if obj.kind == "icb" and obj.payload and isinstance(obj.payload[0], IcbSpec):
                spec = obj.payload[0]
                icbs.append(f"<h3>{_e(obj.name)}: {len(spec.commands)} commands, max kernel buffer bind count "
                            f"{spec.max_bind_count}</h3>" + _table(ICB_COLUMNS, icb_rows(spec)))
                break
    body.append('<section id="icb"><h2>the indirect command buffer</h2>'
                + ("".join(icbs) or "<p>no ICB: the commands are encoded directly every submit</p>") + "</section>")
    body.append(f'<section id="submit"><h2>one submit: {len(messages)} messages</h2>'
                + _table(("#", "message"), list(enumerate(format_message(dict(m)) for m in messages)))
                + "</section>")
    if result is not None:
        verdict = ('<p class="match">output matches</p>' if result.get("match")
                   else '<p class="mismatch">output MISMATCH</p>')
        body.append('<section id="result"><h2>result of the run</h2>' + verdict
                    + _table(("field", "value"), sorted(result.items())) + "</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def write_page(path: Path, lowered: Any, *, title: str, setup: Sequence[Mapping[str, Any]],
               messages: Sequence[Mapping[str, Any]], result: Mapping[str, Any] | None = None) -> Path:
    """Write ``render_page(...)`` to ``path`` (UTF-8) and return it. Raises ``UsageError`` naming ``--html`` when
    the file cannot be written (a folder, a missing parent, no permission). When ``dot`` could not draw some
    stages, the page is written all the same (a note in place of each missing picture) and then one error names
    those stages (``mtlir.cli.lower.pictures_failed``: ``GraphvizTimeoutError``, exit 4, or ``GraphvizError``)."""
    from mtlir.cli.lower import pictures_failed
    failures: list[tuple[str, Any]] = []
    text = render_page(lowered, title=title, setup=setup, messages=messages, result=result, failures=failures)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"--html {path}: cannot write the page: {e.strerror or e}") from None
    if failures:
        raise pictures_failed(f"--html {path} (written)", failures, len(lowered.stages))
    return path
