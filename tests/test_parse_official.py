"""clarify's DQ/DA parser held against the official one.

`official_parse_disambig` is toc/utils.py:25-46 of gankim/tree-of-clarifications copied line for line (only
the bare `except:` narrowed to the two exceptions its body can raise), and `official_fields` is the `disambig`
/ `answer` extraction of dsp/templates/template_v2.py:144-175 with the fallback of run_toc.py:222-225. They
are written here, not imported from batch/toc/format.py, so the comparison is between two implementations.

The rule checked: wherever the official parser yields pairs, clarify's default parser yields the same
pairs (question and DA text as the official code takes them), in the same order; it may add pairs only
from lines the official pairing dropped. `toc.parsing = "official"` yields exactly the official pairs.
"""

from __future__ import annotations

import random
import re

import pytest

from clarify.batch.toc.format import official_pairs, parse_disambiguations
from tests import test_toc_golden


def official_parse_disambig(str_disambig):
    lst_disambig = str_disambig.split("\n")
    if lst_disambig[0] == "":
        lst_disambig = lst_disambig[1:]
    disambigs = []
    for i in range(0, len(lst_disambig), 2):
        if i + 1 >= len(lst_disambig):
            continue
        try:
            assert "DQ" in lst_disambig[i]
            assert "DA" in lst_disambig[i + 1]

            question = re.split(r'DQ\s*\d*:', lst_disambig[i])[1]
            answer = re.split(r'DA\s*\d*:', lst_disambig[i + 1])[1]
            disambigs.append({'question': question.strip(),
                              'answer': answer.strip()
                              }
                             )
        except (AssertionError, IndexError):
            continue

    return disambigs


def official_fields(raw_pred: str) -> tuple[str, str | None]:
    raw_pred = raw_pred.strip()
    offset = raw_pred.find("\nAnswer:")
    if offset < 0:
        return raw_pred.strip(), None
    return raw_pred[:offset].strip(), raw_pred[offset + len("\nAnswer:"):].strip()


def official(completion: str) -> list[tuple[str, str]]:
    """run_toc.py:222-225 on one clarification completion."""
    disambig, answer = official_fields(completion)
    lst = official_parse_disambig(disambig)
    if lst == [] and answer is not None:
        lst = official_parse_disambig(answer.split("\nAnswer:")[0])
    return [(d["question"], d["answer"]) for d in lst]


def default(completion: str, finish_reason: str = "stop") -> list[tuple[str, str]]:
    return [(p.question, p.da) for p in parse_disambiguations(completion, finish_reason).pairs]


def is_subsequence(small: list, big: list) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def check(completion: str, finish_reason: str = "stop") -> None:
    want = official(completion)
    got = default(completion, finish_reason)
    if finish_reason == "length" and want and got != want:
        # clarify drops a pair cut at max_tokens (the official run continues the completion instead,
        # dsp/primitives/predict.py:94-116): the official pairs but the last one
        want = want[:-1]
    assert is_subsequence(want, got), (completion, want, got)
    official_mode = [(p.question, p.da) for p in parse_disambiguations(completion, finish_reason, "official").pairs]
    assert official_mode == official(completion) == official_pairs(completion), completion


