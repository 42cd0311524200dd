"""User settings kept in ``config_dir()/config.toml``: sampling, engine options, UI choices.

The file is read with :mod:`tomllib` and written by the small writer below (the standard
library has no TOML writer), atomically: a temporary file in the same folder, then
``os.replace``, so a crash mid-write never leaves a half-written config behind.

Unknown keys and values of the wrong type are ignored on load (the default stays), so a
hand-edited file can never stop the app from starting.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Callable

from .api import SamplingParams
from .options import MODEL_SAMPLING_KEYS, EngineOptions, add_engine_args
from .speculative import MAX_K
from .sampling_defaults import effective_sampling
from .paths import config_dir

# The EngineOptions / SamplingParams fields the settings screen edits and the file keeps.
# Per-run choices (model, quantize, max_queue, stop strings) stay command-line only.  spec and
# spec_k are kept too, but apply per request (GenerationRequest), not at the next model load.
ENGINE_KEYS = ("device", "n_ctx", "kv_cache", "activations", "vram_budget_gb", "threads", "spec", "spec_k")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed", "stop_on_loop")
# MODEL_SAMPLING_KEYS are kept only when the user chose them (options.sampling_set): the others
# follow the loaded model's recommendation

MAX_RECENT_MODELS = 12


@dataclass
class Config:
    options: EngineOptions = field(default_factory=EngineOptions)
    theme: str = "textual-dark"
    system_prompt: str = ""  # the default system prompt of new conversations
    recent_models: list[str] = field(default_factory=list)
    problem: str | None = None  # why the saved file was not used (it was damaged), for the UI

    def remember_model(self, spec: str) -> None:
        """Put ``spec`` first in the recent-models list."""
        self.recent_models = [spec] + [m for m in self.recent_models if m != spec]
        del self.recent_models[MAX_RECENT_MODELS:]

    def engine_options(self, model: str | None) -> EngineOptions:
        """The options to open ``model`` with."""
        options = copy.deepcopy(self.options)
        options.model = model
        return options

    def sampling(self, model_defaults: dict | None = None) -> SamplingParams:
        """The sampling of a request: the user's choices, the model's defaults for the rest."""
        return effective_sampling(self.options.sampling, self.options.sampling_set, model_defaults or {})


def config_path() -> Path:
    return config_dir() / "config.toml"


# ----------------------------------------------------------------------------- merging
def with_cli_overrides(config: Config, cli: EngineOptions) -> Config:
    """``config`` with every option the command line set to a non-default value.

    argparse cannot tell "given" from "left at its default", so a flag equal to the default
    does not override the file: that is the only ambiguity and it is harmless.
    """
    merged = copy.deepcopy(config)
    default = EngineOptions()
    for key in ENGINE_KEYS:
        if getattr(cli, key) != getattr(default, key):
            setattr(merged.options, key, getattr(cli, key))
    for key in SAMPLING_KEYS:
        given = key in cli.sampling_set if key in MODEL_SAMPLING_KEYS else getattr(cli.sampling, key) != getattr(default.sampling, key)
        if given:
            setattr(merged.options.sampling, key, getattr(cli.sampling, key))
    merged.options.sampling_set = config.options.sampling_set | cli.sampling_set
    merged.options.sampling.stop = list(cli.sampling.stop)
    merged.options.quantize = cli.quantize
    merged.options.gpus = cli.gpus
    merged.options.draft_head = cli.draft_head
    merged.options.max_queue = cli.max_queue
    return merged


# ----------------------------------------------------------------------------- load
def _coerce(value, default):
    """``value`` if it has the type ``default`` implies, else None (int is accepted for float)."""
    if default is None:  # an optional int (the seed)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(default, bool):
        return value if isinstance(value, bool) else None
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(default, str):
        return value if isinstance(value, str) else None
    return None


# what a key without argparse choices may hold (--spec-k's parser takes 1..MAX_K or auto = 0)
RANGES = {"spec_k": range(0, MAX_K + 1)}


@cache
def cli_choices() -> dict[str, list[str]]:
    """The allowed values of the options that have a fixed set, as the command line has them."""
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return {action.dest: list(action.choices) for action in parser._actions if action.choices}


def _load_section(target, section: dict, keys: tuple[str, ...]) -> set[str]:
    """Set the valid values of ``section`` on ``target``; the keys set."""
    defaults = type(target)()
    loaded = set()
    for key in keys:
        if key in section:
            value = _coerce(section[key], getattr(defaults, key))
            if value is not None and value in cli_choices().get(key, RANGES.get(key, [value])):
                setattr(target, key, value)
                loaded.add(key)
    return loaded


def config_from_dict(data: dict) -> Config:
    config = Config()
    _load_section(config.options, data.get("engine", {}), ENGINE_KEYS)
    loaded = _load_section(config.options.sampling, data.get("sampling", {}), SAMPLING_KEYS)
    config.options.sampling_set = frozenset(loaded & set(MODEL_SAMPLING_KEYS))
    ui = data.get("ui", {})
    for key in ("theme", "system_prompt"):
        if isinstance(ui.get(key), str):
            setattr(config, key, ui[key])
    recent = data.get("models", {}).get("recent", [])
    if isinstance(recent, list):
        config.recent_models = [m for m in recent if isinstance(m, str)][:MAX_RECENT_MODELS]
    return config


def load_config(path: Path | None = None) -> Config:
    """The saved config, or the defaults when there is none.  A file that cannot be parsed is
    moved aside (:func:`set_aside`) and the defaults used; ``Config.problem`` says so, for the UI."""
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return Config()
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        config = Config()
        backup = set_aside(path)
        kept = f"; it was kept as {backup.name}" if backup else ""
        config.problem = f"the settings file {path} could not be read ({exc}){kept}. The defaults are in use."
        return config
    return config_from_dict(data)


def set_aside(path: Path) -> Path | None:
    """Rename a damaged file to ``NAME.broken-YYYYmmdd-HHMMSS`` next to it, so that the app can
    start afresh without losing it; None if it could not be moved."""
    backup = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, backup)
    except OSError:
        return None
    return backup


# ----------------------------------------------------------------------------- save
def config_to_dict(config: Config) -> dict:
    def pick(obj, keys):
        return {k: getattr(obj, k) for k in keys if getattr(obj, k) is not None}

    return {
        "ui": {"theme": config.theme, "system_prompt": config.system_prompt},
        "engine": pick(config.options, ENGINE_KEYS),
        "sampling": pick(config.options.sampling, [k for k in SAMPLING_KEYS
                                                   if k not in MODEL_SAMPLING_KEYS or k in config.options.sampling_set]),
        "models": {"recent": list(config.recent_models)},
    }


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        for raw, esc in (("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
            escaped = escaped.replace(raw, esc)
        # the remaining control characters have no short escape in TOML
        return '"' + "".join(c if ord(c) >= 0x20 and c != "\x7f" else f"\\u{ord(c):04x}" for c in escaped) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def dumps_toml(data: dict[str, dict]) -> str:
    """TOML text for a mapping of table name -> flat table (all this config needs)."""
    lines: list[str] = []
    for table, values in data.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_config(config: Config, path: Path | None = None) -> Path:
    path = path or config_path()
    atomic_write_text(path, dumps_toml(config_to_dict(config)))
    return path


def update_saved_config(change: Callable[[Config], None], path: Path | None = None) -> Config:
    """Apply ``change`` to the config *file* (not to a config with command-line overrides in
    it, which must not be saved by a side effect such as picking a theme)."""
    config = load_config(path)
    change(config)
    save_config(config, path)
    return config


__all__ = [
    "Config",
    "ENGINE_KEYS",
    "SAMPLING_KEYS",
    "atomic_write_text",
    "cli_choices",
    "config_path",
    "dumps_toml",
    "load_config",
    "save_config",
    "set_aside",
    "update_saved_config",
    "with_cli_overrides",
]
