"""Settings, conversations, model manager, help and the command palette, with a FakeEngine."""
from __future__ import annotations

import threading
import tomllib

import pytest

from bw24chat.api import LoadProgress
from bw24chat.config import config_path, load_config
from bw24chat.conversations import ChatMessage
from bw24chat.fake_engine import FakeEngine
from bw24chat.options import EngineOptions
from bw24chat.tui.app import ChatApp
from bw24chat.tui.screens.chat import ChatScreen
from bw24chat.tui.screens.conversations import ConversationsScreen
from bw24chat.tui.screens.dialogs import Confirm, ErrorDialog, TextPrompt
from bw24chat.tui.screens.help import HelpScreen
from bw24chat.tui.screens.models import ModelsScreen
from bw24chat.tui.screens.settings import SettingsScreen
from bw24chat.tui.widgets.progress_line import ProgressLine
from tests.tui.tui_helpers import (
    click,
    open_screen,
    row_text,
    send,
    start_chat,
    wait_for,
    wait_for_notification,
    write_gguf,
)

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------- settings
async def test_settings_are_saved_to_toml_and_used(make_app):
    engine = FakeEngine(token_delay=0.002)
    app = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await open_screen(pilot, "f2", SettingsScreen)
        screen = app.screen
        screen.query_one("#set-temperature").value = "0.2"
        screen.query_one("#set-top_k").value = "40"
        screen.query_one("#set-seed").value = "1234"
        screen.query_one("#set-kv_cache").value = "q8_0"
        screen.query_one("#set-activations").value = "bf16"
        screen.query_one("#set-vram_budget_gb").value = "6.5"
        screen.query_one("#set-system-prompt").load_text("Be kind.")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is app.chat, what="the chat after saving")

        data = tomllib.loads(config_path().read_text())
        assert data["sampling"]["temperature"] == 0.2
        assert data["sampling"]["top_k"] == 40 and data["sampling"]["seed"] == 1234
        assert data["engine"]["kv_cache"] == "q8_0"
        assert data["engine"]["activations"] == "bf16"
        assert data["engine"]["vram_budget_gb"] == 6.5
        assert data["ui"]["system_prompt"] == "Be kind."

        await send(pilot, "hi")
        sampling = engine.requests[-1].sampling
        assert (sampling.temperature, sampling.top_k, sampling.seed) == (0.2, 40, 1234)
        assert engine.requests[-1].messages[0] == {"role": "system", "content": "Be kind."}
        assert app.config.engine_options("m").kv_cache == "q8_0"
        assert app.config.engine_options("m").activations == "bf16"

    # a new app reads them back and shows them
    app2 = make_app(FakeEngine())
    async with app2.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await open_screen(pilot, "f2", SettingsScreen)
        assert app2.screen.query_one("#set-temperature").value == "0.2"
        assert app2.screen.query_one("#set-kv_cache").value == "q8_0"
        assert app2.screen.query_one("#set-activations").value == "bf16"
        assert app2.screen.query_one("#set-seed").value == "1234"


async def test_speculative_settings_are_saved_and_apply_to_the_next_reply(make_app):
    engine = FakeEngine(token_delay=0.002)
    app = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await send(pilot, "before")
        assert (engine.requests[-1].spec, engine.requests[-1].spec_k) == ("off", 0)
        await open_screen(pilot, "f2", SettingsScreen)
        spec, spec_k = app.screen.query_one("#set-spec"), app.screen.query_one("#set-spec_k")
        assert ("n-gram", "ngram") in spec._options and ("auto", 0) in spec_k._options and ("8", 8) in spec_k._options
        spec.value, spec_k.value = "ngram", 3
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is app.chat, what="the chat after saving")
        saved = tomllib.loads(config_path().read_text())["engine"]
        assert (saved["spec"], saved["spec_k"]) == ("ngram", 3)
        await send(pilot, "after")  # no reload: the next request carries the choice
        assert (engine.requests[-1].spec, engine.requests[-1].spec_k) == ("ngram", 3)

    app2 = make_app(FakeEngine())
    async with app2.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await open_screen(pilot, "f2", SettingsScreen)
        assert app2.screen.query_one("#set-spec").value == "ngram"
        assert app2.screen.query_one("#set-spec_k").value == 3


