"""A deterministic synthetic DuckLake catalog with DuckLake's shapes.

* Tables 1..T (T = mappings / 100, at least 20) own Zipf-skewed shares of the mappings
  (weight k^-1.2 for the k-th largest; which table id gets which weight is shuffled).
* Ids come from one counter, DuckLake's `next_file_id`: a mapping takes an id, then its data file
  the next; files with a NULL `mapping_id` (DuckLake's own writes, 20% on top) take ids from the
  same counter, interleaved at random, so tables interleave over time.
* Each table has a real column tree (`id`-like primitives, STRUCTs, LISTs whose element is
  `list`, MAPs with `key`/`value`, two hive partition columns) with field ids 1..F in pre-order.
  A mapping is one file layout of its table: 6-20 name rows (mean about 11.7), a pre-order
  depth-first walk over a subset of the table's columns in the file's own order, `column_id`
  0-based, `parent_column` NULL for roots, and on about 30% of the layouts one or two hive
  partition columns appended last with `is_partition` true. Each table has a few layouts
  (8, plus one per 2,000 mappings it owns) that its mappings reuse in turn: row counts and
  shapes are what matter to the benchmark, and a server must not dedup mappings anyway.
* Data files carry all 16 columns of DuckLake 0.3's `ducklake_data_file`, with absolute paths,
  `file_format` 'parquet' and the file's `table_id` equal to its mapping's.

Generation is seeded and never depends on hash order, so a seed always gives the same rows.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc

BIGINT, VARCHAR, BOOLEAN = pa.int64(), pa.utf8(), pa.bool_()

# DuckLake 0.3's tables, exactly: names, order and types.
COLUMN_MAPPING_SCHEMA = pa.schema([
    ("mapping_id", BIGINT), ("table_id", BIGINT), ("type", VARCHAR)])
NAME_MAPPING_SCHEMA = pa.schema([
    ("mapping_id", BIGINT), ("column_id", BIGINT), ("source_name", VARCHAR),
    ("target_field_id", BIGINT), ("parent_column", BIGINT), ("is_partition", BOOLEAN)])
DATA_FILE_SCHEMA = pa.schema([
    ("data_file_id", BIGINT), ("table_id", BIGINT), ("begin_snapshot", BIGINT),
    ("end_snapshot", BIGINT), ("file_order", BIGINT), ("path", VARCHAR),
    ("path_is_relative", BOOLEAN), ("file_format", VARCHAR), ("record_count", BIGINT),
    ("file_size_bytes", BIGINT), ("footer_size", BIGINT), ("row_id_start", BIGINT),
    ("partition_id", BIGINT), ("encryption_key", VARCHAR), ("partial_file_info", VARCHAR),
    ("mapping_id", BIGINT)])
# DuckLake's mapping load: the join's columns, in the query's order.
LOAD_SCHEMA = pa.schema([
    ("mapping_id", BIGINT), ("table_id", BIGINT), ("type", VARCHAR), ("column_id", BIGINT),
    ("source_name", VARCHAR), ("target_field_id", BIGINT), ("parent_column", BIGINT),
    ("is_partition", BOOLEAN)])

MAPPING_TYPE = "map_by_name"
ZIPF_EXPONENT = 1.2
EXTRA_FILE_SHARE = 0.2
LAYOUTS_PER_TABLE = 8
MAPPINGS_PER_EXTRA_LAYOUT = 2000
MIN_NAME_ROWS, MAX_NAME_ROWS = 6, 20
# Name-row count of a layout: 6 + floor(15 * u^1.42) for u uniform in [0, 1): mean about 11.7.
_SIZE_EXPONENT = 1.42
PARTITIONED_SHARE = 0.3
MIN_PRIMITIVE_ROOTS = MAX_NAME_ROWS  # enough that any layout size fills exactly (see _layout)

ROOT_NAMES = (
    "id", "customer_id", "order_id", "account_id", "user_id", "session_id", "event_id",
    "event_type", "event_time", "created_at", "updated_at", "deleted_at", "amount", "currency",
    "price", "quantity", "discount", "tax", "total", "status", "country", "city", "zip_code",
    "latitude", "longitude", "email", "phone", "first_name", "last_name", "full_name", "title",
    "description", "category", "subcategory", "sku", "product_id", "store_id", "device_id",
    "ip_address", "user_agent", "referrer", "campaign", "channel", "score", "rank", "is_active",
    "is_deleted", "version", "checksum", "source", "batch_id", "ingested_at", "partition_key",
    "revenue", "cost", "margin", "weight", "height", "width", "depth", "color", "size", "brand",
    "vendor_id", "warehouse_id", "shipment_id", "tracking_number", "carrier", "eta",
    "delivered_at", "payment_method", "card_type", "last4", "invoice_id", "due_date",
    "paid_at", "notes", "tags", "language", "timezone", "locale", "os", "browser",
    "screen_width", "screen_height", "duration_ms", "bytes_sent", "bytes_received",
    "http_status", "path", "query", "fragment",
)
STRUCT_NAMES = ("address", "geo", "payload", "metadata", "attributes", "billing", "shipping",
                "device", "context", "properties", "stats", "dimensions", "audit", "origin")
COLLECTION_NAMES = ("items", "tags_list", "events", "line_items", "labels", "scores",
                    "history", "variants", "options", "segments", "features", "counters")
CHILD_NAMES = ("street", "city", "zip", "lat", "lon", "amount", "currency", "code", "name",
               "value", "id", "ts", "kind", "count", "unit", "label", "min", "max", "avg",
               "first", "last", "flag")
PARTITION_NAMES = (("year", "month"), ("dt", "region"), ("country", "day"),
                   ("event_date", "tenant"), ("year", "region"), ("ds", "hour"))


@dataclass(frozen=True)
class Column:
    """One node of a table's column tree; `field_id` is the table's (`ducklake_column`)."""
    name: str
    field_id: int
    children: Tuple["Column", ...] = ()

    @property
    def rows(self) -> int:
        """Name rows this column and its subtree take in a mapping."""
        return 1 + sum(child.rows for child in self.children)


@dataclass(frozen=True)
class TableSchema:
    table_id: int
    roots: Tuple[Column, ...]
    partitions: Tuple[Column, Column]


# One layout's name rows (without mapping_id): (column_id, source_name, target_field_id,
# parent_column, is_partition), in pre-order.
LayoutRows = List[Tuple[int, str, int, Optional[int], bool]]


def layout_size(u: float) -> int:
    """The name-row count at quantile `u` in [0, 1) of the layout size distribution."""
    return MIN_NAME_ROWS + min(MAX_NAME_ROWS - MIN_NAME_ROWS,
                               int((MAX_NAME_ROWS - MIN_NAME_ROWS + 1) * u ** _SIZE_EXPONENT))


def table_schema(seed: int, table_id: int) -> TableSchema:
    """Table `table_id`'s columns: at least MIN_PRIMITIVE_ROOTS primitives plus nested ones,
    field ids 1..F in pre-order over the table's column order, then two partition columns."""
    rng = random.Random(f"{seed}:schema:{table_id}")
    next_field = [1]

    def fid() -> int:
        value = next_field[0]
        next_field[0] += 1
        return value

    def children(count: int) -> List[str]:
        return rng.sample(CHILD_NAMES, count)

    # Plan first (names and kinds), then number the fields in the table's column order.
    primitive_count = MIN_PRIMITIVE_ROOTS + rng.randrange(9)
    names = list(rng.sample(ROOT_NAMES, min(primitive_count, len(ROOT_NAMES))))
    names += [f"col_{i}" for i in range(len(names), primitive_count)]
    plans: List[Tuple[str, str]] = [("primitive", name) for name in names]
    for kind in rng.sample(("struct", "list", "map", "struct", "list_struct", "map_struct"),
                           2 + rng.randrange(4)):
        pool = STRUCT_NAMES if kind == "struct" else COLLECTION_NAMES
        taken = {name for _, name in plans}
        plans.append((kind, next(n for n in rng.sample(pool, len(pool)) if n not in taken)))
    rng.shuffle(plans)

    def build(kind: str, name: str) -> Column:
        field_id = fid()  # parent before children: pre-order field ids
        if kind == "primitive":
            return Column(name, field_id)
        if kind == "struct":
            return Column(name, field_id, tuple(Column(c, fid()) for c in
                                                children(2 + rng.randrange(3))))
        if kind == "list":
            return Column(name, field_id, (Column("list", fid()),))
        if kind == "list_struct":
            element_id = fid()
            element = Column("list", element_id, tuple(Column(c, fid()) for c in children(2)))
            return Column(name, field_id, (element,))
        if kind == "map":
            return Column(name, field_id, (Column("key", fid()), Column("value", fid())))
        if kind == "map_struct":
            key = Column("key", fid())
            value_id = fid()
            value = Column("value", value_id, tuple(Column(c, fid()) for c in children(2)))
            return Column(name, field_id, (key, value))
        raise AssertionError(kind)

    roots = tuple(build(kind, name) for kind, name in plans)
    taken = {root.name for root in roots}
    first, second = rng.choice(PARTITION_NAMES)
    first = first if first not in taken else f"{first}_part"
    second = second if second not in taken else f"{second}_part"
    return TableSchema(table_id, roots, (Column(first, fid()), Column(second, fid())))


