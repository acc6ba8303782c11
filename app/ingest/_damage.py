"""Damaged files: a truncated or corrupted container (a zip such as ``torch.save`` writes, a
parquet file, a safetensors file) answers 422 ``damaged_file`` saying which part is damaged,
before any format reads a field from it, so a cut-off download never reads as "field `x` is
missing". Only the containers' own structure is checked (the zip's central directory and each
member's CRC-32, the parquet footer, the safetensors header and data extent); what the bytes
mean is the formats' business.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile

from app.core.errors import ApiError

CODE = "damaged_file"
# Members are CRC-checked while their declared unpacked size is within this; beyond it the
# formats' own budgets answer 413 (torch.save stores members uncompressed: this is ~ the file).
MAX_CHECKED_BYTES = 512 * 1024 * 1024

_ZIP = b"PK\x03\x04"
_PAR1 = b"PAR1"


def damaged(part: str, detail: str, field: str = "file") -> ApiError:
    """422 ``damaged_file`` naming the damaged ``part`` of the upload (``field``: ``file``, or the
    tensor that is cut)."""
    return ApiError(
        422,
        CODE,
        f"the file is damaged: {part} {detail}. Nothing was stored; copy or save the file again "
        "(a download or copy that stopped early truncates it).",
        field=field,
    )


def check(data: bytes) -> None:
    """Raise :func:`damaged` when ``data`` is a zip, parquet or safetensors file whose structure
    is broken; return silently for intact containers and for anything else."""
    if data[:4] == _ZIP:
        _check_zip(data)
    elif data[:4] == _PAR1:
        _check_parquet(data)
    elif len(data) >= 9 and data[8:9] == b"{":
        _check_safetensors(data)


def _check_zip(data: bytes) -> None:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise damaged(
            "the zip archive (torch.save's container)",
            f"has no readable central directory, the index at its end ({e}): it is truncated",
        ) from None
    with zf:
        infos = zf.infolist()
        if sum(i.file_size for i in infos) > MAX_CHECKED_BYTES:
            return
        for info in infos:
            try:
                with zf.open(info) as f:
                    while f.read(1 << 20):
                        pass
            except zipfile.BadZipFile as e:
                raise damaged(f"zip member `{info.filename}`", f"fails its check ({e})") from None
            except (OSError, EOFError, ValueError, zipfile.LargeZipFile) as e:
                raise damaged(
                    f"zip member `{info.filename}`", f"cannot be read ({e}): it is cut off"
                ) from None


def _check_parquet(data: bytes) -> None:
    if len(data) < 12 or data[-4:] != _PAR1:
        raise damaged(
            "the parquet footer",
            "is cut off (the file does not end with the PAR1 magic): it is truncated",
        )
    (n,) = struct.unpack_from("<I", data, len(data) - 8)
    if n > len(data) - 12:
        raise damaged(
            "the parquet footer",
            f"declares {n} bytes of metadata but the file has only {len(data) - 12} before it",
        )


def _check_safetensors(data: bytes) -> None:
    (n,) = struct.unpack_from("<Q", data)
    if n < 2 or n > 100 * 1024 * 1024:  # not a safetensors header length: some other file
        return
    if n > len(data) - 8:
        raise damaged(
            "the safetensors header",
            f"declares {n} bytes but only {len(data) - 8} follow: the file is truncated",
        )
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise damaged(
            "the safetensors header", f"(its first {n} bytes after the length) is not valid JSON"
        ) from None
    if not isinstance(header, dict):
        return
    size = len(data) - 8 - n
    cut = []  # (start, end, name) of the tensors that end beyond the data section
    for name, entry in header.items():
        offs = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) for o in offs)
            and offs[1] > size
        ):
            cut.append((offs[0], offs[1], name))
    if cut:
        start, end, name = min(cut)  # the tensor the cut runs through
        raise damaged(
            f"tensor `{name}`",
            f"ends at byte {end} of the data section, which has only {size} bytes: the file is truncated",
            field=name,
        )


_CUT = ("EOF", "truncated", "corrupt", "unexpected end")


def torch_load_damage(e: BaseException) -> ApiError | None:
    """:func:`damaged` when ``torch.load`` failed because the bytes stop early or are corrupt
    (the legacy pickle format, which has no checksums: its EOF errors), else None."""
    msg = str(e).strip() or type(e).__name__
    if isinstance(e, EOFError) or any(w in msg for w in _CUT):
        return damaged("the torch.save pickle", f"ends early ({msg.splitlines()[0]})")
    return None