async def test_invalid_settings_are_not_saved(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await open_screen(pilot, "f2", SettingsScreen)
        app.screen.query_one("#set-temperature").value = "hot"
        app.screen.query_one("#set-top_p").value = "1.5"  # above its maximum
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        saved = load_config().options.sampling
        assert (saved.temperature, saved.top_p) == (0.7, 1.0)  # the defaults: nothing was saved
        await wait_for_notification(pilot, "error", "Temperature")
        await wait_for_notification(pilot, "error", "Top-p")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.chat, what="the chat")


async def test_a_theme_change_is_remembered(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await start_chat(pilot)
        app.theme = "nord"
        await pilot.pause()
        assert load_config().theme == "nord"


# ----------------------------------------------------------------------------- conversations
async def test_conversations_list_open_rename_export_delete(make_app, private_dirs):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        older = app.store.create(title="About cats")
        app.store.add_message(older.id, ChatMessage("user", "Do cats purr?"))
        app.store.add_message(older.id, ChatMessage("assistant", "Yes, they do."))
        newer = app.store.create(title="About dogs")
        app.store.add_message(newer.id, ChatMessage("user", "Do dogs bark?"))

        await open_screen(pilot, "f4", ConversationsScreen)
        table = app.screen.query_one("#conversations")
        assert table.row_count == 2
        assert row_text(table, 0)[0] == "About dogs"  # most recent first

        # rename the first row
        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, TextPrompt), what="the rename dialog")
        app.screen.query_one("#dialog-text").value = "Dogs [and] barking [/b]"  # not markup: shown as typed
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen), what="the list")
        assert app.store.load(newer.id).title == "Dogs [and] barking [/b]"
        assert row_text(app.screen.query_one("#conversations"), 0)[0] == "Dogs [and] barking [/b]"

        # export it
        await pilot.press("x")
        exports = list((private_dirs["data"] / "exports").glob("*.md"))
        assert len(exports) == 1 and "Do dogs bark?" in exports[0].read_text()

        # delete it (after confirming)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), what="the confirmation")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen), what="the list")
        assert [s.title for s in app.store.list()] == ["About cats"]
        assert app.screen.query_one("#conversations").row_count == 1

        # open the other one
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is app.chat and app.chat.conversation is not None, what="the chat")
        await pilot.pause()
        assert app.chat.conversation.id == older.id
        assert [v.message.content for v in app.chat.views] == ["Do cats purr?", "Yes, they do."]
        assert app.chat.prompt.prompt_history == ["Do cats purr?"]

        # and go on with it
        await send(pilot, "And lions?")
        assert [m.role for m in app.store.load(older.id).messages] == ["user", "assistant", "user", "assistant"]


async def test_deleting_the_open_conversation_starts_a_new_one(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await send(pilot, "hello")
        await open_screen(pilot, "f4", ConversationsScreen)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), what="the confirmation")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.chat.conversation is None and not app.chat.views, what="an empty chat")
        assert app.store.list() == []


