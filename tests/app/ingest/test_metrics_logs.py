"""Trainers' own metrics logs read as {step: {metric: number}} (app/ingest/_metrics_logs.py).

Where each shape comes from:
- verl: written here by verl 0.9.1's own ``verl.utils.tracking.FileLogger`` (``trainer.logger=file``),
  installed beside the tests;
- TRL: ``transformers.TrainerState.save_to_json`` (what TRL's trainers write as
  ``trainer_state.json``), its ``log_history`` entries keyed as in the public GRPO run
  Rusheel86/Chaos-Economy ``trainer_state.json`` @ 7138430cb7f24c6013bb8f8b156bb104209b730f
  (values written here);
- prime-rl: its file monitor's line ``{"step": step, "time": <wall>, **metrics}``, as
  PrimeIntellect-ai/prime-rl ``src/prime_rl/utils/monitor/file.py`` @
  a28a9a4cc8bbe4b6c5daa1557ee33a78ecd7a30a writes it (prime-rl is not installed here);
- Weights & Biases: the ``wandb-history.jsonl`` lines of the public run
  mfts/spaceinvaders-wandb-challenge @ 541cc986c4ab80d2e94f37e4644a5228aa511c06 (the first three
  lines, one of them a video object, copied in the test).
"""

from __future__ import annotations

import gzip
import json

import pytest

from app.core.errors import ApiError
from app.ingest._metrics_logs import read
from app.ingest._notes import describe


