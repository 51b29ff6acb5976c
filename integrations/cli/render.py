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
