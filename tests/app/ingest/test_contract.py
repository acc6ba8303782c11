"""The upload formats' contract, checked for every format in ``app.ingest.FORMATS`` by itself
(app/ingest/_registry.py): its example files under fixtures/formats/ are detected as that format,
its episodes stream (a generator that hands over the first episode before it has read the rest),
``docs/api.md`` lists it and it has a test file of its own. A new format that skips any of these
fails here by name. Registration refuses what would make detection depend on luck."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from app.core.errors import ApiError
from app.core.schemas import EpisodeIn
from app.core.validate import ArrayEpisode
from app.ingest import FORMATS, Document, detect, register_format
from app.ingest._common import looks_like_jsonl
from app.ingest._registry import RegistrationError, discover
from tests.app.svc_helpers import FORMATS as EXAMPLES

ROOT = Path(__file__).resolve().parents[3]
# Formats whose example files predate the one-folder-per-format layout (fixtures/formats/<name>/).
OLDER = {
    "native": ["native.jsonl"],
    "openai_chat": ["openai_chat.jsonl"],
    "verl_rollout": ["verl_rollout.jsonl", "verl_rollout_multiturn/dump.jsonl"],
    "rl_logging_board": ["rl_logging_board.jsonl"],
    "nemo_rl": ["nemo_rl.jsonl"],
    "trl_completions": ["trl_completions.parquet"],
    "slime_pt": ["slime_rollout.pt", "slime_train.pt"],
    "verl_pt": ["verl_batch.pt", "verl_actor/micro_batch_0.pt", "verl_actor/inputs_ids_dump.pt"],
}
NOT_EXAMPLES = {".py", ".md"}


def examples(name: str) -> list[Path]:
    """The example files of format ``name``: its folder's data files (not scripts, READMEs or the
    tokenizer.json sent beside them), and the older top-level ones."""
    folder = EXAMPLES / name
    found = [EXAMPLES / p for p in OLDER.get(name, [])]
    if folder.is_dir():
        found += sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and p.suffix not in NOT_EXAMPLES and p.name != "tokenizer.json"
        )
    return found


NAMES = list(FORMATS)


@pytest.mark.parametrize("name", NAMES)
def test_its_examples_detect_as_itself(name):
    files = examples(name)
    assert files, f"format {name!r} has no example: add fixtures/formats/{name}/ with one"
    for path in files:
        assert detect(path.read_bytes()) == name, path.name


@pytest.mark.parametrize("name", NAMES)
def test_it_streams(name):
    """``episodes`` is a generator; the first episode arrives before the rest of the file is read:
    a JSONL example with a broken last line still hands over its first episode, and the broken
    line is reported only when the reading reaches it."""
    fmt = FORMATS[name]
    data = b""
    for path in examples(name):  # the first example that is not a documented failure
        data = path.read_bytes()
        pairs = fmt.stream(Document.of(data))
        assert inspect.isgenerator(pairs)
        try:
            line, first = next(pairs)
        except ApiError:
            continue
        assert isinstance(first, (EpisodeIn, ArrayEpisode))
        assert line is None or line >= 1
        break
    else:
        pytest.fail(f"no example of {name!r} can be read")
    if looks_like_jsonl(data):
        broken = data.rstrip(b"\n") + b'\n{"never closed": \n'
        n_lines = broken.count(b"\n")
        pairs = fmt.stream(Document.of(broken))
        _, again = next(pairs)
        assert isinstance(again, (EpisodeIn, ArrayEpisode))
        with pytest.raises(ApiError) as err:
            for _ in pairs:
                pass
        assert err.value.code == "bad_json" and err.value.line == n_lines


@pytest.mark.parametrize("name", NAMES)
def test_the_docs_list_it(name):
    assert f"| `{name}` |" in (ROOT / "docs" / "api.md").read_text(), name


@pytest.mark.parametrize("name", NAMES)
def test_it_has_a_test_file(name):
    assert (Path(__file__).parent / f"test_fmt_{name}.py").is_file(), name


def test_sniffing_order_is_the_priorities():
    priorities = [f.priority for f in FORMATS.values()]
    assert priorities == sorted(priorities) and len(set(priorities)) == len(priorities)
    assert all(f.module == f"app.ingest.{n}" for n, f in FORMATS.items())


def test_formats_endpoint_lists_them_in_sniffing_order(client):
    listed = client.get("/api/formats").json()
    assert listed == [{"name": f.name, "description": f.description} for f in FORMATS.values()]


# ---- registration refuses ------------------------------------------------------------------------


def _sniff(_doc: Document) -> bool:
    return False


def _record(_rec):  # pragma: no cover - never called: registration is refused first
    raise AssertionError


FREE = max(f.priority for f in FORMATS.values()) + 1000


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"name": "other", "module": "app.ingest.mine"}, "lives in the module named after it"),
        ({"name": "native", "module": "app.ingest.native_copy"}, "lives in the module named after it"),
        ({"name": "native", "module": "tests.native"}, "registered twice"),
        ({"name": "mine", "module": "app.ingest.mine", "priority": 10}, "both have priority 10"),
        ({"name": "mine", "module": "app.ingest.mine", "record": None}, "exactly one of"),
        ({"name": "mine", "module": "app.ingest.mine", "episodes": lambda _doc: iter(())}, "exactly one of"),
        ({"name": "mine", "module": "app.ingest.mine", "description": ""}, "needs a description"),
    ],
)
def test_registration_refuses(kwargs, says):
    before = dict(FORMATS)
    args = {"description": "x", "priority": FREE, "sniff": _sniff, "record": _record, **kwargs}
    with pytest.raises(RegistrationError, match=says):
        register_format(**args)
    assert FORMATS == before


def test_a_module_that_registers_nothing_is_an_error(tmp_path, monkeypatch):
    pkg = tmp_path / "someformats"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "quiet.py").write_text("NAME = 'quiet'  # forgot register_format\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import someformats  # noqa: F401

    with pytest.raises(RegistrationError, match="someformats.quiet registers no format"):
        discover("someformats")


# ---- format= -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, fmt", [("native.jsonl", "native"), ("verl_rollout.jsonl", "verl_rollout")])
def test_format_parameter_chooses_the_format(client, name, fmt):
    r = client.post(
        "/api/uploads", files={"file": (name, (EXAMPLES / name).read_bytes())}, params={"format": fmt}
    )
    assert r.status_code == 201, r.text
    assert client.get(f"/api/batches/{r.json()['batch_id']}").json()["source"] == f"upload:{fmt}"


def test_a_format_that_does_not_fit_names_the_field(client):
    r = client.post(
        "/api/uploads",
        files={"file": ("x", (EXAMPLES / "native.jsonl").read_bytes())},
        params={"format": "nemo_rl"},
    )
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "token_ids" and r.json()["error"]["line"] == 1


def test_an_unknown_format_lists_the_known_ones(client):
    r = client.post("/api/uploads", files={"file": ("x", b"{}")}, params={"format": "nope"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "format"
    assert all(name in r.json()["error"]["message"] for name in FORMATS)
