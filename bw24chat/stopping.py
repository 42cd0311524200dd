"""Stop strings over a stream of text.

Text that could still be the start of a stop string is held back until it either completes
the stop string (then it is dropped, with everything after it) or can no longer match (then it
is released).  So a client never sees part of a stop string, and the streamed text always
equals the final text.
"""
from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add generated text; return the text safe to emit now.  Sets ``stopped`` when a stop
        string appears (the returned text then ends just before it)."""
        if self.stopped:
            return ""
        buf = self._pending + text
        if not self.stops:
            self._pending = ""
            return buf
        first = -1
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (first < 0 or i < first):
                first = i
        if first >= 0:
            self.stopped = True
            self._pending = ""
            return buf[:first]
        # hold back the longest suffix of buf that is a proper prefix of some stop string
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if k > hold and buf.endswith(s[:k]):
                    hold = k
                    break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        """At the end of generation: release what was held back."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out


class LoopDetector:
    """Sees a reply repeat itself: the same phrase of 1..max_period tokens over and over for
    ``span`` tokens (an opt-in stop, SamplingParams.stop_on_loop; 0 never fires).

    For each period p it counts how many tokens in a row equal the token p before them; a run
    of span - p such tokens means the last ``span`` tokens are one p-token phrase repeated."""

    def __init__(self, span: int, max_period: int = 32):
        self.span = span
        self.periods = range(1, min(max_period, max(span // 2, 1)) + 1)
        self._runs = [0] * (len(self.periods) + 1)
        self._ids: list[int] = []

    def feed(self, token: int) -> bool:
        """Add a generated token; True once the reply is looping."""
        if self.span <= 0:
            return False
        ids = self._ids
        ids.append(token)
        looping = False
        for p in self.periods:
            self._runs[p] = self._runs[p] + 1 if len(ids) > p and ids[-1] == ids[-1 - p] else 0
            looping |= self._runs[p] + p >= self.span
        return looping