def layout(schema: TableSchema, rng: random.Random, size: int, partitions: int) -> LayoutRows:
    """A file layout of `size` name rows: file columns in the file's own (random) order, then
    `partitions` hive partition columns. Roots are taken greedily in a random order while they
    fit; as every table has at least MAX_NAME_ROWS primitive roots, the fill is always exact."""
    file_rows = size - partitions
    order = list(schema.roots)
    rng.shuffle(order)
    chosen: List[Column] = []
    left = file_rows
    for root in order:
        if root.rows <= left:
            chosen.append(root)
            left -= root.rows
            if left == 0:
                break
    assert left == 0, "a table has fewer primitive roots than a layout's rows"

    rows: LayoutRows = []

    def walk(column: Column, parent: Optional[int]) -> None:
        column_id = len(rows)
        rows.append((column_id, column.name, column.field_id, parent, False))
        for child in column.children:
            walk(child, column_id)

    for root in chosen:
        walk(root, None)
    for column in schema.partitions[:partitions]:
        rows.append((len(rows), column.name, column.field_id, None, True))
    return rows


def partition_count(rng: random.Random) -> int:
    return 0 if rng.random() >= PARTITIONED_SHARE else 1 + rng.randrange(2)


def apportion(total: int, weights: Sequence[float]) -> List[int]:
    """`total` split by `weights` (largest remainder), every share at least 1."""
    if total < len(weights):
        raise ValueError(f"cannot give each of {len(weights)} tables one of {total} mappings")
    scale = total / sum(weights)
    exact = [w * scale for w in weights]
    shares = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    i = 0
    while sum(shares) < total:
        shares[by_remainder[i % len(weights)]] += 1
        i += 1
    while sum(shares) > total:  # minimums pushed it over: take from the largest
        largest = max(range(len(shares)), key=lambda j: (shares[j], -j))
        shares[largest] -= 1
    return shares


