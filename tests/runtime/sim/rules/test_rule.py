"""The ``Rule`` enumeration is METAL.md §3: the same numbered rules with the same text, so the two cannot drift; and
messages cite a rule by its number and summary."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtlir.runtime.sim.rules.rule import Rule, assertion, violation

METAL_MD = Path(__file__).resolve().parents[4] / "docs" / "METAL.md"


def _numbered_rules() -> dict[int, str]:
    """METAL.md §3's numbered list: number -> text with its whitespace collapsed (a rule may span several lines)."""
    section = METAL_MD.read_text().split("\n## §3 ", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\Z)", section, re.S | re.M)
    return {int(n): " ".join(text.split()) for n, text in items}


def test_the_enumeration_is_metal_md_section_3() -> None:
    documented = _numbered_rules()
    assert sorted(documented) == list(range(1, 18))  # the parse found the whole list
    assert {r.number: r.text for r in Rule if r is not Rule.API_VALIDATION} == documented


def test_a_rule_is_found_by_its_number_and_names_are_unique() -> None:
    assert Rule(9) is Rule.ICB_RACE and Rule(0) is Rule.API_VALIDATION
    assert len({r.summary for r in Rule}) == len(Rule) == 18
    with pytest.raises(ValueError):
        Rule(18)


def test_messages_cite_the_number_and_summary() -> None:
    e = violation(Rule.ICB_RACE, "commit on MTLCommandBuffer 0x1", "a race")
    assert str(e) == ("commit on MTLCommandBuffer 0x1: a race (METAL.md §3 rule 9: ICB commands without setBarrier "
                      "run concurrently: overlapping bytes are a data race)")
    e = assertion(Rule.ONE_OPEN_ENCODER, "computeCommandEncoder on X", "A command encoder is already encoding")
    assert str(e) == ("computeCommandEncoder on X: failed assertion `A command encoder is already encoding' "
                      "(METAL.md §3 rule 1: one open encoder per command buffer)")
    assert str(violation(Rule.API_VALIDATION, "c", "m")) == "c: m (Metal API validation)"
