"""The trainer adapters with the trainers' own code: a verl 0.9.1 DataProto (advantages from
verl's GRPO estimator) through log_dataproto, and TRL's GRPOTrainer training a tiny random
model through track(). The run endpoints are answered by a recording HTTP server; the bytes
the client sent are decoded by the service's own safetensors parser."""

from __future__ import annotations

import numpy as np
import pytest

from app.ingest import parse_upload
from creditlens import Client
from tests.client.servers import HTTPServer
from tests.client.trainers import TRL_PROMPTS, byte_level_tokenizer, trl_trainer, verl_dataproto

torch = pytest.importorskip("torch")


@pytest.fixture
def server():
    srv = HTTPServer()
    yield srv
    srv.close()


@pytest.mark.verl
def test_verl_dataproto_goes_through_log_dataproto(server):
    pytest.importorskip("verl.protocol")
    from creditlens.adapters.verl import log_dataproto

    tok = byte_level_tokenizer()
    vb = verl_dataproto(tok)
    prompt_rows, resp_rows, scores, adv = vb.prompt_rows, vb.resp_rows, vb.scores, vb.advantages
    with Client(server.url, strict=True) as c:
        run = c.run("verl")
        log_dataproto(run, 12, vb.data, tok)
        assert run.flush(timeout=60) and run.sent == 1
    # The adapter says the steps are verl's.
    assert run.trainer == "verl" and server.step_params[(1, 12)]["trainer"] == "verl"
    fmt, body = server.steps[(1, 12)]
    eps = parse_upload(body, fmt).episodes
    assert [e.group for e in eps] == ["u-a", "u-a", "u-b", "u-b"]
    for b, ep in enumerate(eps):
        n_p, n_r = len(prompt_rows[b // 2]), len(resp_rows[b // 2])
        assert len(ep.tokens) == n_p + n_r
        assert ep.kinds[:n_p] == ["prompt"] * n_p
        assert "".join(ep.tokens[:n_p]) == tok.decode(prompt_rows[b // 2])
        # The outcome reward sits on the last response token, as verl put it.
        assert ep.rewards[-1] == scores[b].item() and sum(ep.rewards) == scores[b].item()
        np.testing.assert_allclose(ep.advantages[n_p:], adv[b, :n_r].numpy(), rtol=1e-6)
        assert ep.advantages[:n_p] == [0.0] * n_p
        assert len(ep.entropy) == len(ep.tokens) and len(ep.ref_logprobs) == len(ep.tokens)
    n_p3, n_r3 = len(prompt_rows[1]), len(resp_rows[1])
    assert eps[3].kinds[n_p3:] == ["policy", "tool", "tool"] + ["policy"] * (n_r3 - 3)
    assert eps[2].kinds[n_p3:] == ["policy"] * n_r3


@pytest.mark.slow
def test_trl_grpo_trainer_is_tracked(server, tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from creditlens.adapters.trl import track

    trainer = trl_trainer(str(tmp_path))
    with Client(server.url, strict=True) as c:
        run = c.run("trl")
        track(trainer, run)
        trainer.train()
        assert run.flush(timeout=60)
        assert (run.sent, run.failed, run.dropped) == (2, 0, 0)
    assert sorted(server.steps) == [(1, 0), (1, 1)]
    assert {server.step_params[k]["trainer"] for k in server.steps} == {"trl"}
    for key in sorted(server.steps):
        fmt, body = server.steps[key]
        eps = parse_upload(body, fmt).episodes
        assert len(eps) == 2 and eps[0].group == eps[1].group
        assert [e.reward for e in eps] == [0.0, 1.0]
        for ep in eps:
            n_prompt = ep.kinds.count("prompt")
            assert ep.kinds == ["prompt"] * n_prompt + ["policy"] * (len(ep.kinds) - n_prompt)
            # The tokenizer's pieces, shown as text: the prompt reads back as the dataset's prompt.
            assert "".join(ep.tokens[:n_prompt]) in set(TRL_PROMPTS)
            adv = ep.advantages
            assert adv[:n_prompt] == [0.0] * n_prompt
            # GRPO: one advantage per sequence, on every completion token; opposite in a group of 2.
            assert len(set(adv[n_prompt:])) == 1
        a0, a1 = (e.advantages[-1] for e in eps)
        assert a0 < 0 < a1 and a0 == pytest.approx(-a1, rel=1e-4)


@pytest.mark.verl
def test_verl_adapter_reads_the_keys_the_importer_reads(server):
    """The adapter and the server's verl_pt importer read one key table (creditlens.keys): an
    actor-style DataProto with `old_log_prob`, `token_level_scores` (no `token_level_rewards`),
    `values` and `returns` gives the same episodes logged live as saved with torch.save."""
    pytest.importorskip("verl.protocol")
    import io

    from creditlens.adapters.verl import log_dataproto

    tok = byte_level_tokenizer()
    vb = verl_dataproto(tok)
    t = vb.data.batch
    B, R = t["responses"].shape
    gen = torch.Generator().manual_seed(0)
    extra = {
        "old_log_prob": -torch.rand(B, R, generator=gen, dtype=torch.float64),
        "token_level_scores": t["token_level_rewards"].double(),
        "values": torch.rand(B, R, generator=gen, dtype=torch.float64),
        "returns": torch.rand(B, R, generator=gen, dtype=torch.float64),
    }
    for key in ("old_log_probs", "token_level_rewards"):
        t.pop(key)
    for key, value in extra.items():
        t[key] = value
    with Client(server.url, strict=True) as c:
        run = c.run("verl-keys")
        log_dataproto(run, 1, vb.data, tok)
        assert run.flush(timeout=60) and run.sent == 1
    fmt, body = server.steps[(1, 1)]
    live = parse_upload(body, fmt).episodes
    buf = io.BytesIO()
    torch.save({**{k: t[k] for k in t.keys()}, "uid": [str(u) for u in vb.uid]}, buf)
    saved = parse_upload(buf.getvalue(), "verl_pt").episodes
    assert len(live) == len(saved) == B
    for a, b in zip(live, saved, strict=True):
        assert a.kinds == b.kinds and a.group == b.group
        n_p = a.kinds.count("prompt")
        # float32 on the wire, float64 in the torch file: equal to float32 precision
        for name in ("logprobs", "rewards", "values"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-6, atol=1e-7)
            assert getattr(a, name)[:n_p] == [0.0] * n_p
        assert a.meta["returns"] == b.meta["returns"]  # float64 in meta both ways: exact
        assert len(a.meta["returns"]) == len(a.tokens)
