"""The app driven end to end on the real NumPy engine and the real SmolLM2 model: the UI loads
the model through its own factory, streams a real greedy reply into the chat, and shows the
engine's stats."""
from __future__ import annotations

import pytest

from tests.tui.tui_helpers import send, start_chat, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_real_smollm2_reply_through_the_ui(smollm2_path, private_dirs):
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions
    from bw24chat.tui.app import ChatApp

    opts = EngineOptions(model=str(smollm2_path), device="cpu")
    opts.sampling.temperature = 0.0
    opts.sampling_set = frozenset({"temperature"})  # chosen: the model's 0.2 does not apply
    opts.sampling.max_tokens = 24
    app = ChatApp(opts, lambda o, progress: open_engine(o, progress))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: getattr(app, "engine", None) is not None, timeout=120, what="the model to load")
        await start_chat(pilot)
        # the clean id first, the GGUF's own name after it
        assert app.chat.sub_title == "SmolLM2-135M-Instruct.Q4_1 · Smollm2 135M 8k Lc100K Mix1 Ep2"
        await send(pilot, "What is the capital of France?", wait=False)
        chat = app.chat
        await wait_for(pilot, lambda: chat.active is None and len(chat.conversation.messages) == 2, timeout=120,
                       what="the real reply")
        reply = chat.conversation.messages[-1]
        assert reply.role == "assistant" and "Paris" in reply.content
        assert chat.views[-1].markdown.source == reply.content
        assert reply.stats["rss"] > 100 * 2**20 and reply.stats["kv_bytes"] > 0  # the panel's memory rows