def _int64(values: array) -> pa.Array:
    """An int64 Arrow array over an `array('q')`, without copying through Python ints."""
    return pa.Array.from_buffers(BIGINT, len(values), [None, pa.py_buffer(values)])


class _Templates:
    """Layouts stored once, as columns; mappings refer to them by id (a row range)."""

    def __init__(self) -> None:
        self.column_id = array("q")
        self.source_name: List[str] = []
        self.target_field_id = array("q")
        self.parent_column: List[Optional[int]] = []
        self.is_partition: List[bool] = []
        self.start = array("q")
        self.length = array("q")

    def add(self, rows: LayoutRows) -> int:
        self.start.append(len(self.column_id))
        self.length.append(len(rows))
        for column_id, name, target, parent, partition in rows:
            self.column_id.append(column_id)
            self.source_name.append(name)
            self.target_field_id.append(target)
            self.parent_column.append(parent)
            self.is_partition.append(partition)
        return len(self.start) - 1

    def table(self) -> pa.Table:
        return pa.table({
            "column_id": _int64(self.column_id),
            "source_name": pa.array(self.source_name, VARCHAR),
            "target_field_id": _int64(self.target_field_id),
            "parent_column": pa.array(self.parent_column, BIGINT),
            "is_partition": pa.array(self.is_partition, BOOLEAN),
        })


