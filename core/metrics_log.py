"""A run's durable metrics log: Parquet parts in `<run>/metrics/` on any pyarrow filesystem.

The log is a sequence of records (dicts with an integer "step"; training records carry "loss",
"lr", ..., eval records "eval_*" fields). One writer (the Ray driver, or rank 0 of a local run)
appends them in batches; any number of readers, on any machine, read it at any time.

Layout. Every file is an immutable part, named

    part-<generation>-<writer>-<first batch>-<last batch>.parquet

A *generation* is one complete version of the log, owned by one `MetricsWriter`: batch 0 is the
history a `rewind()` started it from, batches 1, 2, ... are what was appended since. The
generation number is a millisecond timestamp raised past every generation already in the
folder, and the writer part is a random id, so two generations never share a name.

Rewind. A run that (re)starts from a checkpoint at step S calls `rewind(history)` with the
records that checkpoint holds. That starts a new generation whose batch 0 is exactly `history`;
once it is in place, every older generation is deleted. The checkpoint's history is the
authority: it holds records a dead writer never flushed and none past S, so records the
previous attempt wrote after S disappear, and the switch is one atomic file commit. Parts of a
superseded generation that a lingering writer of an earlier attempt still writes are never read.

Readers use the newest generation that has its batch 0, and nothing else, so a step never
appears twice across restarts. Within a generation, when 16 trailing parts have the same size
they are merged into one part covering their batch range (then deleted): a long run keeps a
few dozen files, not one per flush. A reader takes, from batch 0 on, the widest part starting at
each batch, so a merged part and the parts it replaced are never both read. A part that vanished
between listing and reading (merged or rewound away) makes the reader list again.

Half-written files. A part is written under a temporary name (`.tmp-<name>`) and moved into
place, an atomic rename on local disks, NFS and HDFS; on object stores (s3, gs, Azure) an object
appears only when its upload completes, so parts are written in place there. Readers ignore
every name that is not a part, so a writer killed mid-write leaves nothing they read; the next
rewind deletes its leftovers. A part that is nevertheless unreadable (a machine that crashed
before its disk caught up) is skipped with a warning rather than making the log unreadable.

Schemas may differ between parts (fields that only some models log, eval fields): reading
unifies them, a field a part lacks reading as null, an integer field promoted to float where
another part logged floats. Runs logged before this log existed kept `<run>/metrics.jsonl`;
readers fall back to it when `<run>/metrics/` holds no generation.
"""

from __future__ import annotations

import json
import logging
import operator
import posixpath
import re
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from core import records, storage

log = logging.getLogger("workers")

MERGE_FANOUT = 16  # this many equal-sized trailing parts become one
READ_ATTEMPTS = 6  # listings taken while the writer merged or rewound: list again, with backoff
TEMP_PREFIX = ".tmp-"
# object stores publish an object only when its upload completes; elsewhere: temporary name + rename
PUBLISHED_ON_CLOSE = {"s3", "gcs", "abfs"}
_PART = re.compile(r"part-(\d+)-([0-9a-f]+)-(\d+)-(\d+)\.parquet")


@dataclass(frozen=True)
class Part:
    generation: int
    writer: str
    first: int  # batch numbers: 0 is the rewind's history
    last: int

    @property
    def name(self) -> str:
        return f"part-{self.generation:013d}-{self.writer}-{self.first:06d}-{self.last:06d}.parquet"

    @property
    def owner(self) -> tuple[int, str]:
        return self.generation, self.writer

    @property
    def batches(self) -> int:
        return self.last - self.first + 1

    @classmethod
    def parse(cls, name: str) -> Part | None:
        match = _PART.fullmatch(name)
        if match is None:
            return None
        generation, writer, first, last = match.groups()
        return cls(int(generation), writer, int(first), int(last))


class _ListAgain(Exception):
    """The listing showed a generation with a batch missing: it was taken mid-merge."""


def _metrics_dir(run_uri: str) -> tuple[pafs.FileSystem, str, str]:
    uri = storage.join(run_uri, "metrics")
    fs, path = storage.resolve(uri)
    return fs, path, uri


def _names(fs: pafs.FileSystem, directory: str) -> list[str]:
    try:
        infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File]


def _parts(names: list[str]) -> list[Part]:
    return [p for p in map(Part.parse, names) if p is not None]


