"""Every file of a folder of real third-party files, uploaded as a user would (no format named):
each opens, or says what it is. Runs only when CREDITLENS_REAL_FILES names such a folder (the
files are other projects' and never part of this repository); skipped otherwise.

"Says what it is" is a 4xx whose code names the kind of file (not episodes, empty, damaged, no turn
of the model), never ``unknown_format`` or a 5xx. ``-s`` prints one line per file and the count.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.app.svc_helpers import make_client

FOLDER = os.environ.get("CREDITLENS_REAL_FILES")
SAYS_WHAT_IT_IS = {"not_episodes", "empty_upload", "no_episodes", "damaged_file", "no_policy_tokens"}
DOCS = {"README.md", "SOURCES.md"}

pytestmark = pytest.mark.skipif(not FOLDER, reason="CREDITLENS_REAL_FILES names no folder of real files")


def _files() -> list[Path]:
    root = Path(FOLDER or ".")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in DOCS)


@pytest.mark.slow
def test_every_real_file_opens_or_says_what_it_is(sqlite_template, tmp_path):
    files = _files()
    assert files, f"no files under {FOLDER}"
    opened, refused = 0, []
    with make_client(sqlite_template.url(tmp_path)) as c:
        for path in files:
            r = c.post("/api/uploads", files={"file": (path.name, path.read_bytes())})
            name = path.relative_to(Path(FOLDER or "."))
            if r.status_code == 201:
                opened += 1
                print(f"opens  {name}: {len(r.json()['episodes'])} episodes")
                continue
            err = r.json()["error"]
            print(f"says   {name}: {err['code']}: {err['message'][:160]}")
            refused.append((str(name), r.status_code, err["code"]))
    print(f"{opened} of {len(files)} open; the others say what they are")
    wrong = [x for x in refused if x[1] >= 500 or x[2] not in SAYS_WHAT_IT_IS]
    assert wrong == []