class _Builder:
    """Collects mappings and data files in id order, then builds DuckLake's three tables."""

    def __init__(self, seed_key: str, templates: _Templates, next_id: int, next_snapshot: int,
                 row_id_next: Optional[Dict[int, int]] = None):
        self.rng = random.Random(seed_key)
        self.templates = templates
        self.next_id = next_id
        self.next_snapshot = next_snapshot
        self.row_id_next = row_id_next if row_id_next is not None else {}
        self.mapping_id = array("q")
        self.mapping_table = array("q")
        self.mapping_rows = array("q")
        self.name_mapping_id = array("q")
        self.name_table_id = array("q")
        self.take = array("q")
        self.file_id = array("q")
        self.file_table = array("q")
        self.file_snapshot = array("q")
        self.file_path: List[str] = []
        self.file_records = array("q")
        self.file_size = array("q")
        self.file_footer = array("q")
        self.file_row_start = array("q")
        self.file_partition: List[Optional[int]] = []
        self.file_mapping: List[Optional[int]] = []

    def _id(self) -> int:
        value = self.next_id
        self.next_id += 1
        return value

    def _file(self, table_id: int, mapping_id: Optional[int], snapshot: int) -> None:
        rng = self.rng
        file_id = self._id()
        records = 1000 + rng.getrandbits(22)
        footer = 2048 + rng.getrandbits(15)
        start = self.row_id_next.get(table_id, 0)
        self.row_id_next[table_id] = start + records
        if mapping_id is None:  # written by DuckLake itself
            path = f"/srv/lake/main/t{table_id:05d}/ducklake-{rng.getrandbits(96):024x}.parquet"
            self.file_partition.append(None if rng.random() < 0.5 else rng.randrange(8))
        else:  # registered by ducklake_add_data_files
            path = (f"/srv/lake/external/t{table_id:05d}/part-{file_id:09d}-"
                    f"{rng.getrandbits(48):012x}.parquet")
            self.file_partition.append(None)
        self.file_id.append(file_id)
        self.file_table.append(table_id)
        self.file_snapshot.append(snapshot)
        self.file_path.append(path)
        self.file_records.append(records)
        self.file_size.append(records * (8 + rng.getrandbits(5)) + footer)
        self.file_footer.append(footer)
        self.file_row_start.append(start)
        self.file_mapping.append(mapping_id)

    def mapping_with_file(self, table_id: int, template: int) -> int:
        """One DuckLake commit of `ducklake_add_data_files`: a new mapping, then its file."""
        snapshot = self.next_snapshot
        self.next_snapshot += 1
        mapping_id = self._id()
        start = self.templates.start[template]
        rows = self.templates.length[template]
        self.mapping_id.append(mapping_id)
        self.mapping_table.append(table_id)
        self.mapping_rows.append(rows)
        self.name_mapping_id.extend(_repeat(mapping_id, rows))
        self.name_table_id.extend(_repeat(table_id, rows))
        self.take.extend(range(start, start + rows))
        self._file(table_id, mapping_id, snapshot)
        return mapping_id

    def plain_file(self, table_id: int) -> None:
        """One DuckLake-written file (an INSERT): NULL mapping_id, its own commit."""
        snapshot = self.next_snapshot
        self.next_snapshot += 1
        self._file(table_id, None, snapshot)

    def build(self) -> "Batch":
        mappings = len(self.mapping_id)
        files = len(self.file_id)
        column_mapping = pa.Table.from_arrays(
            [_int64(self.mapping_id), _int64(self.mapping_table),
             pa.repeat(pa.scalar(MAPPING_TYPE, VARCHAR), mappings)],
            schema=COLUMN_MAPPING_SCHEMA)
        body = self.templates.table().take(_int64(self.take))
        name_mapping = pa.Table.from_arrays(
            [_int64(self.name_mapping_id)] + body.columns, schema=NAME_MAPPING_SCHEMA)
        data_file = pa.Table.from_arrays([
            _int64(self.file_id), _int64(self.file_table), _int64(self.file_snapshot),
            pa.nulls(files, BIGINT), pa.nulls(files, BIGINT), pa.array(self.file_path, VARCHAR),
            pa.repeat(pa.scalar(False, BOOLEAN), files),
            pa.repeat(pa.scalar("parquet", VARCHAR), files),
            _int64(self.file_records), _int64(self.file_size), _int64(self.file_footer),
            _int64(self.file_row_start), pa.array(self.file_partition, BIGINT),
            pa.nulls(files, VARCHAR), pa.nulls(files, VARCHAR),
            pa.array(self.file_mapping, BIGINT),
        ], schema=DATA_FILE_SCHEMA)
        return Batch(column_mapping, name_mapping, data_file, _int64(self.name_table_id),
                     self.mapping_rows, self.next_id, self.next_snapshot)


