"""Snapshots of the main screens (pytest-textual-snapshot).  Deterministic: a fixed terminal
size, scripted engine output with fixed stats, a fixed GPU, no clock, no cursor blink.
Regenerate with ``python -m pytest tests/tui/test_snapshots.py --snapshot-update``."""
from __future__ import annotations

import pytest

from bw24chat import model_catalog
from bw24chat.tui.screens.models import ModelsScreen
from bw24chat.tui.screens.settings import SettingsScreen
from tests.tui.tui_helpers import HeldEngine, send, start_chat, wait_for, write_gguf

SIZE = (130, 36)


@pytest.fixture(autouse=True)
def fixed_gpu(monkeypatch):
    gpu = model_catalog.GpuMemory("NVIDIA H200 (fake)", free=120 * 2**30, total=140 * 2**30)
    monkeypatch.setattr(model_catalog, "gpu_memory", lambda: gpu)


async def settle(pilot) -> None:
    """Stop what would differ between two runs: toasts and blinking cursors."""
    app = pilot.app
    app.clear_notifications()
    for widget in app.screen.query("Input, TextArea"):
        widget.cursor_blink = False
    await pilot.pause()


def test_model_manager(snap_compare, make_app, private_dirs):
    write_gguf(private_dirs["models"] / "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF" / "smollm2-135m-instruct-q4_1.gguf", name="SmolLM2 135M Instruct", file_type=3)
    write_gguf(private_dirs["models"] / "Qwen--Qwen3-0.6B-GGUF" / "Qwen3-0.6B-Q8_0.gguf", name="Qwen3 0.6B", file_type=7, n_ctx=40960)
    snapshot = private_dirs["hf"] / "models--unsloth--Llama-3.2-1B-Instruct-GGUF" / "snapshots" / ("c" * 40)
    write_gguf(snapshot / "Llama-3.2-1B-Instruct-Q4_K_M.gguf", name="Llama 3.2 1B Instruct", file_type=15)
    (snapshot.parent.parent / "refs").mkdir(parents=True)
    (snapshot.parent.parent / "refs" / "main").write_text("c" * 40)
    app = make_app(model=None, hf_cache=private_dirs["hf"])

    async def run_before(pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        await wait_for(pilot, lambda: app.screen.query_one("#local-models").row_count == 3, what="the local models")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_chat_mid_stream_with_stats(snap_compare, make_app):
    engine = HeldEngine(hold_after=22)
    app = make_app(engine)

    async def run_before(pilot):
        await start_chat(pilot)
        await send(pilot, "Write a tiny Python function that adds two numbers.", wait=False)
        await wait_for(pilot, engine.holding.is_set, what="the engine to hold")
        view = app.chat.views[-1]
        await wait_for(
            pilot,
            lambda: view.markdown.source == engine.held_text() and len(app.chat.stats_panel.tps_history) == 5,
            what="the held text and its stats on screen",
        )
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    engine.release.set()


def test_settings(snap_compare, make_app):
    app = make_app()

    async def run_before(pilot):
        await start_chat(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen), what="the settings")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
