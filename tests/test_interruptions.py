"""Interruptions and damaged state: a process killed while saving loses nothing it had saved,
a full disk leaves the old file in place, damaged settings and databases are set aside and the
app starts afresh, Ctrl-C in headless mode stops cleanly with the partial output flushed."""
from __future__ import annotations

import errno
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bw24chat.config import Config, load_config, save_config
from bw24chat.conversations import ChatMessage, ConversationStore

ROOT = Path(__file__).resolve().parents[1]

# Saves conversations the way the chat screen does (the reply stored as it streams, then marked
# complete) and the settings file after each reply; prints the number of replies completed.
WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bw24chat.config import load_config, save_config
    from bw24chat.conversations import ChatMessage, ConversationStore

    folder, trial = Path(sys.argv[1]), sys.argv[2]
    store = ConversationStore(folder / "conversations.sqlite3")
    conv = store.create(title=f"trial {trial}")
    for i in range(1000):
        store.add_message(conv.id, ChatMessage("user", f"question {i}"))
        reply = store.add_message(conv.id, ChatMessage("assistant", "", complete=False))
        for k in range(20):
            reply.content += f"tok{k} "
            store.update_message(reply)
        reply.complete, reply.finish_reason = True, "stop"
        store.update_message(reply)
        config = load_config(folder / "config.toml")
        config.remember_model(f"trial-{trial}-model-{i}")
        save_config(config, folder / "config.toml")
        print(i + 1, flush=True)
""")
FULL_REPLY = "".join(f"tok{k} " for k in range(20))


def _kill_trials(folder: Path, trials: int, seed: int) -> dict:
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    acknowledged = {}
    for trial in range(trials):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(trial)], env=env,
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()  # the first reply is saved: from here on, kill at a random moment
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        lines = out.split()
        acknowledged[f"trial {trial}"] = int(lines[-1]) if lines else 1
    return acknowledged


def _check_after_kills(folder: Path, acknowledged: dict) -> dict:
    store = ConversationStore(folder / "conversations.sqlite3")
    assert store.problem is None
    assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    partial = 0
    for summary in store.list():
        conv = store.load(summary.id)
        replies = [m for m in conv.messages if m.role == "assistant"]
        done = [m for m in replies if m.complete]
        assert len(done) >= acknowledged[conv.title], conv.title  # every reply reported saved is there
        assert all(m.content == FULL_REPLY for m in done)
        for m in replies:
            if not m.complete:  # the reply being written when the process died: a clean prefix
                partial += 1
                assert FULL_REPLY.startswith(m.content)
    store.close()
    assert load_config(folder / "config.toml").problem is None  # the settings file is whole too
    return {"trials": len(acknowledged), "replies_saved": sum(acknowledged.values()), "partial_replies": partial}


def test_killing_the_writer_loses_nothing_saved(tmp_path):
    figures = _check_after_kills(tmp_path, _kill_trials(tmp_path, trials=8, seed=1))
    assert figures["trials"] == 8


@pytest.mark.slow
def test_killing_the_writer_at_100_random_points(tmp_path):
    figures = _check_after_kills(tmp_path, _kill_trials(tmp_path, trials=100, seed=2024))
    print(json.dumps(figures))


# ----------------------------------------------------------------------------- full disk
def test_a_full_disk_keeps_the_old_settings_file(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    config = Config()
    config.theme = "old-theme"
    save_config(config, path)
    before = path.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    config.theme = "new-theme"
    with pytest.raises(OSError, match="No space left"):
        save_config(config, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temporary file left behind


def test_a_full_database_keeps_what_was_saved(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    conv = store.create(title="kept")
    store.add_message(conv.id, ChatMessage("user", "small"))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 1}")  # the disk is full from here on
    with pytest.raises(sqlite3.OperationalError, match="full"):
        store.add_message(conv.id, ChatMessage("user", "x" * 1_000_000))
    store.close()
    again = ConversationStore(tmp_path / "c.sqlite3")
    assert again.problem is None
    assert [m.content for m in again.load(conv.id).messages] == ["small"]


def test_a_full_database_is_reported_to_the_caller_that_asked(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    conv = store.create(title="kept")
    reply = store.add_message(conv.id, ChatMessage("assistant", "saved part", complete=False))
    errors = []
    store.on_write_error = errors.append
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    reply.content = "saved part" + "x" * 1_000_000
    store.update_message(reply)  # no exception: the UI goes on
    assert store.add_message(conv.id, ChatMessage("user", "y" * 1_000_000)).id is None
    assert errors and all("full" in str(e) for e in errors)
    assert [m.content for m in store.load(conv.id).messages] == ["saved part"]


# ----------------------------------------------------------------------------- damaged files
def test_a_damaged_settings_file_is_set_aside_and_reported(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"[ui\ntheme = \xff\xfe broken")
    config = load_config(path)
    assert config.theme == Config().theme and "could not be read" in config.problem
    backups = list(tmp_path.glob("config.toml.broken-*"))
    assert len(backups) == 1 and backups[0].read_bytes().startswith(b"[ui")
    assert backups[0].name in config.problem
    assert load_config(path).problem is None  # the next start is clean


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed pages"])
def test_a_damaged_conversation_database_is_set_aside_and_the_app_starts(tmp_path, damage):
    path = tmp_path / "conversations.sqlite3"
    store = ConversationStore(path)
    for i in range(30):
        store.add_message(store.create(title=f"c{i}").id, ChatMessage("user", "y" * 3000))
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    raw = bytearray(path.read_bytes())
    if damage == "garbage":
        raw[:100] = os.urandom(100)
    elif damage == "truncated":
        raw = raw[: len(raw) // 3 + 100]
    else:
        raw[4096 * 2 : 4096 * 6] = bytes(4096 * 4)
    path.write_bytes(bytes(raw))
    store = ConversationStore(path)
    assert store.problem and "damaged" in store.problem
    assert list(tmp_path.glob("conversations.sqlite3.broken-*"))
    conv = store.create(title="fresh")
    assert [s.title for s in store.list()] == ["fresh"] and store.load(conv.id).title == "fresh"


# ----------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_in_headless_mode_stops_cleanly(tmp_path):
    from tests.model_factory import make_gguf

    model = make_gguf(tmp_path / "tiny.gguf", metadata={"llama.context_length": 100000})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "bw24chat", "--headless", "--json", "-m", str(model), "--device", "cpu",
                             "--temperature", "0", "--max-tokens", "100000", "hello"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    assert json.loads(first)["type"] == "text"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    records = [json.loads(line) for line in (first + out).splitlines()]
    assert proc.returncode == 130
    assert records[-1]["type"] == "done" and records[-1]["finish_reason"] == "cancelled"
    assert records[-1]["generated_tokens"] >= len([r for r in records if r["type"] == "text"]) > 0
    assert "Traceback" not in err and "interrupted" in err
