"""The local stack's fleet commands from stdin: `+` adds a simulated server, `-` removes one.

On a terminal each key counts at once (cbreak mode, restored when the stack stops; Ctrl-C still interrupts);
on a pipe, one command per line.
"""

from __future__ import annotations

import queue
import sys
import threading
from typing import Any


class Keys:
    def __init__(self) -> None:
        self.commands: queue.Queue[str] = queue.Queue()
        self._tty: list[Any] | None = None  # saved terminal attributes while keys are read

    def start(self) -> None:
        """Feed stdin into `commands` from a daemon thread (nothing when stdin is closed)."""
        if sys.stdin is None or sys.stdin.closed:
            return
        interactive = sys.stdin.isatty() and sys.stdout.isatty()
        if interactive:
            import termios
            import tty

            fd = sys.stdin.fileno()
            self._tty = [fd, termios.tcgetattr(fd)]
            tty.setcbreak(fd)  # keys without Enter; Ctrl-C still interrupts
        threading.Thread(target=self._read, args=(interactive,), daemon=True).start()

    def _read(self, keys: bool) -> None:
        try:
            while True:
                data = sys.stdin.read(1) if keys else sys.stdin.readline()
                if not data:
                    return
                if data.strip():
                    self.commands.put(data)
        except (OSError, ValueError):
            return

    def restore(self) -> None:
        """Give the terminal its attributes back."""
        if self._tty is not None:
            import termios

            termios.tcsetattr(self._tty[0], termios.TCSADRAIN, self._tty[1])
            self._tty = None
