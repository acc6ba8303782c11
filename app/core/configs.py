"""A trainer's configuration file, read into the nested mapping :mod:`app.core.trainers` searches.

Users have their trainer's configuration as a file, not as JSON they wrote themselves:

* verl runs under Hydra, which saves the composed configuration of every run as
  ``outputs/<date>/<time>/.hydra/config.yaml`` and the command line's overrides as
  ``.hydra/overrides.yaml`` (a YAML list of ``key.path=value`` strings);
* OpenRLHF is configured by command-line arguments (``--advantage_estimator group_norm --gamma 1``);
* prime-rl reads TOML files (``[trainer.loss]`` tables of ``key = value``);
* TRL's ``GRPOConfig`` and anything else arrive as JSON.

:func:`parse_config` reads any of these. YAML is read with ``yaml.safe_load`` (plain data only,
nothing constructed). Hydra saves the configuration unresolved, so a value may be an OmegaConf
interpolation (``${algorithm.gamma}``, or relative: ``${..gamma}``); those that point into the
configuration are resolved, as is ``${oc.select:key,default}`` (Hydra configs use it throughout);
other resolvers (``${oc.env:HOME}``) stay as their text.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from typing import Any

import yaml

from app.core.errors import ApiError

MAX_CONFIG_BYTES = 2 * 1024 * 1024
_OVERRIDE = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.\-/@]*)=(.*)$", re.S)


def parse_config(text: str | bytes, field: str = "config") -> dict[str, Any]:
    """The nested configuration in ``text``: a JSON object, TOML, YAML (a Hydra ``config.yaml``, or
    an ``overrides.yaml`` list of ``key=value``), or command-line arguments (``--key value``). 413
    beyond :data:`MAX_CONFIG_BYTES`; 422 ``bad_config`` naming the line for anything else."""
    if isinstance(text, bytes):
        if len(text) > MAX_CONFIG_BYTES:
            raise ApiError(
                413,
                "config_too_large",
                f"the configuration is {len(text):,} bytes; the limit is {MAX_CONFIG_BYTES:,}. Send the "
                "trainer's configuration file alone (e.g. .hydra/config.yaml).",
                field=field,
            )
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise ApiError(
                422, "bad_config", f"the configuration is not UTF-8 text (byte {e.start}).", field=field
            ) from None
    if len(text) > MAX_CONFIG_BYTES:
        return parse_config(text.encode(), field)
    body = text.strip()
    if not body:
        return {}
    if body.startswith("--"):
        return _arguments(body)
    parsed = _json(body) if body[0] in "{[" else None
    if parsed is None:
        parsed = _toml(body)
    if parsed is None:
        parsed = _yaml(body, field)  # YAML reads JSON too, but not its \u escapes of surrogate pairs
    if isinstance(parsed, list) and all(isinstance(x, str) for x in parsed):
        return _overrides(parsed, field)
    if not isinstance(parsed, dict):
        raise ApiError(
            422,
            "bad_config",
            f"the configuration is a {type(parsed).__name__}, not a mapping of settings (a JSON object, "
            "a YAML mapping such as .hydra/config.yaml, an overrides list, or --key value arguments).",
            field=field,
        )
    return resolve(_str_keys(parsed))


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s settings on top, nested mappings merged key by key."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        out[k] = merged(old, v) if isinstance(old, dict) and isinstance(v, dict) else v
    return out


def _json(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None  # perhaps YAML in flow style; its parser says what is wrong if not


_TOML_LINE = re.compile(r"^\s*(\[[\w.\-\"' ]+\]|[\w.\-\"]+\s*=)", re.M)


def _toml(body: str) -> dict[str, Any] | None:
    """prime-rl's TOML configuration (``[section]`` tables, ``key = value``), or None when the
    text is not TOML (YAML has no ``key = value`` lines)."""
    if _TOML_LINE.search(body) is None:
        return None
    try:
        return tomllib.loads(body)
    except tomllib.TOMLDecodeError:
        return None  # YAML with an `=` in a value, or broken TOML: YAML's parser says which


def _yaml(body: str, field: str) -> Any:
    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ApiError(
            422,
            "bad_config",
            f"the configuration is neither JSON nor YAML{where}: {problem}.",
            field=field,
            line=mark.line + 1 if mark is not None else None,
        ) from None


def _str_keys(node: Any) -> Any:
    """YAML allows keys of any type (``1: x``, ``true: y``); a configuration's keys are names."""
    if isinstance(node, dict):
        return {str(k): _str_keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_str_keys(v) for v in node]
    return node


