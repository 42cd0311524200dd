"""The chat: messages, the prompt, the live stats, and the reply being generated.

A reply is consumed on a worker thread that iterates ``handle.events()`` and posts
``ReplyChunk`` / ``ReplyStats`` / ``ReplyFinished`` to this screen; every message carries the
handle's id so that anything arriving after Esc (or after a regenerate) is recognised as
stale and dropped.  The partial reply is written to the conversation store as it streams,
at most every ``PERSIST_INTERVAL_S``, marked incomplete until its final event.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ...api import DoneEvent, ErrorEvent, GenerationRequest, RequestHandle, StatsEvent, TokenEvent
from ...conversations import DEFAULT_TITLE, ChatMessage, Conversation
from ..commands import parse_slash
from ..formatting import first_line, model_title
from ..messages import (
    EngineLoading,
    MessageAction,
    PromptSubmitted,
    ReplyChunk,
    ReplyFinished,
    ReplyStats,
)
from ..widgets.chat_input import ChatInput
from ..widgets.message_view import MessageView, code_blocks
from ..widgets.progress_line import ProgressLine
from ..widgets.stats_panel import SPEC_STATS, StatsPanel
from .dialogs import TextPrompt

if TYPE_CHECKING:
    from ..app import ChatApp

PERSIST_INTERVAL_S = 0.5


@dataclass
class ActiveReply:
    handle: RequestHandle | None  # None when the engine refused the request
    message: ChatMessage
    view: MessageView


class ChatScreen(Screen):
    app: ChatApp

    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+t", "toggle_stats", "Stats"),
        Binding("f1", "app.help", "Help"),
        Binding("f2", "app.settings", "Settings"),
        Binding("f3", "app.models", "Models"),
        Binding("f4", "app.conversations", "Chats"),
    ]

    def __init__(self) -> None:
        super().__init__(id="chat")
        self.conversation: Conversation | None = None  # created with the first message
        self.pending_system_prompt: str | None = None  # /system before the first message
        self.active: ActiveReply | None = None
        self.editing: ChatMessage | None = None
        self._stopped: dict[int, ChatMessage] = {}  # replies stopped by Esc, awaiting their DoneEvent
        self._persist_timer = None

    def compose(self):
        yield Header(show_clock=False)
        with Horizontal(id="chat-body"):
            with Vertical(id="chat-column"):
                yield ProgressLine(id="load-progress")
                yield Static("", id="system-line")
                yield VerticalScroll(id="messages")
                yield Static("Editing a message: Enter resends from here, Esc cancels", id="edit-banner")
                yield ChatInput(id="prompt")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.messages_box.anchor()  # follow the reply as it grows, unless the user scrolls up
        self.query_one("#edit-banner").display = False
        self._show_system_prompt()
        self.prompt.focus()

    # ------------------------------------------------------------------ parts
    @property
    def prompt(self) -> ChatInput:
        return self.query_one("#prompt", ChatInput)

    @property
    def messages_box(self) -> VerticalScroll:
        return self.query_one("#messages", VerticalScroll)

    @property
    def stats_panel(self) -> StatsPanel:
        return self.query_one("#stats", StatsPanel)

    @property
    def views(self) -> list[MessageView]:
        return list(self.messages_box.query_children(MessageView))

    @property
    def system_prompt(self) -> str:
        if self.conversation is not None:
            return self.conversation.system_prompt
        if self.pending_system_prompt is not None:
            return self.pending_system_prompt
        return self.app.config.system_prompt

    def _show_system_prompt(self) -> None:
        line = self.query_one("#system-line", Static)
        line.update(Content.from_markup("[b]System:[/b] $text", text=first_line(self.system_prompt, 200)))
        line.display = bool(self.system_prompt)

    # ------------------------------------------------------------------ engine loading
    def on_engine_loading(self, message: EngineLoading) -> None:
        self.query_one("#load-progress", ProgressLine).report_load(self.app.loading_name, message.progress)

    def show_load_text(self, text: str, fraction: float | None = None) -> None:
        self.query_one("#load-progress", ProgressLine).report(text, fraction)

    def engine_ready(self) -> None:
        self.query_one("#load-progress", ProgressLine).hide()
        self.sub_title = model_title(self.app.engine.info)
        self.stats_panel.update_stats(self.app.engine.stats())

    def engine_failed(self) -> None:
        self.query_one("#load-progress", ProgressLine).hide()

    # ------------------------------------------------------------------ conversations
    def _ensure_conversation(self) -> Conversation:
        if self.conversation is None:
            self.conversation = self.app.store.create(model=self.app.model_spec, system_prompt=self.system_prompt)
            self.pending_system_prompt = None
        return self.conversation

    async def show_conversation(self, conversation: Conversation | None) -> None:
        """Show ``conversation`` (None: a new, empty one)."""
        self.action_stop()
        self._end_edit()
        self.conversation = conversation
        self.pending_system_prompt = None
        await self.messages_box.remove_children()
        messages = conversation.messages if conversation else []
        await self.messages_box.mount_all([MessageView(m) for m in messages])
        self.stats_panel.reset([m.stats["decode_tps"] for m in messages if "decode_tps" in m.stats])
        if self.app.engine is not None:
            self.stats_panel.update_stats(self.app.engine.stats())
        self.prompt.prompt_history = [m.content for m in messages if m.role == "user"]
        self._show_system_prompt()
        self.prompt.focus()

    def action_new_chat(self) -> None:
        self.run_worker(self.show_conversation(None), exclusive=True, group="show")

    def forget_conversation(self, conversation_id: str) -> None:
        """``conversation_id`` was deleted: if it is the one shown, start a new one."""
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.conversation = None
            self.action_new_chat()

    # ------------------------------------------------------------------ the prompt
    async def on_prompt_submitted(self, event: PromptSubmitted) -> None:
        text = event.text
        self.prompt.remember(text.strip())
        call = parse_slash(text)
        if call is not None:
            self.prompt.clear()
            if call.command is None:
                self.notify(f"Unknown command /{call.name} (see /help)", severity="error", markup=False)
            else:
                await getattr(self, f"slash_{call.command.name}")(call.arg)
            return
        if text.strip().startswith("//"):
            text = text.strip()[1:]
        if await self.send(text):
            self.prompt.clear()

    async def send(self, text: str) -> bool:
        """Send ``text`` as the next user message; False if it cannot be sent now."""
        if self.active is not None:
            self.notify("A reply is being written: press Esc to stop it first", severity="warning")
            return False
        if self.app.engine is None:
            self.notify("No model loaded: choose one in the model manager (F3)", severity="warning")
            return False
        if self.editing is not None:
            await self._truncate_from(self.editing)
            self._end_edit()
        conversation = self._ensure_conversation()
        if not conversation.messages and conversation.title == DEFAULT_TITLE:
            conversation.title = first_line(text)
            self.app.store.rename(conversation.id, conversation.title)
        user = self.app.store.add_message(conversation.id, ChatMessage("user", text))
        conversation.messages.append(user)
        await self.messages_box.mount(MessageView(user))
        await self._start_reply()
        return True

    def _request_messages(self) -> list[dict]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for m in self.conversation.messages:
            if m.role == "user" or m.content:  # an empty failed reply says nothing
                messages.append({"role": m.role, "content": m.content})
        return messages

    async def _start_reply(self) -> None:
        conversation = self.conversation
        sampling = self.app.config.sampling(self.app.engine.info.sampling_defaults)
        options = self.app.config.options
        # per request, so that a change in the settings applies to the next reply without a reload
        request = GenerationRequest(messages=self._request_messages(), sampling=sampling,
                                    spec=options.spec, spec_k=options.spec_k, interactive=True)
        self.stats_panel.forget(SPEC_STATS)  # a reply without speculation must not show the last one's
        reply = self.app.store.add_message(conversation.id, ChatMessage("assistant", "", complete=False))
        conversation.messages.append(reply)
        view = MessageView(reply, live=True)
        await self.messages_box.mount(view)
        try:
            handle = self.app.engine.submit(request)
        except Exception as exc:  # noqa: BLE001 - EngineBusy / EngineClosed: shown on the reply
            await self._finish(ActiveReply(None, reply, view), ErrorEvent(f"{type(exc).__name__}: {exc}"))
            return
        self.active = ActiveReply(handle, reply, view)
        self._consume(handle)

    @work(thread=True, group="reply")
    def _consume(self, handle: RequestHandle) -> None:
        for event in handle.events():
            if isinstance(event, TokenEvent):
                if event.text:
                    self.post_message(ReplyChunk(handle.id, event.text))
            elif isinstance(event, StatsEvent):
                self.post_message(ReplyStats(handle.id, event.stats))
            else:
                self.post_message(ReplyFinished(handle.id, event))

    def _is_active(self, handle_id: int) -> bool:
        return self.active is not None and self.active.handle.id == handle_id

    # ------------------------------------------------------------------ streaming
    def on_reply_chunk(self, message: ReplyChunk) -> None:
        if not self._is_active(message.handle_id):
            return  # stopped or replaced: what was shown stays as it was
        self.active.message.content += message.text
        self.active.view.append(message.text)
        if self._persist_timer is None:
            self._persist_timer = self.set_timer(PERSIST_INTERVAL_S, self._persist_partial_reply)

    def _persist_partial_reply(self) -> None:
        """Store the reply so far (at most every PERSIST_INTERVAL_S, and never later than that
        after a chunk, so a kill loses at most that much)."""
        self._persist_timer = None
        if self.active is not None:
            self.app.store.update_message(self.active.message)

    def on_reply_stats(self, message: ReplyStats) -> None:
        if self._is_active(message.handle_id):
            self.stats_panel.update_stats(message.stats)

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        stopped = self._stopped.pop(message.handle_id, None)
        if stopped is not None and isinstance(message.event, DoneEvent):
            stopped.stats = message.event.stats  # figures of the stopped reply, for the record
            self.app.store.update_message(stopped)
        if self._is_active(message.handle_id):
            active, self.active = self.active, None
            await self._finish(active, message.event)

    async def _finish(self, active: ActiveReply, event: DoneEvent | ErrorEvent) -> None:
        reply = active.message
        reply.complete = True
        if isinstance(event, ErrorEvent):
            reply.finish_reason = "error"
            reply.error = event.message
            self.notify(event.message, title="The engine failed", severity="error", markup=False)
        else:
            reply.finish_reason = event.finish_reason
            reply.stats = event.stats
            self.stats_panel.update_stats(event.stats)
            if event.finish_reason == "loop":
                self.notify("The reply kept repeating itself and was stopped (settings: Stop on loop)",
                            title="Stopped", severity="warning")
            if event.finish_reason == "context_full":
                self.notify(
                    "The context is full: start a new chat (/clear) to go on",
                    title="Context full",
                    severity="warning",
                )
        self.app.store.update_message(reply)
        await active.view.finish()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop":
            return self.active is not None or self.editing is not None
        return True

    def action_stop(self) -> None:
        """Esc: stop the reply now (the text so far stays), or leave edit mode."""
        stopped = self.stop_reply()
        if stopped is None:
            self._end_edit()
        else:
            self.run_worker(stopped.view.finish(), group="finish")

    def stop_reply(self) -> ActiveReply | None:
        """Cancel the reply being written and store it as stopped; the stopped reply, if any."""
        active, self.active = self.active, None
        if active is not None:
            active.handle.cancel()
            active.message.finish_reason = "cancelled"
            active.message.complete = True
            self.app.store.update_message(active.message)
            self._stopped[active.handle.id] = active.message
        return active

    # ------------------------------------------------------------------ regenerate / edit
    async def _truncate_from(self, message: ChatMessage) -> None:
        """Delete ``message`` and everything after it, in the store and on screen."""
        index = self.conversation.messages.index(message)
        self.app.store.delete_messages_from(self.conversation.id, message.id)
        del self.conversation.messages[index:]
        for view in self.views[index:]:
            await view.remove()

    async def action_regenerate(self) -> None:
        if self.app.engine is None or self.conversation is None or not self.conversation.messages:
            self.notify("Nothing to regenerate", severity="warning")
            return
        self.action_stop()
        last = self.conversation.messages[-1]
        if last.role == "assistant":
            await self._truncate_from(last)
        await self._start_reply()

    def _start_edit(self, message: ChatMessage) -> None:
        if self.active is not None:
            self.notify("Stop the reply first (Esc)", severity="warning")
            return
        self.editing = message
        self.prompt.load_text(message.content)
        self.prompt.move_cursor(self.prompt.document.end)
        self.query_one("#edit-banner").display = True
        self.prompt.focus()

    def _end_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.prompt.clear()
        self.query_one("#edit-banner").display = False

    # ------------------------------------------------------------------ copy
    def _copy(self, text: str, what: str) -> None:
        self.app.copy_to_clipboard(text)
        self.notify(f"Copied {what}")

    async def on_message_action(self, event: MessageAction) -> None:
        message = event.view.message
        if event.action == "copy":
            self._copy(message.content, "the message")
        elif event.action == "copy_code":
            blocks = code_blocks(message.content)
            if blocks:
                self._copy(blocks[-1], "the code block")
            else:
                self.notify("This message has no code block", severity="warning")
        elif event.action == "edit":
            self._start_edit(message)
        elif event.action == "regenerate":
            if message is self.conversation.messages[-1]:
                await self.action_regenerate()
            else:  # an earlier reply: regenerate from there
                self.action_stop()
                await self._truncate_from(message)
                await self._start_reply()

    def _replies(self) -> list[ChatMessage]:
        return [m for m in (self.conversation.messages if self.conversation else []) if m.role == "assistant"]

    def action_copy_last_reply(self) -> None:
        replies = self._replies()
        if replies:
            self._copy(replies[-1].content, "the last reply")
        else:
            self.notify("No reply to copy yet", severity="warning")

    def action_copy_last_code(self) -> None:
        blocks = [b for m in self._replies() for b in code_blocks(m.content)]
        if blocks:
            self._copy(blocks[-1], "the last code block")
        else:
            self.notify("No code block in this conversation", severity="warning")

    def action_toggle_stats(self) -> None:
        self.stats_panel.display = not self.stats_panel.display

    # ------------------------------------------------------------------ system prompt, export
    def set_system_prompt(self, text: str) -> None:
        if self.conversation is None:
            self.pending_system_prompt = text
        else:
            self.conversation.system_prompt = text
            self.app.store.set_system_prompt(self.conversation.id, text)
        self._show_system_prompt()
        self.notify("System prompt set" if text else "System prompt cleared")

    def action_edit_system_prompt(self) -> None:
        def done(text: str | None) -> None:
            if text is not None:
                self.set_system_prompt(text.strip())

        self.app.push_screen(TextPrompt("System prompt", self.system_prompt, multiline=True, ok_label="Set"), done)

    def action_export(self, path: str = "") -> None:
        if self.conversation is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        written = self.app.store.export_to_file(self.conversation.id, Path(path) if path else None)
        self.notify(f"Saved to {written}", title="Exported", markup=False)

    # ------------------------------------------------------------------ slash commands
    async def slash_clear(self, arg: str) -> None:
        await self.show_conversation(None)

    async def slash_system(self, arg: str) -> None:
        if arg:
            self.set_system_prompt(arg)
        else:
            self.action_edit_system_prompt()

    async def slash_model(self, arg: str) -> None:
        if arg:
            self.app.load_model(arg)
        else:
            self.app.action_models()

    async def slash_retry(self, arg: str) -> None:
        await self.action_regenerate()

    async def slash_save(self, arg: str) -> None:
        self.action_export(arg)

    async def slash_help(self, arg: str) -> None:
        self.app.action_help()

    async def slash_info(self, arg: str) -> None:
        self.app.action_model_info()
