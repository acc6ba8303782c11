"""/docs and /redoc work offline: every asset they load is served by us, under the same CSP."""

from __future__ import annotations

import re

from tests.app.svc_helpers import make_client


def test_api_explorers_load_only_local_assets(sqlite_url):
    with make_client(sqlite_url) as client:
        for page in ("/docs", "/redoc"):
            res = client.get(page)
            assert res.status_code == 200
            assert "script-src 'self'" in res.headers["content-security-policy"]
            refs = re.findall(r'(?:src|href)="([^"]+)"', res.text)
            assert refs, page
            for ref in refs:
                assert ref.startswith("/"), f"{page} loads {ref} from elsewhere"
                asset = client.get(ref)
                assert asset.status_code == 200 and len(asset.content) > 100, ref
            assert "<script>" not in res.text  # no inline bootstrap script
        assert client.get("/openapi.json").json()["info"]["title"] == "creditlens"
