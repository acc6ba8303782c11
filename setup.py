"""Only the optional C kernel lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "estimators._native",
            sources=["estimators/_native.c"],
            extra_compile_args=["-O3"],
            # Without a compiler the install still succeeds and gae uses the torch path.
            optional=True,
        )
    ]
)
