"""An interactive CLI in a pseudo-terminal (stdlib ``pty``): what a user at a terminal sees.

The agent CLIs behave differently with a terminal than in their one-shot modes (Claude
Code starts in auto mode and sends ``safeguards`` only interactively), so a test types
into a real pty and reads the screen back as plain text (ANSI escapes removed).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
                   r"|\x1b[()][0-9A-B]|\x1b[=>78MDEHc]")


def plain(raw: str) -> str:
    """The screen's text without escapes; cursor moves become spaces."""
    return re.sub(r"[ \t]+", " ", _ANSI.sub(" ", raw.replace("\r", "")))


class Terminal:
    """``argv`` on a ``cols`` x ``rows`` pty; everything it writes is kept in ``raw``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
                 cols: int = 160, rows: int = 50) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=slave,
                                     stdout=slave, stderr=slave, start_new_session=True,
                                     close_fds=True)
        os.close(slave)
        self.fd, self.raw, self._lock = master, "", threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    if self.proc.poll() is not None:
                        return
                    continue
                data = os.read(self.fd, 65536)
            except OSError:  # the child closed its side
                return
            if not data:
                return
            with self._lock:
                self.raw += data.decode(errors="replace")

    @property
    def text(self) -> str:
        with self._lock:
            return plain(self.raw)

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def type_line(self, line: str) -> None:
        """Type ``line`` as a person would (a paste would be held as one bracketed block),
        then Enter."""
        for ch in line:
            self.send(ch)
            time.sleep(0.01)
        time.sleep(0.3)
        self.send("\r")

    def wait_for(self, found: Callable[[str], bool], timeout_s: float, what: str) -> str:
        """The screen once ``found(screen)``; AssertionError with the screen's end if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            screen = self.text
            if found(screen):
                return screen
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no {what} within {timeout_s:.0f} s (exit "
                             f"{self.proc.poll()}); the screen ended:\n{self.text[-3000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        os.close(self.fd)
