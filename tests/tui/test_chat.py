"""The chat screen with a FakeEngine: streaming, stop, errors, regenerate, edit, history,
slash commands, context full, copy, persistence of a partial reply, responsiveness."""
from __future__ import annotations

import pytest

from bw24chat.conversations import ConversationStore, finish_note
from bw24chat.fake_engine import DEFAULT_REPLY, FakeEngine
from bw24chat.tui.screens.help import HelpScreen
from bw24chat.tui.screens.models import ModelsScreen
from bw24chat.tui.widgets.message_view import MessageView
from tests.tui.tui_helpers import HeldEngine, send, send_and_hold, start_chat, wait_for, wait_for_notification

pytestmark = pytest.mark.anyio


async def test_a_reply_streams_into_the_chat_and_is_stored(make_app):
    app = make_app(FakeEngine(token_delay=0.05))
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        await send(pilot, "hello", wait=False)
        chat = app.chat
        reply_view = chat.views[-1]
        # seen mid-stream: some text rendered while the reply is still being written
        await wait_for(pilot, lambda: reply_view.markdown.source and chat.active is not None, what="streamed text")
        assert len(reply_view.markdown.source) < len(DEFAULT_REPLY)
        await wait_for(pilot, lambda: chat.active is None, what="the end of the reply")
        await pilot.pause()
        assert [m.role for m in chat.conversation.messages] == ["user", "assistant"]
        reply = chat.conversation.messages[-1]
        assert reply.content == DEFAULT_REPLY and reply.finish_reason == "stop" and reply.complete
        assert reply_view.markdown.source == DEFAULT_REPLY
        assert chat.conversation.title == "hello"
        stored = app.store.load(chat.conversation.id).messages
        assert [(m.role, m.content, m.complete) for m in stored] == [("user", "hello", True), ("assistant", DEFAULT_REPLY, True)]


async def test_escape_stops_the_reply_at_once_and_keeps_the_partial_text(make_app):
    engine = HeldEngine(hold_after=6)
    app = make_app(engine)
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send_and_hold(pilot, engine, "write code")
        chat = app.chat
        await wait_for(pilot, lambda: chat.active.message.content == engine.held_text(), what="the held text")
        handle = chat.active.handle
        await pilot.press("escape")
        assert handle.cancelled
        assert chat.active is None  # at once: not after the engine's DoneEvent
        await wait_for(pilot, lambda: handle.done, what="the cancelled stream to end")
        await pilot.pause()
        reply = chat.conversation.messages[-1]
        assert reply.content == engine.held_text()
        assert reply.finish_reason == "cancelled" and reply.complete
        view = chat.views[-1]
        assert view.markdown.source == engine.held_text()
        assert "stopped" in str(view.query_one(".note").render())
        stored = app.store.load(chat.conversation.id).messages[-1]
        assert stored.content == engine.held_text() and stored.finish_reason == "cancelled"
        assert stored.stats["decode_tps"] > 0  # the stopped reply's final figures were kept


async def test_an_engine_error_is_shown_on_the_reply(make_app):
    app = make_app(FakeEngine(token_delay=0.002))
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "please fail [[error]]")
        reply = app.chat.conversation.messages[-1]
        assert reply.error and "fake engine failure" in reply.error
        view = app.chat.views[-1]
        assert view.has_class("-error")
        assert "fake engine failure" in str(view.query_one(".note").render())
        await wait_for_notification(pilot, "error", "fake engine failure")


@pytest.mark.parametrize("on_the_reply", [False, True], ids=["ctrl+r", "r-on-the-reply"])
async def test_regenerate_replaces_the_last_reply(make_app, on_the_reply):
    engine = FakeEngine(replies=["first answer", "second answer"], token_delay=0.002)
    app = make_app(engine)
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "question")
        if on_the_reply:
            app.chat.views[-1].focus()
            await pilot.press("r")
        else:
            await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.chat.active is None and len(engine.requests) == 2, what="the second reply")
        await pilot.pause()
        messages = app.chat.conversation.messages
        assert [(m.role, m.content) for m in messages] == [("user", "question"), ("assistant", "second answer")]
        assert engine.requests[0].messages == engine.requests[1].messages
        assert len(app.chat.views) == 2
        assert [m.content for m in app.store.load(app.chat.conversation.id).messages] == ["question", "second answer"]


