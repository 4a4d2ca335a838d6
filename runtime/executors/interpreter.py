"""The plain ``Interpreter``: a dispatch loop over pre-decoded instructions, the reference for the semantics of
``mtlir.program.instructions`` (what every executor shares is in ``mtlir.runtime.executors.executor``).

On a native ``MetalBridge`` its messages of proven values are bare ctypes calls, runs of them fused into one block
(``mtlir.runtime.executors.native``); ``CompiledReplay`` (``mtlir.runtime.executors.replay``) is the fast executor.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from mtlir.program.instructions import Alu, Bitcast, Call, Cast, End, Gep, Index, Instr, Load, Range, Store, Struct
from mtlir.program.program import Program
from mtlir.runtime.bridge.bridge import Bridge
from mtlir.runtime.executors.executor import (Executor, ProgramError, alu_fn, bind_variables, bitcast_fn, cast_fn,
                                              format_instr, range_at)
from mtlir.runtime.executors.native import NativeCalls, fits, plan_message, size_structs, value_bounds
from mtlir.runtime.metal.marshal import MTLSizeStruct, ret_kind

__all__ = ["Interpreter"]


# The Interpreter's own pre-decoded form of each instruction, a tuple read by position in its hot loop (the fastest
# dispatch Python has; Program instructions are records, mtlir.program.instructions): (kind, dst, ...) with
#   _MSG proto, args | _CALL fn, proto, args | _STORE dtype, addr, value | _LOAD dtype, addr |
#   _INDEX itemsize, base, index | _ALU fn, srcs | _STRUCT fields | _GEP field, src | _CAST fn, src |
#   _RANGE bound, end_pc | _END counter, range_pc, bound
#   _NATIVE fn, getter, result kind, constants: a message as a bare ctypes call (a native MetalBridge, every value
#   proven to fit: mtlir.runtime.executors.native), its arguments ``getter(regs)`` (constants converted once, kept
#   in registers past nregs), the result converted as msg_send does (_PLAIN, _PTR, _BOOL); ``constants``: the
#   argument tuple when every argument is a constant (a block's op then reads that tuple from one register), else
#   None |
#   _CELL cell, value: a store at a constant host address through a ctypes cell (same conditions) |
#   _SIZE fields, MTLSizeStruct: a STRUCT built as the MTLSize that only direct calls read (native.size_structs) |
#   _KNOWN: a pure instruction whose result _fold computed (native only): its register holds it from the start |
#   _BLOCK ops, next_pc, pcs: on a native MetalBridge, a run of straight-line instructions that each are
#   ``regs[dst] = fn(*getter(regs))`` (_FUSED kinds; a _KNOWN one is left out; a loop of known bound whose body
#   is all of them unrolled, its counter set by an op per iteration), as
#   (fn, getter, dst) tuples run by one tight loop; ``pcs``: each op's instruction. The instructions
#   after the first keep their own forms (never reached: no jump lands inside a run, jumps go to a RANGE or END).
#   A getter builds no tuple where it need not: an op without operands reads a register holding (), one of
#   constant operands a register holding their tuple, a ctypes cell's store is ``value.__set__(cell, v)``
#   _ARRAY getitem, index, array: a load at a constant host table's entry ``index`` (bounded), ``getitem`` of a
#   ctypes array over the table (native.NativeCalls.array; in an unrolled loop, the entry's cell read at its
#   address); the INDEX that only such loads read becomes _KNOWN
#   _ARRAYSET setitem, index, value: a store into such a table entry (the value proven to fit)
_CALL, _MSG, _STORE, _LOAD, _INDEX, _ALU, _STRUCT, _GEP, _CAST, _RANGE, _END, _NATIVE, _CELL, _BLOCK, _SIZE, _KNOWN, \
    _ARRAY, _ARRAYSET = range(18)
_FUSED = (_NATIVE, _CELL, _SIZE, _CAST, _ALU, _KNOWN, _ARRAY, _ARRAYSET, _MSG, _CALL, _STORE, _LOAD, _INDEX, _STRUCT,
          _GEP)
_UNROLL = 4096  # the most ops a loop of known bound becomes when a block unrolls it
_PLAIN, _PTR, _BOOL = range(3)
_RESULT_KINDS = {"void": _PLAIN, "plain": _PLAIN, "ptr": _PTR, "bool": _BOOL}
_UNSET = object()
_POINTERS = ("ptr", "id", "sel")  # parameter kinds ctypes passes as c_void_p (None is NULL)


_VALUE = operator.attrgetter("value")  # a ctypes cell's value: the op reading a table entry at a known index


def _entry(arr: Any, i: int) -> Any:
    """Entry ``i`` of the ctypes array ``arr`` as a ctypes cell at its address."""
    return arr._type_.from_address(ctypes.addressof(arr) + i * ctypes.sizeof(arr._type_))


def _dst(d: int, scratch: int) -> int:
    return d if d >= 0 else scratch


def _send(send: Any, proto: Any, *args: Any) -> Any:
    """A block op of msg_send (or a C call): the operands as one tuple, as the loop passes them."""
    return send(proto, args)


def _store(store: Any, dtype: Any, addr: Any, value: Any) -> None:
    store(addr, dtype, value)


def _load(load: Any, dtype: Any, addr: Any) -> Any:
    return load(addr, dtype)


def _index(itemsize: int, base: int, index: int) -> int:
    return base + index * itemsize


def _tuple(*fields: Any) -> tuple[Any, ...]:
    return fields


def _ptr_result(fn: Any, *args: Any) -> Any:
    """A direct call whose pointer result is converted as msg_send does (NULL as 0)."""
    return fn(*args) or 0


def _bool_result(fn: Any, *args: Any) -> int:
    """A direct call whose BOOL result is read as msg_send does (the low byte only)."""
    return 1 if fn(*args) & 255 else 0


class Interpreter(Executor):
    """The plain executor: a loop over pre-decoded instructions (the semantics of ``mtlir.program.instructions``)."""

    name = "interpreter"

    def __init__(self, program: Program, bridge: Bridge, registers: Sequence[Any] | None = None, *,
                 results: Sequence[int] = ()) -> None:
        super().__init__(program, bridge, registers, results=results)
        self.native = NativeCalls.of(bridge)
        self._fixed: dict[int, Any] = {}
        self.bounds: dict[int, Any] = {}
        self._sizes: set[int] = set()
        self._defs: dict[int, Instr] = {}
        self._readers: dict[int, list[Instr]] = {}
        if self.native is not None:
            counts: dict[int, int] = {}
            for ins in program.instrs:
                counts[ins.dst] = counts.get(ins.dst, 0) + 1
                for r in set(ins.reads()):
                    self._readers.setdefault(r, []).append(ins)
            self._defs = {ins.dst: ins for ins in program.instrs if ins.dst >= 0 and counts[ins.dst] == 1}
            self._fixed = self._fold()
            self.bounds, fields = value_bounds(program, self._fixed)
            self._sizes = size_structs(program, self.native, self._fixed, self.bounds, fields)
        self._constants: list[Any] = []  # converted constants of _NATIVE calls: registers nregs, nregs + 1, ...
        self._raw: set[int] = set()
        self._scratch = -1
        self.code = [self._decode(pc, ins) for pc, ins in enumerate(program.instrs)]
        self.registers += self._constants
        self._bridge_calls = (bridge.msg_send, bridge.c_call, bridge.load, bridge.store)
        self._blocks()
        self._results = operator.itemgetter(*self.results) if len(self.results) > 1 else None
        self._vars = tuple((name, r, lo, hi) for name, (r, lo, hi) in program.variables.items())
        if self.code and self.code[0][0] == _BLOCK and self.code[0][3] == len(self.code):
            self.run = self._straight()  # the whole Program is one block: run is its loop alone

    def _blocks(self) -> None:
        """On a native MetalBridge, fuse each run of instructions of ``_FUSED`` kinds with two or more ops into a
        ``_BLOCK`` at the run's first pc (a run holding a RANGE's END or a jump target cannot occur: those are
        RANGE and END, never fused)."""
        if self.native is None:
            return
        self._raw = self._raw_results()
        self._scratch = self._hold(None)  # where an op without a result writes its None
        self._nothing = operator.itemgetter(self._hold(()))  # the getter of an op without operands: no list made
        code, pc = self.code, 0
        while pc < len(code):
            end, ops = pc, []
            while end < len(code):
                if code[end][0] in _FUSED:
                    if code[end][0] != _KNOWN:
                        ops.append((self._op(code[end]), end))
                    end += 1
                    continue
                loop = self._unrolled(end)
                if loop is None:
                    break
                ops += loop
                end = code[end][3] + 1  # past the loop's END
            if len(ops) >= 2 or (ops and end - pc > len(ops)):
                code[pc] = (_BLOCK, -1, tuple(op for op, _ in ops), end, tuple(i for _, i in ops))
            pc = max(end, pc + 1)

    def _hold(self, value: Any) -> int:
        """A register past the Program's holding ``value`` from the start (for the ops of blocks)."""
        self.registers.append(value)
        return len(self.registers) - 1

    def _unrolled(self, pc: int) -> list[tuple[tuple[Any, Any, int], int]] | None:
        """The ops of the loop whose RANGE is at ``pc`` unrolled (with each op's pc), when its bound is known
        before the run (at most ``_UNROLL`` iterations) and its body is all of ``_FUSED`` kinds; else None. The
        counter is set as the loop sets it: 0 .. bound - 1 in turn, then bound (0 for a loop that never runs)."""
        c = self.code[pc]
        if c[0] != _RANGE or type(self._fixed.get(c[2])) is not int:
            return None
        bound, end_pc, counter = self._fixed[c[2]], c[3], c[1]
        body = range(pc + 1, end_pc)
        if bound * len(body) > _UNROLL or not all(self.code[i][0] in _FUSED for i in body):
            return None
        body_ops = [(self._op(self.code[i]), i) for i in body if self.code[i][0] != _KNOWN]
        empty = self._nothing
        ops: list[tuple[tuple[Any, Any, int], int]] = []
        pcs = {id(ins): q for q, ins in enumerate(self.program.instrs)}
        needed = any(self.code[pcs[id(r)]][0] != _KNOWN for r in self._readers.get(counter, ()) if type(r) is not End)
        for i in range(max(bound, 0)):
            if needed:  # an op of the body reads the counter (not only the INDEX of a table entry read directly)
                ops.append(((itertools.repeat(i).__next__, empty, counter), pc))
            for op, at in body_ops:  # a table entry the counter indexes: that iteration's entry, as a cell
                c = self.code[at]
                ops.append(((_VALUE, operator.itemgetter(self._hold((_entry(c[4], i),))), c[1]), at)
                           if c[0] == _ARRAY and c[3] == counter and i < len(c[4]) else (op, at))
        ops.append(((itertools.repeat(max(bound, 0)).__next__, empty, counter), end_pc))
        return ops

    def _raw_results(self) -> set[int]:
        """Pointer results of direct calls that may stay as ctypes returns them (None for NULL) inside a block:
        written once, not a result, read only by direct calls at pointer parameters (None is NULL there) and by
        stores at a constant address of a pointer's size, whose cell becomes a ``c_void_p`` (None stores 0)."""
        writes: dict[int, int] = {}
        for ins in self.program.instrs:
            writes[ins.dst] = writes.get(ins.dst, 0) + 1
        raw = {c[1] for c in self.code if c[0] == _NATIVE and c[1] >= 0 and c[4] == _PTR and writes[c[1]] == 1}
        raw -= set(self.results)
        for pc, ins in enumerate(self.program.instrs):
            reads, c = raw.intersection(ins.reads()), self.code[pc]
            if reads and not (c[0] == _NATIVE and type(ins) is Call and all(
                    dt.kind in _POINTERS for dt, a in zip(ins.proto.args, ins.args) if a in reads)) and not (
                    c[0] == _CELL and NativeCalls.pointer_cell(c[2]) is not None):
                raw -= reads
        for pc, c in enumerate(self.code):  # a raw value stored at a constant address: a pointer cell (None is 0)
            if c[0] == _CELL and c[3] in raw:
                self.code[pc] = (_CELL, -1, NativeCalls.pointer_cell(c[2]), c[3])
        return raw

    def _op(self, c: tuple[Any, ...]) -> tuple[Any, Any, int]:
        """A fused instruction as ``(fn, getter, dst)``: ``regs[dst] = fn(*getter(regs))`` (an op without a result
        writes the scratch register; a result to convert as msg_send does gets a wrapper)."""
        def get(regs: Sequence[int]) -> Any:  # one register: a slice gives a list of one
            return operator.itemgetter(*regs) if len(regs) > 1 else operator.itemgetter(slice(regs[0], regs[0] + 1))
        k = c[0]
        if k == _NATIVE:
            fn, dst, kind = c[2], c[1], c[4]
            args = c[3] if c[5] is None else operator.itemgetter(self._hold(c[5]))  # constants: the tuple itself
            if dst < 0:
                return fn, args, self._scratch
            if kind == _PTR and dst not in self._raw:
                fn = functools.partial(_ptr_result, fn)
            elif kind == _BOOL:
                fn = functools.partial(_bool_result, fn)
            return fn, args, dst
        if k == _CELL:  # cell.value = v as the descriptor's __set__(cell, v)
            return type(c[2]).value.__set__, operator.itemgetter(self._hold(c[2]), c[3]), self._scratch
        if k == _SIZE:
            return c[3], get(c[2]), c[1]
        if k == _ARRAY:
            return c[2], get([c[3]]), c[1]
        if k == _ARRAYSET:
            return c[2], operator.itemgetter(c[3], c[4]), self._scratch
        msg_send, c_call, load, store = self._bridge_calls
        nothing = self._nothing
        if k == _MSG:  # through msg_send and its checks, as the loop sends it
            return functools.partial(_send, msg_send, c[2]), get(c[3]) if c[3] else nothing, _dst(c[1], self._scratch)
        if k == _CALL:
            return (functools.partial(_send, functools.partial(c_call, c[2]), c[3]), get(c[4]) if c[4] else nothing,
                    _dst(c[1], self._scratch))
        if k == _STORE:
            return functools.partial(_store, store, c[2]), operator.itemgetter(c[3], c[4]), self._scratch
        if k == _LOAD:
            return functools.partial(_load, load, c[2]), get([c[3]]), c[1]
        if k == _INDEX:
            return functools.partial(_index, c[2]), operator.itemgetter(c[3], c[4]), c[1]
        if k == _STRUCT:
            return _tuple, get(c[2]) if c[2] else nothing, c[1]
        if k == _GEP:
            return operator.itemgetter(c[2]), get([c[3]]), c[1]
        if k == _CAST:
            return c[2], get([c[3]]), c[1]
        return c[2], get(c[3]), c[1]  # _ALU

    def _native(self, ins: Instr) -> tuple[Any, ...] | None:
        """A ``_NATIVE``, ``_CELL`` or ``_SIZE`` form where ``NativeCalls`` allows it, else None."""
        native = self.native
        if native is None:
            return None
        if type(ins) is Store and ins.addr not in self._fixed:  # into a host table's entry: an array's setitem
            arr, at = self._array(ins), self._defs.get(ins.addr)
            if arr is None or type(at) is not Index or ins.value in self._fixed or not fits(
                    self.bounds.get(ins.value), ins.dtype):
                return None
            return (_ARRAYSET, -1, functools.partial(operator.setitem, arr), at.index, ins.value)
        if type(ins) is Store:
            addr, value = self._fixed.get(ins.addr), ins.value
            if type(addr) is not int or value in self._fixed or not fits(self.bounds.get(value), ins.dtype):
                return None
            cell = native.cell(addr, ins.dtype)
            return None if cell is None else (_CELL, -1, cell, value)
        if type(ins) is Struct and ins.dst in self._sizes:
            return (_SIZE, ins.dst, tuple(ins.fields), MTLSizeStruct)
        if type(ins) is Load:
            arr, at = self._array(ins), self._defs.get(ins.addr)
            return None if arr is None or type(at) is not Index else (_ARRAY, ins.dst, arr.__getitem__, at.index,
                                                                      arr)
        if type(ins) is Index and ins.dst not in self.results and self._readers.get(ins.dst) and all(
                (type(r) is Load or (type(r) is Store and r.addr == ins.dst and r.value != ins.dst))
                and self._native(r) is not None for r in self._readers[ins.dst]):
            return (_KNOWN, ins.dst)  # only array loads read it: nothing to compute
        if type(ins) is not Call:
            return None
        plan = plan_message(native, ins, self._fixed, self.bounds, self._sizes)
        if plan is None:
            return None
        slots = []
        for (const, v), a in zip(plan[1], ins.args):
            if not const or (type(v) is int and type(self._fixed[a]) is int and a in self.static):
                slots.append(a)  # a register, or a constant register holding the int as it is
            else:
                slots.append(self.program.nregs + len(self._constants))
                self._constants.append(v)
        constants = tuple(v for _, v in plan[1]) if all(const for const, _ in plan[1]) else None
        return (_NATIVE, ins.dst, plan[0], operator.itemgetter(*slots), _RESULT_KINDS[ret_kind(ins.proto.ret)],
                constants)

    def _array(self, ins: Load | Store) -> Any:
        """The ctypes array a load at ``base + index * itemsize`` reads through (a constant host table, a bounded
        index: ``NativeCalls.array``), or None."""
        index = self._defs.get(ins.addr)
        if type(index) is not Index or index.base not in self._fixed or index.index in self._fixed:
            return None
        return NativeCalls.array(self._fixed[index.base], ins.dtype, self.bounds.get(index.index), index.itemsize)

    def _fold(self) -> dict[int, Any]:
        """Registers known before the run: the constants, selectors and objects, and the results of pure
        instructions (casts, ALU, INDEX, STRUCT, GEP) of known operands written once, evaluated now as the loop
        would (the proofs of the direct calls use them; their instructions become _KNOWN: nothing to run)."""
        known = {r: self.registers[r] for r in self.static}
        writes: dict[int, int] = {}
        for ins in self.program.instrs:
            if ins.dst >= 0:
                writes[ins.dst] = writes.get(ins.dst, 0) + 1
        for ins in self.program.instrs:
            if writes.get(ins.dst) != 1 or not all(r in known for r in ins.reads()):
                continue
            val = [known[r] for r in ins.reads()]
            try:
                match ins:
                    case Cast(dtype=dtype):
                        known[ins.dst] = cast_fn(dtype)(val[0])
                    case Bitcast(dtype=dtype):
                        known[ins.dst] = bitcast_fn(dtype)(val[0])
                    case Alu(op=op, dtype=dtype):
                        known[ins.dst] = alu_fn(op, dtype)(*val)
                    case Index(itemsize=itemsize):
                        known[ins.dst] = val[0] + val[1] * itemsize
            except Exception:  # it fails at run time, where the error names the instruction
                continue
        return known

    def _decode(self, pc: int, ins: Instr) -> tuple[Any, ...]:
        """Instruction ``pc`` in the loop's own form (``_CALL`` ... ``_END`` above): ALU ops and casts become their
        functions, a CALL of ``objc_msgSend`` a ``_MSG``, an END carries its RANGE's bound register."""
        try:
            if ins.dst >= 0 and ins.dst in self._fixed and ins.dst not in self.static:
                self.registers[ins.dst] = self._fixed[ins.dst]  # computed once by _fold: held from the start
                return (_KNOWN, ins.dst)
            direct = self._native(ins)
            if direct is not None:
                return direct
            match ins:
                case Call(dst=dst, fn="objc_msgSend", proto=proto, args=args):
                    return (_MSG, dst, proto, tuple(args))
                case Call(dst=dst, fn=fn, proto=proto, args=args):
                    return (_CALL, dst, fn, proto, tuple(args))
                case Store(dtype=dtype, addr=addr, value=value):
                    return (_STORE, -1, dtype, addr, value)
                case Load(dst=dst, dtype=dtype, addr=addr):
                    return (_LOAD, dst, dtype, addr)
                case Index(dst=dst, itemsize=itemsize, base=base, index=index):
                    return (_INDEX, dst, itemsize, base, index)
                case Alu(dst=dst, op=op, dtype=dtype, srcs=srcs):
                    return (_ALU, dst, alu_fn(op, dtype), tuple(srcs))
                case Struct(dst=dst, fields=fields):
                    return (_STRUCT, dst, tuple(fields))
                case Gep(dst=dst, field=field, src=src):
                    return (_GEP, dst, field, src)
                case Cast(dst=dst, dtype=dtype, src=src) if dtype.is_word and dtype.kind != "bool" and fits(
                        self.bounds.get(src), dtype):  # an int proven to fit (native only): the cast keeps it
                    return (_CAST, dst, operator.index, src)
                case Cast(dst=dst, dtype=dtype, src=src):
                    return (_CAST, dst, cast_fn(dtype), src)
                case Bitcast(dst=dst, dtype=dtype, src=src):
                    return (_CAST, dst, bitcast_fn(dtype), src)
                case Range(dst=dst, bound=bound, end_pc=end_pc):
                    return (_RANGE, dst, bound, end_pc)
                case End(counter=counter, range_pc=range_pc):
                    return (_END, -1, counter, range_pc, range_at(self.program, range_pc).bound)
        except ProgramError as e:
            raise ProgramError(f"instruction {format_instr(self.program, pc)}: {e}") from None
        raise ProgramError(f"instruction {format_instr(self.program, pc)}: not an instruction")

    def _straight(self) -> Callable[..., tuple[Any, ...]]:
        """``run`` for a Program that is one ``_BLOCK`` (a native MetalBridge; a loop of known bound unrolled):
        plain in-bounds integers bound by name, then the block's ops, nothing else per run (no dispatch, no
        attribute read). Anything else (another Program named, a value to convert or to refuse, a missing or
        unknown name) goes to ``_run``, which binds through ``bind_variables`` and raises its errors."""
        regs, ops, pcs, program = self.registers, self.code[0][2], self.code[0][4], self.program
        variables, nvars, results, name = self._vars, len(self._vars), self.results, self.name
        get_results = self._results
        general = self._run

        def run(program_: Program | None = None, /, **values: Any) -> tuple[Any, ...]:
            if program_ is not None or len(values) != nvars:
                return general(program_, **values)
            bound = True
            try:
                for var, r, lo, hi in variables:
                    v = values[var]
                    if type(v) is not int or not lo <= v <= hi:
                        bound = False
                        break
                    regs[r] = v
            except KeyError:  # an unknown name in place of a known one
                bound = False
            if not bound:
                return general(**values)
            try:
                for fn, get, d in ops:
                    regs[d] = fn(*get(regs))
            except Exception as e:  # the instruction of the op that raised (each op is its own object)
                if not getattr(e, "deferred", False):  # a deferred device error: GPU work before, not this op
                    pc = pcs[ops.index((fn, get, d))]
                    e.add_note(f"while running instruction {format_instr(program, pc)} ({name})")
                raise
            if get_results is not None:
                return get_results(regs)  # type: ignore[no-any-return]
            return (regs[results[0]],) if results else ()
        return run

    def _run(self, program: Program | None = None, /, **values: Any) -> tuple[Any, ...]:
        """``run``: execute the Program once with ``values`` (variables by name); returns the ``results``
        registers. Raises ``ValueError``/``TypeError`` for a missing, unknown or out-of-bounds variable and whatever the
        Bridge raises, noted with the instruction that was running. ``program``: see ``Executor``."""
        if program is not None and program is not self.program:
            return self._other(program).run(**values)
        program, regs, code = self.program, self.registers, self.code
        bound = len(values) == len(self._vars)
        if bound:  # plain ints in bounds, by name: no conversion needed
            for name, r, lo, hi in self._vars:
                v = values.get(name, _UNSET)
                if type(v) is not int or not lo <= v <= hi:
                    bound = False
                    break
                regs[r] = v
        if not bound:  # anything else: converted, or refused with the error naming the variable
            for (r, _, _), v in zip(program.variables.values(), bind_variables(program, values)):
                regs[r] = v
        msg_send, c_call, load, store = self._bridge_calls
        pc, n = 0, len(code)
        try:
            while pc < n:
                ins = code[pc]
                k = ins[0]
                if k == _BLOCK:
                    for fn, get, d in ins[2]:
                        regs[d] = fn(*get(regs))
                    pc = ins[3]
                    continue
                if k == _KNOWN:
                    pc += 1
                    continue
                if k == _NATIVE:
                    v = ins[2](*ins[3](regs))
                    if ins[1] >= 0:
                        kind = ins[4]
                        regs[ins[1]] = v if kind == _PLAIN else (v or 0) if kind == _PTR else (1 if v & 255 else 0)
                elif k == _CELL:
                    ins[2].value = regs[ins[3]]
                elif k == _SIZE:
                    regs[ins[1]] = ins[3](*[regs[a] for a in ins[2]])
                elif k == _ARRAY:
                    regs[ins[1]] = ins[2](regs[ins[3]])
                elif k == _ARRAYSET:
                    ins[2](regs[ins[3]], regs[ins[4]])
                elif k == _MSG:
                    v = msg_send(ins[2], tuple([regs[a] for a in ins[3]]))
                    if ins[1] >= 0:
                        regs[ins[1]] = v
                elif k == _STORE:
                    store(regs[ins[3]], ins[2], regs[ins[4]])
                elif k == _LOAD:
                    regs[ins[1]] = load(regs[ins[3]], ins[2])
                elif k == _INDEX:
                    regs[ins[1]] = regs[ins[3]] + regs[ins[4]] * ins[2]
                elif k == _ALU:
                    regs[ins[1]] = ins[2](*[regs[a] for a in ins[3]])
                elif k == _CALL:
                    v = c_call(ins[2], ins[3], tuple([regs[a] for a in ins[4]]))
                    if ins[1] >= 0:
                        regs[ins[1]] = v
                elif k == _STRUCT:
                    regs[ins[1]] = tuple([regs[a] for a in ins[2]])
                elif k == _GEP:
                    regs[ins[1]] = regs[ins[3]][ins[2]]
                elif k == _CAST:
                    regs[ins[1]] = ins[2](regs[ins[3]])
                elif k == _RANGE:
                    regs[ins[1]] = 0
                    if regs[ins[2]] <= 0:
                        pc = ins[3]
                else:  # _END
                    regs[ins[2]] += 1
                    if regs[ins[2]] < regs[ins[4]]:
                        pc = ins[3]
                pc += 1
        except Exception as e:
            if code[pc][0] == _BLOCK:  # the instruction of the block that raised (each op is its own object)
                pc = code[pc][4][code[pc][2].index((fn, get, d))]
            if not getattr(e, "deferred", False):  # a deferred device error: GPU work before, not this instruction
                e.add_note(f"while running instruction {format_instr(program, pc)} ({self.name})")
            raise
        if self._results is not None:
            return self._results(regs)  # type: ignore[no-any-return]
        return (regs[self.results[0]],) if self.results else ()
