"""Format detection reads only the first record(s) and never parses a file twice
(app/ingest/_document.py ``Document.first``; the timing figures are in bench/chat_ingest.py).

Each check would fail if detection parsed the whole file: the rest of each file is broken JSON,
which a whole-file parse refuses, yet the format is found from the first record."""

from __future__ import annotations

import json

from app.ingest import Document, detect
from tests.app.svc_helpers import FORMATS

NEMO = (FORMATS / "nemo_gym" / "tau2_synth_example_rollouts.jsonl").read_bytes().strip()
VERIFIERS = (FORMATS / "verifiers" / "math_python_results.jsonl").read_bytes().strip()
BROKEN = b'{"responses_create_params": {"input": [' + b"1," * 200_000  # never closed


def test_jsonl_detected_from_its_first_line():
    assert detect(NEMO + b"\n" + BROKEN) == "nemo_gym"
    assert detect(VERIFIERS + b"\n" + BROKEN) == "verifiers"


def test_json_array_detected_from_its_first_element():
    # Only the first element is parsed (raw_decode), never the broken rest.
    assert detect(b"[\n" + NEMO + b",\n" + BROKEN) == "nemo_gym"
    assert detect(b"  [" + VERIFIERS + b"," + BROKEN) == "verifiers"


def test_a_single_document_is_parsed_once():
    data = json.dumps({"history": [{"role": "user", "content": "hi"}], "info": {}}).encode()
    doc = Document.of(data)
    first = doc.first
    [rec] = doc.records()
    assert rec.obj is first  # the format reads the object detection parsed
    # A second read parses again (the parse is handed over once, not kept for ever).
    assert next(doc.records()).obj is not first
    # Each upload has its own document: nothing is shared between two uploads of the same bytes.
    assert Document.of(data).first is not first


def test_a_byte_order_mark_is_dropped_once():
    data = json.dumps({"tokens": ["a"], "kinds": ["policy"]}).encode()
    assert Document.of(b"\xef\xbb\xbf" + data).data == data
    assert detect(b"\xef\xbb\xbf" + data) == "native"


def test_a_zip_is_sniffed_from_its_directory():
    """A torch.save zip: no JSON parse is attempted (``first`` is None); its member names come
    from the central directory and a member's head is read without inflating the rest."""
    data = (FORMATS / "slime_rollout.pt").read_bytes()
    doc = Document.of(data)
    assert doc.first is None
    names = doc.zip_names
    assert names is not None and any(n.endswith("data.pkl") for n in names)
    head = doc.zip_member_head("data.pkl", 64)
    assert len(head) == 64 and head[:1] == b"\x80"  # a pickle's protocol opcode
    assert detect(data) == "slime_pt"
    assert Document.of(b'{"a": 1}').zip_names is None
