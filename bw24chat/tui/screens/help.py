"""Keys and slash commands, generated from the bindings and the command list themselves so
that the help can never disagree with what the keys do."""
from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from ..commands import SLASH_COMMANDS
from ..widgets.chat_input import ChatInput
from ..widgets.message_view import MessageView


def _key(key: str) -> str:
    return ", ".join(f"`{k.strip()}`" for k in key.split(","))


def _cell(text: str) -> str:
    """Table-cell text: a bare "|" would end the cell (/model [PATH|REPO])."""
    return text.replace("|", "\\|")


def _binding_rows(bindings) -> list[str]:
    rows = []
    for b in bindings:
        if isinstance(b, Binding) and b.description:
            rows.append(f"| {_key(b.key)} | {b.description} |")
    return rows


def help_markdown() -> str:
    from .chat import ChatScreen

    parts = ["# bw24chat", "", "## Chat", "", "| Key | Does |", "|---|---|"]
    parts += [f"| {_key(key)} | {what} |" for key, what in ChatInput.KEY_HELP]
    parts += _binding_rows(ChatScreen.BINDINGS)
    parts += ["| `ctrl+p` | command palette |", "| `ctrl+q` | quit |"]
    parts += ["", "## On a message (Tab / click to focus it)", "", "| Key | Does |", "|---|---|"]
    parts += _binding_rows(MessageView.BINDINGS)
    parts += ["", "## Slash commands", "", "| Command | Does |", "|---|---|"]
    for c in SLASH_COMMANDS:
        usage = " ".join(filter(None, (f"/{c.name}", c.args)))
        parts.append(f"| {_cell(f'`{usage}`')} | {_cell(c.help)} |")
    parts += ["", "Start a message with `//` to send text that begins with `/`.", ""]
    return "\n".join(parts)


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close")]

    def compose(self):
        with VerticalScroll(id="help-box"):
            yield Markdown(help_markdown())