def _scalar(text: str) -> Any:
    """A command-line or override value as Hydra reads it (numbers, booleans, null, else text)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (int, float, bool, str, list, dict)) or value is None else text


def _put(config: dict[str, Any], dotted: str, value: Any) -> None:
    node = config
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _overrides(items: list[str], field: str) -> dict[str, Any]:
    """Hydra's ``overrides.yaml`` (``algorithm.adv_estimator=grpo``, ``+trainer.x=1``) as nesting."""
    config: dict[str, Any] = {}
    for i, item in enumerate(items):
        m = _OVERRIDE.match(item.strip())
        if m is None:
            raise ApiError(
                422,
                "bad_config",
                f"override {i + 1} ({item!r}) is not key=value.",
                field=field,
                line=i + 1,
            )
        _put(config, m.group(1), _scalar(m.group(2)))
    return config


def _arguments(body: str) -> dict[str, Any]:
    """``--key value`` / ``--flag`` / ``--key=value`` arguments (OpenRLHF's) as a flat mapping;
    dashes in names become underscores, as argparse stores them."""
    config: dict[str, Any] = {}
    words = shlex.split(body, comments=True)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("--"):
            continue  # a positional argument (the script itself) says nothing about credit
        name, eq, value = word[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            config[key] = _scalar(value)
        elif i < len(words) and not words[i].startswith("--"):
            config[key] = _scalar(words[i])
            i += 1
        else:
            config[key] = True
    return config


def _lookup(root: dict[str, Any], path: list[str], ref: str) -> tuple[bool, Any]:
    """The node at ``ref`` (absolute ``a.b``, or relative to ``path``'s parent: ``.x``, ``..x``)."""
    if ref.startswith("."):
        ups = len(ref) - len(ref.lstrip("."))
        base = path[: max(len(path) - ups, 0)]
        ref = ref[ups:]
    else:
        base = []
    node: Any = root
    for part in [*base, *(ref.split(".") if ref else [])]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each outermost ``${...}`` in ``text`` (nested ones balanced)."""
    out, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text.startswith("${", i):
            if depth == 0:
                start = i
            depth += 1
            i += 2
            continue
        if text[i] == "}" and depth:
            depth -= 1
            if depth == 0:
                out.append((start, i + 1))
        i += 1
    return out


def _split_top(text: str) -> tuple[str, str | None]:
    """``text`` split at its first comma outside any ``${...}`` (the default of ``oc.select``)."""
    depth = 0
    for i, ch in enumerate(text):
        if text.startswith("${", i):
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:i], text[i + 1 :]
    return text, None


def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its OmegaConf interpolations that point into it replaced by their values
    (a whole-value ``${x}`` keeps the target's type; inside text it is formatted) and
    ``${oc.select:key,default}`` (nested ones too); another resolver (``${oc.env:X}``), a missing
    key or a cycle stays as its text."""

    def value(node: Any, path: list[str], seen: frozenset[str]) -> Any:
        if isinstance(node, dict):
            return {k: value(v, [*path, k], seen) for k, v in node.items()}
        if isinstance(node, list):
            return [value(v, [*path, str(i)], seen) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        return text(node, path, seen)

    def target(expr: str, path: list[str], seen: frozenset[str]) -> tuple[bool, Any]:
        """What ``${expr}`` stands for at ``path``; (False, None) when it is left as text."""
        expr = expr.strip()
        if expr.startswith("oc.select:"):  # the key, else the default
            key, default = _split_top(expr[len("oc.select:") :])
            ok, v = target(key, path, seen)
            if ok and v != "???":  # OmegaConf's mark for a value not given selects the default
                return True, v
            if default is None:
                return True, None  # OmegaConf's oc.select gives None for a missing key
            d = default.strip()
            return True, text(d, path, seen) if "${" in d else _scalar(d)
        if ":" in expr or "${" in expr or expr in seen:
            return False, None
        found, hit = _lookup(config, path, expr)
        if not found:
            return False, None
        return True, value(hit, _target_path(path, expr), seen | {expr})

    def text(node: str, path: list[str], seen: frozenset[str]) -> Any:
        spans = _spans(node)
        if spans == [(0, len(node))]:  # one whole interpolation: the target's own type
            ok, v = target(node[2:-1], path, seen)
            return v if ok else node
        out, last = [], 0
        for a, b in spans:
            ok, v = target(node[a + 2 : b - 1], path, seen)
            shown = (json.dumps(v) if isinstance(v, (dict, list)) else str(v)) if ok else node[a:b]
            out.append(node[last:a] + shown)
            last = b
        return "".join(out) + node[last:]

    out = value(config, [], frozenset())
    assert isinstance(out, dict)
    return out


def _target_path(path: list[str], ref: str) -> list[str]:
    if ref.startswith("."):
        ups = len(ref) - len(ref.lstrip("."))
        return [*path[: max(len(path) - ups, 0)], *ref[ups:].split(".")]
    return ref.split(".")
