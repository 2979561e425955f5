"""Progress for long work: one status line rewritten in place on a terminal, plain lines in CI;
byte progress (bars, or periodic lines) for save, export, load and verify."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

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


MIB = 1 << 20
BAR_REDRAW_S = 0.2
# A rate means something once bytes have flowed this long, an ETA once this share of an
# exact total has come too. Before, the figures would time the engine's start-up (Docker
# 20.10 writes every layer to disk before `docker save` sends its first byte) as
# throughput: "0/4076 MiB ... ETA 2291675 s".
RATE_AFTER_S = 2.0
ETA_AFTER_SHARE = 0.02


class ByteProgress:
    """A ``stackpin.meter.Meter`` for people: click's progress bar on a terminal (done/total,
    percent, rate and ETA), and in CI or a pipe one plain line once the work is under way,
    one every ``interval_s`` seconds and one at the end, each with done/total and, once they
    mean something, rate and ETA. An estimated total, and an ETA against it, are shown as
    such ("~"); the end shows what was really counted.

    A phase shows nothing until it has counted ``min_bytes``: progress is for work that has
    started. A small bundle finishes before anyone looks, and a refusal that came from a
    header or a listing (a member with '..', a link, a missing file), before the bytes
    were read, keeps its error to one line instead of following "0/544 MiB (0%)".
    """

    def __init__(self, *, stream: TextIO | None = None, tty: bool | None = None,
                 interval_s: float = 10.0, min_bytes: int = 16 * MIB,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s
        self.min_bytes = min_bytes
        self._clock = clock
        self._bar: Any = None  # click's ProgressBar (its item type is the shown text)
        self._label, self._total, self._done, self._pending = "", 0, 0, 0
        self._estimate = False
        self._started = self._shown = 0.0
        self._flowing: float | None = None  # when the first bytes were counted
        self._first = 0  # how many: the rate is what came after them
        self._visible = False

    def start(self, label: str, total: int, *, estimate: bool = False) -> None:
        self._label, self._total, self._done, self._pending = label, max(total, 0), 0, 0
        self._estimate = estimate
        self._started = self._shown = self._clock()
        self._flowing, self._first = None, 0
        self._visible = False
        self._show_if_big()

    def advance(self, count: int) -> None:
        now = self._clock()
        if self._flowing is None and count > 0:
            self._flowing, self._first = now, count
        self._done += count
        self._pending += count
        if self._done > self._total:  # an estimated total was low: it grows
            self._total = self._done
        if not self._visible:
            self._show_if_big()
            return
        # Redrawn at most 5 times a second on a terminal: a 10 KiB read must not draw.
        if now - self._shown < (BAR_REDRAW_S if self._bar is not None else self.interval_s):
            return
        self._shown = now
        if self._bar is not None:
            self._bar.length = max(self._total, 1)
            self._bar.update(self._pending, self._figures(now))
        else:
            click.echo(f"{self._label}: {self._figures(now)}", file=self.stream)
        self._pending = 0

    def finish(self) -> None:
        self._total = self._done  # what was really counted is the total
        self._estimate = False
        if not self._visible:
            return
        now = self._clock()
        if self._bar is not None:
            self._bar.length = max(self._total, 1)
            self._bar.pos = self._done
            self._bar.current_item = self._figures(now, final=True)
            self._bar.render_progress()  # the last frame: 100 % of what was counted
            self._bar.__exit__(None, None, None)
            self._bar = None
        else:
            click.echo(f"{self._label}: {self._figures(now, final=True)} "
                       f"in {now - self._started:.0f} s", file=self.stream)

    def _show_if_big(self) -> None:
        if self._done == 0 or self._done < self.min_bytes:
            return
        self._visible = True
        now = self._clock()
        self._shown = now  # the next line comes an interval after this one
        if self.tty:
            # click's own ETA would divide by the time since the start: ours is below.
            self._bar = click.progressbar(
                length=max(self._total, 1), label=self._label, file=self.stream,
                show_eta=False, show_percent=True, item_show_func=lambda text: text)
            self._bar.__enter__()
            self._bar.update(self._done, self._figures(now))
            self._pending = 0
        else:
            click.echo(f"{self._label}: {self._figures(now)}", file=self.stream)

    def _figures(self, now: float, *, final: bool = False) -> str:
        """done/total (percent), then the rate and the ETA once they mean something."""
        percent = 100 * self._done / self._total if self._total else 0.0
        total = f"~{self._total / MIB:.0f}" if self._estimate else f"{self._total / MIB:.0f}"
        text = f"{self._done / MIB:.0f}/{total} MiB ({percent:.0f}%)"
        flowed = now - self._flowing if self._flowing is not None else 0.0
        if flowed <= 0 or (flowed < RATE_AFTER_S and not final):
            return text
        rate = (self._done - self._first) / flowed
        text += f", {rate / MIB:.1f} MiB/s"
        if not final and ETA_AFTER_SHARE * self._total <= self._done < self._total:
            about = "~" if self._estimate else ""
            text += f", ETA {about}{(self._total - self._done) / rate:.0f} s"
        return text