# ----------------------------------------------------------------------------- model manager
async def test_first_start_without_a_model_offers_the_default_one(make_app):
    app = make_app(model=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        screen = app.screen
        await wait_for(pilot, lambda: screen.query_one("#first-run").display, what="the default-model offer")
        assert screen.query_one("#local-models").row_count == 0
        await click(pilot, "#get-default")
        await start_chat(pilot)
        assert app.factory_calls[-1].model == "default"  # the engine resolves (and fetches) it
        assert app.screen is app.chat
        assert load_config().recent_models == ["default"]


async def test_first_start_enter_alone_gets_the_default_model(make_app):
    """A newcomer with no model presses Enter: the offer has the focus, so that fetches it."""
    app = make_app(model=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        await wait_for(pilot, lambda: app.screen.query_one("#first-run").display, what="the default-model offer")
        await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "get-default", what="focus on the offer")
        await pilot.press("enter")
        await start_chat(pilot)
        assert app.factory_calls[-1].model == "default"


async def test_local_models_are_listed_and_open_on_enter(make_app, private_dirs):
    gguf_path = write_gguf(private_dirs["models"] / "acme--tiny" / "tiny-Q8_0.gguf", name="Tiny", file_type=7)
    snapshot = private_dirs["hf"] / "models--acme--cached" / "snapshots" / ("a" * 40)
    write_gguf(snapshot / "cached-Q4_1.gguf", name="Cached")
    (private_dirs["hf"] / "models--acme--cached" / "refs").mkdir(parents=True)
    (private_dirs["hf"] / "models--acme--cached" / "refs" / "main").write_text("a" * 40)
    app = make_app(model=None, hf_cache=private_dirs["hf"])
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        table = app.screen.query_one("#local-models")
        await wait_for(pilot, lambda: table.row_count == 2, what="two local models")
        rows = [row_text(table, i) for i in range(2)]
        assert rows[0][0] == "Tiny" and rows[0][1] == "llama" and rows[0][2] == "gguf Q8_0"
        assert rows[0][5] == "-" and rows[0][6] == "models/acme--tiny/tiny-Q8_0.gguf"
        assert rows[1][0] == "Cached" and rows[1][6] == "acme/cached/cached-Q4_1.gguf"
        assert not app.screen.query_one("#first-run").display
        table.focus()
        await pilot.press("enter")
        await start_chat(pilot)
        assert app.factory_calls[-1].model == str(gguf_path)
        assert load_config().recent_models == [str(gguf_path)]


async def test_an_moe_models_expert_tiers_show_under_the_table(make_app, private_dirs, monkeypatch):
    """Highlighting an MoE model in the model manager shows where its experts would land at the
    app's budgets and the speed to expect (expert_tiers.describe_plan); a dense model shows none."""
    from bw24chat import model_catalog
    from tools.write_synthetic_gguf import write_synthetic_gguf

    write_gguf(private_dirs["models"] / "acme--tiny" / "tiny-Q8_0.gguf", name="Tiny", file_type=7)
    (private_dirs["models"] / "acme--moe").mkdir()
    write_synthetic_gguf("tiny-moe", "Q8_0", private_dirs["models"] / "acme--moe" / "moe-Q8_0.gguf", report=lambda s: None)
    monkeypatch.setattr(model_catalog, "gpu_memory", lambda: model_catalog.GpuMemory("G", free=8 * 2**30, total=8 * 2**30))
    app = make_app(model=None)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        table = app.screen.query_one("#local-models")
        await wait_for(pilot, lambda: table.row_count == 2, what="two local models")
        fit = app.screen.query_one("#model-fit")
        moe = next(i for i in range(2) if row_text(table, i)[1] == "qwen3moe")
        table.focus()
        table.move_cursor(row=moe)
        await wait_for(pilot, lambda: fit.display, what="the MoE model's tier plan")
        text = str(fit.render())
        assert text.startswith("experts: all 16 experts x 3 layers in VRAM") and "decode <=" in text
        table.move_cursor(row=1 - moe)
        await wait_for(pilot, lambda: not fit.display, what="no plan for the dense model")


async def test_a_path_typed_by_hand_opens(make_app, tmp_path):
    path = write_gguf(tmp_path / "elsewhere" / "mine.gguf")
    app = make_app(model=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        field = app.screen.query_one("#model-path")
        field.value = str(tmp_path / "missing.gguf")
        await click(pilot, "#open-path")
        await wait_for_notification(pilot, "error", "missing.gguf")
        field.value = str(path)
        field.focus()
        await pilot.press("enter")
        await start_chat(pilot)
        assert app.factory_calls[-1].model == str(path)


async def test_loading_shows_progress_and_a_failure_is_reported(make_app):
    release = threading.Event()
    reached = threading.Event()

    def slow_factory(options, progress):
        progress(LoadProgress("reading", 1.0))
        progress(LoadProgress("compiling", 0.5, "matmul kernels"))
        reached.set()
        release.wait(10)
        if options.model == "broken":
            raise RuntimeError("unsupported architecture")
        return FakeEngine()

    app = ChatApp(EngineOptions(model="slow.gguf"), slow_factory)
    async with app.run_test(size=(120, 40)) as pilot:
        line = app.chat.query_one("#load-progress", ProgressLine)
        await wait_for(pilot, lambda: reached.is_set() and "compiling" in str(line.query_one(".progress-text").render()), what="progress")
        assert line.display and "matmul kernels" in str(line.query_one(".progress-text").render())
        release.set()
        await start_chat(pilot)
        assert not line.display
        release.clear()
        reached.clear()
        app.load_model("broken")
        await wait_for(pilot, reached.is_set, what="the second load")
        release.set()
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        assert "unsupported architecture" in str(app.screen.query_one("#error-text").render())
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager after a failure")
        await wait_for(pilot, lambda: app.screen.query("#local-models"), what="the model manager's table")
        assert app.engine is None


async def test_sending_without_a_model_says_so(make_app):
    app = make_app(model=None)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen), what="the chat")
        app.chat.prompt.load_text("hello?")
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat.prompt.text == "hello?"  # kept, not lost
        await wait_for_notification(pilot, "warning", "No model loaded")


