"""The screens as the snapshot tests and ``tools/screenshots.py`` show them: each scene sets
up its data, and its ``run`` brings the app to the state to capture.  Deterministic: a fixed
size, scripted engine output with fixed stats, a fixed GPU, no clock, no cursor blink."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from bw24chat.model_catalog import GpuMemory
from bw24chat.tui.screens.models import ModelsScreen
from bw24chat.tui.screens.settings import SettingsScreen
from tests.tui.tui_helpers import HeldEngine, open_screen, send_and_hold, start_chat, wait_for, write_gguf

SCREEN_SIZE = (130, 36)
FAKE_GPU = GpuMemory("NVIDIA H200 (fake)", free=120 * 2**30, total=140 * 2**30)


async def settle(pilot) -> None:
    """Stop what would differ between two runs: toasts and blinking cursors."""
    app = pilot.app
    app.clear_notifications()
    for widget in app.screen.query("Input, TextArea"):
        widget.cursor_blink = False
    await pilot.pause()


def add_local_models(models_dir: Path, hf_cache: Path) -> None:
    """Two models in bw24chat's folder, one in the Hugging Face cache."""
    write_gguf(models_dir / "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF" / "smollm2-135m-instruct-q4_1.gguf", name="SmolLM2 135M Instruct", file_type=3)
    write_gguf(models_dir / "Qwen--Qwen3-0.6B-GGUF" / "Qwen3-0.6B-Q8_0.gguf", name="Qwen3 0.6B", file_type=7, n_ctx=40960)
    repo = hf_cache / "models--unsloth--Llama-3.2-1B-Instruct-GGUF"
    write_gguf(repo / "snapshots" / ("c" * 40) / "Llama-3.2-1B-Instruct-Q4_K_M.gguf", name="Llama 3.2 1B Instruct", file_type=15)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text("c" * 40)


@dataclass
class Scene:
    name: str
    model: str | None  # the app's -m (None: it opens in the model manager)
    make_engine: Callable[[], HeldEngine]
    run: Callable[..., Awaitable[None]]  # run(pilot, engine)


async def _model_manager(pilot, engine) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
    await wait_for(pilot, lambda: app.screen.query_one("#local-models").row_count == 3, what="the local models")
    await settle(pilot)


async def _chat_mid_stream(pilot, engine) -> None:
    app = pilot.app
    await start_chat(pilot)
    await send_and_hold(pilot, engine, "Write a tiny Python function that adds two numbers.")
    view = app.chat.views[-1]
    await wait_for(
        pilot,
        lambda: view.markdown.source == engine.held_text() and len(app.chat.stats_panel.tps_history) == 5,
        what="the held text and its stats on screen",
    )
    await settle(pilot)


async def _settings(pilot, engine) -> None:
    await start_chat(pilot)
    await open_screen(pilot, "f2", SettingsScreen)
    await settle(pilot)


SCENES = {
    "model_manager": Scene("model_manager", None, HeldEngine, _model_manager),
    "chat_mid_stream": Scene("chat_mid_stream", "fake", lambda: HeldEngine(hold_after=22), _chat_mid_stream),
    "settings": Scene("settings", "fake", HeldEngine, _settings),
}
