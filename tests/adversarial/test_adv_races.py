"""Races against a real server: deletes while others read (every answer 200 or 404, never a 500),
two deletes of the same thing, LIKE wildcards in the search, and paging with limit/offset."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.adversarial.adv_helpers import Server


def _batch(n: int, name: str = "race") -> bytes:
    eps = [
        {
            "tokens": ["p", "a", "b", "c"],
            "kinds": ["prompt", "policy", "policy", "policy"],
            "reward": float(i % 2),
            "group": f"g{i % 4}",
            "meta": {"task": name},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(e) + "\n" for e in eps).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adv-races")
    with Server(tmp / "races.db", tmp / "server.log") as s:
        yield s


def upload(c: httpx.Client, data: bytes, name: str = "race") -> dict:
    r = c.post("/api/uploads", files={"file": (f"{name}.jsonl", data)}, params={"name": name})
    assert r.status_code == 201, r.text
    return r.json()


def _recorder(statuses: list, lock: threading.Lock):
    def record(what: str, status: int) -> None:
        with lock:
            statuses.append((what, status))

    return record


def _reader(base: str, urls: list[str], offset: int, start: threading.Barrier, record) -> None:
    start.wait()
    with httpx.Client(base_url=base, timeout=60) as c:
        for k in range(len(urls)):
            url = urls[(k + offset) % len(urls)]
            record(url, c.get(url).status_code)


def _deleter(base: str, slugs: list[str], bid: int, token: str, start: threading.Barrier, record) -> None:
    start.wait()
    headers = {"X-Delete-Token": token}
    with httpx.Client(base_url=base, timeout=60) as c:
        for s in slugs[::2]:  # half the episodes one by one, then the whole batch
            record(f"DELETE {s}", c.delete(f"/api/episodes/{s}", headers=headers).status_code)
        record(f"DELETE batch {bid}", c.delete(f"/api/batches/{bid}", headers=headers).status_code)


def _delete(url: str, token: str, start: threading.Barrier, results: list) -> None:
    start.wait()
    results.append(httpx.delete(url, headers={"X-Delete-Token": token}, timeout=60).status_code)


def test_delete_during_reads_is_404_never_500(server):
    statuses: list[tuple[str, int]] = []
    lock = threading.Lock()
    with httpx.Client(base_url=server.base, timeout=60) as c:
        for _ in range(3):
            body = upload(c, _batch(24))
            bid, token = body["batch_id"], body["delete_token"]
            slugs = [e["slug"] for e in body["episodes"]]
            urls = [
                *(f"/api/episodes/{s}/advantages?scheme=outcome,opo,token_gae&critic=zero" for s in slugs),
                *(f"/api/episodes/{s}" for s in slugs[:6]),
                f"/api/batches/{bid}",
                f"/api/batches/{bid}?limit=5&offset=10",
                f"/api/batches/{bid}/groups/g1",
                f"/e/{slugs[0]}",
                f"/b/{bid}",
            ]
            start = threading.Barrier(5)
            record = _recorder(statuses, lock)
            threads = [
                threading.Thread(target=_reader, args=(server.base, urls, i * 7, start, record))
                for i in range(4)
            ]
            threads.append(
                threading.Thread(target=_deleter, args=(server.base, slugs, bid, token, start, record))
            )
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # After the dust settles everything of the batch is gone.
            assert c.get(f"/api/batches/{bid}").status_code == 404
            assert c.get(f"/api/episodes/{slugs[1]}/advantages").status_code == 404
    bad = [(u, s) for u, s in statuses if s not in (200, 204, 404)]
    assert not bad, bad[:10]
    assert sum(s == 404 for _, s in statuses) > 0  # the reads did overlap the deletes
    assert "Traceback" not in server.log()


def test_two_deletes_of_the_same_episode_and_batch(server):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        body = upload(c, _batch(4))
        token, slug, bid = body["delete_token"], body["episodes"][0]["slug"], body["batch_id"]
        for target in (f"/api/episodes/{slug}", f"/api/batches/{bid}"):
            results: list[int] = []
            start = threading.Barrier(4)
            args = (f"{server.base}{target}", token, start, results)
            threads = [threading.Thread(target=_delete, args=args) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results)[0] == 204 and set(results) <= {204, 404}, results


def test_search_q_matches_wildcards_literally(server):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        plain = upload(c, _batch(2, "plainname"), "plainname")["batch_id"]
        pct = upload(c, _batch(2, "100% sure"), "100% sure")["batch_id"]
        under = upload(c, _batch(2, "snake_case"), "snake_case")["batch_id"]
        back = upload(c, _batch(2, "back\\slash"), "back\\slash")["batch_id"]

        def ids(q: str) -> set[int]:
            r = c.get("/api/batches", params={"q": q, "limit": 1000})
            assert r.status_code == 200
            return {b["id"] for b in r.json()}

        assert ids("%") == {pct}  # not every batch
        assert ids("0% s") == {pct}
        assert ids("_") == {under}  # "_" is not "any one character"
        assert ids("e_c") == {under} and plain not in ids("n_m")
        assert ids("\\") == {back} and ids("k\\s") == {back}
        assert ids("k\\%") == set()  # the escape character itself is literal too


def test_batch_paging_with_limit_and_offset(server):
    with httpx.Client(base_url=server.base, timeout=60) as c:
        body = upload(c, _batch(1203, "big"), "big")
        bid, slugs = body["batch_id"], [e["slug"] for e in body["episodes"]]
        first = c.get(f"/api/batches/{bid}").json()
        assert (first["total"], first["limit"], first["offset"]) == (1203, 500, 0)
        assert [e["slug"] for e in first["episodes"]] == slugs[:500]
        assert first["next"] == f"/api/batches/{bid}?limit=500&offset=500"
        # Follow `next` to the end: every episode once, in upload order.
        seen, url, pages = [], f"/api/batches/{bid}", 0
        while url:
            page = c.get(url).json()
            seen += [e["slug"] for e in page["episodes"]]
            wvc = page["diagnostics"]["whiten_vs_center"]["episodes"]
            assert [e["slug"] for e in wvc] == [e["slug"] for e in page["episodes"]]
            url, pages = page["next"], pages + 1
        assert seen == slugs and pages == 3
        # The aggregates describe the whole batch on every page.
        last = c.get(f"/api/batches/{bid}", params={"limit": 3, "offset": 1200}).json()
        assert [e["slug"] for e in last["episodes"]] == slugs[1200:] and last["next"] is None
        assert sum(g["n"] for g in last["diagnostics"]["groups"]) == 1203
        assert c.get(f"/api/batches/{bid}", params={"offset": 5000}).json()["episodes"] == []
        for bad in ({"limit": 0}, {"limit": 5001}, {"offset": -1}, {"limit": "x"}):
            assert c.get(f"/api/batches/{bid}", params=bad).status_code == 422
        # The list of batches pages too.
        all_ids = [b["id"] for b in c.get("/api/batches", params={"limit": 1000}).json()]
        assert [b["id"] for b in c.get("/api/batches", params={"limit": 2, "offset": 1}).json()] == all_ids[
            1:3
        ]
