"""One chat message: a role line, the text as Markdown (code blocks highlighted by Textual's
Markdown widget) and, for a reply, a note on how it ended.

While a reply streams, fragments are buffered and handed to Textual's ``MarkdownStream`` at
most ``FLUSH_INTERVAL_S`` apart: re-rendering Markdown for every token would make the UI
thread the bottleneck and typing in the input would lag behind a fast engine.
"""
from __future__ import annotations

from markdown_it import MarkdownIt
from textual.binding import Binding
from textual.content import Content
from textual.containers import Vertical
from textual.widgets import Label, Markdown, Static

from ...conversations import ChatMessage, finish_note
from ..messages import MessageAction

FLUSH_INTERVAL_S = 1 / 15


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks of ``markdown``, in order."""
    return [t.content for t in MarkdownIt("commonmark").parse(markdown) if t.type in ("fence", "code_block")]


class MessageView(Vertical, can_focus=True):
    BINDINGS = [
        Binding("c", "act('copy')", "Copy"),
        Binding("k", "act('copy_code')", "Copy code"),
        Binding("e", "act('edit')", "Edit"),
        Binding("r", "act('regenerate')", "Regenerate"),
    ]

    def __init__(self, message: ChatMessage, live: bool = False) -> None:
        super().__init__(classes=f"message -{message.role}")
        self.message = message
        self.live = live  # a reply being generated now (its note waits for the end)
        self._pending: list[str] = []
        self._stream = None
        self._flush_timer = None

    def compose(self):
        yield Label("You" if self.message.role == "user" else "Assistant", classes="role")
        yield Markdown(self.message.content, classes="body")
        yield Static("", classes="note")

    def on_mount(self) -> None:
        self._show_state()

    @property
    def markdown(self) -> Markdown:
        return self.query_one(".body", Markdown)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "act" and parameters:
            wanted = parameters[0]
            if wanted == "edit":
                return self.message.role == "user"
            if wanted == "regenerate":
                return self.message.role == "assistant"
        return True

    def action_act(self, action: str) -> None:
        self.post_message(MessageAction(self, action))

    # ------------------------------------------------------------------ streaming
    def append(self, text: str) -> None:
        """Queue streamed text; it is rendered at the next flush."""
        if self._stream is None:
            self._stream = Markdown.get_stream(self.markdown)
        self._pending.append(text)
        if self._flush_timer is None:
            self._flush_timer = self.set_timer(FLUSH_INTERVAL_S, self._flush)

    async def _flush(self) -> None:
        self._flush_timer = None
        if self._pending and self._stream is not None:
            text = "".join(self._pending)
            self._pending.clear()
            await self._stream.write(text)

    async def finish(self) -> None:
        """The reply ended (or was stopped): render what is buffered and show how it ended."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        if self._stream is not None:
            await self._flush()
            await self._stream.stop()
            self._stream = None
        self.live = False
        if self.markdown.source != self.message.content:
            await self.markdown.update(self.message.content)
        self._show_state()

    def _show_state(self) -> None:
        note = finish_note(self.message) if self.message.role == "assistant" and not self.live else None
        note_widget = self.query_one(".note", Static)
        note_widget.update(Content(note or ""))  # plain text: an error message may hold brackets
        note_widget.display = bool(note)
        self.set_class(bool(self.message.error), "-error")
        self.set_class(self.message.finish_reason == "context_full", "-context-full")
        self.set_class(not self.message.complete and not self.live, "-incomplete")
