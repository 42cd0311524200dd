"""Where bw24chat keeps things (platformdirs): models, kernel cache, config, conversations."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "bw24chat"


def _dir(env: str, default: str) -> Path:
    p = Path(os.environ.get(env) or default)
    p.mkdir(parents=True, exist_ok=True)
    return p


def cache_dir() -> Path:
    return _dir("BW24CHAT_CACHE_DIR", platformdirs.user_cache_dir(APP))


def models_dir() -> Path:
    """Models bw24chat downloaded itself (the default model lands here)."""
    return _dir("BW24CHAT_MODELS_DIR", os.path.join(platformdirs.user_data_dir(APP), "models"))


def kernel_cache_dir() -> Path:
    p = cache_dir() / "kernels"
    p.mkdir(parents=True, exist_ok=True)
    return p


def config_dir() -> Path:
    return _dir("BW24CHAT_CONFIG_DIR", platformdirs.user_config_dir(APP))


def log_file() -> Path:
    """Where the TUI sends log output (its own and third-party libraries'), off the screen."""
    return _dir("BW24CHAT_LOG_DIR", platformdirs.user_log_dir(APP)) / "bw24chat.log"


def data_dir() -> Path:
    return _dir("BW24CHAT_DATA_DIR", platformdirs.user_data_dir(APP))
