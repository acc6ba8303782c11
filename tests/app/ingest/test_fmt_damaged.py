"""Damaged files uploaded to the real app: a truncated or corrupted torch.save zip, legacy pickle,
parquet or safetensors file answers 422 `damaged_file` saying which part is damaged (never "field
`prompts` is missing"), with or without a named format, and stores nothing.

The intact files are the committed fixtures (verl batch and actor micro-batch, slime dump, TRL
parquet) and a safetensors file written by the safetensors library; the damage is made here:
cut at the half, cut by the last bytes, one byte flipped inside a tensor's data."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import numpy as np
import pytest
import torch
from safetensors.numpy import save

from tests.app.ingest.fmt_helpers import upload
from tests.app.svc_helpers import FORMATS, row_counts

PT = {
    "verl_batch.pt": FORMATS / "verl_batch.pt",
    "micro_batch_0.pt": FORMATS / "verl_actor" / "micro_batch_0.pt",
    "slime_rollout.pt": FORMATS / "slime_rollout.pt",
}


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def _damaged(client, name, data, part, **params):
    r = upload(client, name, data, **params)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "damaged_file", err
    assert err["message"].startswith("the file is damaged: ") and part in err["message"], err
    assert "is missing" not in err["message"]  # never "field `x` is missing"
    assert row_counts(client) == (0, 0)
    return err


@pytest.mark.parametrize("name", list(PT))
def test_truncated_torch_zip(client, name):
    data = PT[name].read_bytes()
    for cut in (data[: len(data) // 2], data[:-10], data[:64]):
        err = _damaged(client, name, cut, "central directory")
        assert err["field"] == "file"
    # Naming the format does not skip the check.
    _damaged(client, name, data[:-10], "central directory", format="verl_pt")


def test_corrupted_torch_zip_names_the_member(client):
    data = PT["micro_batch_0.pt"].read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/data/0"))
    # The member's bytes start after its local header: 30 bytes, then the name and the extra field
    # whose lengths the header gives at offsets 26 and 28 (torch pads the extra field).
    h = info.header_offset
    start = (
        h
        + 30
        + int.from_bytes(data[h + 26 : h + 28], "little")
        + int.from_bytes(data[h + 28 : h + 30], "little")
    )
    _damaged(client, "micro_batch_0.pt", _flip(data, start + 3), f"zip member `{info.filename}`")


def test_truncated_legacy_pickle(client):
    buf = io.BytesIO()
    torch.save({"prompts": torch.ones(2, 3, dtype=torch.long)}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    _damaged(client, "old.pt", data[: len(data) // 2], "torch.save pickle")


def test_truncated_parquet(client):
    data = (FORMATS / "trl_completions.parquet").read_bytes()
    _damaged(client, "c.parquet", data[: len(data) // 2], "parquet footer")
    # The magic kept but the footer's metadata length beyond the file.
    _damaged(
        client, "c.parquet", b"PAR1" + b"\0" * 8 + (10**6).to_bytes(4, "little") + b"PAR1", "parquet footer"
    )


def test_truncated_safetensors_names_the_tensor(client):
    data = save(
        {"kinds": np.ones((2, 4), dtype=np.uint8), "token_ids": np.arange(8, dtype=np.int64).reshape(2, 4)}
    )
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + n])
    last = max(header, key=lambda k: header[k]["data_offsets"][1])  # the library orders by dtype
    err = _damaged(client, "b.safetensors", data[:-5], f"tensor `{last}`")
    assert err["field"] == last
    _damaged(client, "b.safetensors", data[:20], "safetensors header")


def test_intact_files_still_upload(client):
    for path in PT.values():
        r = upload(client, path.name, path.read_bytes())
        assert r.status_code == 201, r.text