def _jsonl(rows: list[object]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_verl_file_logger_lines_as_verl_writes_them(tmp_path, monkeypatch):
    tracking = pytest.importorskip("verl.utils.tracking")
    path = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = tracking.FileLogger("proj", "exp")
    logger.log({"critic/score/mean": 0.25, "actor/entropy": 1.5, "timing_s/gen": 3}, step=1)
    logger.log({"critic/score/mean": 0.5, "actor/entropy": 1.25, "timing_s/gen": 2}, step=2)
    logger.finish()
    log = read(path.read_bytes())
    assert log.steps == {
        1: {"critic/score/mean": 0.25, "actor/entropy": 1.5, "timing_s/gen": 3.0},
        2: {"critic/score/mean": 0.5, "actor/entropy": 1.25, "timing_s/gen": 2.0},
    }
    assert log.trainer == "verl" and log.shape.startswith("verl file logger")
    assert (log.n_records, log.n_skipped, log.records_without_step) == (2, 0, 0)


def test_trl_trainer_state_log_history_merges_train_and_eval_entries_of_a_step(tmp_path):
    transformers = pytest.importorskip("transformers")
    state = transformers.TrainerState(global_step=10, max_steps=10)
    state.log_history = [
        {"loss": -0.0078, "reward": -0.098, "rewards/format_reward_fn/mean": 0.55, "kl": 7.8e-06, "step": 5},
        {"loss": 0.0057, "reward": 0.31, "rewards/format_reward_fn/mean": 0.85, "kl": 0.0015, "step": 10},
        {"eval_loss": 0.02, "eval_runtime": 1.5, "step": 10},  # an eval entry of the same step
        {"train_runtime": 120.0, "train_loss": -0.001, "total_flos": 0.0, "step": 10},
    ]
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    log = read(path.read_bytes())
    assert sorted(log.steps) == [5, 10]
    assert log.steps[5] == {
        "loss": -0.0078,
        "reward": -0.098,
        "rewards/format_reward_fn/mean": 0.55,
        "kl": 7.8e-06,
    }
    assert log.steps[10]["reward"] == 0.31 and log.steps[10]["eval_loss"] == 0.02
    assert log.steps[10]["train_runtime"] == 120.0
    assert log.n_records == 4 and log.trainer == "TRL / transformers"
    assert "trainer_state.json" in log.shape


def test_prime_rl_file_monitor_lines_drop_the_wall_clock():
    data = _jsonl(
        [
            {"step": 0, "time": 1764925000.5, "reward/mean": 0.125, "loss/mean": 0.5, "entropy/mean": 0.75},
            {"step": 1, "time": 1764925010.5, "reward/mean": 0.25, "loss/mean": 0.25, "entropy/mean": 0.5},
        ]
    )
    log = read(data)
    assert log.steps[1] == {"reward/mean": 0.25, "loss/mean": 0.25, "entropy/mean": 0.5}
    assert log.shape.startswith("prime-rl file monitor") and log.trainer == "prime-rl"


def test_wandb_history_skips_media_and_counts_it():
    lines = (
        b'{"episodic_reward": 180.0, "_runtime": 4.989176988601685, "_timestamp": 1582070918.2388577, "_step": 0}\n'
        b'{"cumulative_avg_reward": 136.66666666666666, "_runtime": 4.9976396560668945, "_timestamp": 1582070918.2473204, "_step": 1}\n'
        b'{"gameplays": {"_type": "video-file", "path": "media/videos/openaigym.video.11.1360.video000000_968fe1cf.mp4", '
        b'"sha256": "968fe1cf2bdd6964908801ea2fa39bb340b14d1f21d53a82c148357a11b9ed07", "size": 192147}, '
        b'"_runtime": 6.2802734375, "_timestamp": 1582070919.5299542, "_step": 2}\n'
    )
    log = read(lines)
    # Step 2 holds only the video: no metric, so it is not a logged step.
    assert log.steps == {0: {"episodic_reward": 180.0}, 1: {"cumulative_avg_reward": 136.66666666666666}}
    assert log.skipped == {"gameplays": 1} and log.shape == "Weights & Biases history export"


def test_values_that_are_not_numbers_are_skipped_and_counted_nested_objects_flattened():
    rows = [
        {"step": 3, "loss": 0.5, "note": "warmup", "done": True, "lr": None, "bad": float("nan")},
        {"step": 4, "loss": 0.25, "grad": {"norm": 1.5, "max": [1, 2]}, "metrics": {"kl": 0.01}},
    ]
    log = read(_jsonl(rows))
    assert log.steps == {3: {"loss": 0.5}, 4: {"loss": 0.25, "grad/norm": 1.5, "kl": 0.01}}
    assert log.skipped == {"note": 1, "done": 1, "lr": 1, "bad": 1, "grad/max": 1}
    assert log.n_skipped == 5


def test_records_without_a_step_are_counted_and_a_json_array_and_gzip_read():
    rows = [{"step": 1, "loss": 0.5}, {"loss": 0.1}, "an error line", {"global_step": 2.0, "loss": 0.25}]
    log = read(gzip.compress(json.dumps(rows).encode()))
    assert log.steps == {1: {"loss": 0.5}, 2: {"loss": 0.25}}
    assert log.records_without_step == 2


def test_a_line_that_is_not_json_is_a_422_naming_it():
    data = b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n{"step": 3, "loss": \n'
    with pytest.raises(ApiError) as e:
        read(data)
    assert (e.value.status, e.value.code, e.value.line) == (422, "bad_json", 3)
    assert e.value.message.startswith("line 3: ")


def test_files_that_are_not_metrics_logs_say_what_they_are():
    with pytest.raises(ApiError) as e:
        read(b"")
    assert e.value.code == "empty_upload"
    with pytest.raises(ApiError) as e:
        read(
            _jsonl(
                [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
            )
        )
    assert e.value.code == "not_a_metrics_log"
    assert "it holds transcripts: post them as a step of the run" in e.value.message
    with pytest.raises(ApiError) as e:
        read(_jsonl([{"step": 1, "note": "x"}, {"step": 2, "note": "y"}]))
    assert e.value.code == "not_a_metrics_log" and "no numeric metric" in e.value.message


def test_the_episode_readers_refusal_names_the_way_to_attach_it():
    # What an upload of a metrics log answers (the upload page shows this message as it is).
    message = describe({"step": 1, "data": {"actor/entropy": 0.5, "critic/score/mean": 0.1}}, 1)
    assert message is not None
    assert (
        "upload it to a run with `POST /api/runs/{id}/logged-metrics` or `creditlens log-metrics RUN FILE`"
        in message
    )
