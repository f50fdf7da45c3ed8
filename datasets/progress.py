"""Progress reporting seam: the library reports, the task layer decides whether and where it is shown."""

from __future__ import annotations

from typing import Protocol, TextIO


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
