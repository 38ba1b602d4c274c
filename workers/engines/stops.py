"""Stop-string handling shared by every engine that streams text.

Text that could be the start of a stop string is held back until it is known not
to be one, so a client never sees part of a stop sequence.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None  # the stop string that was hit
        self.armed = True  # False: stop strings are not looked for (vLLM's min_tokens)

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        buf = self._held + text
        if not self._stops or not self.armed:
            self._held = ""
            return buf, False
        hits = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits)
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
