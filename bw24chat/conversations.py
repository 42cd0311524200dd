"""Conversations kept in SQLite (``data_dir()/conversations.sqlite3``).

SQLite because every write is a transaction: if the app is killed mid-reply, the database
holds the last committed state, never a torn file.  The chat screen stores the partial reply
as it streams (throttled) with ``complete = 0`` and sets ``complete = 1`` when the engine's
DoneEvent (or ErrorEvent) arrives, so a reply cut short by a crash is shown as incomplete.

One store is used from one thread (the UI's); the engine thread never touches it.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .paths import data_dir

DEFAULT_TITLE = "New chat"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    model TEXT,
    system_prompt TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    complete INTEGER NOT NULL DEFAULT 1,
    finish_reason TEXT,
    error TEXT,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    complete: bool = True  # False while streaming (and forever if the app died mid-reply)
    finish_reason: str | None = None  # the DoneEvent's, or "error"
    error: str | None = None
    stats: dict = field(default_factory=dict)
    id: int | None = None  # set by the store


@dataclass
class Conversation:
    id: str
    title: str
    created: float
    updated: float
    model: str | None = None
    system_prompt: str = ""
    messages: list[ChatMessage] = field(default_factory=list)


@dataclass
class ConversationSummary:
    id: str
    title: str
    updated: float
    n_messages: int


class ConversationStore:
    """``problem`` (None when all is well) says why the database was started afresh: a damaged
    file is set aside (config.set_aside) with its journal files, never deleted.

    A write that fails (a full disk, a read-only folder) is rolled back, so the database keeps
    its last committed state; it raises, unless ``on_write_error`` is set: then that gets the
    error and the caller goes on (the UI keeps the conversation on screen and says so)."""

    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / "conversations.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.problem: str | None = None
        self.on_write_error: Callable[[Exception], None] | None = None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            from .config import set_aside

            backup = set_aside(self.path)
            for suffix in ("-wal", "-shm"):
                journal = self.path.with_name(self.path.name + suffix)
                if journal.exists() and backup is not None:
                    os.replace(journal, backup.with_name(backup.name + suffix))
            kept = f"; it was kept as {backup.name}" if backup else ""
            self.problem = f"the conversation database {self.path} is damaged ({exc}){kept}. A new one was started."
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA journal_mode = WAL")  # readers never block the streaming writes
            db.executescript(_SCHEMA)
            ok = db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {ok}")
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self):
        try:
            with self._db:  # commits, or rolls back on any exception
                yield self._db
        except sqlite3.OperationalError as exc:  # SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR ...
            if self.on_write_error is None:
                raise
            self.on_write_error(exc)

    # ------------------------------------------------------------------ conversations
    def create(self, title: str = DEFAULT_TITLE, model: str | None = None, system_prompt: str = "") -> Conversation:
        now = time.time()
        conv = Conversation(uuid.uuid4().hex, title, now, now, model, system_prompt)
        with self._transaction():
            self._db.execute(
                "INSERT INTO conversations (id, title, created, updated, model, system_prompt) VALUES (?, ?, ?, ?, ?, ?)",
                (conv.id, conv.title, conv.created, conv.updated, conv.model, conv.system_prompt),
            )
        return conv

    def list(self) -> list[ConversationSummary]:
        """Most recently updated first."""
        rows = self._db.execute(
            "SELECT c.id, c.title, c.updated, COUNT(m.id) AS n FROM conversations c "
            "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.rowid DESC"
        ).fetchall()
        return [ConversationSummary(r["id"], r["title"], r["updated"], r["n"]) for r in rows]

    def load(self, conversation_id: str) -> Conversation:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        messages = [
            ChatMessage(
                role=m["role"],
                content=m["content"],
                complete=bool(m["complete"]),
                finish_reason=m["finish_reason"],
                error=m["error"],
                stats=json.loads(m["stats"]),
                id=m["id"],
            )
            for m in self._db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,))
        ]
        return Conversation(
            row["id"], row["title"], row["created"], row["updated"], row["model"], row["system_prompt"], messages
        )

    def _update_conversation(self, conversation_id: str, **columns) -> None:
        columns["updated"] = time.time()
        assignments = ", ".join(f"{name} = ?" for name in columns)
        with self._transaction():
            self._db.execute(f"UPDATE conversations SET {assignments} WHERE id = ?", (*columns.values(), conversation_id))

    def rename(self, conversation_id: str, title: str) -> None:
        self._update_conversation(conversation_id, title=title.strip() or DEFAULT_TITLE)

    def set_system_prompt(self, conversation_id: str, system_prompt: str) -> None:
        self._update_conversation(conversation_id, system_prompt=system_prompt)

    def set_model(self, conversation_id: str, model: str | None) -> None:
        self._update_conversation(conversation_id, model=model)

    def delete(self, conversation_id: str) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ------------------------------------------------------------------ messages
    def add_message(self, conversation_id: str, message: ChatMessage) -> ChatMessage:
        """``message`` with its id set (None if it could not be stored)."""
        cur = None
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, complete, finish_reason, error, stats, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    message.role,
                    message.content,
                    int(message.complete),
                    message.finish_reason,
                    message.error,
                    json.dumps(message.stats),
                    time.time(),
                ),
            )
        message.id = cur.lastrowid if cur is not None else None
        self._update_conversation(conversation_id)
        return message

    def update_message(self, message: ChatMessage) -> None:
        """Store ``message``'s current content and state (it must have been added)."""
        with self._transaction():
            self._db.execute(
                "UPDATE messages SET content = ?, complete = ?, finish_reason = ?, error = ?, stats = ? WHERE id = ?",
                (
                    message.content,
                    int(message.complete),
                    message.finish_reason,
                    message.error,
                    json.dumps(message.stats),
                    message.id,
                ),
            )

    def delete_messages_from(self, conversation_id: str, message_id: int) -> None:
        """Delete ``message_id`` and every later message of the conversation (edit, regenerate)."""
        with self._transaction():
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))
        self._update_conversation(conversation_id)

    # ------------------------------------------------------------------ export
    def export_markdown(self, conversation_id: str) -> str:
        return conversation_markdown(self.load(conversation_id))

    def export_to_file(self, conversation_id: str, path: Path | None = None) -> Path:
        """Write the conversation as Markdown to ``path`` (default: ``data_dir()/exports/<title>.md``)."""
        conv = self.load(conversation_id)
        if path is None:
            path = data_dir() / "exports" / f"{safe_filename(conv.title)}-{conv.id[:8]}.md"
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(conversation_markdown(conv), encoding="utf-8")
        return path


def finish_note(message: ChatMessage) -> str | None:
    """Why a reply ended, when that is worth telling the reader (None for a normal stop)."""
    if message.error:
        return f"error: {message.error}"
    if not message.complete:
        return "incomplete: the app closed before the reply finished"
    return {
        "cancelled": "stopped",
        "length": "stopped at the max-tokens limit",
        "context_full": "the context is full: start a new chat (/clear) to continue",
    }.get(message.finish_reason or "")


def conversation_markdown(conv: Conversation) -> str:
    parts = [f"# {conv.title}", ""]
    if conv.model:
        parts += [f"Model: `{conv.model}`", ""]
    if conv.system_prompt:
        parts += ["## System", "", conv.system_prompt, ""]
    for message in conv.messages:
        parts += [f"## {message.role.capitalize()}", "", message.content, ""]
        note = finish_note(message)
        if note:
            parts += [f"*({note})*", ""]
    return "\n".join(parts)


def safe_filename(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", title).strip("-")[:60] or "chat"