def visible_parts(parts: list[Part]) -> tuple[list[Part], bool]:
    """The parts a reader reads, in batch order: the newest generation that has its batch 0,
    each batch once; and whether a batch is missing from the listing."""
    committed = [p.owner for p in parts if p.first == 0]
    if not committed:
        return [], False
    newest = max(committed)
    # at each batch the widest part first: a merged part hides the parts it replaced
    candidates = sorted((p for p in parts if p.owner == newest), key=lambda p: (p.first, -p.last))
    chosen, next_batch, gap = [], 0, False
    for part in candidates:
        if part.first < next_batch:
            continue
        gap |= part.first > next_batch
        chosen.append(part)
        next_batch = part.last + 1
    return chosen, gap


def _column(name: str, values: list) -> pa.Array:
    if name == "step":
        return pa.array(values, pa.int64())
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds of value: keep them as text
        return pa.array(
            [v if v is None or isinstance(v, str) else json.dumps(v, default=str) for v in values],
            pa.string(),
        )


def records_table(records: list[dict]) -> pa.Table:
    """Records -> a table with a column per field any record has ("step" first), nulls where
    a record lacks the field."""
    names = ["step"] + [n for n in dict.fromkeys(k for r in records for k in r) if n != "step"]
    return pa.table({n: _column(n, [r.get(n) for r in records]) for n in names})


def _check_steps(records: list[dict]) -> None:
    """Checked when a record arrives: a bad one must not stay in the buffer, failing every write."""
    for r in records:
        step = r.get("step")
        try:
            operator.index(step)  # ints, numpy ints; not floats, not None
        except TypeError:
            raise ValueError(f"a metrics record needs an integer 'step': {r!r}") from None


def _unify(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive") if tables else records_table([])


def _ordered(table: pa.Table) -> pa.Table:
    """Sorted by step, training records before eval records of the same step, else as written."""
    is_eval = pa.array([False] * table.num_rows, pa.bool_())
    for name in table.column_names:
        if records.is_eval_field(name):
            is_eval = pc.or_(is_eval, pc.is_valid(table[name]))
    keys = pa.table({"step": table["step"], "eval": is_eval, "order": pa.array(range(table.num_rows))})
    return table.take(pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in keys.column_names]))


def _read_part(fs: pafs.FileSystem, directory: str, part: Part) -> pa.Table:
    with fs.open_input_file(posixpath.join(directory, part.name)) as source:
        return pq.read_table(source)


def _read_parts(fs: pafs.FileSystem, directory: str, parts: list[Part]) -> list[pa.Table]:
    tables = []
    for part in parts:
        try:
            tables.append(_read_part(fs, directory, part))
        except pa.ArrowInvalid as err:  # not Parquet: a machine crashed before its disk caught up
            log.warning("metrics log: skipping unreadable part %s (%s)", part.name, err)
    return tables


def _legacy_jsonl(run_uri: str) -> pa.Table | None:
    """Runs logged before the Parquet log kept `<run>/metrics.jsonl`."""
    fs, path = storage.resolve(storage.join(run_uri, "metrics.jsonl"))
    try:
        with fs.open_input_stream(path) as source:
            text = source.read().decode()
    except (FileNotFoundError, NotADirectoryError):
        return None
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a writer that died
            continue
    return records_table([r for r in records if isinstance(r, dict) and r.get("step") is not None])


def metrics_table(run_uri: str) -> pa.Table:
    """The run's log as one table, each record once, ordered by (step, training before eval).

    Raises FileNotFoundError when the run has no metrics log."""
    fs, directory, uri = _metrics_dir(run_uri)
    for attempt in range(READ_ATTEMPTS):
        final = attempt == READ_ATTEMPTS - 1
        try:
            parts, gap = visible_parts(_parts(_names(fs, directory)))
            if gap:
                if not final:
                    raise _ListAgain()
                log.warning("metrics log %s: some batches are missing; reading the others", uri)
            if not parts:
                break
            return _ordered(_unify(_read_parts(fs, directory, parts)))
        except (_ListAgain, FileNotFoundError):
            if final:
                raise
            time.sleep(0.02 * 2**attempt)
    legacy = _legacy_jsonl(run_uri)
    if legacy is not None:
        return _ordered(legacy)
    raise FileNotFoundError(f"nothing logged in {uri}")


def read_metrics(run_uri: str) -> list[dict]:
    """Every record once, ordered by (step, training before eval); fields a record lacks are absent."""
    return [{k: v for k, v in row.items() if v is not None} for row in metrics_table(run_uri).to_pylist()]


