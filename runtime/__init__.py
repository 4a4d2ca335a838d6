"""mtlir.runtime: run a lowered Program on a device.

``link`` makes a Program's device objects once; an executor (``Interpreter`` or ``CompiledReplay``) runs the
Program through a ``Bridge``; a ``Session`` links once and replays ``submit``/``wait``; ``RecordingBridge`` records
the messages a run sends; ``Messenger`` sends one by selector name (docs/runtime.md). The devices live in
``mtlir.runtime.sim`` (simulated) and ``mtlir.runtime.metal.bridge`` (macOS).
"""
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.bridge.messenger import Messenger
from mtlir.runtime.bridge.recording import Message, RecordingBridge
from mtlir.runtime.executors.executor import Executor, ProgramError, prepare_registers
from mtlir.runtime.executors.interpreter import Interpreter
from mtlir.runtime.executors.replay import EXECUTORS, CompiledReplay, make_executor
from mtlir.runtime.link.link import link
from mtlir.runtime.link.linked import Linked
from mtlir.runtime.session import Session
from mtlir.runtime.submission import Submission

__all__ = ["Bridge", "Messenger", "Message", "RecordingBridge",
           "EXECUTORS",
           "CompiledReplay", "Executor", "Interpreter", "ProgramError", "make_executor", "prepare_registers",
           "Linked", "link", "Session", "Submission"]