def _repeat(value: int, count: int) -> array:
    return array("q", (value,)) * count


@dataclass
class Batch:
    """Rows of DuckLake's three tables, in id order, and what the benchmark needs to check."""
    column_mapping: pa.Table
    name_mapping: pa.Table
    data_file: pa.Table
    name_table_ids: pa.Array  # table_id of each name row (the join's table_id column)
    mapping_rows: array  # name rows of each mapping, in column_mapping's order
    next_id: int  # the counter after these rows: DuckLake's next_file_id
    next_snapshot: int

    @property
    def rows(self) -> int:
        return self.column_mapping.num_rows + self.name_mapping.num_rows + self.data_file.num_rows

    def tables(self) -> List[Tuple[str, pa.Table]]:
        """The three tables in DuckLake's insert order."""
        return [("ducklake_column_mapping", self.column_mapping),
                ("ducklake_name_mapping", self.name_mapping),
                ("ducklake_data_file", self.data_file)]

    @property
    def first_id(self) -> int:
        return int(self.column_mapping.column("mapping_id")[0].as_py())

    def split(self) -> List["Batch"]:
        """One batch per mapping (a mapping with its data file): one DuckLake commit each."""
        if self.data_file.num_rows != self.column_mapping.num_rows:
            raise ValueError("only a batch with one data file per mapping splits by mapping")
        parts = []
        offset = 0
        ids = self.column_mapping.column("mapping_id").to_pylist()
        for i, rows in enumerate(self.mapping_rows):
            # The counter after commit i: its mapping id, then its file id.
            after = ids[i + 1] if i + 1 < len(ids) else self.next_id
            parts.append(Batch(
                self.column_mapping.slice(i, 1), self.name_mapping.slice(offset, rows),
                self.data_file.slice(i, 1), self.name_table_ids.slice(offset, rows),
                array("q", [rows]), after, self.next_snapshot))
            offset += rows
        return parts

    def load_rows(self) -> pa.Table:
        """The mapping load's shape (one row per name row), in insert order."""
        names = self.name_mapping
        return pa.Table.from_arrays([
            names.column("mapping_id"), self.name_table_ids,
            pa.repeat(pa.scalar(MAPPING_TYPE, VARCHAR), names.num_rows),
            names.column("column_id"), names.column("source_name"),
            names.column("target_field_id"), names.column("parent_column"),
            names.column("is_partition")], schema=LOAD_SCHEMA)


