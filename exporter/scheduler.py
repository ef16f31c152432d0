"""Runs each collector on its own interval, off the event loop, with a timeout.

A collection runs in a worker thread of its own, so a hung NVML call or a
stuck sysfs read can hold at most one thread per collector: while it is still
running, later ticks are skipped and counted instead of queued. A collection
that outlives its timeout is reported as failed at once and its result, should
it ever arrive, is thrown away. Each outcome replaces an immutable
`CollectorState`, which the exposition reads without locks.

Before its first collection, and while its collections fail or hang, a
collector serves what it keeps itself (`Collector.held`): a GPU held at a reset
stays held through a restart and a hung driver, where serving nothing would let
the page resolve.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, replace

from gpufleet.exporter.collector import Collection, Collector
from gpufleet.exporter.render import render

log = logging.getLogger(__name__)


def _discard(future: asyncio.Future[tuple[Collection, bytes]]) -> None:
    if not future.cancelled():
        future.exception()  # Retrieved, so asyncio does not log it as never retrieved.


@dataclass(frozen=True)
class CollectorState:
    """The latest outcome of one collector, as the self-metrics report it."""

    success: bool = False
    duration_seconds: float = 0.0
    last_success_timestamp: float | None = None
    skipped: int = 0
    body: bytes = b""


class ScheduledCollector:
    def __init__(self, collector: Collector, interval: float, timeout: float) -> None:
        self.collector = collector
        self.name = collector.name
        self.interval = interval
        self.timeout = timeout
        self._problems: tuple[str, ...] = ()
        self.state = CollectorState(body=self._held(hung=False))
        self._running: concurrent.futures.Future[tuple[Collection, bytes]] | None = None

    async def run(self) -> None:
        """Tick forever at a fixed rate; a tick that cannot start is skipped, never delayed."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        while True:
            await self.tick()
            next_tick += self.interval
            now = loop.time()
            if next_tick < now:  # The event loop was starved: skip the ticks that are already past.
                missed = int((now - next_tick) // self.interval) + 1
                next_tick += missed * self.interval
                self._update(replace(self.state, skipped=self.state.skipped + missed))
            await asyncio.sleep(next_tick - now)

    async def tick(self) -> None:
        if self._running is not None and not self._running.done():
            log.debug("collector=%s tick skipped: the previous collection is still running", self.name)
            # Still hung: what the collector keeps may have changed meanwhile (an XID read from the kernel log).
            self._update(replace(self.state, skipped=self.state.skipped + 1, body=self._held(hung=True)))
            return
        started = time.perf_counter()
        self._running = self._start_collection()
        outcome = asyncio.wrap_future(self._running)
        # asyncio.wait, not wait_for: in Python 3.11 wait_for can swallow a cancellation that arrives as the
        # collection completes, and this task would then never stop.
        done, _ = await asyncio.wait({outcome}, timeout=self.timeout)
        if not done:
            outcome.add_done_callback(_discard)  # Its late result, or error, is of no interest any more.
            self._failed(started, f"collection timed out after {self.timeout:g}s; "
                                  "later ticks are skipped until it returns", hung=True)
            return
        try:
            collection, body = outcome.result()
        except Exception as err:  # noqa: BLE001 - a broken collector must not take the exporter down.
            self._failed(started, f"collection failed: {err}")
        else:
            self._succeeded(started, collection, body)

    def collect_now(self) -> None:
        """Collect in the calling thread, for a caller that owns the thread and the timing (the simulator)."""
        started = time.perf_counter()
        try:
            collection, body = self._collect_and_render()
        except TimeoutError as err:  # A simulated call that would have outlived the timeout.
            self._failed(started, f"collection timed out: {err}", hung=True)
        except Exception as err:  # noqa: BLE001 - as in tick().
            self._failed(started, f"collection failed: {err}")
        else:
            self._succeeded(started, collection, body)

    def start(self) -> None:
        self.collector.start()

    def stop(self) -> None:
        self.collector.stop()

    def close(self) -> None:
        self.collector.close()

    def _start_collection(self) -> concurrent.futures.Future[tuple[Collection, bytes]]:
        """Run one collection in a fresh daemon thread, so a hung call never blocks exit."""
        future: concurrent.futures.Future[tuple[Collection, bytes]] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self._collect_and_render())
            except BaseException as err:  # noqa: BLE001 - handed to the event loop, which logs it.
                future.set_exception(err)

        threading.Thread(target=work, name=f"collector-{self.name}", daemon=True).start()
        return future

    def _collect_and_render(self) -> tuple[Collection, bytes]:
        collection = self.collector.collect()
        return collection, render(collection.families)

    def _succeeded(self, started: float, collection: Collection, body: bytes) -> None:
        self._report(collection.problems)
        ok = not collection.problems
        self._update(
            CollectorState(
                success=ok,
                duration_seconds=time.perf_counter() - started,
                last_success_timestamp=time.time() if ok else self.state.last_success_timestamp,
                skipped=self.state.skipped,
                body=body,
            )
        )

    def _failed(self, started: float, message: str, hung: bool = False) -> None:
        self._report((message,))
        # A failed collection serves no values, stale numbers would look like live ones: only what the collector
        # keeps itself.
        self._update(replace(self.state, success=False, duration_seconds=time.perf_counter() - started,
                             body=self._held(hung)))

    def _held(self, hung: bool) -> bytes:
        try:
            return render(self.collector.held(hung).families)
        except Exception:  # A broken collector's fallback must not take the exporter down: it is logged.
            log.exception("collector=%s: what it holds cannot be served", self.name)
            return b""

    def _report(self, problems: tuple[str, ...]) -> None:
        """Log problems when they change, not every tick, so a missing driver is one line, not thousands."""
        for problem in problems:
            if problem not in self._problems:
                log.warning("collector=%s %s", self.name, problem)
        if self._problems and not problems:
            log.info("collector=%s recovered", self.name)
        self._problems = problems

    def _update(self, state: CollectorState) -> None:
        self.state = state
