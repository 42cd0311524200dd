"""Settings: sampling, engine options, theme and the default system prompt, saved to
``config.toml``.  The form is built from ``SETTINGS``; the choices of the select fields come
from the command-line parser so that the two can never offer different values.  A sampling
value the model recommends (options.MODEL_SAMPLING_KEYS) left blank follows the loaded model;
its field shows the value in force as a placeholder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import Screen
from textual.validation import Integer, Number
from textual.widgets import Button, Footer, Header, Input, Label, Select, TextArea

from ...config import cli_choices, save_config
from ...options import MODEL_SAMPLING_KEYS
from ...sampling_defaults import CONSERVATIVE
from ...speculative import MAX_K, SPEC_MODES

if TYPE_CHECKING:
    from ..app import ChatApp


SPEC_LABELS = {"ngram": "n-gram"}


@dataclass(frozen=True)
class Setting:
    key: str  # the EngineOptions / SamplingParams attribute
    section: str  # "sampling" | "engine" | "speculative"
    label: str
    kind: type  # int, float or str (str: a choice among the CLI's)
    help: str
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False  # blank means None
    choices: tuple[tuple[str, object], ...] = ()  # (label, value) of a select; () with kind str: the CLI's


SETTINGS = (
    Setting("temperature", "sampling", "Temperature", float, "0 = greedy", 0, 5),
    Setting("top_p", "sampling", "Top-p", float, "1 = off", 0, 1),
    Setting("top_k", "sampling", "Top-k", int, "0 = off", 0),
    Setting("min_p", "sampling", "Min-p", float, "0 = off", 0, 1),
    Setting("repeat_penalty", "sampling", "Repeat penalty", float, "1 = off", 0.5, 2),
    Setting("max_tokens", "sampling", "Max tokens", int, "per reply", 1),
    Setting("stop_on_loop", "sampling", "Stop on loop", int, "stop a reply repeating one phrase for N tokens, 0 = off", 0),
    Setting("seed", "sampling", "Seed", int, "blank = random", optional=True),
    Setting("kv_cache", "engine", "KV cache", str, "cache precision"),
    Setting("activations", "engine", "Activations", str, "matmul inputs: bf16 = faster prefill"),
    Setting("vram_budget_gb", "engine", "VRAM budget", float, "GiB, 0 = all free", 0),
    Setting("threads", "engine", "CPU threads", int, "BLAS threads of the NumPy backend", 1, 256),
    Setting("spec", "speculative", "Drafter", str, "off, or n-gram: draft from the prompt and reply so far",
            choices=tuple((SPEC_LABELS.get(m, m), m) for m in SPEC_MODES)),
    Setting("spec_k", "speculative", "Drafts per step", int, "auto: the fastest K for the acceptance and step times",
            choices=(("auto", 0), *((str(k), k) for k in range(1, MAX_K + 1)))),
)


class SettingsScreen(Screen):
    app: ChatApp

    BINDINGS = [Binding("ctrl+s", "save", "Save"), Binding("escape", "app.pop_screen", "Cancel")]

    def _target(self, setting: Setting):
        options = self.app.config.options
        return options.sampling if setting.section == "sampling" else options

    def _model_defaults(self) -> tuple[dict, str]:
        engine = self.app.engine
        if engine is None:
            return CONSERVATIVE, "no model loaded; bw24chat's conservative defaults until one is"
        info = engine.info
        return info.sampling_defaults or CONSERVATIVE, info.sampling_source or "bw24chat's conservative defaults"

    def compose(self):
        yield Header(show_clock=False)
        with VerticalScroll(id="settings-form"):
            for section, title in (("sampling", "Sampling"), ("engine", "Engine (applies at the next model load)"),
                                   ("speculative", "Speculative decoding (applies at the next reply)")):
                yield Label(title, classes="section-title")
                if section == "sampling":
                    yield Label(f"Blank fields follow the model: {self._model_defaults()[1]}", classes="hint",
                                id="sampling-source")
                with Grid(classes="settings-grid"):
                    for setting in SETTINGS:
                        if setting.section == section:
                            yield Label(setting.label)
                            yield self._field(setting)
                            yield Label(setting.help, classes="hint")
            yield Label("Interface", classes="section-title")
            with Grid(classes="settings-grid"):
                yield Label("Theme")
                themes = sorted(self.app.available_themes)
                yield Select([(t, t) for t in themes], value=self.app.theme, allow_blank=False, id="set-theme", compact=True)
                yield Label("also: command palette", classes="hint")
            yield Label("Default system prompt (new conversations)", classes="section-title")
            yield TextArea(self.app.config.system_prompt, id="set-system-prompt", soft_wrap=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")
        yield Footer()

    def _field(self, setting: Setting):
        value = getattr(self._target(setting), setting.key)
        field_id = f"set-{setting.key}"
        if setting.choices or setting.kind is str:
            choices = setting.choices or [(c, c) for c in cli_choices()[setting.key]]
            return Select(choices, value=value, allow_blank=False, id=field_id, compact=True)
        validator = (Integer if setting.kind is int else Number)(minimum=setting.minimum, maximum=setting.maximum)
        if setting.key in MODEL_SAMPLING_KEYS:
            chosen = setting.key in self.app.config.options.sampling_set
            placeholder = f"{self._model_defaults()[0][setting.key]} (model)"
            return Input(str(value) if chosen else "", placeholder=placeholder, id=field_id, validators=[validator],
                         valid_empty=True, compact=True)
        text = "" if value is None else str(value)
        return Input(text, id=field_id, validators=[validator], valid_empty=setting.optional, compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.app.pop_screen()

    def action_save(self) -> None:
        values, invalid = {}, []
        for setting in SETTINGS:
            widget = self.query_one(f"#set-{setting.key}")
            if isinstance(widget, Select):
                values[setting] = widget.value
                continue
            text = widget.value.strip()
            if not text and (setting.optional or setting.key in MODEL_SAMPLING_KEYS):
                values[setting] = None
            elif widget.validate(text).is_valid:
                values[setting] = setting.kind(float(text)) if setting.kind is int else setting.kind(text)
            else:
                invalid.append(setting.label)
        if invalid:
            self.notify("Check: " + ", ".join(invalid), title="Not saved", severity="error")
            return
        config = self.app.config
        chosen = set(config.options.sampling_set)
        for setting, value in values.items():
            if setting.key in MODEL_SAMPLING_KEYS:
                if value is None:  # blank: the model's value
                    chosen.discard(setting.key)
                    continue
                chosen.add(setting.key)
            setattr(self._target(setting), setting.key, value)
        config.options.sampling_set = frozenset(chosen)
        config.theme = self.query_one("#set-theme", Select).value
        config.system_prompt = self.query_one("#set-system-prompt", TextArea).text.strip()
        self.app.theme = config.theme
        path = save_config(config)
        self.notify(f"Saved to {path}", title="Settings", markup=False)
        self.app.pop_screen()
