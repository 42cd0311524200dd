"""The model manager: models on this machine (with the VRAM they would need against the VRAM
free, and whether they have a draft head for --spec mtp), a path typed by hand, and Hugging Face
search with downloads (progress, cancel, resume).  ctrl+t trains a draft head for the selected
model (``bw24chat train-draft``, through the app's ``draft_trainer``).  Scanning, searching,
downloading and training run on worker threads that report back with messages, so the screen
stays responsive on a slow disk or network."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, Select, Static, TabbedContent, TabPane

from ... import hub, model_catalog, train_draft
from ..formatting import human_bytes, human_duration, human_rate
from ..messages import (
    CatalogScanned,
    DownloadEnded,
    DownloadProgressed,
    HubFailed,
    HubFilesListed,
    HubSearchDone,
    TrainEnded,
    TrainProgressed,
)
from ..widgets.progress_line import ProgressLine
from ..widgets.table import fill_table

if TYPE_CHECKING:
    from ..app import ChatApp

DEFAULT_MODEL_SPEC = "default"  # resolved by the engine to the default model, fetched on first use

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct (Q4_1, 98 MB)"


def vram_text(needed: int | None, gpu: model_catalog.GpuMemory | None) -> str:
    if needed is None:
        return "?"
    text = human_bytes(needed)
    if gpu is None:
        return text
    return f"{text} ✓" if needed <= gpu.free else f"{text} ✗"


LOCAL_COLUMNS = ("Name", "Arch", "Format", "Size", "VRAM est.", "Draft head", "Location")


def local_row(m: model_catalog.LocalModel, gpu: model_catalog.GpuMemory | None) -> tuple[str, ...]:
    fmt = f"{m.fmt} {m.quant}" if m.quant else m.fmt
    name = f"{m.name} (unreadable: {m.error})" if m.error else m.name
    return (name, m.arch or "?", fmt, human_bytes(m.size), vram_text(m.vram_needed, gpu), m.draft_head or "-", m.location)


def choice_row(c: hub.DownloadChoice, gpu: model_catalog.GpuMemory | None) -> tuple[str, ...]:
    # weights as downloaded plus the fixed workspace: the KV cache needs the model's shape
    needed = model_catalog.estimate_vram(c.size, None, None) if c.size else None
    return (c.label, c.fmt, str(len(c.files)), human_bytes(c.size), vram_text(needed, gpu))


class ModelsScreen(Screen):
    app: ChatApp

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("ctrl+r", "rescan", "Rescan"),
        Binding("ctrl+f", "find", "Search the Hub"),
        Binding("ctrl+t", "train_draft", "Train a draft head"),
    ]

    def __init__(self) -> None:
        super().__init__(id="models")
        self.models: list[model_catalog.LocalModel] = []
        self.gpu: model_catalog.GpuMemory | None = None
        self.hub_models: list[hub.HubModel] = []
        self.repo_files: hub.RepoFiles | None = None
        self._cancel_download: threading.Event | None = None
        self._select_after_scan: str | None = None  # a just-downloaded model to put the cursor on
        self._retry = None  # what the Retry button of a failed Hub request runs
        self._cancel_training: threading.Event | None = None

    def compose(self):
        yield Header(show_clock=False)
        with TabbedContent(id="model-tabs"):
            with TabPane("Local", id="local-tab"):
                yield Static("", id="gpu-line")
                with Vertical(id="first-run"):
                    yield Static(
                        "No model found on this machine. bw24chat can fetch a small one to start with.",
                        classes="hint",
                    )
                    yield Button(f"Get {DEFAULT_MODEL_LABEL}", variant="primary", id="get-default")
                yield DataTable(id="local-models", cursor_type="row", zebra_stripes=True)
                yield Static("", id="model-fit")  # an MoE model's expert tiers at the budgets, and its speed
                with Horizontal(classes="form-row"):
                    yield Input(placeholder="Path to a GGUF file or a Hugging Face model folder", id="model-path")
                    yield Button("Open", id="open-path")
                with Horizontal(id="train-row"):
                    yield ProgressLine(id="train-progress")
                    yield Button("Cancel", id="train-cancel", variant="error")
            with TabPane("Hugging Face", id="hub-tab"):
                with Horizontal(classes="form-row"):
                    yield Input(placeholder="Search models by name", id="hub-query")
                    yield Select(
                        [("GGUF", "gguf"), ("safetensors", "safetensors"), ("any format", "any")],
                        value="gguf",
                        allow_blank=False,
                        id="hub-format",
                    )
                    yield Button("Search", id="hub-search")
                with Vertical(id="hub-error"):
                    yield Static("", id="hub-error-text")
                    yield Button("Retry", variant="primary", id="hub-retry")
                yield DataTable(id="hub-results", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="hub-files", cursor_type="row", zebra_stripes=True)
                with Horizontal(id="download-row"):
                    yield ProgressLine(id="download-progress")
                    yield Button("Cancel", id="download-cancel", variant="error")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#first-run").display = False
        self.query_one("#hub-error").display = False
        self.query_one("#hub-files").display = False
        self.query_one("#download-cancel").display = False
        self.query_one("#train-cancel").display = False
        self.query_one("#gpu-line", Static).update("Looking for models…")
        self.action_rescan()
        self.query_one("#local-models").focus()

    # ------------------------------------------------------------------ local models
    def action_rescan(self) -> None:
        self._scan(list(self.app.config.recent_models))

    @work(thread=True, exclusive=True, group="catalog")
    def _scan(self, recent: list[str]) -> None:
        models = model_catalog.list_local_models(recent, self.app.hf_cache)
        self.post_message(CatalogScanned(models, model_catalog.gpu_memory()))

    def on_catalog_scanned(self, message: CatalogScanned) -> None:
        self.models, self.gpu = message.models, message.gpu
        gpu = self.gpu
        self.query_one("#gpu-line", Static).update(
            Content.from_markup(
                "[b]GPU[/b] $name · $free free of $total", name=gpu.name, free=human_bytes(gpu.free), total=human_bytes(gpu.total)
            )
            if gpu
            else Content.from_markup("[b]GPU[/b] none found (pynvml / CuPy): models run on the CPU")
        )
        table = self.query_one("#local-models", DataTable)
        fill_table(table, LOCAL_COLUMNS, ((str(i), local_row(m, gpu)) for i, m in enumerate(self.models)))
        self.query_one("#first-run").display = not self.models
        if not self.models and (self.focused is None or self.focused is table):
            # a first start: Enter fetches and opens the default model — unless the user has
            # already moved on (e.g. ctrl+f to the Hub search) while the scan ran: the scan
            # finishing must not pull the focus away from what they are typing into
            self.query_one("#get-default", Button).focus()
        if self._select_after_scan is not None:
            for index, m in enumerate(self.models):
                if m.spec == self._select_after_scan:
                    table.move_cursor(row=index)
            self._select_after_scan = None

    @on(DataTable.RowHighlighted, "#local-models")
    def show_fit(self, event: DataTable.RowHighlighted) -> None:
        """Under the table, for an MoE model: where its experts would land at the app's VRAM and
        host budgets (VRAM slots, pinned host RAM, the file) and the decode speed to expect."""
        fit = self.query_one("#model-fit", Static)
        o = self.app.config.options
        m = self.models[int(event.row_key.value)] if event.row_key.value is not None else None
        lines = model_catalog.moe_fit(m, self.gpu.free, o.vram_budget_gb, o.host_budget_gb) if m and self.gpu else []
        fit.update("\n".join(lines))
        fit.display = bool(lines)

    @on(DataTable.RowSelected, "#local-models")
    def open_selected(self, event: DataTable.RowSelected) -> None:
        self.app.load_model(self.models[int(event.row_key.value)].spec)

    @on(Button.Pressed, "#get-default")
    def get_default(self) -> None:
        self.app.load_model(DEFAULT_MODEL_SPEC)

    @on(Button.Pressed, "#open-path")
    @on(Input.Submitted, "#model-path")
    def open_path(self) -> None:
        text = self.query_one("#model-path", Input).value.strip()
        if not text:
            return
        path = Path(text).expanduser()
        if not (path.is_file() or model_catalog.is_hf_folder(path)):
            self.notify(f"Not a GGUF file or a model folder: {text}", severity="error", markup=False)
            return
        self.app.load_model(str(path))

    # ------------------------------------------------------------------ draft heads
    def action_train_draft(self) -> None:
        """Train a draft head (train_draft.py) for the model under the cursor, on a worker."""
        table = self.query_one("#local-models", DataTable)
        if not self.models or table.cursor_row is None:
            self.notify("Select a model to train a draft head for", severity="warning")
            return
        m = self.models[table.cursor_row]
        if self._cancel_training is not None:
            self.notify("A draft head is already training", severity="warning")
            return
        if m.draft_head == "shipped":
            self.notify(f"{m.name} ships its own multi-token-prediction head: --spec mtp uses it", markup=False)
            return
        self._cancel_training = threading.Event()
        self.query_one("#train-progress", ProgressLine).report(f"Training a draft head for {m.name}…", None)
        self.query_one("#train-cancel").display = True
        self._train(m.spec, self._cancel_training)

    @work(thread=True, group="train")
    def _train(self, spec: str, cancel: threading.Event) -> None:
        last = {"t": 0.0, "stage": None}

        def report(p: train_draft.TrainProgress) -> None:
            now = time.monotonic()
            if now - last["t"] > 0.25 or p.stage != last["stage"] or p.done == p.total:  # a few redraws a second
                last.update(t=now, stage=p.stage)
                self.post_message(TrainProgressed(p.text(), p.fraction))

        try:
            path = self.app.draft_trainer(spec, report, cancel)
        except train_draft.TrainCancelled:
            self.post_message(TrainEnded(None, cancelled=True))
        except train_draft.TrainError as exc:
            self.post_message(TrainEnded(None, str(exc)))
        except Exception as exc:  # noqa: BLE001 - any failure is reported in the UI
            self.post_message(TrainEnded(None, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(TrainEnded(str(path)))

    def on_train_progressed(self, message: TrainProgressed) -> None:
        self.query_one("#train-progress", ProgressLine).report(message.text, message.fraction)

    @on(Button.Pressed, "#train-cancel")
    def cancel_training(self) -> None:
        if self._cancel_training is not None:
            self._cancel_training.set()

    def on_train_ended(self, message: TrainEnded) -> None:
        self._cancel_training = None
        self.query_one("#train-cancel").display = False
        progress = self.query_one("#train-progress", ProgressLine)
        if message.cancelled:
            progress.report("Training cancelled: ctrl+t on the same model resumes it", None)
            return
        if message.error:
            progress.report(f"Training failed: {message.error}", None)
            self.notify(message.error, title="Draft head not trained", severity="error", markup=False)
            return
        progress.hide()
        self.notify(f"Saved {message.path}. Speculative decoding uses it with the mtp mode (Settings)",
                    title="Draft head trained", markup=False)
        self.action_rescan()

    # ------------------------------------------------------------------ Hugging Face
    def action_find(self) -> None:
        self.query_one("#model-tabs", TabbedContent).active = "hub-tab"
        self.query_one("#hub-query", Input).focus()

    @on(Button.Pressed, "#hub-search")
    @on(Input.Submitted, "#hub-query")
    def search(self) -> None:
        self._start_search(fresh=False)

    def _start_search(self, fresh: bool) -> None:
        """Search the Hub (``fresh``: probe its reachability again, a Retry)."""
        query = self.query_one("#hub-query", Input).value.strip()
        fmt = self.query_one("#hub-format", Select).value
        self._show_hub_error(None)
        self.query_one("#hub-results", DataTable).loading = True
        self._retry = self._start_search
        self._search(query, None if fmt == "any" else fmt, fresh)

    def _show_hub_error(self, text: str | None) -> None:
        """A failed Hub request: its reason and a Retry button where its table was."""
        failed = text is not None
        self.query_one("#hub-error").display = failed
        self.query_one("#hub-results").display = not failed
        if failed:
            self.query_one("#hub-files").display = False
            self.query_one("#hub-error-text", Static).update(Content(text))
            self.query_one("#hub-retry", Button).focus()

    @on(Button.Pressed, "#hub-retry")
    def retry_hub(self) -> None:
        if self._retry is not None:
            self._retry(fresh=True)

    @work(thread=True, exclusive=True, group="hub")
    def _search(self, query: str, fmt: str | None, fresh: bool) -> None:
        try:
            hub.hub_offline(fresh)
            self.post_message(HubSearchDone(hub.search_models(query, fmt)))
        except Exception as exc:  # noqa: BLE001 - network errors are shown, not raised
            self.post_message(HubFailed("search", f"{type(exc).__name__}: {exc}"))

    def on_hub_search_done(self, message: HubSearchDone) -> None:
        self.hub_models = message.models
        table = self.query_one("#hub-results", DataTable)
        table.loading = False
        rows = ((str(i), (m.repo_id, f"{m.downloads:,}", f"{m.likes:,}")) for i, m in enumerate(self.hub_models))
        fill_table(table, ("Repository", "Downloads", "Likes"), rows)
        if not self.hub_models:
            self.notify("No model matches", severity="warning")
        else:
            table.focus()

    def on_hub_failed(self, message: HubFailed) -> None:
        for table in self.query(DataTable):
            table.loading = False
        self._show_hub_error(f"The Hugging Face {message.what} failed: {message.error}")

    @on(DataTable.RowSelected, "#hub-results")
    def list_files(self, event: DataTable.RowSelected) -> None:
        self._open_repo(self.hub_models[int(event.row_key.value)].repo_id)

    def _open_repo(self, repo_id: str, fresh: bool = False) -> None:
        self._show_hub_error(None)
        files = self.query_one("#hub-files", DataTable)
        files.display = True
        files.loading = True
        self._retry = lambda fresh: self._open_repo(repo_id, fresh)
        self._list_files(repo_id, fresh)

    @work(thread=True, exclusive=True, group="hub")
    def _list_files(self, repo_id: str, fresh: bool) -> None:
        try:
            hub.hub_offline(fresh)
            self.post_message(HubFilesListed(hub.list_choices(repo_id)))
        except Exception as exc:  # noqa: BLE001
            self.post_message(HubFailed("listing", f"{type(exc).__name__}: {exc}"))

    def on_hub_files_listed(self, message: HubFilesListed) -> None:
        self.repo_files = message.files
        table = self.query_one("#hub-files", DataTable)
        table.loading = False
        rows = ((str(i), choice_row(c, self.gpu)) for i, c in enumerate(self.repo_files.choices))
        fill_table(table, ("Choice", "Format", "Files", "Size", "VRAM est."), rows)
        if not self.repo_files.choices:
            self.notify("This repository has no GGUF or safetensors weights", severity="warning")
        else:
            table.focus()

    @on(DataTable.RowSelected, "#hub-files")
    def download_selected(self, event: DataTable.RowSelected) -> None:
        if self._cancel_download is not None:
            self.notify("A download is already running", severity="warning")
            return
        choice = self.repo_files.choices[int(event.row_key.value)]
        self._cancel_download = threading.Event()
        self.query_one("#download-progress", ProgressLine).report(f"Starting {choice.label}…", None)
        self.query_one("#download-cancel").display = True
        self._download(self.repo_files, choice, self._cancel_download)

    @work(thread=True, group="download")
    def _download(self, repo: hub.RepoFiles, choice: hub.DownloadChoice, cancel: threading.Event) -> None:
        try:
            hub.download_files(
                repo.repo_id,
                choice.files,
                revision=repo.revision,
                progress=lambda p: self.post_message(DownloadProgressed(p)),
                cancel=cancel,
            )
        except hub.DownloadCancelled:
            self.post_message(DownloadEnded(None, cancelled=True))
            return
        except Exception as exc:  # noqa: BLE001
            self.post_message(DownloadEnded(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(DownloadEnded(str(hub.repo_dir(repo.repo_id) / choice.main_file)))

    def on_download_progressed(self, message: DownloadProgressed) -> None:
        p = message.progress
        eta = f" · ETA {human_duration(p.eta_s)}" if p.eta_s is not None else ""
        files = f" ({p.files_done + 1}/{p.files_total})" if p.files_total > 1 else ""
        text = f"{Path(p.filename).name}{files}: {human_bytes(p.downloaded)} / {human_bytes(p.total)} · {human_rate(p.speed)}{eta}"
        self.query_one("#download-progress", ProgressLine).report(text, p.fraction)

    @on(Button.Pressed, "#download-cancel")
    def cancel_download(self) -> None:
        if self._cancel_download is not None:
            self._cancel_download.set()

    def on_download_ended(self, message: DownloadEnded) -> None:
        self._cancel_download = None
        self.query_one("#download-cancel").display = False
        progress = self.query_one("#download-progress", ProgressLine)
        if message.cancelled:
            progress.report("Download cancelled: start it again to resume", None)
            return
        if message.error:
            progress.report(f"Download failed: {message.error}", None)
            self.notify(message.error, title="Download failed", severity="error", markup=False)
            return
        progress.hide()
        self.notify("Downloaded: press Enter on it to load it", title="Download complete")
        self._select_after_scan = message.path
        self.query_one("#model-tabs", TabbedContent).active = "local-tab"
        self.action_rescan()
        self.query_one("#local-models").focus()
