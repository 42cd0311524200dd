"""The live stats panel: a row for each figure the engine reports, none for the others, and a
sparkline of decode tokens/s."""
from __future__ import annotations

import pytest
from textual.app import App

from bw24chat.fake_engine import FakeEngine
from bw24chat.tui.widgets.stats_panel import STAT_ROWS, StatsPanel

SPEC_ROWS = ("spec_acceptance", "spec_mean_len")
EXPERT_ROWS = ("experts", "expert_io", "expert_slots")  # MoE tiers: reported by runners that spill experts
from tests.tui.tui_helpers import send, start_chat, wait_for

pytestmark = pytest.mark.anyio


class PanelApp(App):
    def compose(self):
        yield StatsPanel(id="stats")


def shown(panel: StatsPanel) -> dict[str, str]:
    return {row.name: str(panel.query_one(f"#stat-{row.name}").render()) for row in STAT_ROWS if panel.query_one(f"#stat-{row.name}").display}


async def test_only_reported_figures_are_shown():
    app = PanelApp()
    async with app.run_test(size=(40, 30)) as pilot:
        panel = app.query_one(StatsPanel)
        assert shown(panel) == {}
        assert not panel.query_one("#tps-sparkline").display
        panel.update_stats({"decode_tps": 41.25, "ctx_used": 300, "backend": "cuda"})
        await pilot.pause()
        rows = shown(panel)
        assert set(rows) == {"decode", "context", "backend"}
        assert "41.2 tok/s" in rows["decode"] and "300" in rows["context"] and "/" not in rows["context"]
        assert not panel.query_one("#tps-sparkline").display  # one point would be a solid block
        panel.update_stats({"decode_tps": 40.0})
        await pilot.pause()
        assert panel.query_one("#tps-sparkline").display

        panel.update_stats({"ctx_max": 4096, "vram_used": 3 * 2**30, "vram_total": 24 * 2**30, "ttft_s": 0.25})
        panel.update_stats({"gpu_name": "H200", "prefill_tps": 1000.0, "kv_bytes": 96 * 2**20, "rss": 1.5 * 2**30})
        panel.update_stats({"spec_acceptance": 0.625, "spec_mean_len": 2.5})
        # what CudaRunner.expert_stats reports (ExpertStats.as_dict)
        panel.update_stats({"expert_hit_vram": 0.968, "expert_hit_host": 0.032, "expert_hit_disk": 0.0,
                            "expert_bytes_per_token": 61898496, "expert_cache_occupancy": 1.0, "expert_prefill_bytes": 0})
        await pilot.pause()
        rows = shown(panel)
        assert set(rows) == {row.name for row in STAT_ROWS}
        assert "97 % VRAM, 3 % host, 0 % disk" in rows["experts"] and "59.0 MiB / token" in rows["expert_io"]
        assert "100 % full" in rows["expert_slots"]
        assert "62 % of drafts" in rows["spec_acceptance"] and "2.50" in rows["spec_mean_len"]
        assert "300 / 4,096" in rows["context"]
        assert "3.0 / 24.0 GiB" in rows["vram"]
        assert "250 ms" in rows["ttft"]
        assert "96.0 MiB" in rows["kv"] and "1.5 GiB" in rows["rss"]
        assert "40.0 tok/s" in rows["decode"]  # a figure not in the latest event keeps its value

        panel.reset([10.0, 20.0])
        await pilot.pause()
        assert shown(panel) == {} and panel.tps_history == [10.0, 20.0]
        panel.reset([12.0])  # a reopened conversation of one reply: no solid block
        await pilot.pause()
        assert not panel.query_one("#tps-sparkline").display


async def test_a_reply_fills_the_panel_and_the_sparkline(make_app):
    app = make_app(FakeEngine(token_delay=0.002))
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        panel = app.chat.stats_panel
        # before any reply: what engine.stats() reports (no decode speed yet)
        assert set(shown(panel)) == {"context", "vram", "kv", "rss", "gpu", "backend"}
        await send(pilot, "hello")
        # the FakeEngine reports everything but the speculative figures (speculation is off) and
        # the expert tiers' (a dense model)
        assert set(shown(panel)) == {row.name for row in STAT_ROWS} - set(SPEC_ROWS) - set(EXPERT_ROWS)
        samples = len(panel.tps_history)
        assert samples >= 2 and panel.query_one("#tps-sparkline").data == panel.tps_history
        await send(pilot, "again")
        assert len(panel.tps_history) > samples  # the sparkline spans the conversation
        reply = app.chat.conversation.messages[-1]
        assert reply.stats["decode_tps"] == panel.tps_history[-1]
        await pilot.press("ctrl+t")
        assert not panel.display


async def test_speculation_rows_follow_the_request(make_app):
    """The rows appear while a reply drafts (the live StatsEvents carry them) and go when the
    next reply does not."""
    # slow enough tokens that the reply is still running when the first live figures arrive,
    # however long the app takes to settle (the model list is described in the background)
    engine = FakeEngine(replies=["one two three four five six seven eight nine ten " * 3], token_delay=0.1)
    app = make_app(engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await start_chat(pilot)
        panel = app.chat.stats_panel
        app.config.options.spec, app.config.options.spec_k = "ngram", 2
        await pilot.press(*"hello", "enter")
        await wait_for(pilot, lambda: app.chat.active is not None and "spec_mean_len" in panel.stats,
                       what="a live speculative figure mid-reply")
        await wait_for(pilot, lambda: app.chat.active is None, what="the reply's end")
        rows = shown(panel)
        # the scripted drafter: a round every second token, 2 drafts of which 1 is accepted
        assert "50 % of drafts" in rows["spec_acceptance"] and "2.00" in rows["spec_mean_len"]
        app.config.options.spec = "off"
        await send(pilot, "again")
        assert not set(SPEC_ROWS) & set(shown(panel))
