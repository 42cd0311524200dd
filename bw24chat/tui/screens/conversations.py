"""Saved conversations: open, rename, delete, export to Markdown."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from ..widgets.table import fill_table
from .dialogs import Confirm, TextPrompt

if TYPE_CHECKING:
    from ..app import ChatApp


class ConversationsScreen(Screen):
    app: ChatApp

    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("r", "rename", "Rename"),
        Binding("d,delete", "delete", "Delete"),
        Binding("x", "export", "Export"),
        Binding("n", "new", "New chat"),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def compose(self):
        yield Header(show_clock=False)
        yield Static("", id="conversations-empty")
        yield DataTable(id="conversations", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(DataTable).focus()

    def refresh_list(self) -> None:
        summaries = self.app.store.list()
        rows = ((s.id, (s.title, str(s.n_messages), time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated)))) for s in summaries)
        fill_table(self.query_one(DataTable), ("Title", "Messages", "Updated"), rows)
        empty = self.query_one("#conversations-empty", Static)
        empty.update("No conversations yet." if not summaries else "")
        empty.display = not summaries

    @property
    def selected_id(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("open", "rename", "delete", "export"):
            return self.selected_id is not None
        return True

    async def action_open(self) -> None:
        conversation_id = self.selected_id
        self.app.pop_screen()
        await self.app.chat.show_conversation(self.app.store.load(conversation_id))

    async def action_new(self) -> None:
        self.app.pop_screen()
        await self.app.chat.show_conversation(None)

    def action_rename(self) -> None:
        conversation_id = self.selected_id
        current = self.app.store.load(conversation_id).title

        def done(title: str | None) -> None:
            if title:
                self.app.store.rename(conversation_id, title)
                chat = self.app.chat
                if chat.conversation is not None and chat.conversation.id == conversation_id:
                    chat.conversation.title = title.strip()
                self.refresh_list()

        self.app.push_screen(TextPrompt("Rename conversation", current, ok_label="Rename"), done)

    def action_delete(self) -> None:
        conversation_id = self.selected_id
        title = self.app.store.load(conversation_id).title

        def done(confirmed: bool | None) -> None:
            if confirmed:
                self.app.store.delete(conversation_id)
                self.app.chat.forget_conversation(conversation_id)
                self.refresh_list()
                self.notify(f"Deleted “{title}”", markup=False)

        self.app.push_screen(Confirm(f"Delete “{title}”?", ok_label="Delete"), done)

    def action_export(self) -> None:
        path = self.app.store.export_to_file(self.selected_id)
        self.notify(f"Saved to {path}", title="Exported", markup=False)
