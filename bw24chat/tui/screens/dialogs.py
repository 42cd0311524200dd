"""Small modal dialogs shared by the screens: ask for a text, confirm an action."""
from __future__ import annotations

from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea


class _Dialog(ModalScreen):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def action_cancel(self) -> None:
        self.dismiss(None)

    def buttons(self, ok_label: str):
        with Horizontal(classes="dialog-buttons"):
            yield Button(ok_label, variant="primary", id="ok")
            yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "ok":
            self.accept()
        else:
            self.action_cancel()

    def accept(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class TextPrompt(_Dialog):
    """Dismisses with the text entered, or None when cancelled."""

    def __init__(self, title: str, value: str = "", multiline: bool = False, ok_label: str = "OK") -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.value = value
        self.multiline = multiline
        self.ok_label = ok_label

    def compose(self):
        with Vertical(classes="dialog-box"):
            yield Label(Content(self.title_text), classes="dialog-title")
            if self.multiline:
                yield TextArea(self.value, id="dialog-text", soft_wrap=True)
            else:
                yield Input(self.value, id="dialog-text")
            yield from self.buttons(self.ok_label)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.accept()

    def accept(self) -> None:
        field = self.query_one("#dialog-text")
        self.dismiss(field.text if isinstance(field, TextArea) else field.value)


class Confirm(_Dialog):
    """Dismisses with True when confirmed."""

    def __init__(self, question: str, ok_label: str = "Yes") -> None:
        super().__init__(classes="dialog")
        self.question = question
        self.ok_label = ok_label

    def compose(self):
        with Vertical(classes="dialog-box"):
            yield Label(Content(self.question), classes="dialog-title")  # plain: it may quote user text
            yield from self.buttons(self.ok_label)

    def on_mount(self) -> None:
        self.query_one("#ok").focus()

    def accept(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class ErrorDialog(_Dialog):
    """An error that needs reading (a model that cannot load): it stays until dismissed."""

    def __init__(self, title: str, message: str) -> None:
        super().__init__(classes="dialog")
        self.title_text = title
        self.message = message

    def compose(self):
        with Vertical(classes="dialog-box error-box"):
            yield Label(Content(self.title_text), classes="dialog-title")
            yield Label(Content(self.message), id="error-text")  # plain: it quotes the file's own names
            with Horizontal(classes="dialog-buttons"):
                yield Button("OK", variant="primary", id="ok")

    def on_mount(self) -> None:
        self.query_one("#ok").focus()

    def accept(self) -> None:
        self.dismiss(None)