# Constructed lines: the layouts models write (the context numbering echoed, list numbers, bold, a label
# glued to its number or followed by " -", two labels on a line, a label in mid-sentence, an empty DA)
CONSTRUCTED = {
    "echoed context numbers": ("[1] DQ 2: When did season 3 air?\n[2] DA 2: October 1, 2017",
                               [("When did season 3 air?", "October 1, 2017")]),
    "list numbers": ("1. DQ: Who won in 2010?\n2. DA: Spain", [("Who won in 2010?", "Spain")]),
    "bold labels": ("**DQ 1**: Who won?\n**DA 1**: Spain", [("Who won?", "Spain")]),
    # no separator either parser knows: no pair from either
    "glued number, dash": ("DQ1 - Who won?\nDA1 - Spain", []),
    "two labels on one line": ("DQ 1: Who won? DA 1: Spain\nDQ 2: Who lost?\nDA 2: Netherlands",
                               [("Who won?", "Spain"), ("Who lost?", "Netherlands")]),
    "two labels, official pairing": ("DQ 1: Who won? DQ 2: Who lost?\nDA 1: Spain DA 2: Netherlands",
                                     [("Who won?", "Spain")]),
    "label mid-sentence": ("The first reading, DQ 1: who won in 2010?\nso DA 1: Spain",
                           [("who won in 2010?", "Spain")]),
    "empty DA": ("DQ 1: Who won?\nDA 1:", [("Who won?", "")]),
    "empty DQ": ("DQ 1:\nDA 1: Spain", [("", "Spain")]),
    "missing DA shifts the official pairing": ("DQ 1: a?\nDQ 2: b?\nDA 2: x\nDQ 3: c?\nDA 3: y",
                                               [("b?", "x"), ("c?", "y")]),
    "extra line between pairs": ("DQ 1: a?\nDA 1: x\n\nDQ 2: b?\nDA 2: y", [("a?", "x"), ("b?", "y")]),
    "label line opening with Answer": ("Answer: DQ 1: a?\nDA 1: x", [("a?", "x")]),
    "pairs in the answer field": ("I think\nAnswer:\nDQ 1: a?\nDA 1: x", [("a?", "x")]),
    "long answer after pairs": ("DQ 1: a?\nDA 1: x\nAnswer: DQ 2: b?\nDA 2: y", [("a?", "x")]),
    "lower-case label": ("dq 1: a?\nda 1: x", [("a?", "x")]),
    "label with period": ("DQ 1. a?\nDA 1. x", [("a?", "x")]),
    "windows line ends": ("DQ 1: a?\r\nDA 1: x\r\n", [("a?", "x")]),
    "leading blank lines": ("\n\n  DQ 1: a?\nDA 1: x", [("a?", "x")]),
}


@pytest.mark.parametrize("name", list(CONSTRUCTED))
def test_constructed_cases(name):
    completion, want = CONSTRUCTED[name]
    check(completion)
    assert default(completion) == want


def test_the_mid_line_label_the_differential_run_met():
    # node 0.2 of "When does last chance u season 3 take place?": the context numbers echoed before each
    # label; the official parser keeps both pairs, the line-start parser kept none
    completion = ("[1] DQ 1: When did Last Chance U season 3 premiere?\n[2] DA 1: July 20, 2018\n"
                  "[1] DQ 2: When was season 3 filmed?\n[2] DA 2: September 25, 2016")
    assert default(completion) == official(completion) == [
        ("When did Last Chance U season 3 premiere?", "July 20, 2018"),
        ("When was season 3 filmed?", "September 25, 2016")]


def test_golden_completions():
    completions = [c for cs in test_toc_golden.CLARIFY.values() for c in cs]
    assert completions
    for c in completions:
        check(c)
        assert default(c) == official(c)


def test_cut_at_max_tokens_drops_only_the_cut_pair():
    c = "DQ 1: a?\nDA 1: x\nDQ 2: b?\nDA 2: Jo"
    assert default(c, "length") == [("a?", "x")]
    assert [(p.question, p.da) for p in parse_disambiguations(c, "length", "official").pairs] == official(c)


_PIECES = ["DQ", "DA", "DQ 1:", "DA 1:", "DQ2:", "DA 2 :", "- DQ 3.", "**DA 4**:", "[1]", "1.", "Answer:",
           "who won?", "Spain; Germany", ";", " ", "  ", "dq:", "da:", "\r", "\t", "", "x"]


def test_random_label_soup():
    # lines made of label fragments, in every order: the rule holds on all of them
    rng = random.Random(42)
    for _ in range(3000):
        lines = [" ".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 9))]
        completion = "\n".join(lines)
        check(completion, rng.choice(["stop", "length"]))


def check_recorded(completions: list[tuple[str, str]]) -> None:
    """The rule on recorded (completion, finish_reason) pairs, e.g. a real engine's (tests/test_toc_real.py)."""
    for text, reason in completions:
        check(text, reason)
