"""The App: owns the engine, the config and the conversation store; screens do the rest.

``run_app(options)`` is the entry point.  With ``options.model`` it opens straight into the
chat and loads that model; without, it opens the model manager (which offers the default
model when none is found; the engine fetches it on first use).  Models load on a worker thread through ``engine_factory``
(default: ``bw24chat.engine.open_engine``), reporting ``LoadProgress`` to the chat screen; the model
manager trains draft heads through ``draft_trainer`` (default: ``bw24chat.train_draft.train_model``).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Callable

from textual import work
from textual.app import App

from ..api import EngineAPI, LoadProgress
from ..config import load_config, update_saved_config, with_cli_overrides
from ..conversations import ConversationStore
from ..loaders.errors import ModelFileError
from ..model_store import ModelNotFound
from ..options import EngineOptions
from ..paths import log_file
from ..train_draft import train_model
from .commands import ChatCommands
from .formatting import model_title
from .messages import EngineFailed, EngineLoading, EngineReady
from .screens.chat import ChatScreen
from .screens.conversations import ConversationsScreen
from .screens.dialogs import ErrorDialog
from .screens.help import HelpScreen
from .screens.model_info import ModelInfoScreen
from .screens.models import DEFAULT_MODEL_SPEC, ModelsScreen
from .screens.settings import SettingsScreen

ProgressCallback = Callable[[LoadProgress], None]
EngineFactory = Callable[[EngineOptions, ProgressCallback | None], EngineAPI]
# (model spec, progress(train_draft.TrainProgress), cancel event) -> the trained head's path
DraftTrainer = Callable[[str, Callable, threading.Event], Path]


def open_engine(options: EngineOptions, progress: ProgressCallback | None = None) -> EngineAPI:
    from ..engine import open_engine as open_real_engine  # imported late: heavy, and optional in UI tests

    return open_real_engine(options, progress)


class ChatApp(App):
    CSS_PATH = "bw24chat.tcss"
    TITLE = "bw24chat"
    COMMANDS = App.COMMANDS | {ChatCommands}

    def __init__(
        self,
        options: EngineOptions | None = None,
        engine_factory: EngineFactory | None = None,
        *,
        store: ConversationStore | None = None,
        hf_cache: Path | None = None,  # the Hugging Face cache to list (default: the user's)
        draft_trainer: DraftTrainer | None = None,  # the model manager's ctrl+t (default: train_draft.train_model)
    ) -> None:
        super().__init__()
        self.options = options or EngineOptions()
        self.config = with_cli_overrides(load_config(), self.options)
        self.engine_factory = engine_factory or open_engine
        self.store = store or ConversationStore()
        self.store.on_write_error = self._report_save_error
        self._save_error_shown = 0.0
        self.hf_cache = hf_cache
        self.draft_trainer = draft_trainer or train_model
        self.engine: EngineAPI | None = None
        self.model_spec: str | None = None
        self.loading_name = ""
        self._load_ids = itertools.count(1)
        self._load_id = 0
        self.chat = ChatScreen()

    async def on_mount(self) -> None:
        if self.config.theme in self.available_themes:
            self.theme = self.config.theme
        self.theme_changed_signal.subscribe(self, self._save_theme)
        await self.push_screen(self.chat)
        for problem in (self.config.problem, self.store.problem):
            if problem:
                self.notify(problem, title="Recovered", severity="warning", timeout=20, markup=False)
        if self.options.model:
            self.load_model(self.options.model)
        else:
            self.push_screen(ModelsScreen())

    def _report_save_error(self, exc: Exception) -> None:
        """A conversation could not be saved (full disk ...): say so, at most every 30 s (a
        streaming reply is saved every few hundred ms); what is on screen stays."""
        if time.monotonic() - self._save_error_shown > 30:
            self._save_error_shown = time.monotonic()
            self.notify(f"{exc}. The conversation stays on screen; the saved copy keeps its last state.",
                        title="Could not save the conversation", severity="error", timeout=15, markup=False)

    def _save_theme(self, theme) -> None:
        self.config.theme = theme.name
        update_saved_config(lambda c: setattr(c, "theme", theme.name))

    def on_unmount(self) -> None:
        self.chat.stop_reply()  # the partial reply is saved as stopped
        if self.engine is not None:
            self.engine.close()
        self.store.close()

    # ------------------------------------------------------------------ engine
    def load_model(self, spec: str) -> None:
        """Load ``spec`` (a path, a repo id in the HF cache, or DEFAULT_MODEL_SPEC) and show
        the chat, where the progress shows."""
        self.show_chat()
        self.chat.action_stop()
        old, self.engine = self.engine, None
        self._load_id = next(self._load_ids)
        self.loading_name = "the default model" if spec == DEFAULT_MODEL_SPEC else Path(spec).name
        self.chat.show_load_text(f"Loading {self.loading_name}…", 0.0)
        self._load_engine(self._load_id, spec, old)

    @work(thread=True, group="engine")
    def _load_engine(self, load_id: int, spec: str, old: EngineAPI | None) -> None:
        if old is not None:
            old.close()  # free its memory before the next model takes its place

        def report(progress: LoadProgress) -> None:
            self.chat.post_message(EngineLoading(progress))

        options = self.config.engine_options(spec)
        if spec != self.options.model:  # --draft-head names the head of the command line's model only
            options.draft_head = None
        try:
            engine = self.engine_factory(options, report)
        except (ModelFileError, ModelNotFound) as exc:  # their messages are written for the user
            self.post_message(EngineFailed(load_id, spec, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - any failure is reported in the UI
            self.post_message(EngineFailed(load_id, spec, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(EngineReady(load_id, engine, spec))

    def on_engine_ready(self, message: EngineReady) -> None:
        if message.load_id != self._load_id:  # replaced by a later load while it loaded
            self.run_worker(message.engine.close, thread=True)
            return
        self.engine, self.model_spec = message.engine, message.spec
        saved = update_saved_config(lambda c: c.remember_model(message.spec))
        self.config.recent_models = saved.recent_models
        if self.chat.conversation is not None:
            self.store.set_model(self.chat.conversation.id, message.spec)
        self.chat.engine_ready()
        self.notify(f"{model_title(self.engine.info)} is ready", title="Model loaded", markup=False)

    def on_engine_failed(self, message: EngineFailed) -> None:
        if message.load_id != self._load_id:
            return
        self.chat.engine_failed()
        self.action_models()
        self.push_screen(ErrorDialog("Could not load the model", message.error))

    # ------------------------------------------------------------------ screens
    def show_chat(self) -> None:
        """Close whatever screens are above the chat."""
        while self.screen is not self.chat and len(self.screen_stack) > 1:
            self.pop_screen()

    def _open(self, screen_type: type) -> None:
        if not isinstance(self.screen, screen_type):
            self.push_screen(screen_type())

    def action_models(self) -> None:
        self._open(ModelsScreen)

    def action_settings(self) -> None:
        self._open(SettingsScreen)

    def action_conversations(self) -> None:
        self._open(ConversationsScreen)

    def action_help(self) -> None:
        self._open(HelpScreen)

    def action_model_info(self) -> None:
        self._open(ModelInfoScreen)

    async def action_chat(self, action: str) -> None:
        """Run a chat-screen action from anywhere (the command palette)."""
        self.show_chat()
        await self.chat.run_action(action)


def log_to_file() -> Path:
    """Send every logger (huggingface_hub's retries, httpx, ...) and Python warnings to the app's
    log file: written to the terminal they would be painted over the screen."""
    path = log_file()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return path


def run_app(options: EngineOptions, engine_factory: EngineFactory | None = None) -> int:
    log_to_file()
    app = ChatApp(options, engine_factory)
    app.run()
    return app.return_code or 0
