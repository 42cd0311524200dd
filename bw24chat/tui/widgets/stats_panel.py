"""Live engine figures: one row per stat the engine reports (a row appears only once its
key has been seen, since no engine has to report every key) and a sparkline of decode
tokens/s over the conversation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Label, Sparkline, Static

from ..formatting import human_bytes, human_duration

LABEL_WIDTH = 11
# the figures of one reply's speculative decoding, dropped when the next reply starts
SPEC_STATS = ("spec_rounds", "spec_drafted", "spec_accepted", "spec_acceptance", "spec_mean_len")


def _both(a: str, b: str, fmt: Callable[[float], str], unit: str = "") -> Callable[[dict], str | None]:
    """A "used / total" row that needs ``a`` and shows ``b`` when present."""

    def render(stats: dict) -> str | None:
        if a not in stats:
            return None
        return fmt(stats[a]) + (f" / {fmt(stats[b])}" if b in stats else "") + unit

    return render


def _one(key: str, fmt: Callable) -> Callable[[dict], str | None]:
    return lambda stats: fmt(stats[key]) if key in stats else None


@dataclass(frozen=True)
class StatRow:
    name: str  # also the widget id suffix
    label: str
    render: Callable[[dict], str | None]


STAT_ROWS = (
    StatRow("decode", "Decode", _one("decode_tps", lambda v: f"{v:.1f} tok/s")),
    # speculative decoding (only while a reply uses it): drafts accepted, tokens per verify step
    StatRow("spec_acceptance", "Accepted", _one("spec_acceptance", lambda v: f"{100 * v:.0f} % of drafts")),
    StatRow("spec_mean_len", "Tok/step", _one("spec_mean_len", lambda v: f"{v:.2f}")),
    StatRow("prefill", "Prefill", _one("prefill_tps", lambda v: f"{v:.1f} tok/s")),
    StatRow("ttft", "First tok", _one("ttft_s", human_duration)),
    StatRow("context", "Context", _both("ctx_used", "ctx_max", lambda v: f"{int(v):,}")),
    StatRow("vram", "VRAM", _both("vram_used", "vram_total", lambda v: human_bytes(v).removesuffix(" GiB"), " GiB")),
    StatRow("kv", "KV cache", _one("kv_bytes", human_bytes)),
    StatRow("rss", "Memory", _one("rss", human_bytes)),
    # MoE experts spilled from VRAM (backends/expert_tiers.ExpertStats): who served the lookups,
    # what crossed the PCIe bus per token, how full the VRAM slots are
    StatRow("experts", "Experts", lambda s: None if "expert_hit_vram" not in s else (
        f"{100 * s['expert_hit_vram']:.0f} % VRAM, {100 * s['expert_hit_host']:.0f} % host, "
        f"{100 * s['expert_hit_disk']:.0f} % disk")),
    StatRow("expert_io", "Moved", _one("expert_bytes_per_token", lambda v: f"{human_bytes(v)} / token")),
    StatRow("expert_slots", "Slots", _one("expert_cache_occupancy", lambda v: f"{100 * v:.0f} % full")),
    StatRow("gpu", "GPU", _one("gpu_name", str)),
    StatRow("backend", "Backend", _one("backend", str)),
)


class StatsPanel(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.stats: dict = {}
        self.tps_history: list[float] = []

    def compose(self):
        yield Label("Stats", classes="panel-title")
        for row in STAT_ROWS:
            yield Static("", id=f"stat-{row.name}", classes="stat")
        yield Label("Decode tok/s", id="tps-label", classes="panel-title")
        yield Sparkline([], id="tps-sparkline")

    def on_mount(self) -> None:
        self._render_rows()

    def update_stats(self, stats: dict) -> None:
        """Merge newly reported figures (keys not in ``stats`` keep their last value)."""
        self.stats.update(stats)
        if "decode_tps" in stats:
            self.tps_history.append(float(stats["decode_tps"]))
            self.query_one("#tps-sparkline", Sparkline).data = list(self.tps_history)
        self._render_rows()

    def forget(self, keys: tuple[str, ...]) -> None:
        """Drop figures that hold for one reply only, so that their rows hide until reported again."""
        for key in keys:
            self.stats.pop(key, None)
        self._render_rows()

    def reset(self, tps_history: list[float] = ()) -> None:
        """A new conversation: forget the figures, start the sparkline from ``tps_history``."""
        self.stats = {}
        self.tps_history = list(tps_history)
        self.query_one("#tps-sparkline", Sparkline).data = list(self.tps_history)
        self._render_rows()

    def _render_rows(self) -> None:
        for row in STAT_ROWS:
            text = row.render(self.stats)
            widget = self.query_one(f"#stat-{row.name}", Static)
            widget.display = text is not None
            if text is not None:
                widget.update(Content.from_markup(f"[b]{row.label:<{LABEL_WIDTH}}[/b]$value", value=text))
        # one point would be drawn as a solid block: the line needs two to say anything
        has_history = len(self.tps_history) > 1
        self.query_one("#tps-label").display = has_history
        self.query_one("#tps-sparkline").display = has_history
