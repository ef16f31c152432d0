"""What the exporter remembers across restarts and upgrades: XID counts, the recovery action each GPU is held
at, the InfiniBand ports that have been ACTIVE. Without it, a restart would count XIDs from nothing and
resolve the page of a GPU that still needs its reset.

One small JSON file in `--path.state`, one section per collector, written atomically (a temporary file,
fsync, rename, fsync of the directory) whenever a section changes. A file that cannot be read or written
(corrupt, truncated, from another version, a read-only directory) gets one log line and
`gpufleet_exporter_state_ok` 0; the exporter starts empty or stops saving, and keeps serving.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

FILE = "gpufleet-exporter-state.json"
VERSION = 1
Section = dict[str, Any]


class StateError(Exception):
    """The state cannot be read or written; the message says what and why."""


class Store(Protocol):
    def load(self) -> dict[str, Any] | None:
        """The last saved state, None where there is none yet; raises StateError where it cannot be read."""

    def save(self, data: dict[str, Any]) -> None:
        """Replace the saved state; raises StateError where it cannot."""


class FileStore:
    """The state in one file of `directory`, replaced atomically: a crash leaves the old file or the new one."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE

    def load(self) -> dict[str, Any] | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StateError(f"cannot read {self.path}: {err.strerror or err}") from None
        try:
            data = json.loads(text)
        except ValueError as err:
            raise StateError(f"{self.path} is not valid JSON ({err}); starting empty") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("sections"), dict):
            raise StateError(f"{self.path} is not a version {VERSION} gpufleet state file; starting empty")
        return data

    def save(self, data: dict[str, Any]) -> None:
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=".state-", dir=self.directory)
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    out.write(text)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as err:
            raise StateError(f"cannot write {self.path}: {err.strerror or err}") from None


class MemoryStore:
    """The state kept in this process, for the simulator, whose nodes' exporters restart within it."""

    def __init__(self) -> None:
        self.data: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.data)

    def save(self, data: dict[str, Any]) -> None:
        self.data = copy.deepcopy(data)


class PersistentState:
    """The sections the collectors keep, loaded once at start and saved whenever one changes.

    Without a store (no `--path.state`) nothing is kept, and the exporter behaves as it always did.
    """

    def __init__(self, store: Store | None = None) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._sections: dict[str, Section] = {}
        self.load_ok = self.save_ok = True
        self.ignored_entries = 0
        if store is None:
            return
        try:
            data = store.load() or {}
        except StateError as err:
            log.warning("%s", err)
            self.load_ok = False
            data = {}
        sections = data.get("sections", {})
        self._sections = {name: section for name, section in sections.items() if isinstance(section, dict)}

    def section(self, name: str) -> Section:
        """A copy of what the collector `name` saved, empty where nothing was."""
        with self._lock:
            return copy.deepcopy(self._sections.get(name, {}))

    def update(self, name: str, section: Section) -> None:
        """Replace one collector's section, and save the whole state if it changed."""
        if self.store is None:
            return
        with self._lock:
            if self._sections.get(name) == section:
                return
            self._sections[name] = copy.deepcopy(section)
            data = {"version": VERSION, "sections": self._sections}
            try:
                self.store.save(data)
            except StateError as err:
                if self.save_ok:  # Once, when saving starts to fail; again once it works.
                    log.warning("%s; the state is kept in memory only", err)
                self.save_ok = False
            else:
                if not self.save_ok:
                    log.info("the state is saved again")
                self.save_ok = True

    def ignored(self, entries: int) -> None:
        """A collector dropped entries of the loaded state that do not apply to this node."""
        with self._lock:
            self.ignored_entries += entries

    def families(self) -> list[Metric]:
        """Whether the state loaded and saves, where the exporter keeps one."""
        if self.store is None:
            return []
        ok = GaugeMetricFamily("gpufleet_exporter_state_ok",
                               "1 when the exporter's state file last loaded (at start) or saved without error.",
                               labels=("operation",))
        ok.add_metric(["load"], 1.0 if self.load_ok else 0.0)
        ok.add_metric(["save"], 1.0 if self.save_ok else 0.0)
        ignored = GaugeMetricFamily("gpufleet_exporter_state_ignored_entries",
                                    "Entries of the loaded state that name what this node does not have (replaced "
                                    "GPUs, or another host's file), and were dropped.")
        ignored.add_metric([], float(self.ignored_entries))
        return [ok, ignored]
