"""The task set: real code, real tests. Each planted bug fails tests, its fix passes them all, and
the hardcode_tests exploit passes the visible tests but not the hidden ones."""

import pytest

from app.sim.tasks import OPS, TASKS, run_tests


def test_twenty_tasks_covering_every_bug_kind():
    assert len(TASKS) == 20
    assert len({t.name for t in TASKS}) == 20
    assert {t.bug for t in TASKS} == set(OPS)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_bug_fix_and_exploit(task):
    assert not all(run_tests(task.source, task.visible)), "the bug must show in the visible tests"
    assert not all(run_tests(task.source, task.hidden)), "the bug must show in the hidden tests"
    assert all(run_tests(task.fixed_source, task.visible + task.hidden)), "the fix must pass everything"
    hacked = task.hardcoded_source()
    assert all(run_tests(hacked, task.visible)), "the exploit passes the visible tests"
    assert not all(run_tests(hacked, task.hidden)), "the exploit must not pass the hidden tests"
    # Hard-coding on top of the real fix still passes everything.
    assert all(run_tests(hacked.replace(task.old, task.new, 1), task.visible + task.hidden))


def test_run_tests_counts_a_crash_as_a_failure():
    assert run_tests("def f(x):\n    return 1 / x\n", (("f(0)", 1), ("f(1)", 1.0))) == [False, True]
