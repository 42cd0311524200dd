"""A one-line progress report: a text and a bar.  Used for model loading and downloads."""
from __future__ import annotations

from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, ProgressBar

from ...api import LoadProgress

LOAD_STAGES = ("reading", "uploading", "compiling", "ready")


class ProgressLine(Horizontal):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="progress-line")
        self.display = False

    def compose(self):
        yield Label("", classes="progress-text")
        yield ProgressBar(total=1.0, show_eta=False, classes="progress-bar")

    def report(self, text: str, fraction: float | None) -> None:
        """Show ``text`` and the bar at ``fraction`` (None: indeterminate)."""
        self.display = True
        self.query_one(".progress-text", Label).update(Content(text))  # plain: file names may hold brackets
        bar = self.query_one(ProgressBar)
        if fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=1.0, progress=max(0.0, min(fraction, 1.0)))

    def hide(self) -> None:
        self.display = False

    def report_load(self, name: str, progress: LoadProgress) -> None:
        """A model load: the bar runs over all stages, the text names the current one."""
        stage = progress.stage
        index = LOAD_STAGES.index(stage) if stage in LOAD_STAGES else None
        overall = (index + progress.fraction) / (len(LOAD_STAGES) - 1) if index is not None else progress.fraction
        detail = f" · {progress.detail}" if progress.detail else ""
        self.report(f"Loading {name}: {stage}{detail}", min(overall, 1.0))
