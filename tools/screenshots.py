"""Write docs/screenshots/*.svg: the model manager, the chat mid-stream with its stats panel,
and the settings, with a FakeEngine and throw-away folders (the user's config, conversations
and models are not touched).  The scenes are the snapshot tests' (tests/tui/scenes.py).

    python tools/screenshots.py
"""
from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"


async def shoot(scene, hf_cache: Path) -> Path:
    from bw24chat.options import EngineOptions
    from bw24chat.tui.app import ChatApp
    from tests.tui.scenes import SCREEN_SIZE

    engine = scene.make_engine()
    app = ChatApp(EngineOptions(model=scene.model), lambda options, progress: engine, hf_cache=hf_cache)
    try:
        async with app.run_test(size=SCREEN_SIZE) as pilot:
            await scene.run(pilot, engine)
            return Path(app.save_screenshot(f"{scene.name}.svg", str(OUT)))
    finally:
        engine.release.set()


def main() -> int:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="bw24chat-screenshots-") as tmp:
        for name in ("config", "data", "models", "cache"):
            os.environ[f"BW24CHAT_{name.upper()}_DIR"] = str(Path(tmp) / name)
        hf_cache = Path(tmp) / "hf-cache"
        os.environ["HF_HUB_CACHE"] = str(hf_cache)

        from bw24chat import model_catalog
        from tests.tui.scenes import FAKE_GPU, SCENES, add_local_models

        model_catalog.gpu_memory = lambda: FAKE_GPU  # the same machine in every screenshot
        add_local_models(Path(tmp) / "models", hf_cache)
        OUT.mkdir(parents=True, exist_ok=True)
        for scene in SCENES.values():
            print(asyncio.run(shoot(scene, hf_cache)).relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
