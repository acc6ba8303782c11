"""The restricted unpickler (app/ingest/_unpickle.py): plain containers, numbers, strings, numpy
arrays and torch tensors come back whole; anything else is refused by name and never runs."""

from __future__ import annotations

import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from app.core.errors import ApiError
from app.ingest._unpickle import safe_loads


def test_plain_data_numpy_and_torch_round_trip() -> None:
    # The shapes a trainer's generator output takes (SkyRL dumps dicts of lists and arrays).
    obj = {
        "response_ids": [[1, 2, 3], [4, 5]],
        "loss_masks": [[1, 0, 1], [1, 1]],
        "rewards": [1.0, -0.5],
        "meta": OrderedDict(step=3, ok=True, name="x", none=None, pair=(1, 2.5), tags={"a"}),
        "arr": np.arange(6, dtype=np.int32).reshape(2, 3),
        "f16": np.array([0.5, 1.5], dtype=np.float16),
        "scalar": np.float64(2.25),
        "t": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),
        "ti": torch.arange(5)[1:4],  # a view: offset and stride survive
    }
    for protocol in (2, 4, 5):
        back = safe_loads(pickle.dumps(obj, protocol=protocol))
        assert back["response_ids"] == obj["response_ids"] and back["rewards"] == [1.0, -0.5]
        assert back["meta"] == obj["meta"]
        assert back["arr"].dtype == np.int32 and back["arr"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert back["f16"].tolist() == [0.5, 1.5] and back["scalar"] == 2.25
        assert torch.equal(back["t"], obj["t"]) and back["t"].dtype == torch.float64
        assert back["ti"].tolist() == [1, 2, 3]


class _RunsACommand:
    """A payload: unpickling it with ``pickle.load`` would run ``touch <path>``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


def test_a_payload_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    payload = pickle.dumps({"rewards": [1.0], "x": _RunsACommand(marker)})
    # The payload is real: plain pickle runs it.
    pickle.loads(payload)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ApiError) as err:
        safe_loads(payload)
    assert err.value.status == 422 and err.value.code == "refused_pickle"
    assert "refused: the pickle asks for `posix.system`" in err.value.message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("reduce", "name"),
    [((eval, ("1+1",)), "builtins.eval"), ((getattr, (1, "real")), "builtins.getattr")],
)
def test_other_callables_are_refused_by_name(reduce: tuple, name: str) -> None:
    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return reduce

    with pytest.raises(ApiError) as err:
        safe_loads(pickle.dumps([Payload()]))
    assert err.value.code == "refused_pickle" and f"`{name}`" in err.value.message


def test_an_object_of_a_class_is_refused() -> None:
    with pytest.raises(ApiError) as err:
        safe_loads(pickle.dumps(Path("/etc")))
    assert err.value.code == "refused_pickle" and "pathlib" in err.value.message


def test_a_cut_pickle_says_it_is_damaged() -> None:
    data = pickle.dumps({"rewards": list(range(100))}, protocol=4)
    with pytest.raises(ApiError) as err:
        safe_loads(data[: len(data) // 2])
    assert err.value.code == "damaged_file" and f"{len(data) // 2:,} bytes" in err.value.message
