"""SkyRL ``dumped_data/*.pkl`` uploaded to the real app without naming a format.

No public dump exists (they are run outputs): the examples in fixtures/formats/skyrl_dump/ are
written by make_example.py from SkyRL's documented code (NovaSky-AI/SkyRL skyrl-train:
``TrainingInputBatch.save`` pickles the batch, a ``dict`` of tensors whose ``__getstate__`` adds
torch.save bytes and ``metadata``; ``GeneratorOutput`` is a dict of lists). The pickle is read
without running it: a payload that would run a command is refused by name and runs nothing."""

from __future__ import annotations

import os
import pickle

import pytest

from tests.app.ingest.fmt_helpers import example, pick, refused, stored, uploaded_advantages

BATCH, GEN = "skyrl_dump/global_step_2_training_input.pkl", "skyrl_dump/generator_output.pkl"
A = 0.7071067690849304  # GRPO on uid "0" (rewards 1, 0), as float32


def test_a_training_batch(client):
    batch, eps = stored(client, "global_step_2_training_input.pkl", example(BATCH))
    assert batch["source"] == "upload:skyrl_dump" and len(eps) == 3
    a, b, c = eps
    # Left-padded prompt [_, 1, 5, 6] + right-padded response: padding gone, the response's
    # loss_mask 0 inside it (the observation 40, 41) is tool.
    assert a["token_ids"] == [1, 5, 6, 20, 21, 40, 41, 22, 2]
    assert a["kinds"] == ["prompt"] * 3 + ["policy"] * 2 + ["tool"] * 2 + ["policy"] * 2
    assert c["token_ids"] == [1, 9, 50, 51, 2] and c["kinds"] == ["prompt"] * 2 + ["policy"] * 3
    assert [e["group"] for e in eps] == ["0", "0", "1"]  # metadata.uids
    assert pick(a, "policy", "rollout_logprobs") == pytest.approx([-0.1, -0.2, -0.3, -0.05])
    # action_log_probs = rollout - 0.01 on trained ids (make_example.py)
    assert pick(a, "policy", "logprobs") == pytest.approx([-0.11, -0.21, -0.31, -0.06])
    assert uploaded_advantages(client, a["slug"])[3:] == pytest.approx([A, A, 0, 0, A, A])
    assert a["reward"] is None and a["rewards"][-1] == 1.0  # per-token rewards, outcome on the end
    assert a["meta"]["token_signals"]["returns"][3] == pytest.approx(A)
    assert a["meta"]["global_step"] == 2


def test_a_generator_output(client):
    _, eps = stored(client, "generator_output.pkl", example(GEN))
    assert [e["token_ids"] for e in eps] == [
        [1, 5, 6, 20, 21, 40, 41, 22, 2],
        [1, 5, 6, 33, 2],
        [1, 9, 50, 51, 2],
    ]
    assert eps[0]["group"] == eps[1]["group"] != eps[2]["group"]  # the prompt's hash
    assert eps[2]["meta"]["stop_reason"] == "length"


class _RunsACommand:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(client, tmp_path):
    marker = tmp_path / "ran"
    payload = {
        "prompt_token_ids": [[1]],
        "response_ids": [[2]],
        "loss_masks": [[1]],
        "x": _RunsACommand(str(marker)),
    }
    data = pickle.dumps(payload)
    err = refused(client, "evil.pkl", data, format="skyrl_dump")
    assert err["code"] == "refused_pickle" and "`posix.system`" in err["message"]
    assert not marker.exists()
    # Detected as SkyRL without format=: refused just the same.
    assert refused(client, "evil.pkl", data)["code"] == "refused_pickle"
    assert not marker.exists()