class MetricsWriter:
    """Appends a run's records to `<run_uri>/metrics/` in batches; one per run at a time.

    `rewind(history)` first (at every start of the run, `[]` for a fresh one), then `append`.
    `append` writes when `flush_every_s` has passed since the last write and never raises for
    storage errors (the batch stays buffered and is tried again); `rewind` and `flush` do raise,
    keeping what they could not write for the next try. Not thread-safe: one caller thread."""

    def __init__(self, run_uri: str, flush_every_s: float = 5.0):
        self.fs, self.directory, self.uri = _metrics_dir(run_uri)
        self.flush_every_s = flush_every_s
        self.writer = uuid.uuid4().hex[:8]
        self.generation: int | None = None
        self.parts: list[Part] = []  # this generation's parts, in batch order
        self.buffer: list[dict] = []
        self.pending_history: pa.Table | None = None  # batch 0, until it is written
        self.last_write = time.monotonic()
        self.publish_on_close = self.fs.type_name in PUBLISHED_ON_CLOSE

    def rewind(self, history: list[dict]) -> None:
        """From now on the log holds exactly `history`, then what is appended."""
        _check_steps(history)
        self.fs.create_dir(self.directory, recursive=True)
        newest = max((p.generation for p in _parts(self._names_with_temporaries())), default=0)
        self.generation = max(time.time_ns() // 1_000_000, newest + 1, (self.generation or 0) + 1)
        self.parts, self.buffer = [], []
        self.pending_history = records_table(history)
        self.flush()

    def append(self, records: list[dict]) -> None:
        if self.generation is None:
            raise RuntimeError("MetricsWriter.append before rewind(): the log's start is unknown")
        _check_steps(records)
        self.buffer.extend(records)
        if time.monotonic() - self.last_write >= self.flush_every_s:
            try:
                self.flush()
            except OSError as err:
                log.warning("metrics log %s: cannot write (%s); trying again later", self.uri, err)
                self.last_write = time.monotonic()

    def flush(self) -> None:
        """Write what is buffered now."""
        if self.generation is None:
            return
        if self.pending_history is not None:
            base = Part(self.generation, self.writer, 0, 0)
            self._commit(base, self.pending_history)
            self.pending_history, self.parts = None, [base]
            self._delete_older_generations()
        if self.buffer:
            batch = self.parts[-1].last + 1
            part = Part(self.generation, self.writer, batch, batch)
            self._commit(part, records_table(self.buffer))
            self.buffer = []
            self.parts.append(part)
            self._merge()
        self.last_write = time.monotonic()

    # -- files ------------------------------------------------------------------------------

    def _names_with_temporaries(self) -> list[str]:
        return [n.removeprefix(TEMP_PREFIX) for n in _names(self.fs, self.directory)]

    def _commit(self, part: Part, table: pa.Table) -> None:
        path = posixpath.join(self.directory, part.name)
        if self.publish_on_close:
            with self.fs.open_output_stream(path) as out:
                pq.write_table(table, out)
            return
        temporary = posixpath.join(self.directory, TEMP_PREFIX + part.name)
        with self.fs.open_output_stream(temporary) as out:
            pq.write_table(table, out)
        self.fs.move(temporary, path)

    def _delete(self, name: str) -> None:
        try:
            self.fs.delete_file(posixpath.join(self.directory, name))
        except FileNotFoundError:
            pass
        except OSError as err:  # left behind: readers never read it, the next rewind retries
            log.warning("metrics log %s: cannot delete %s (%s)", self.uri, name, err)

    def _delete_older_generations(self) -> None:
        """Parts and leftover temporary files of every generation this one replaced."""
        mine = (self.generation, self.writer)
        for name in _names(self.fs, self.directory):
            part = Part.parse(name.removeprefix(TEMP_PREFIX))
            if part is not None and part.owner < mine:
                self._delete(name)

    def _merge(self) -> None:
        """Equal-sized trailing parts -> one part; then the merged ones go."""
        while len(self.parts) >= MERGE_FANOUT and len({p.batches for p in self.parts[-MERGE_FANOUT:]}) == 1:
            group = self.parts[-MERGE_FANOUT:]
            merged = Part(self.generation, self.writer, group[0].first, group[-1].last)
            try:
                table = _unify([_read_part(self.fs, self.directory, p) for p in group])
                self._commit(merged, table)
            except (OSError, pa.ArrowException) as err:  # the small parts still read correctly
                log.warning("metrics log %s: cannot merge parts (%s)", self.uri, err)
                return
            self.parts[-MERGE_FANOUT:] = [merged]
            for part in group:
                self._delete(part.name)
