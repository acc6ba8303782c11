"""Format detection reads only the first record(s) and never parses a file twice
(app/ingest/_common.py ``first_object``; the timing figures are in bench/chat_ingest.py).

Each check would fail if detection parsed the whole file: the rest of each file is broken JSON,
which a whole-file parse refuses, yet the format is found from the first record."""

from __future__ import annotations

import json

from app.ingest import detect
from app.ingest._common import first_object, read_records
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
    doc = json.dumps({"history": [{"role": "user", "content": "hi"}], "info": {}}).encode()
    first = first_object(doc)
    [rec] = read_records(doc)
    assert rec.obj is first  # the format reads the object detection parsed
    # A second read parses again (the parse is handed over once, not cached for ever).
    assert read_records(doc)[0].obj is not first
