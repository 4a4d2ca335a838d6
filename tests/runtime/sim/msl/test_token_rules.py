"""The translator's table of token rewrite rules: built in one place, read-only, the bounds checks' rules first on
their tokens (they used to be inserted into the translator's table when the guard module was imported)."""
from __future__ import annotations

import pytest

from mtlir.runtime.sim.msl.guard.access import deref, device_cast, pointer_declaration
from mtlir.runtime.sim.msl.guard.loops import loop_guard
from mtlir.runtime.sim.msl.guard.pointers import pointer_group
from mtlir.runtime.sim.msl.lex import render, tokenize
from mtlir.runtime.sim.msl.prelude import Prelude
from mtlir.runtime.sim.msl.rewrite import Ctx, constant_space, device_space, rewrite
from mtlir.runtime.sim.msl.token_rules import TOKEN_RULES


def test_the_guard_rules_come_first_on_their_tokens() -> None:
    assert TOKEN_RULES["device"] == (pointer_declaration, device_space)
    assert TOKEN_RULES["constant"] == (pointer_declaration, constant_space)
    assert TOKEN_RULES["*"] == (deref,) and TOKEN_RULES["("] == (device_cast, pointer_group)
    assert TOKEN_RULES["for"] == TOKEN_RULES["while"] == (loop_guard,)


def test_the_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        TOKEN_RULES["*"] = ()  # type: ignore[index]


def test_rewrite_uses_the_table_its_context_carries() -> None:
    source = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    assert render(rewrite(tokenize(source), Ctx(Prelude(), TOKEN_RULES))) == "barrier(CLK_LOCAL_MEM_FENCE);"
    assert render(rewrite(tokenize(source), Ctx(Prelude(), {}))) == source
