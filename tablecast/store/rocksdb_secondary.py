"""A RocksDB store read by another process than the node's: RocksDB's secondary instance.

A node's read processes (``serve --processes``, :mod:`tablecast.http.readers`)
open each partition's store this way. A secondary instance never writes the
primary's files; it sees the primary's writes up to the moment it last caught up
(:meth:`SecondaryStore.catch_up`, which replays the primary's new log records, a
microsecond when there are none), and between two catch-ups it reads one
unchanging state. The applied offset lives in the same database as the rows and
is written in the same batch (:mod:`tablecast.store.rocksdb`), so every read is
exact at the position it reports, however far behind the primary it is.

A catch-up that finds the primary flushed a memtable opens the store afresh: a
secondary stops reading a write-ahead log once it is flushed, and what it had
read of that log stays in its memtable, hiding the newer values in the file
(the rows, and the applied offset with them) until the primary writes again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rocksdict import AccessType, Rdict

from tablecast.store.base import Record
from tablecast.store.rocksdb import DATA, META, _decode, _options, unpack_meta


class SecondaryStore:
    def __init__(self, path: Path, own_dir: Path) -> None:
        """Open the store at `path` read-only; `own_dir` holds this instance's own log files
        (created here, deleted by :meth:`close`)."""
        self.path = path
        self._own = own_dir
        own_dir.mkdir(parents=True, exist_ok=True)
        self._db = self._open()
        self._closed = False
        self._flushed = self._flush_mark()
        self.applied_offset = self._applied()

    def _open(self) -> Rdict:
        opts = _options()
        opts.create_if_missing(False)  # a store that is not there is not made here
        opts.set_max_open_files(-1)  # a secondary must keep every file it reads open
        return Rdict(str(self.path), opts, access_type=AccessType.secondary(str(self._own)))

    def _flush_mark(self) -> tuple[int | None, int | None]:
        """What changes when the primary's flush reaches the files this instance reads:
        the oldest log still needed, and the files' size."""
        prop = self._db.property_int_value
        return prop("rocksdb.min-log-number-to-keep"), prop("rocksdb.total-sst-files-size")

    def _applied(self) -> int:
        meta = self._db.get(META)
        return -1 if meta is None else unpack_meta(meta)[0]

    def catch_up(self) -> int:
        """Read what the primary wrote since the last catch-up; the applied offset now."""
        self._db.try_catch_up_with_primary()
        mark = self._flush_mark()
        if mark != self._flushed:
            self._db.close()
            self._closed = True
            self._db = self._open()  # raises if the store is gone: the caller closes this
            self._closed = False
            self._flushed = self._flush_mark()
        self.applied_offset = self._applied()
        return self.applied_offset

    def get(self, key: bytes) -> Record | None:
        raw = self._db.get(DATA + key)
        return None if raw is None else _decode(raw)

    def close(self) -> None:
        try:
            if not self._closed:
                self._closed = True
                self._db.close()
        finally:
            shutil.rmtree(self._own, ignore_errors=True)
