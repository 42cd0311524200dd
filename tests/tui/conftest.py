"""Fixtures of the TUI tests: private folders and an app factory."""
from __future__ import annotations

import pytest

from bw24chat.fake_engine import FakeEngine
from bw24chat.options import EngineOptions


@pytest.fixture
def anyio_backend():
    """The app tests run on asyncio (Textual's loop)."""
    return "asyncio"


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    """Config, data, models and the HF cache in tmp_path: tests never see the user's."""
    dirs = {}
    for name in ("config", "data", "models", "cache"):
        dirs[name] = tmp_path / name
        monkeypatch.setenv(f"BW24CHAT_{name.upper()}_DIR", str(dirs[name]))
    dirs["hf"] = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(dirs["hf"]))
    return dirs


@pytest.fixture
def make_app():
    """``make_app(engine, model="fake")``: a ChatApp whose engine factory returns ``engine``."""
    from bw24chat.tui.app import ChatApp

    def make(engine=None, model: str | None = "fake", **kwargs):
        engine = engine if engine is not None else FakeEngine(token_delay=0.002)
        calls = []

        def factory(options, progress):
            calls.append(options)
            return engine

        app = ChatApp(EngineOptions(model=model), factory, **kwargs)
        app.factory_calls = calls
        return app

    return make
