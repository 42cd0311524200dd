"""The loaded model at a glance (/info, or "Model info" in the palette): architecture, size,
backend, context, and which storage format each tensor role is in per layer range — so a mixed
checkpoint (e.g. NVFP4 projections, BF16 embedding, Q8_0 LM head) shows what runs where."""
from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from ...api import ModelInfo
from ...loaders import summarize_formats


def info_markdown(info: ModelInfo | None) -> str:
    if info is None:
        return "# No model loaded\n\nChoose one in the model manager (F3)."
    parts = [f"# {info.name}", "", f"* id: `{info.model_id}`", f"* architecture: `{info.arch}`, {info.n_params / 1e6:,.1f} M parameters",
             f"* backend: {info.backend} ({info.device_name})", f"* context: {info.n_ctx:,} tokens",
             f"* file: `{info.path}`"]
    if info.sampling_source:
        values = ", ".join(f"{k} {v}" for k, v in info.sampling_defaults.items())
        parts.append(f"* sampling defaults: {values} ({info.sampling_source})")
    parts += ["", "## Storage formats", "", "| Tensor | Format | Layers |", "|---|---|---|"]
    parts += [f"| `{role}` | {fmt} | {layers} |" for role, fmt, layers in summarize_formats(info.formats)]
    return "\n".join(parts) + "\n"


class ModelInfoScreen(ModalScreen):
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def compose(self):
        engine = self.app.engine
        with VerticalScroll(id="info-box"):
            yield Markdown(info_markdown(engine.info if engine is not None else None))