@dataclass
class Catalog(Batch):
    seed: int = 0
    schemas: Dict[int, TableSchema] = field(default_factory=dict)
    table_weights: Dict[int, float] = field(default_factory=dict)
    row_id_next: Dict[int, int] = field(default_factory=dict)

    @property
    def mappings(self) -> int:
        return self.column_mapping.num_rows

    def table_sizes(self) -> Dict[int, Tuple[int, int]]:
        """table_id -> (mappings, name rows)."""
        sizes: Dict[int, List[int]] = {}
        tables = self.column_mapping.column("table_id").to_pylist()
        for table_id, rows in zip(tables, self.mapping_rows):
            entry = sizes.setdefault(table_id, [0, 0])
            entry[0] += 1
            entry[1] += rows
        return {t: (m, r) for t, (m, r) in sorted(sizes.items())}

    def mapping_load(self) -> pa.Table:
        """DuckLake's full mapping load, as a SQL engine answers it: the join, ordered by
        mapping_id, parent_column NULLS FIRST (a stable sort keeps pre-order among siblings)."""
        rows = self.load_rows()
        order = pc.sort_indices(rows, sort_keys=[("mapping_id", "ascending"),
                                                 ("parent_column", "ascending", "at_start")])
        return rows.take(order)

    def cursor_for_last(self, mappings: int) -> Tuple[int, int]:
        """DuckLake's load cursor returning the last `mappings` mappings: (cursor, name rows)."""
        ids = self.column_mapping.column("mapping_id")
        cursor = ids[self.mappings - mappings].as_py()
        return cursor, sum(self.mapping_rows[self.mappings - mappings:])

    def new_batch(self, seed_key: str, mappings: int, sizes: Sequence[int]) -> Batch:
        """`mappings` new mappings with one data file each, ids continuing DuckLake's counter
        from this catalog's `next_id` (the caller advances it: see `advance`). Each mapping's
        table is drawn by the catalog's table weights; its name-row count from `sizes`."""
        rng = random.Random(f"{self.seed}:{seed_key}")
        tables = list(self.table_weights)
        cumulative = _cumulative([self.table_weights[t] for t in tables])
        templates = _Templates()
        cache: Dict[Tuple[int, int, int], int] = {}
        builder = _Builder(f"{self.seed}:{seed_key}:files", templates, self.next_id,
                           self.next_snapshot, dict(self.row_id_next))
        for _ in range(mappings):
            table_id = rng.choices(tables, cum_weights=cumulative)[0]
            key = (table_id, rng.choice(sizes), partition_count(rng))
            template = cache.get(key)
            if template is None:
                template = templates.add(layout(self.schemas[table_id], rng, key[1], key[2]))
                cache[key] = template
            builder.mapping_with_file(table_id, template)
        return builder.build()

    def advance(self, batch: Batch) -> None:
        """Move the id counter past a batch written to the targets."""
        self.next_id = max(self.next_id, batch.next_id)
        self.next_snapshot = max(self.next_snapshot, batch.next_snapshot)


def _cumulative(weights: Sequence[float]) -> List[float]:
    total = 0.0
    out = []
    for w in weights:
        total += w
        out.append(total)
    return out


def generate(mappings: int, seed: int) -> Catalog:
    """The catalog of `mappings` mappings (and 20% extra unmapped files) for `seed`."""
    if mappings < 100:
        raise ValueError("the catalog needs at least 100 mappings")
    rng = random.Random(f"{seed}:catalog")
    table_count = max(20, mappings // 100)
    weights = [k ** -ZIPF_EXPONENT for k in range(1, table_count + 1)]
    rng.shuffle(weights)  # which table id is large is arbitrary
    table_ids = list(range(1, table_count + 1))
    mapping_counts = apportion(mappings, weights)
    extra_counts = apportion(max(int(mappings * EXTRA_FILE_SHARE), table_count), weights)

    templates = _Templates()
    schemas: Dict[int, TableSchema] = {}
    layouts: Dict[int, List[int]] = {}
    for table_id, count in zip(table_ids, mapping_counts):
        schema = table_schema(seed, table_id)
        schemas[table_id] = schema
        layout_rng = random.Random(f"{seed}:layouts:{table_id}")
        variants = min(count, LAYOUTS_PER_TABLE + count // MAPPINGS_PER_EXTRA_LAYOUT)
        phase = layout_rng.random()
        ids = [templates.add(layout(schema, layout_rng, layout_size((v + phase) / variants),
                                    partition_count(layout_rng)))
               for v in range(variants)]
        layout_rng.shuffle(ids)
        layouts[table_id] = ids

    # The order of commits over time: +t is a mapping of table t, -t a DuckLake-written file.
    events = array("q")
    for table_id, count, extra in zip(table_ids, mapping_counts, extra_counts):
        events.extend(_repeat(table_id, count))
        events.extend(_repeat(-table_id, extra))
    order = list(events)
    rng.shuffle(order)

    builder = _Builder(f"{seed}:files", templates, next_id=0, next_snapshot=1)
    seen: Dict[int, int] = {}
    for event in order:
        if event > 0:
            n = seen.get(event, 0)
            seen[event] = n + 1
            variants = layouts[event]
            builder.mapping_with_file(event, variants[n % len(variants)])
        else:
            builder.plain_file(-event)
    batch = builder.build()
    return Catalog(
        batch.column_mapping, batch.name_mapping, batch.data_file, batch.name_table_ids,
        batch.mapping_rows, batch.next_id, batch.next_snapshot, seed=seed, schemas=schemas,
        table_weights=dict(zip(table_ids, weights)), row_id_next=builder.row_id_next)
