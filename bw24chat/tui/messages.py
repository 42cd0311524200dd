"""The Message classes the app's widgets, screens and worker threads talk through.

Worker threads never touch widgets: they post one of these (``post_message`` is thread-safe)
and the handler runs on the UI thread.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from ..api import DoneEvent, ErrorEvent, LoadProgress

if TYPE_CHECKING:
    from ..api import EngineAPI
    from ..hub import DownloadProgress, HubModel, RepoFiles
    from ..model_catalog import GpuMemory, LocalModel
    from .widgets.message_view import MessageView


# ----------------------------------------------------------------------------- engine loading
class EngineLoading(Message):
    def __init__(self, progress: LoadProgress) -> None:
        super().__init__()
        self.progress = progress


class EngineReady(Message):
    """``load_id`` tells the latest load from one the user has since replaced."""

    def __init__(self, load_id: int, engine: EngineAPI, spec: str) -> None:
        super().__init__()
        self.load_id = load_id
        self.engine = engine
        self.spec = spec


class EngineFailed(Message):
    def __init__(self, load_id: int, spec: str | None, error: str) -> None:
        super().__init__()
        self.load_id = load_id
        self.spec = spec
        self.error = error


# ----------------------------------------------------------------------------- a reply streaming
class ReplyMessage(Message):
    """Base of the messages of one request; ``handle_id`` tells stale ones apart."""

    def __init__(self, handle_id: int) -> None:
        super().__init__()
        self.handle_id = handle_id


class ReplyChunk(ReplyMessage):
    def __init__(self, handle_id: int, text: str) -> None:
        super().__init__(handle_id)
        self.text = text


class ReplyStats(ReplyMessage):
    def __init__(self, handle_id: int, stats: dict) -> None:
        super().__init__(handle_id)
        self.stats = stats


class ReplyFinished(ReplyMessage):
    def __init__(self, handle_id: int, event: DoneEvent | ErrorEvent) -> None:
        super().__init__(handle_id)
        self.event = event


# ----------------------------------------------------------------------------- widgets
class PromptSubmitted(Message):
    """The chat input's Enter."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class MessageAction(Message):
    """A key pressed on a message: ``action`` is "copy", "copy_code", "edit" or "regenerate"."""

    def __init__(self, view: MessageView, action: str) -> None:
        super().__init__()
        self.view = view
        self.action = action


# ----------------------------------------------------------------------------- model manager
class CatalogScanned(Message):
    def __init__(self, models: list[LocalModel], gpu: GpuMemory | None) -> None:
        super().__init__()
        self.models = models
        self.gpu = gpu


class HubSearchDone(Message):
    def __init__(self, models: list[HubModel]) -> None:
        super().__init__()
        self.models = models


class HubFilesListed(Message):
    def __init__(self, files: RepoFiles) -> None:
        super().__init__()
        self.files = files


class HubFailed(Message):
    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error


class DownloadProgressed(Message):
    def __init__(self, progress: DownloadProgress) -> None:
        super().__init__()
        self.progress = progress


class DownloadEnded(Message):
    """``path`` is the model to open when it succeeded; else ``error`` says why (or cancelled)."""

    def __init__(self, path: str | None, error: str | None = None, cancelled: bool = False) -> None:
        super().__init__()
        self.path = path
        self.error = error
        self.cancelled = cancelled


class TrainProgressed(Message):
    """A draft-head training run's progress (train_draft.TrainProgress, as text and fraction)."""

    def __init__(self, text: str, fraction: float) -> None:
        super().__init__()
        self.text = text
        self.fraction = fraction


class TrainEnded(Message):
    """``path``: the trained head; else ``error`` says why (or cancelled)."""

    def __init__(self, path: str | None, error: str | None = None, cancelled: bool = False) -> None:
        super().__init__()
        self.path = path
        self.error = error
        self.cancelled = cancelled
