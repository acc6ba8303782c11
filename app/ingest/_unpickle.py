"""Read a pickle without running it: plain containers, numbers, strings, numpy arrays and torch
tensors, nothing else.

Trainers dump rollouts as pickles (SkyRL's ``dumped_data/*.pkl``). ``pickle.load`` runs whatever a
pickle asks for (``os.system``, ``subprocess.Popen``, ``builtins.eval`` ...), so an upload is read by
an :class:`pickle.Unpickler` whose ``find_class`` answers only from :data:`ALLOWED`; anything else is
refused by name before a single call is made. Tensors pickled by ``torch.save``'s legacy path or by
plain ``pickle`` hold their storage as ``torch.save`` bytes: those are read with
``torch.load(weights_only=True)``, never torch's own ``_load_from_bytes`` (which allows any object).
The opcode stream is walked first (:func:`pickletools.genops`, which executes nothing), so a cut or
corrupted file says at which byte it breaks.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import codecs
import collections
import io
import pickle
import pickletools
from collections.abc import Callable, Mapping
from typing import Any

from app.core.errors import ApiError

PICKLE_PROTO = b"\x80"  # the first byte of every pickle of protocol 2 and later


def _torch_storage_from_bytes(b: bytes) -> Any:
    """A storage pickled as ``torch.save`` bytes, read with torch's weights-only loader."""
    import torch

    return torch.load(io.BytesIO(b), weights_only=True)


def _allowed() -> dict[tuple[str, str], Callable[..., Any] | type]:
    """(module, name) -> the object a pickle may ask for. numpy and torch are imported only when a
    pickle names them (numpy 2 moved ``numpy.core`` to ``numpy._core``: both names are accepted)."""
    import numpy as np

    out: dict[tuple[str, str], Callable[..., Any] | type] = {
        ("builtins", n): getattr(builtins, n)
        for n in ("set", "frozenset", "complex", "bytearray", "slice", "range", "list", "dict", "tuple")
    }
    # Protocol 2 writes bytes as _codecs.encode(text, "latin1"): a string encoding, nothing more.
    out[("_codecs", "encode")] = codecs.encode
    out[("collections", "OrderedDict")] = collections.OrderedDict
    out[("collections", "defaultdict")] = collections.defaultdict
    out[("numpy", "ndarray")] = np.ndarray
    out[("numpy", "dtype")] = np.dtype
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        out[(mod, "_reconstruct")] = np._core.multiarray._reconstruct  # type: ignore[attr-defined]
        out[(mod, "scalar")] = np._core.multiarray.scalar  # type: ignore[attr-defined]
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):  # protocol 5: an array from its buffer
        out[(mod, "_frombuffer")] = np._core.numeric._frombuffer  # type: ignore[attr-defined]
    for name in ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        out[("numpy", name)] = getattr(np, name)
    for name in ("float16", "float32", "float64", "complex64", "complex128", "str_", "bytes_"):
        out[("numpy", name)] = getattr(np, name)
    for name in ("Int64DType", "Float64DType", "Float32DType", "Int32DType", "BoolDType"):
        for mod in ("numpy.dtypes", "numpy._core.dtypes"):
            if hasattr(np.dtypes, name):
                out[(mod, name)] = getattr(np.dtypes, name)
    return out


def _allowed_torch() -> dict[tuple[str, str], Callable[..., Any] | type]:
    import torch
    from torch import _utils

    out: dict[tuple[str, str], Callable[..., Any] | type] = {
        ("torch._utils", "_rebuild_tensor_v2"): _utils._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): _utils._rebuild_tensor,
        ("torch.storage", "_load_from_bytes"): _torch_storage_from_bytes,
        ("torch", "Size"): torch.Size,
    }
    for name in (
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
    ):
        out[("torch", name)] = getattr(torch, name)
    return out


class _Restricted(pickle.Unpickler):
    """An unpickler that hands out only the allowed classes and functions (and the caller's
    ``stand_ins``: inert classes of its own standing in for a trainer's container classes)."""

    stand_ins: Mapping[tuple[str, str], Callable[..., Any] | type] = {}

    def find_class(self, module: str, name: str) -> Any:
        # Protocols 0-2 write Python 2 names (__builtin__.set, copy_reg ...): map them as pickle's
        # own find_class does (no Python 3 module has those names, so the mapping is always safe).
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        key = (module, name)
        if key in self.stand_ins:
            return self.stand_ins[key]
        if module.startswith("torch"):
            table = _allowed_torch()
        else:
            table = _allowed()
        if key in table:
            return table[key]
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"a persistent id ({type(pid).__name__})")


class _Refused(Exception):
    """The pickle asked for something outside :data:`ALLOWED` (the message is its dotted name)."""


def check_stream(data: bytes) -> None:
    """Walk the pickle's opcodes without running any: 422 ``damaged_file`` naming the byte where a
    cut or corrupted stream breaks."""
    try:
        for op, _arg, _pos in pickletools.genops(io.BytesIO(data)):
            if op.name == "STOP":
                return
    except ValueError as exc:
        raise ApiError(
            422,
            "damaged_file",
            f"the pickle is damaged: {exc} (the file has {len(data):,} bytes; a file cut short or "
            "changed in transfer reads like this). Upload the whole file again.",
        ) from None
    raise ApiError(
        422,
        "damaged_file",
        f"the pickle ends without its STOP opcode after {len(data):,} bytes: the file was cut short. "
        "Upload the whole file again.",
    )


def safe_loads(
    data: bytes, stand_ins: Mapping[tuple[str, str], Callable[..., Any] | type] | None = None
) -> Any:
    """The object a pickle holds, built only from plain containers, numbers, strings, numpy arrays
    and torch tensors. 422 ``refused_pickle`` naming what else it asks for ("refused: the pickle
    asks for `os.system`"), 422 ``damaged_file`` for a stream that is cut or corrupted. Nothing in
    the pickle is ever called except the allowed constructors. ``stand_ins``: (module, name) -> an
    inert class or function of the caller's own to build instead of that name (a format reading a
    trainer's pickled container class)."""
    check_stream(data)
    try:
        unpickler = _Restricted(io.BytesIO(data))
        if stand_ins:
            unpickler.stand_ins = stand_ins
        return unpickler.load()
    except _Refused as exc:
        raise ApiError(
            422,
            "refused_pickle",
            f"refused: the pickle asks for `{exc}`. creditlens reads pickles of plain containers, "
            "numbers, strings, numpy arrays and torch tensors only, and runs nothing in them; save the "
            "dump with those (or as JSON / safetensors) and upload it again.",
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise ApiError(
            422,
            "damaged_file",
            f"the pickle could not be read: {exc}. Upload the whole file again.",
        ) from None