def test_a_cut_pickle_says_where_it_breaks(client):
    data = example(BATCH)
    err = refused(client, "cut.pkl", data[: len(data) // 2])
    assert err["code"] == "damaged_file" and "pickle" in err["message"]


def test_a_loss_mask_longer_than_the_response_is_kept(client):
    payload = pickle.loads(example(GEN))
    payload["loss_masks"][1] = [1, 1, 1, 1]  # 4 entries for 2 response ids
    _, eps = stored(client, "g.pkl", pickle.dumps(payload))
    bad = eps[1]["meta"]["mask_misaligned"]
    assert bad["mask_length"] == 4 and bad["ids_length"] == 2 and bad["at"] == [3, 4]  # after 3 prompt ids


def test_a_field_of_the_wrong_shape_names_it(client):
    payload = pickle.loads(example(GEN))
    payload["rollout_logprobs"][0] = [-0.1]
    err = refused(client, "g.pkl", pickle.dumps(payload))
    assert err["code"] == "bad_skyrl_dump" and err["field"] == "rollout_logprobs" and err["episode"] == 1


def _trajectory_id_class() -> type:
    """A class pickled as SkyRL's ``TrajectoryID`` (``skyrl_train.generators.base``: a dataclass of
    ``instance_id`` and ``repetition_id``), with the same pickled shape; not SkyRL's code."""
    import dataclasses
    import sys
    import types

    @dataclasses.dataclass
    class TrajectoryID:
        instance_id: str
        repetition_id: int

    mod = types.ModuleType("skyrl_train.generators.base")
    TrajectoryID.__module__ = mod.__name__
    TrajectoryID.__qualname__ = "TrajectoryID"
    mod.TrajectoryID = TrajectoryID  # type: ignore[attr-defined]
    sys.modules.setdefault("skyrl_train", types.ModuleType("skyrl_train"))
    sys.modules.setdefault("skyrl_train.generators", types.ModuleType("skyrl_train.generators"))
    sys.modules[mod.__name__] = mod
    return TrajectoryID


def test_a_step_wise_generator_output_joins_each_trajectory_as_sampled(client):
    # Hand-built from SkyRL's GeneratorOutput (skyrl_train/generators/base.py): step-wise training
    # writes one sample per turn, `trajectory_ids` and `is_last_step` tie them together. Trajectory
    # q1_0 has two turns; the second prompt re-renders the first turn's sampled [20, 21, 2] as
    # [20, 77, 2] (a decode/re-encode), then the observation [40, 41]. q1_1 has one turn. The
    # samples come interleaved (q1_0 turn 1, q1_1, q1_0 turn 2).
    tid = _trajectory_id_class()
    out = {
        "prompt_token_ids": [[1, 5, 6], [1, 5, 6], [1, 5, 6, 20, 77, 2, 40, 41]],
        "response_ids": [[20, 21, 2], [33, 2], [22, 2]],
        "loss_masks": [[1, 1, 1], [1, 1], [1, 1]],
        "rewards": [0.0, 0.0, 1.0],
        "rollout_logprobs": [[-0.1, -0.2, -0.3], [-0.7, -0.4], [-0.4, -0.5]],
        "stop_reasons": ["stop", "stop", "stop"],
        "trajectory_ids": [tid("q1", 0), tid("q1", 1), tid("q1", 0)],
        "is_last_step": [False, True, True],
    }
    _, eps = stored(client, "generator_output.pkl", pickle.dumps(out))
    assert len(eps) == 2
    a, b = eps
    # As sampled: turn 1's ids, the second prompt's new part (the observation) as tool, turn 2.
    assert a["token_ids"] == [1, 5, 6, 20, 21, 2, 40, 41, 22, 2]
    assert a["kinds"] == ["prompt"] * 3 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 2
    assert pick(a, "policy", "turn_ids") == [0, 0, 0, 1, 1]
    assert pick(a, "policy", "rollout_logprobs") == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert a["rewards"][5] == 0.0 and a["rewards"][-1] == 1.0  # each turn's reward on its last id
    # The re-render, by hand: the prompt first differs at row position 4 (21 -> 77); the sampled
    # tail [21, 2] matches [77, 2] on `2` only: 1 differing id, re-rendered as [77, 2].
    assert a["meta"]["drift"] == [
        {
            "turn": 1,
            "position": 4,
            "sampled": 2,
            "rerendered_ids": [77, 2],
            "differing": 1,
            "first": [21, 77],
            "at": [4],
        }
    ]
    assert a["group"] == b["group"] == "q1" and a["meta"]["trajectory"] == "q1_0"
    assert a["meta"]["samples"] == [0, 2]
    assert b["token_ids"] == [1, 5, 6, 33, 2] and "drift" not in b["meta"]


def test_a_step_wise_training_batch_joins_consecutive_steps(client):
    # A TrainingInputBatch of step-wise training (its metadata's `is_last_step`, as in SkyRL's
    # trainer tests): one row per turn, a trajectory's rows together. Written with the stand-in
    # class of fixtures/formats/skyrl_dump/make_example.py (SkyRL's pickled shape). Rows 0-1 are one
    # trajectory whose second prompt re-renders the sampled [20, 21, 2] as [20, 77, 2], then the
    # observation [40, 41]; row 2 is a trajectory of one turn.
    import importlib.util

    import torch

    from tests.app.svc_helpers import FORMATS

    spec = importlib.util.spec_from_file_location(
        "skyrl_make_example", FORMATS / "skyrl_dump" / "make_example.py"
    )
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    mod = make._module()
    prompts = [[1, 5, 6], [1, 5, 6, 20, 77, 2, 40, 41], [1, 5, 6]]
    responses = [[20, 21, 2], [22, 2], [33, 2]]
    B, P, R = 3, 8, 3
    seq = torch.zeros((B, P + R), dtype=torch.long)
    att = torch.zeros((B, P + R), dtype=torch.long)
    loss = torch.zeros((B, R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        seq[i, P - len(p) : P] = torch.tensor(p)
        seq[i, P : P + len(r)] = torch.tensor(r)
        att[i, P - len(p) : P + len(r)] = 1
        loss[i, : len(r)] = 1
    batch = mod.TrainingInputBatch(
        sequences=seq, attention_mask=att, response_mask=loss.clone(), loss_mask=loss
    )
    batch.metadata = {"uids": ["0", "0", "0"], "response_length": R, "is_last_step": [False, True, True]}
    _, eps = stored(client, "global_step_1_training_input.pkl", pickle.dumps(batch))
    assert len(eps) == 2
    a, b = eps
    assert a["token_ids"] == [1, 5, 6, 20, 21, 2, 40, 41, 22, 2]
    assert a["kinds"] == ["prompt"] * 3 + ["policy"] * 3 + ["tool"] * 2 + ["policy"] * 2
    assert [d["first"] for d in a["meta"]["drift"]] == [[21, 77]] and a["meta"]["drift"][0]["at"] == [4]
    assert a["group"] == b["group"] == "0" and a["meta"]["samples"] == [0, 1]
    assert b["token_ids"] == [1, 5, 6, 33, 2]
