"""Slash commands (typed in the chat input) and the command-palette entries.

Both lists are data: the chat screen runs a slash command through its ``slash_<name>``
method, the palette runs an app action, and the help screen prints both lists, so a command
is declared once.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


@dataclass(frozen=True)
class SlashCommand:
    name: str
    args: str  # shown in help, "" when it takes none
    help: str


SLASH_COMMANDS = (
    SlashCommand("clear", "", "start a new conversation"),
    SlashCommand("system", "[TEXT]", "set this conversation's system prompt (no text: edit it)"),
    SlashCommand("model", "[PATH|REPO]", "load a model (no argument: open the model manager)"),
    SlashCommand("retry", "", "regenerate the last reply"),
    SlashCommand("save", "[PATH]", "export this conversation to Markdown"),
    SlashCommand("info", "", "the loaded model: size, backend, storage format per layer"),
    SlashCommand("help", "", "keys and commands"),
)
_BY_NAME = {c.name: c for c in SLASH_COMMANDS}


@dataclass(frozen=True)
class SlashCall:
    command: SlashCommand | None  # None: an unknown name
    name: str
    arg: str


def parse_slash(text: str) -> SlashCall | None:
    """The slash command in ``text``, or None for a message to send.

    "//..." sends a message that starts with "/" (the first slash is dropped by the caller).
    """
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, arg = stripped[1:].partition(" ")
    return SlashCall(_BY_NAME.get(name.lower()), name, arg.strip())


@dataclass(frozen=True)
class PaletteEntry:
    title: str
    help: str
    action: str  # an App action


PALETTE_ENTRIES = (
    PaletteEntry("Models", "Open the model manager: local models, Hugging Face search and downloads", "models"),
    PaletteEntry("Conversations", "List, open, rename, delete and export conversations", "conversations"),
    PaletteEntry("Settings", "Sampling, KV cache, VRAM budget", "settings"),
    PaletteEntry("Model info", "The loaded model: size, backend, storage format of each layer", "model_info"),
    PaletteEntry("Help", "Keys and slash commands", "help"),
    PaletteEntry("New chat", "Start a new conversation", "chat('new_chat')"),
    PaletteEntry("Regenerate", "Regenerate the last reply", "chat('regenerate')"),
    PaletteEntry("Stop generation", "Stop the reply being written", "chat('stop')"),
    PaletteEntry("Copy last reply", "Copy the last reply to the clipboard", "chat('copy_last_reply')"),
    PaletteEntry("Copy last code block", "Copy the last code block of the conversation", "chat('copy_last_code')"),
    PaletteEntry("Edit system prompt", "The system prompt of this conversation", "chat('edit_system_prompt')"),
    PaletteEntry("Export conversation", "Save this conversation as Markdown", "chat('export')"),
    PaletteEntry("Toggle stats panel", "Show or hide the live stats", "chat('toggle_stats')"),
)


class ChatCommands(Provider):
    """The app's entries in Textual's command palette (ctrl+p)."""

    def _entries(self):
        for entry in PALETTE_ENTRIES:
            yield entry, partial(self.app.run_action, entry.action)

    async def discover(self) -> Hits:
        for entry, run in self._entries():
            yield DiscoveryHit(entry.title, run, help=entry.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for entry, run in self._entries():
            score = matcher.match(entry.title)
            if score > 0:
                yield Hit(score, matcher.highlight(entry.title), run, help=entry.help)
