"""Progress reporting seam: the library reports, the task layer decides whether and where it is shown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TextIO

from checks.units import size_binary


class Bar(Protocol):
    def update(self, n: int) -> None: ...

    def moveto(self, done: int) -> None: ...

    def close(self) -> None: ...


class Progress(Protocol):
    def bar(self, what: str, total: int | None, unit: str, initial: int = 0) -> Bar: ...


class _NullBar:
    def update(self, n: int) -> None:
        return None

    def moveto(self, done: int) -> None:
        return None

    def close(self) -> None:
        return None


class Silent:
    """Show nothing."""

    def bar(self, what: str, total: int | None, unit: str, initial: int = 0) -> Bar:
        return _NullBar()


class _TqdmBar:
    def __init__(self, bar: object) -> None:
        self._bar = bar

    def update(self, n: int) -> None:
        self._bar.update(n)  # type: ignore[attr-defined]

    def moveto(self, done: int) -> None:
        self._bar.update(done - self._bar.n)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._bar.close()  # type: ignore[attr-defined]


class Bars:
    """tqdm bars on ``stream`` with throughput and ETA; silent when tqdm is not installed."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        try:
            import tqdm
        except ImportError:
            self._tqdm = None
        else:
            tqdm.tqdm.monitor_interval = 0  # no monitor thread: the decode workers are spawned from this process
            self._tqdm = tqdm.tqdm

    def bar(self, what: str, total: int | None, unit: str, initial: int = 0) -> Bar:
        if self._tqdm is None:
            return _NullBar()
        scale = unit == "B"
        return _TqdmBar(
            self._tqdm(
                total=total,
                initial=initial,
                desc=what,
                unit=unit,
                unit_scale=scale,
                unit_divisor=1024 if scale else 1000,
                file=self.stream,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        )


class Lines:
    """A progress line through ``say`` at most every ``every_s`` seconds, for a stderr that is not a terminal (a log,
    CI, ``nohup``): what, how far, how fast, how long left. A step done within ``every_s`` says nothing."""

    def __init__(self, say: Callable[[str], None], every_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.say, self.every_s, self.clock = say, every_s, clock

    def bar(self, what: str, total: int | None, unit: str, initial: int = 0) -> Bar:
        return _LineBar(self, what, total, unit, initial)


class _LineBar:
    def __init__(self, lines: Lines, what: str, total: int | None, unit: str, initial: int) -> None:
        self.lines, self.what, self.total, self.unit = lines, what, total, unit
        self.start = self.last = lines.clock()
        self.initial = self.done = initial
        self.spoke = False

    def update(self, n: int) -> None:
        self.moveto(self.done + n)

    def moveto(self, done: int) -> None:
        self.done = done
        now = self.lines.clock()
        if now - self.last >= self.lines.every_s:
            self.last, self.spoke = now, True
            self.lines.say(self._line(now))

    def close(self) -> None:
        if self.spoke:  # a step that said how it went says it ended
            took = self.lines.clock() - self.start
            self.lines.say(f"stage-data: {self.what} done: {_amount(self.done, self.unit)} in {took:.0f} s")

    def _line(self, now: float) -> str:
        rate = (self.done - self.initial) / max(now - self.start, 1e-9)
        done = _amount(self.done, self.unit)
        if self.total:
            count = size_binary(self.done) if self.unit == "B" else f"{self.done:,}"
            done = f"{count} of {_amount(self.total, self.unit)} ({self.done / self.total:.0%})"
        text = f"stage-data: {self.what} {done}"
        text += f", {_amount(round(rate), self.unit)}/s"
        if self.total and rate > 0:
            text += f", about {max(0.0, (self.total - self.done) / rate):.0f} s left"
        return text


def _amount(n: int, unit: str) -> str:
    """``1,234 img``; bytes in binary units (``3.2 GiB``)."""
    return size_binary(n) if unit == "B" else f"{n:,} {unit}"
