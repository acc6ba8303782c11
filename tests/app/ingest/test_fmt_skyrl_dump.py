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
