"""A trainer's configuration file read as the trainer reads it (app/core/configs.py).

The reference is OmegaConf 2.4 itself (Hydra's configuration library, installed for verl) on the
composed configuration verl 0.9.1 ships in its wheel (``verl/trainer/config/_generated_ppo_trainer.yaml``:
the full tree a Hydra run saves as ``.hydra/config.yaml``, with its ``${...}`` and
``${oc.select:...}`` interpolations unresolved), read from the installed package, not copied."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.configs import parse_config, resolve
from app.core.errors import ApiError
from app.core.trainers import dialect_of, discount_of, flat, loss_of, trainer_of_config


def _verl_config() -> Path:
    import verl

    return Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"


def test_verls_composed_config_resolves_as_omegaconf_resolves_it():
    from omegaconf import OmegaConf

    text = _verl_config().read_bytes()
    ours = dict(flat(parse_config(text)))
    theirs = dict(flat(OmegaConf.to_container(OmegaConf.load(_verl_config()), resolve=True)))
    assert len(theirs) > 800  # the whole tree, not a sample
    assert ours == theirs
    # The nested select with a select as its default, and a relative interpolation, both resolved.
    assert "actor_rollout_ref.rollout.qat.enable" in ours


def test_verls_config_says_what_its_credit_is():
    config = parse_config(_verl_config().read_bytes())
    assert trainer_of_config(config) == "verl"
    assert dialect_of("verl", config) == "verl:gae"  # algorithm.adv_estimator: gae
    assert loss_of("verl", config) == "vanilla"  # actor_rollout_ref.actor.policy_loss.loss_mode
    assert discount_of(config) == (1.0, 1.0)  # algorithm.gamma, algorithm.lam
    # The same file after `algorithm.adv_estimator=grpo algorithm.lam=0.95` on the command line.
    edited = (
        _verl_config()
        .read_text()
        .replace("adv_estimator: gae", "adv_estimator: grpo")
        .replace("  lam: 1.0", "  lam: 0.95")
    )
    config = parse_config(edited)
    assert dialect_of("verl", config) == "verl:grpo"
    assert discount_of(config) == (1.0, 0.95)


def test_hydra_overrides_become_nested_settings():
    # .hydra/overrides.yaml: the command line's overrides, one `key=value` string each.
    text = "- algorithm.adv_estimator=rloo\n- algorithm.gamma=0.99\n- +trainer.val_before_train=false\n"
    config = parse_config(text)
    assert config == {
        "algorithm": {"adv_estimator": "rloo", "gamma": 0.99},
        "trainer": {"val_before_train": False},
    }
    assert dialect_of("verl", config) == "verl:rloo"


def test_openrlhf_arguments_are_read_as_argparse_stores_them():
    args = (
        "python -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen3-0.6B "
        "--advantage_estimator group_norm --n_samples_per_prompt 8 --gamma 1.0 --lambd 0.95 "
        "--no-std-norm --init_kl_coef=0.01"
    )
    # A command line starts with the script; the part from the first flag on is the arguments.
    config = parse_config(args[args.index("--") :])
    assert config["advantage_estimator"] == "group_norm"
    assert config["n_samples_per_prompt"] == 8 and config["init_kl_coef"] == 0.01
    assert config["no_std_norm"] is True
    assert trainer_of_config(config) == "openrlhf"
    assert dialect_of("openrlhf", config) == "openrlhf:group_norm"
    assert discount_of(config) == (1.0, 0.95)


def test_json_and_a_string_trainer_key():
    config = parse_config(b'{"trainer": "trl", "loss_type": "grpo", "num_generations": 8}')
    assert trainer_of_config(config) == "trl" and loss_of("trl", config) == "trl:grpo"
    assert trainer_of_config({"num_generations": 8, "scale_rewards": "group"}) == "trl"
    assert trainer_of_config({"lr": 1e-6}) is None


def test_interpolations_absolute_relative_missing_and_cycles():
    config = resolve(
        {
            "a": {"x": 1, "y": "${.x}", "z": "${..b.w}", "s": "n=${a.x}!"},
            "b": {"w": [1, 2], "loop1": "${b.loop2}", "loop2": "${b.loop1}"},
            "env": "${oc.env:HOME}",
            "gone": "${no.such.key}",
            "sel": "${oc.select:no.such,0.5}",
            "sel_none": "${oc.select:no.such}",
        }
    )
    assert config["a"] == {"x": 1, "y": 1, "z": [1, 2], "s": "n=1!"}
    assert config["env"] == "${oc.env:HOME}" and config["gone"] == "${no.such.key}"
    assert config["sel"] == 0.5 and config["sel_none"] is None
    assert config["b"]["loop1"].startswith("${")  # a cycle stays as text, it does not recurse forever


@pytest.mark.parametrize(
    ("text", "code", "line"),
    [
        ("algorithm:\n  gamma: 1.0\n   lam: [\n", "bad_config", 3),
        ("- just a list\n- of words\n", "bad_config", 1),
        ("42\n", "bad_config", None),
        (b"\xff\xfe\x00bad", "bad_config", None),
    ],
)
def test_what_cannot_be_read_is_a_422_naming_the_line(text, code, line):
    with pytest.raises(ApiError) as e:
        parse_config(text)
    assert e.value.status == 422 and e.value.code == code and e.value.field == "config"
    assert e.value.line == line


def test_a_huge_config_is_a_413():
    with pytest.raises(ApiError) as e:
        parse_config(b"a: 1\n" * 500_000)
    assert e.value.status == 413 and "config.yaml" in e.value.message


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=10)),
        max_size=6,
    )
)
def test_any_plain_json_object_reads_back_unchanged(d):
    import json

    assert parse_config(json.dumps(d)) == {k: v for k, v in d.items()}


def test_prime_rls_toml_config():
    # prime-rl's configs are TOML files of nested tables; these keys are illustrative, the shape is TOML's.
    text = '[model]\nname = "Qwen/Qwen3-0.6B"\n\n[orchestrator.advantage]\ntype = "grpo"\n\n[trainer.loss]\nratio_type = "token"\n'
    config = parse_config(text)
    assert config["orchestrator"]["advantage"]["type"] == "grpo"
    assert config["model"]["name"] == "Qwen/Qwen3-0.6B"
    # A YAML value holding an `=` stays YAML.
    assert parse_config("cmd: a=b\n") == {"cmd": "a=b"}
