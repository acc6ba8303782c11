"""Run a GAE test through the compiled kernel and through the vectorised torch path."""

from __future__ import annotations

from contextlib import contextmanager

from estimators import native

GAE_PATHS = ["native", "torch"]


@contextmanager
def gae_path(name: str):
    if name == "native":
        assert native.enabled(), "the compiled GAE kernel is not built or is turned off"
        yield
    else:
        with native.disabled():
            yield
