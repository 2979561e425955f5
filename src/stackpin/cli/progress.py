"""Progress for long work: one status line rewritten in place on a terminal, plain lines in CI."""

from __future__ import annotations

import re
import sys
from typing import TextIO

import click

# The classic builder's "Step 2/9 : RUN ..." and BuildKit's plain "#7 [2/9] RUN ...".
_STEP = re.compile(r"^(Step \d+/\d+ : |#\d+ \[(?:[^\]]*\s)?\d+/\d+\] )")


class StepProgress:
    """Shows build/bootstrap progress; the full output always goes to the log file.

    On a terminal: the current step, rewritten in place. Otherwise (CI, pipes): each step
    line and each phase line, so a log reader sees where a build is without the noise of
    every pip line. ``verbose`` prints every line.
    """

    def __init__(self, *, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self.tty = self.stream.isatty()
        self._width = 0

    def __call__(self, line: str) -> None:
        text = line.rstrip()
        if self.verbose:
            self._print(text)
        elif _STEP.match(text) or text.startswith(("base:", "bootstrap:", "ERROR")):
            self._status(text) if self.tty else self._print(text)

    def _status(self, text: str) -> None:
        shown = text[:118]
        click.echo("\r" + shown.ljust(self._width), nl=False, file=self.stream)
        self._width = len(shown)

    def _print(self, text: str) -> None:
        self.done()
        click.echo(text, file=self.stream)

    def done(self) -> None:
        if self.tty and self._width:
            click.echo("\r" + " " * self._width + "\r", nl=False, file=self.stream)
            self._width = 0
