"""The lab's figures, one module each, discovered like the upload formats (app/ingest/).

Add a figure = add one module here with:

``NAME``     its URL name: the page ``/lab/<NAME>`` and the API ``/api/lab/<NAME>`` (JSON or CSV);
``ORDER``    its place in the lab's navigation;
``VERSION``  part of every cache key: bump it when the computation changes, old results go stale;
``TITLE``    the page's title (None: an API twin only, no page);
``SUMMARY``  the API's one-line summary in /docs;
``INTRO``    the paragraph of HTML above the page's form;
``PARAMS``   its query parameters, ``{name: app.lab.params.Param}`` (the whole state of a figure);
``compute(params) -> dict``      the JSON the API answers and the page draws (plain JSON: it is cached
                                 in the database as it is); raise ``param_error`` for a bad combination;
``csv_rows(result) -> list[dict]``  the same numbers as flat rows, one CSV line each.

static/lab.js draws a figure's JSON; until it has a drawing there, the page shows the JSON as text.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, cast

from app.lab.params import Param, Params, Result


class Figure(Protocol):
    """What a figure module has (the list above)."""

    @property
    def NAME(self) -> str: ...
    @property
    def ORDER(self) -> int: ...
    @property
    def VERSION(self) -> int: ...
    @property
    def TITLE(self) -> str | None: ...
    @property
    def SUMMARY(self) -> str: ...
    @property
    def INTRO(self) -> str: ...
    @property
    def PARAMS(self) -> Mapping[str, Param]: ...

    def compute(self, p: Params) -> Result: ...

    def csv_rows(self, result: Result) -> list[dict[str, Any]]: ...


if TYPE_CHECKING:  # mypy checks that every figure module is a Figure
    from app.lab.figures import (
        delayed_horizon,
        difficulty,
        horizon,
        lambda_sweep,
        oracle,
        recovery,
        variable_horizon,
    )

    _CHECKED: tuple[Figure, ...] = (
        delayed_horizon,
        difficulty,
        horizon,
        lambda_sweep,
        oracle,
        recovery,
        variable_horizon,
    )


@lru_cache
def figures() -> dict[str, Figure]:
    """Every figure module by NAME, in ORDER."""
    # Found at run time; their shape is checked statically above.
    mods = [
        cast(Figure, importlib.import_module(f"{__name__}.{info.name}"))
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    ]
    mods.sort(key=lambda m: m.ORDER)
    return {m.NAME: m for m in mods}


def pages() -> dict[str, str]:
    """The figures that have a page: NAME -> TITLE, in ORDER."""
    return {name: m.TITLE for name, m in figures().items() if m.TITLE}
