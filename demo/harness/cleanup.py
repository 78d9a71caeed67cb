"""Undo actions, run in reverse order, and SIGINT/SIGTERM as an exception."""

import signal
import sys
import traceback


class Interrupted(Exception):
    """Raised in the main thread when SIGINT or SIGTERM arrives."""


class Cleanup:
    """A stack of (description, action). `undo()` runs them newest first;
    one failing does not stop the others. While it runs, further signals
    are only noted, so an impatient second Ctrl-C does not cut it short."""

    def __init__(self):
        self._actions = []
        self._undoing = False
        self.signal = None

    def push(self, what, action):
        self._actions.append((what, action))

    def install_signal_handlers(self):
        def on_signal(sig, _frame):
            first = self.signal is None
            self.signal = self.signal or sig
            if first and not self._undoing:
                raise Interrupted(signal.Signals(sig).name)

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    def undo(self):
        self._undoing = True
        failures = 0
        while self._actions:
            what, action = self._actions.pop()
            try:
                action()
            except Exception:
                failures += 1
                print(f"demo: cleanup: {what} failed:", file=sys.stderr)
                traceback.print_exc()
        return failures
