"""The optional C kernel, and the data folders copied into the package; everything else is in
pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# Top-level folders (and files) a built wheel carries under app/_data/ (found by app/core/resources.py).
DATA = ("templates", "static", "migrations", "fixtures/demo", "alembic.ini")


class BuildPyWithData(build_py):
    """build_py that also copies :data:`DATA` into the built package. An editable install reads
    them from the checkout instead."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "app" / "_data"
        for name in DATA:
            src, out = Path(name), dest / name
            if src.is_dir():
                shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out)


setup(
    cmdclass={"build_py": BuildPyWithData},
    ext_modules=[
        Extension(
            "estimators._native",
            sources=["estimators/_native.c"],
            extra_compile_args=["-O3"],
            # Without a compiler the install still succeeds and gae uses the torch path.
            optional=True,
        ),
        # The per-token policy-loss weights (estimators/losses/verl.py); the same fallback without it.
        # -fno-trapping-math lets the selections in its loop become vector blends.
        Extension(
            "estimators._loss_native",
            sources=["estimators/_loss_native.c"],
            extra_compile_args=["-O3", "-fno-trapping-math"],
            optional=True,
        ),
        # The lists of numbers of a JSON line read straight into arrays, exactly (app/ingest/_columns.py);
        # without it simdjson reads them.
        Extension(
            "app.ingest._numbers",
            sources=["app/ingest/_numbers.c"],
            depends=["app/ingest/_pow5.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ],
)
