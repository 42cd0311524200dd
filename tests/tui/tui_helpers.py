"""Helpers of the TUI tests: a wait helper (tests wait on conditions, never on time), a
scripted engine that can hold a reply mid-stream, and a tiny GGUF writer."""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np

from bw24chat.api import DoneEvent, StatsEvent, TokenEvent, Usage
from bw24chat.fake_engine import FakeEngine


async def wait_for(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def wait_for_notification(pilot, severity: str, text: str) -> None:
    """Wait for a notification of ``severity`` whose message contains ``text``."""

    def shown() -> bool:
        return any(n.severity == severity and text in n.message for n in pilot.app._notifications)

    await wait_for(pilot, shown, what=f"a {severity} notification about {text!r}")


class HeldEngine(FakeEngine):
    """A FakeEngine whose replies stop after ``hold_after`` words until ``release`` is set
    (or the request is cancelled), with fixed stats: a deterministic "mid-stream" state."""

    REPLY = (
        "Sure. Here is a tiny Python function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
        "It adds two numbers and returns the sum."
    )

    def __init__(self, hold_after: int = 20, reply: str = REPLY, **kwargs):
        super().__init__(replies=[reply], **kwargs)
        self.reply = reply
        self.hold_after = hold_after
        self.holding = threading.Event()
        self.release = threading.Event()

    def stats_at(self, n: int) -> dict:
        return {
            **self.stats(),
            "ctx_used": 40 + n,
            "decode_tps": 50.0 + 2.5 * n,
            "prefill_tps": 812.5,
            "ttft_s": 0.042,
        }

    def run_request(self, handle) -> None:
        self.requests.append(handle.request)
        words = re.findall(r"\s*\S+|\s+", self.reply)
        for i, word in enumerate(words):
            if i == self.hold_after:
                self.holding.set()
                while not (self.release.wait(0.01) or handle.cancelled):
                    pass
            if handle.cancelled:
                handle.emit(DoneEvent("cancelled", Usage(40, i), self.stats_at(i), "".join(words[:i])))
                return
            handle.emit(TokenEvent(word, [i]))
            if i % 4 == 3:
                handle.emit(StatsEvent(self.stats_at(i + 1)))
        handle.emit(DoneEvent("stop", Usage(40, len(words)), self.stats_at(len(words)), self.reply))

    def held_text(self) -> str:
        return "".join(re.findall(r"\s*\S+|\s+", self.reply)[: self.hold_after])


async def start_chat(pilot) -> None:
    """Wait until the app's model is loaded."""
    await wait_for(pilot, lambda: pilot.app.engine is not None, what="the engine to load")
    await pilot.pause()


async def send(pilot, text: str, wait: bool = True) -> None:
    """Type ``text`` into the prompt and press Enter; wait until it was taken (the prompt is
    cleared) and, with ``wait``, until the reply has ended."""
    chat = pilot.app.chat
    chat.prompt.focus()
    chat.prompt.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: chat.prompt.text == "", what="the prompt to be taken")
    if wait:
        await wait_for(pilot, lambda: chat.active is None, what="the reply to end")
        await pilot.pause()


def row_text(table, index: int) -> list[str]:
    """The cells of a DataTable row as plain strings."""
    return [str(cell) for cell in table.get_row_at(index)]


async def click(pilot, selector: str) -> None:
    """Click the widget once it is laid out on screen (a click before that would miss it)."""
    widget = pilot.app.screen.query_one(selector)
    await wait_for(pilot, lambda: widget.region.area > 0, what=f"{selector} on screen")
    await pilot.click(selector)


async def send_and_hold(pilot, engine: HeldEngine, text: str) -> None:
    """Send ``text`` and wait until ``engine`` holds its reply mid-stream."""
    await send(pilot, text, wait=False)
    await wait_for(pilot, engine.holding.is_set, what="the engine to hold")


async def open_screen(pilot, key: str, screen_type: type):
    """Press ``key`` and wait for a ``screen_type`` screen; return it."""
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, screen_type), what=screen_type.__name__)
    return pilot.app.screen


def write_gguf(path: Path, name: str = "Tiny Llama", file_type: int = 3, n_ctx: int = 2048) -> Path:
    """A small valid GGUF (llama metadata, one tensor) for the model catalog."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(n_ctx)
    writer.add_block_count(4)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(file_type)
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
