"""The multi-line prompt: Enter sends, Shift+Enter / Ctrl+J insert a newline, Up / Down on the
first / last line walk the prompt history (elsewhere they move the cursor as usual)."""
from __future__ import annotations

from textual import events
from textual.widgets import TextArea

from ..messages import PromptSubmitted

NEWLINE_KEYS = ("shift+enter", "ctrl+j")


class ChatInput(TextArea):
    # Shown by the help screen next to the bindings.
    KEY_HELP = (
        ("enter", "send"),
        ("shift+enter, ctrl+j", "new line"),
        ("up / down", "previous / next prompt (on the first / last line)"),
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(
            id=id,
            soft_wrap=True,
            tab_behavior="focus",
            compact=True,
            highlight_cursor_line=False,
            placeholder="Message · Enter sends · Shift+Enter new line · /help",
        )
        self.prompt_history: list[str] = []
        self._history_pos: int | None = None  # index into history while browsing it
        self._draft = ""  # what was typed before browsing started

    def remember(self, prompt: str) -> None:
        if prompt and (not self.prompt_history or self.prompt_history[-1] != prompt):
            self.prompt_history.append(prompt)
        self._history_pos = None

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(PromptSubmitted(self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def action_cursor_up(self, select: bool = False) -> None:
        if select or self.cursor_location[0] > 0 or not self.prompt_history:
            super().action_cursor_up(select)
            return
        if self._history_pos is None:
            self._draft = self.text
            self._history_pos = len(self.prompt_history)
        if self._history_pos > 0:
            self._history_pos -= 1
            self._show(self.prompt_history[self._history_pos])

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if select or self._history_pos is None or self.cursor_location[0] < last_row:
            super().action_cursor_down(select)
            return
        self._history_pos += 1
        if self._history_pos >= len(self.prompt_history):
            self._history_pos = None
            self._show(self._draft)
        else:
            self._show(self.prompt_history[self._history_pos])

    def _show(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)
