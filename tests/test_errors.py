"""The error family (mtlir.errors): every exception class mtlir defines derives from MtlirError, each root has one
exit code of the command line, and the classes keep the Python bases that ``except`` clauses rely on."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import mtlir
from mtlir.cli.report import EXIT_BAD_INPUT, EXIT_CODES, EXIT_GPU_ERROR, EXIT_UNSUPPORTED, UsageError, exit_code
from mtlir.errors import (WaitTimeoutError, BridgeError, DeviceError, GPUExecutionError, InputError, KernelAccessError, KernelBuildError,
                          KernelCompileError, LinkError, LoweringError, MetalValidationError, MtlirError,
                          UnsupportedError, UnsupportedKernelError)


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the installed package (all of them imported), by qualified
    name."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(mtlir.__path__, "mtlir."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("mtlir"):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_of_the_package_is_an_mtlir_error() -> None:
    classes = _exception_classes()
    # the walk reaches every part of the package, or this test proves nothing
    for name in ("mtlir.errors.KernelBuildError", "mtlir.cli.report.UsageError", "mtlir.frontend.trace.TraceError",
                 "mtlir.ir.upat.RuleError", "mtlir.runtime.sim.faults.GPUFault", "mtlir.runtime.metal.marshal.Unfit",
                 "mtlir.runtime.sim.msl.lex.MslSyntaxError", "mtlir.viz.GraphvizNotFoundError"):
        assert name in classes, name
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, MtlirError))
    assert outside == [], f"exception classes outside the MtlirError family: {outside}"


@pytest.mark.parametrize("error, code", [
    (InputError("a bad trace"), EXIT_BAD_INPUT),
    (LoweringError("encode refuses the queue"), EXIT_BAD_INPUT),
    (KernelCompileError("invalid MSL"), EXIT_BAD_INPUT),
    (UsageError("a bad flag"), EXIT_BAD_INPUT),
    (LinkError("nil"), EXIT_BAD_INPUT),
    (BridgeError("cut to 32 bits"), EXIT_BAD_INPUT),
    (FileNotFoundError("nope.json"), EXIT_BAD_INPUT),
    (DeviceError("the GPU failed"), EXIT_GPU_ERROR),
    (GPUExecutionError("status Error", 3, "PageFault"), EXIT_GPU_ERROR),
    (MetalValidationError("rule 9"), EXIT_GPU_ERROR),
    (TimeoutError("timed out"), EXIT_GPU_ERROR),
    (WaitTimeoutError("waiting for timeline value 1"), EXIT_GPU_ERROR),
    (UnsupportedError("not yet"), EXIT_UNSUPPORTED),
    (UnsupportedKernelError("simdgroup_float8x8", "simdgroup_float8x8"), EXIT_UNSUPPORTED),
    (KernelBuildError("no build", kernels=("k",), log="", source="", errors=[], summary="no build"),
     EXIT_UNSUPPORTED),  # a KernelCompileError too: the unsupported root comes first
    (MtlirError("a bug"), None),
    (ValueError("a bug"), None),
    (KeyError("a bug"), None),
])
def test_each_root_has_its_exit_code(error: BaseException, code: int | None) -> None:
    assert exit_code(error) == code


def test_every_exception_class_has_the_exit_code_of_its_root() -> None:
    """Classes outside the roots are bugs (exit 5): a malformed Program, a rule set that is wrong or never ends."""
    roots = [root for root, _ in EXIT_CODES]
    for name, cls in _exception_classes().items():
        try:
            error = cls.__new__(cls)  # isinstance needs no message; each class has its own constructor
        except TypeError:  # a class with two built-in bases of different layouts (WaitTimeoutError: an OSError too)
            error = cls("a message")
        expected = next((code for root, code in EXIT_CODES if issubclass(cls, root)), None)
        assert exit_code(error) == expected, name
    bugs = {name.rsplit(".", 1)[1] for name, cls in _exception_classes().items()
            if not any(issubclass(cls, root) for root in roots)}
    assert {"ProgramError", "RuleError", "RewriteLoopError", "Unfit"} <= bugs


def test_the_classes_keep_their_python_bases() -> None:
    from mtlir.frontend.trace import TraceError
    from mtlir.ir.rewrite import RewriteLoopError
    from mtlir.ir.upat import RuleError
    from mtlir.passes.verify import VerifyError
    from mtlir.runtime.executors.executor import ProgramError
    for cls in (TraceError, VerifyError, LoweringError, UsageError, ProgramError):
        assert issubclass(cls, ValueError), cls
    for cls in (LinkError, BridgeError, DeviceError, KernelAccessError, KernelCompileError, UnsupportedKernelError,
                RewriteLoopError):
        assert issubclass(cls, RuntimeError), cls
    assert issubclass(RuleError, TypeError)
    assert not issubclass(KernelCompileError, ValueError)  # an `except ValueError` does not catch invalid MSL


def test_locate_puts_the_place_in_front_once() -> None:
    e = UnsupportedKernelError("MSL line 4: cannot translate", "simdgroup_float8x8")
    assert e.locate("program 'k'") is e and str(e) == "program 'k': MSL line 4: cannot translate"
    e.locate("somewhere else")
    assert e.where == "program 'k'" and str(e) == "program 'k': MSL line 4: cannot translate"
    b = KernelBuildError("could not build\n  line 1", kernels=("k",), log="", source="", errors=[],
                         summary="could not build")
    raise_me = b.locate("program 'k'")
    assert raise_me.summary == "program 'k': could not build" and str(b).startswith("program 'k': could not build\n")


def test_the_python_api_raises_the_family_where_the_user_can_act() -> None:
    """A variable out of its bounds or misspelled, an unknown target, a closed Session, a wait for a value no submit
    signals, a buffer that does not exist: each an ``InputError`` naming what is wrong (and still the ``ValueError``
    or ``RuntimeError`` it was)."""
    from mtlir.errors import ArgumentError, StateError
    from mtlir.frontend.trace import load_trace
    from mtlir.passes import lower
    from mtlir.runtime.session import Session
    from mtlir.runtime.sim.device import SimDevice
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    trace = load_trace(root / "examples" / "traces" / "symbolic_kv.apple7.json")
    program = lower(trace.queue(), target="x86_64", keep_stages=False).program
    with pytest.raises(ArgumentError, match="unknown target 'sparc'"):
        SimDevice("sparc")
    with SimDevice("x86_64", family="Apple7") as dev:
        s = Session(program, dev, initial=trace.initial_data())
        with pytest.raises(ArgumentError, match=r"'start_pos' = 1000000000 is outside its bounds \[1, 32\]"):
            s.submit(start_pos=10**9)
        with pytest.raises(ArgumentError, match=r"unknown variable\(s\) 'Start_pos'.*did you mean 'start_pos'\?"):
            s.submit(Start_pos=3)
        with pytest.raises(ArgumentError, match="no buffer named 'nope'"):
            s.linked.read_buffer("nope")
        s.submit(start_pos=3)
        with pytest.raises(ArgumentError, match="no submit signals timeline value 5"):
            s.wait(5, timeout_s=1)
        s.close()
        with pytest.raises(StateError, match="submit on a closed Session"):
            s.submit(start_pos=3)
        assert isinstance(StateError("x"), RuntimeError) and isinstance(ArgumentError("x"), ValueError)
