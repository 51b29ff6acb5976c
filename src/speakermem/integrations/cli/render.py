"""Terminal rendering shared by the CLI commands (rich tables and progress bars)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console()
err_console = Console(stderr=True)


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Progress]:
    """A progress bar on stderr that stays quiet when stderr is not a terminal."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        disable=not err_console.is_terminal,
    )
    with progress:
        progress.add_task(label, total=total)
        yield progress


def advance(progress: Progress, n: int) -> None:
    progress.advance(progress.task_ids[0], n)


def fmt_time(ts: datetime | None) -> str:
    return "-" if ts is None else ts.strftime("%Y-%m-%d %H:%M")


class MigrationBars:
    """Progress bars for the re-indexing a migration does while the store opens (one bar
    per table, drawn on first news; quiet when stderr is not a terminal)."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, what: str, done: int, total: int) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]re-indexing {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
                disable=not err_console.is_terminal,
            )
            self._progress.start()
        if what not in self._tasks:
            self._tasks[what] = self._progress.add_task(what, total=total)
        self._progress.update(self._tasks[what], completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
