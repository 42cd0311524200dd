"""The conversation store: create, list, load, rename, delete, export, partial replies."""
from __future__ import annotations

import sqlite3

import pytest

from bw24chat.conversations import (
    DEFAULT_TITLE,
    ChatMessage,
    ConversationStore,
    conversation_markdown,
    finish_note,
    safe_filename,
)


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "chats.sqlite3")
    yield s
    s.close()


def test_a_conversation_round_trips(store):
    conv = store.create(model="m.gguf", system_prompt="Be brief.")
    store.add_message(conv.id, ChatMessage("user", "Hi"))
    store.add_message(conv.id, ChatMessage("assistant", "Hello!", finish_reason="stop", stats={"decode_tps": 12.5}))
    loaded = store.load(conv.id)
    assert (loaded.title, loaded.model, loaded.system_prompt) == (DEFAULT_TITLE, "m.gguf", "Be brief.")
    assert [(m.role, m.content, m.complete, m.finish_reason) for m in loaded.messages] == [
        ("user", "Hi", True, None),
        ("assistant", "Hello!", True, "stop"),
    ]
    assert loaded.messages[1].stats == {"decode_tps": 12.5}


def test_list_is_most_recent_first_with_message_counts(store):
    a = store.create(title="a")
    b = store.create(title="b")
    store.add_message(a.id, ChatMessage("user", "x"))  # a is now the most recent
    assert [(s.title, s.n_messages) for s in store.list()] == [("a", 1), ("b", 0)]


def test_rename_and_delete(store):
    conv = store.create()
    store.add_message(conv.id, ChatMessage("user", "x"))
    store.rename(conv.id, "  Renamed  ")
    assert store.load(conv.id).title == "Renamed"
    store.rename(conv.id, "   ")
    assert store.load(conv.id).title == DEFAULT_TITLE
    store.delete(conv.id)
    assert store.list() == []
    with pytest.raises(KeyError):
        store.load(conv.id)
    # the messages went with it
    assert sqlite3.connect(store.path).execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_a_partial_reply_survives_a_kill_and_is_marked_incomplete(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = ConversationStore(path)
    conv = store.create()
    reply = store.add_message(conv.id, ChatMessage("assistant", "", complete=False))
    reply.content = "half of the"
    store.update_message(reply)
    # no close(): the process dies here; a new process opens the file
    reloaded = ConversationStore(path).load(conv.id).messages[0]
    assert reloaded.content == "half of the" and not reloaded.complete
    assert finish_note(reloaded).startswith("incomplete")


def test_delete_messages_from_truncates(store):
    conv = store.create()
    ids = [store.add_message(conv.id, ChatMessage(r, t)).id for r, t in [("user", "1"), ("assistant", "2"), ("user", "3")]]
    store.delete_messages_from(conv.id, ids[1])
    assert [m.content for m in store.load(conv.id).messages] == ["1"]


def test_export_to_markdown(store, tmp_path):
    conv = store.create(title="Fish & chips?", model="m.gguf", system_prompt="Be brief.")
    store.add_message(conv.id, ChatMessage("user", "Hi"))
    store.add_message(conv.id, ChatMessage("assistant", "Hello", finish_reason="cancelled"))
    text = store.export_markdown(conv.id)
    assert text.startswith("# Fish & chips?\n")
    for part in ("Model: `m.gguf`", "## System\n\nBe brief.", "## User\n\nHi", "## Assistant\n\nHello", "*(stopped)*"):
        assert part in text
    path = store.export_to_file(conv.id, tmp_path / "out" / "x.md")
    assert path.read_text() == text
    default = store.export_to_file(conv.id)
    assert default.name.startswith("Fish-chips-") and default.read_text() == text
    assert conversation_markdown(store.load(conv.id)) == text


@pytest.mark.parametrize(
    "message, note",
    [
        (ChatMessage("assistant", "x", finish_reason="stop"), None),
        (ChatMessage("assistant", "x", finish_reason="length"), "stopped at the max-tokens limit"),
        (ChatMessage("assistant", "x", finish_reason="context_full"), "the context is full: start a new chat (/clear) to continue"),
        (ChatMessage("assistant", "x", finish_reason="error", error="boom"), "error: boom"),
    ],
)
def test_finish_notes(message, note):
    assert finish_note(message) == note


def test_safe_filename():
    assert safe_filename("a/b: c?") == "a-b-c"
    assert safe_filename("???") == "chat"
