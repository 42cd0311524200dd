"""Snapshots of the main screens (pytest-textual-snapshot), from the scenes in scenes.py.
Regenerate with ``python -m pytest tests/tui/test_snapshots.py --snapshot-update``."""
from __future__ import annotations

import pytest

from bw24chat import model_catalog
from tests.tui.scenes import FAKE_GPU, SCENES, SCREEN_SIZE, add_local_models


@pytest.mark.parametrize("scene_name", ["model_manager", "chat_mid_stream", "settings"])
def test_screen(scene_name, snap_compare, make_app, private_dirs, monkeypatch):
    monkeypatch.setattr(model_catalog, "gpu_memory", lambda: FAKE_GPU)
    add_local_models(private_dirs["models"], private_dirs["hf"])
    scene = SCENES[scene_name]
    engine = scene.make_engine()
    app = make_app(engine, model=scene.model, hf_cache=private_dirs["hf"])
    try:
        assert snap_compare(app, terminal_size=SCREEN_SIZE, run_before=lambda pilot: scene.run(pilot, engine))
    finally:
        engine.release.set()