# ----------------------------------------------------------------------------- help, palette
async def test_help_lists_keys_and_slash_commands(make_app):
    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await start_chat(pilot)
        await open_screen(pilot, "f1", HelpScreen)
        source = app.screen.query_one("Markdown").source
        for text in ("/clear", "/system", "/model", "/retry", "/save", "/help", "`escape`", "`ctrl+r`", "Regenerate", "new line"):
            assert text in source
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.chat, what="the chat")


async def test_command_palette_offers_the_app_commands(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"conversations")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen), what="the conversations screen")


async def test_info_shows_the_storage_format_of_each_layer(make_app):
    """/info opens the model screen; the fake engine's mixed checkpoint (Q4_1 layers 0-3 with a
    Q6_K ffn_down in layer 4, a Q8_0 embedding) reads as one row per (role, format)."""
    from bw24chat.tui.screens.model_info import ModelInfoScreen

    app = make_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await start_chat(pilot)
        app.chat.prompt.load_text("/info")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelInfoScreen), what="the model info screen")
        source = app.screen.query_one("Markdown").source
        for text in ("# fake-model", "| `ffn_down` | Q4_1 | 0-3 |", "| `ffn_down` | Q6_K | 4 |",
                     "| `attn_q` | Q4_1 | 0-3 |", "| `tok_embd` | Q8_0 | - |", "Fake GPU"):
            assert text in source, text
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.chat, what="the chat")


async def test_the_tui_reports_a_damaged_settings_file():
    config_path().write_text("[[[ not toml")
    app = ChatApp(EngineOptions(model="fake"), lambda options, progress: FakeEngine())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert any("settings file" in n.message and n.severity == "warning" for n in app._notifications)


async def test_a_conversation_that_cannot_be_saved_is_reported_and_stays_on_screen(make_app):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await start_chat(pilot)
        await send(pilot, "first")
        pages = app.store._db.execute("PRAGMA page_count").fetchone()[0]
        app.store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
        await send(pilot, "second " + "x" * 200_000)
        assert any(n.title == "Could not save the conversation" for n in app._notifications)
        assert [m.content[:6] for m in app.chat.conversation.messages if m.role == "user"] == ["first", "second"]
        saved = app.store.load(app.chat.conversation.id)
        assert [m.content for m in saved.messages if m.role == "user"] == ["first"]


# ----------------------------------------------------------------------------- draft heads
async def test_the_model_manager_trains_a_draft_head(make_app, private_dirs):
    from pathlib import Path

    from bw24chat.loaders.draft_head import head_path
    from bw24chat.train_draft import TrainError, TrainProgress

    path = write_gguf(private_dirs["models"] / "tiny.gguf", name="Tiny")
    calls, release = [], threading.Event()

    def trainer(spec, progress, cancel):
        calls.append(spec)
        if len(calls) == 2:
            raise TrainError("training a draft head needs PyTorch, an optional extra: pip install 'bw24chat[train]'")
        progress(TrainProgress("generating", 2, 2))
        progress(TrainProgress("training", 30, 60, loss=0.5, heldout={"accept": [0.7, 0.6, 0.5], "mean_len": 2.12},
                               elapsed_s=3.0))
        release.wait(10)
        head_path(Path(spec)).write_bytes(b"a head")
        return head_path(Path(spec))

    app = make_app(model=None, draft_trainer=trainer)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        table = app.screen.query_one("#local-models")
        await wait_for(pilot, lambda: table.row_count == 1, what="the local model")
        assert row_text(table, 0)[5] == "-"
        table.focus()
        await pilot.press("ctrl+t")
        line = app.screen.query_one("#train-progress", ProgressLine)
        await wait_for(pilot, lambda: "accepted length 2.12" in str(line.query_one(".progress-text").render()),
                       what="the training progress")
        assert "step 30/60" in str(line.query_one(".progress-text").render())
        await pilot.press("ctrl+t")
        await wait_for_notification(pilot, "warning", "already training")
        release.set()
        await wait_for_notification(pilot, "information", "Speculative decoding uses it")
        await wait_for(pilot, lambda: row_text(table, 0)[5] == "trained", what="the row marked trained")
        assert calls == [str(path)] and not line.display
        await pilot.press("ctrl+t")  # the trainer fails: its message is shown
        await wait_for_notification(pilot, "error", "pip install 'bw24chat[train]'")
