"""`speakermem migrate --from sqlite:PATH --to postgresql://...`: copy a SQLite store into
PostgreSQL (memory.maintenance does the copying), with a progress bar, then print the
per-table counts of both sides. Safe to run again: nothing is doubled."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.render import advance, console, err_console, progress_bar


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "migrate",
        help="copy a SQLite store into PostgreSQL (re-runnable, counts verified)",
        description="Copy every table of a SQLite store (messages, vectors, records with their "
        "chains and sources, rosters, policies, preferences, audit log, catch-up cursors) "
        "into a PostgreSQL database with pgvector, keeping every id, then compare the row "
        "counts of each table. The PostgreSQL tables are created on first use. Running it "
        "again writes only what changed in the SQLite file since: nothing is doubled. Stop "
        "the bot while migrating (or run the command once more after stopping it), then set "
        "SPEAKERMEM_DB_URL to the same URL.",
        epilog="example: speakermem migrate --from sqlite:speakermem.db "
        "--to postgresql://speakermem:secret@localhost:5432/speakermem",
    )
    common(p)
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="sqlite:PATH",
        help="the SQLite database file to copy (only read; an older schema is upgraded first, "
        "as the bot does on start)",
    )
    p.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="postgresql://user:password@host:port/database (the database must exist)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1000,
        help="rows per PostgreSQL transaction (default 1000)",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="also delete PostgreSQL rows the SQLite file no longer has (forgotten or expired "
        "since an earlier run). Only before the bot writes to PostgreSQL: its new rows are not "
        "in the SQLite file either",
    )
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(handler="speakermem.integrations.cli.commands_migrate:cmd_migrate")


async def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.memory import maintenance
    from speakermem.memory.engine import StoreError

    if args.batch < 1:
        err_console.print("error: --batch must be at least 1")
        return 2
    try:
        source: Path = maintenance.migration_source(args.source)
    except ImportError as exc:
        err_console.print(
            f"error: migrate needs the PostgreSQL driver ({exc}): "
            "pip install 'speakermem[postgres]'",
            markup=False,
        )
        return 2
    except StoreError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False)
        return 2

    totals: dict[str, int] = {}
    with progress_bar("copying", None) as bar:

        def on_counts(counts: dict[str, int]) -> None:
            totals.update(counts)
            bar.update(bar.task_ids[0], total=sum(counts.values()))

        def on_batch(table: str, n: int) -> None:
            bar.update(bar.task_ids[0], description=f"copying {table}")
            advance(bar, n)

        try:
            report = await maintenance.migrate_into_postgres(
                source,
                args.target,
                batch=args.batch,
                progress=on_batch,
                on_counts=on_counts,
                sqlite_driver=settings.sqlite_driver,
                prune=args.prune,
            )
        except StoreError as exc:
            err_console.print(f"error: {exc}", markup=False, highlight=False)
            return 2

    if args.json:
        console.print_json(
            json.dumps(
                {
                    "source": report.source,
                    "target": report.target,
                    "ok": report.ok,
                    "written": report.written,
                    "seconds": round(report.seconds, 3),
                    "tables": [
                        {
                            "table": t.table,
                            "source": t.source,
                            "target": t.target,
                            "written": t.written,
                            "deleted": t.deleted,
                        }
                        for t in report.tables
                    ],
                }
            )
        )
    else:
        table = Table(title=f"{report.source} -> {report.target}")
        columns = ["table", "sqlite rows", "postgres rows", "written now"]
        if args.prune:
            columns.append("deleted now")
        for column in (*columns, ""):
            table.add_column(column, justify="left" if column == "table" else "right")
        for t in report.tables:
            cells = [t.table, str(t.source), str(t.target), str(t.written)]
            if args.prune:
                cells.append(str(t.deleted))
            table.add_row(*cells, "ok" if t.ok else "[red]MISMATCH[/red]")
        console.print(table)
        if report.ok:
            console.print(
                f"all counts match ({report.written} rows written, {report.seconds:.1f} s)"
            )
    if not report.ok:
        names = ", ".join(t.table for t in report.mismatches())
        err_console.print(
            f"error: row counts differ in {names}. Rows deleted from the SQLite file after an "
            "earlier run stay in PostgreSQL: run again with --prune (before the bot writes to "
            "PostgreSQL), or migrate into an empty database."
        )
        return 1
    return 0
