"""Token-in/token-out alignment (app/ingest/_drift.py) on hand-made turns: the common prefix, the
re-rendered span, the number of sampled ids without a counterpart, and where the new part begins."""

from __future__ import annotations

from app.ingest._drift import align_turn, common_prefix


def test_a_prompt_that_extends_the_sampled_ids_has_no_drift() -> None:
    assert align_turn([1, 2, 3], [1, 2, 3, 9, 9]) is None
    assert common_prefix(list(range(1000)), list(range(1000)) + [5]) == 1000


def test_a_re_serialised_call_is_measured_token_by_token() -> None:
    # Sampled: prompt [1, 2] + generation [10, 11, 12, 13]. The next prompt re-renders the call as
    # [10, 21, 12, 13] (one token differs) and adds the tool output [7, 7] after it.
    sampled = [1, 2, 10, 11, 12, 13]
    prompt = [1, 2, 10, 21, 12, 13, 7, 7]
    d = align_turn(sampled, prompt)
    assert d is not None
    assert d.start == 3  # 1, 2, 10 agree
    assert d.sampled == [11, 12, 13] and d.rerendered == [21, 12, 13]
    assert d.differing == 1  # 11 has no counterpart; 12, 13 match
    assert d.new_from == 6 and prompt[d.new_from :] == [7, 7]
    assert d.first_pair == (11, 21)
    assert d.as_meta(turn=1, position=3)["first"] == [11, 21]


def test_a_longer_re_render_ends_after_its_last_match() -> None:
    # The template re-encodes 2 sampled ids [30, 31] as 3 ([40, 41, 42]) before [12, 13]:
    # tail [30, 31, 12, 13] vs window [40, 41, 42, 12, 13, 8]: matched 12, 13 -> differing 2,
    # the re-render ends after 13 (5 ids), the tool output [8] is new.
    sampled = [5, 30, 31, 12, 13]
    prompt = [5, 40, 41, 42, 12, 13, 8]
    d = align_turn(sampled, prompt)
    assert d is not None and d.start == 1
    assert d.rerendered == [40, 41, 42, 12, 13] and d.differing == 2 and d.new_from == 6


def test_nothing_in_common_after_the_prefix() -> None:
    # No match at all: the re-render is taken one for one (3 ids), the rest is new.
    d = align_turn([1, 2, 3, 4], [1, 9, 9, 9, 6, 6])
    assert d is not None and d.start == 1 and d.rerendered == [9, 9, 9] and d.differing == 3
    assert d.new_from == 4


def test_a_prompt_shorter_than_the_sampled_ids() -> None:
    d = align_turn([1, 2, 3, 4], [1, 2])
    assert d is not None and d.start == 2 and d.rerendered == [] and d.differing == 2 and d.new_from == 2
    assert d.first_pair == (3, None)


def test_common_prefix_against_a_plain_loop() -> None:
    # Hand-made pairs that exercise the bisection (a mismatch past 16, 256 and near the end) and
    # the short tail, against the element-by-element definition.
    base = list(range(1000))
    for k in (0, 1, 15, 16, 17, 255, 256, 257, 998, 999):
        other = base[:k] + [-1] + base[k + 1 :]
        assert common_prefix(base, other) == k
    assert common_prefix(base, base[:300]) == 300 and common_prefix([], base) == 0
