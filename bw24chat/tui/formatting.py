"""How numbers read in the UI (sizes, rates, durations), in one place."""
from __future__ import annotations


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_rate(bytes_per_s: float) -> str:
    return human_bytes(bytes_per_s) + "/s"


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def first_line(text: str, width: int = 48) -> str:
    """A one-line title from a message."""
    line = next((l.strip() for l in text.splitlines() if l.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def model_title(info) -> str:
    """The loaded model for people: its clean id, and its own (friendly) name where that says more."""
    if info.name and info.name != info.model_id:
        return f"{info.model_id} · {info.name}"
    return info.model_id
