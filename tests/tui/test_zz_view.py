import pytest
from tests.tui.test_snapshots import *  # noqa
from tests.tui.test_snapshots import SIZE
pytestmark = pytest.mark.anyio

def text_screen(app):
    return "\n".join(s.text for s in app.screen._compositor.render_strips())

async def test_view_models(make_app, private_dirs, fixed_gpu):
    write_gguf(private_dirs["models"] / "HuggingFaceTB--SmolLM2-135M-Instruct-GGUF" / "smollm2-135m-instruct-q4_1.gguf", name="SmolLM2 135M Instruct", file_type=3)
    app = make_app(model=None, hf_cache=private_dirs["hf"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        await wait_for(pilot, lambda: app.screen.query_one("#local-models").row_count == 1)
        await pilot.pause()
        print(text_screen(app))
        await pilot.press("ctrl+f")
        await pilot.pause()
        print(text_screen(app))

async def test_view_chat(make_app):
    engine = HeldEngine(hold_after=22)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await start_chat(pilot)
        await send(pilot, "Write a tiny Python function that adds two numbers.", wait=False)
        await wait_for(pilot, engine.holding.is_set)
        await pilot.pause(0.3)
        print(text_screen(app))
        engine.release.set()
        await pilot.press("f2")
        await pilot.pause(0.3)
        print(text_screen(app))
        await pilot.press("escape")
        await pilot.press("f1")
        await pilot.pause(0.3)
        print(text_screen(app))
        await pilot.press("escape")
        await pilot.press("f4")
        await pilot.pause(0.3)
        print(text_screen(app))
