"""Where the service's files are: templates/, static/, migrations/ (with alembic.ini) and the
demo fixtures (fixtures/demo/).

In a source checkout (and an editable install) they are the top-level folders of the repository.
A built wheel carries them inside the package, under ``app/_data/`` (mapped by setup.py), and they
are found with ``importlib.resources``. ``CREDITLENS_HOME`` overrides both: a folder laid out like
the repository.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from pathlib import Path

# app/core/resources.py -> the checkout (or site-packages, for an installed wheel).
_CHECKOUT = Path(__file__).resolve().parents[2]


@cache
def data_root() -> Path:
    """The folder holding templates/, static/, migrations/, alembic.ini and fixtures/."""
    home = os.environ.get("CREDITLENS_HOME")
    if home:
        return Path(home).resolve()
    if (_CHECKOUT / "templates").is_dir() and (_CHECKOUT / "app").is_dir():
        return _CHECKOUT
    # An installed wheel: package files are plain files on disk (pip never installs zipped).
    return Path(str(resources.files("app").joinpath("_data")))


def templates_dir() -> Path:
    """The Jinja2 templates."""
    return data_root() / "templates"


def static_dir() -> Path:
    """The files served under /static."""
    return data_root() / "static"


def alembic_ini() -> Path:
    """Alembic's configuration; its ``script_location`` is the migrations folder beside it."""
    return data_root() / "alembic.ini"


def demo_dir() -> Path:
    """The demo batches loaded into an empty database (``--demo``)."""
    return data_root() / "fixtures" / "demo"


def default_data_dir() -> Path:
    """Where the default SQLite database goes: ``data/`` of the checkout, else of the working
    directory (an installed copy must not write into its own package)."""
    if data_root() == _CHECKOUT:
        return _CHECKOUT / "data"
    return Path.cwd().resolve() / "data"