async def test_edit_a_message_and_resend_from_there(make_app):
    engine = FakeEngine(replies=["one", "two", "three"], token_delay=0.002)
    app = make_app(engine)
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "first question")
        await send(pilot, "second question")
        first_user_view = app.chat.views[0]
        first_user_view.focus()
        await pilot.press("e")
        assert app.chat.prompt.text == "first question"
        assert app.chat.query_one("#edit-banner").display
        app.chat.prompt.load_text("better question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engine.requests) == 3 and app.chat.active is None, what="the resent reply")
        await pilot.pause()
        messages = app.chat.conversation.messages
        assert [(m.role, m.content) for m in messages] == [("user", "better question"), ("assistant", "three")]
        assert engine.requests[-1].messages == [{"role": "user", "content": "better question"}]
        assert len(app.store.load(app.chat.conversation.id).messages) == 2
        assert not app.chat.query_one("#edit-banner").display


async def test_up_and_down_walk_the_prompt_history(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.press("d", "r", "a", "f", "t")
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("up")
        assert prompt.text == "first"  # the oldest stays
        await pilot.press("down")
        assert prompt.text == "second"
        await pilot.press("down")
        assert prompt.text == "draft"  # back to what was being typed


async def test_shift_enter_and_ctrl_j_insert_newlines(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
        assert app.chat.prompt.text == "a\nb\nc"
        assert app.chat.conversation is None  # nothing was sent


async def test_slash_commands(make_app, tmp_path):
    engine = FakeEngine(replies=["r1", "r2", "r3"], token_delay=0.002)
    app = make_app(engine)
    async with app.run_test() as pilot:
        await start_chat(pilot)
        chat = app.chat
        await send(pilot, "/system You are terse.", wait=False)
        await pilot.pause()
        assert chat.system_prompt == "You are terse."
        assert chat.query_one("#system-line").display
        await send(pilot, "hi")
        assert engine.requests[-1].messages[0] == {"role": "system", "content": "You are terse."}
        assert app.store.load(chat.conversation.id).system_prompt == "You are terse."

        await send(pilot, "/retry")
        assert len(engine.requests) == 2 and chat.conversation.messages[-1].content == "r2"

        target = tmp_path / "export" / "chat.md"
        await send(pilot, f"/save {target}", wait=False)
        await pilot.pause()
        text = target.read_text()
        assert "## System" in text and "You are terse." in text and "## User" in text and "r2" in text

        first_id = chat.conversation.id
        await send(pilot, "/clear", wait=False)
        await wait_for(pilot, lambda: chat.conversation is None and not chat.views, what="a new chat")
        assert app.store.load(first_id).messages  # /clear starts anew, it does not delete

        await send(pilot, "/help", wait=False)
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is chat, what="the chat")

        await send(pilot, "/model", wait=False)
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is chat, what="the chat")

        await send(pilot, "/nonsense", wait=False)
        await pilot.pause()
        await wait_for_notification(pilot, "error", "/nonsense")

        await send(pilot, "//not a command")
        assert chat.conversation.messages[0].content == "/not a command"


async def test_a_full_context_is_shown(make_app):
    app = make_app(FakeEngine(n_ctx=12, token_delay=0.002))
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "a question that fills the tiny context")
        reply = app.chat.conversation.messages[-1]
        assert reply.finish_reason == "context_full"
        view = app.chat.views[-1]
        assert view.has_class("-context-full")
        assert "context is full" in str(view.query_one(".note").render())
        await wait_for_notification(pilot, "warning", "context is full")


async def test_copy_a_message_and_its_code_block(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "code please")
        reply_view = app.chat.views[-1]
        reply_view.focus()
        await pilot.press("c")
        assert app.clipboard == DEFAULT_REPLY
        await pilot.press("k")
        assert app.clipboard == "print('hello from bw24chat')\n"
        await app.run_action("chat('copy_last_reply')")
        assert app.clipboard == DEFAULT_REPLY


async def test_typing_stays_responsive_while_a_reply_streams(make_app):
    app = make_app(FakeEngine(token_delay=0.02))  # [[slow]]: 0.2 s a token, seconds in all
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send(pilot, "[[slow]] take your time", wait=False)
        chat = app.chat
        await wait_for(pilot, lambda: chat.active is not None and chat.active.message.content, what="streaming")
        handle = chat.active.handle
        await pilot.press("a", "b", "c")
        assert chat.prompt.text == "abc"
        assert not handle.done  # the keys were handled while the engine was still streaming
        await pilot.press("escape")


async def test_a_partial_reply_is_stored_as_it_streams_and_marked_incomplete(make_app, private_dirs):
    engine = HeldEngine(hold_after=8)
    app = make_app(engine)
    async with app.run_test() as pilot:
        await start_chat(pilot)
        await send_and_hold(pilot, engine, "tell me")
        conversation_id = app.chat.conversation.id
        # another connection, as a restarted app would open it after a kill
        other = ConversationStore(app.store.path)

        def stored_reply():
            return other.load(conversation_id).messages[-1]

        await wait_for(pilot, lambda: stored_reply().content == engine.held_text(), what="the partial reply stored")
        assert not stored_reply().complete
        assert finish_note(stored_reply()).startswith("incomplete")
        engine.release.set()
        await wait_for(pilot, lambda: app.chat.active is None, what="the end of the reply")
        assert stored_reply().complete and stored_reply().content == HeldEngine.REPLY
        other.close()


async def test_an_incomplete_reply_is_shown_as_such_when_reopened(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await start_chat(pilot)
        from bw24chat.conversations import ChatMessage

        conv = app.store.create(title="crashed")
        app.store.add_message(conv.id, ChatMessage("user", "hi"))
        app.store.add_message(conv.id, ChatMessage("assistant", "half a rep", complete=False))
        await app.chat.show_conversation(app.store.load(conv.id))
        await pilot.pause()
        view = app.chat.views[-1]
        assert isinstance(view, MessageView) and view.has_class("-incomplete")
        assert "incomplete" in str(view.query_one(".note").render())
