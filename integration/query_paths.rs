//! Every fast path of the read path returns exactly the rows of the plain plan.
//!
//! A seeded random catalog (skewed tables, random trees, two tables sharing a `mapping_id`,
//! files with and without a mapping, ended files, negative ids) is written through the write
//! path; then every query below runs twice, with all fast paths on (key and index ranges,
//! DuckLake's load read from the records, scans in several partitions) and with each off, and
//! the results must hold the same rows. Queries with DuckLake's `ORDER BY` must also come back
//! in that order. `MORAINE_SEED=<seed>` replays a run.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray as _};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::TryStreamExt as _;
use moraine::model::{ColumnMappingRow, DataFileRow, NameMappingRow};
use moraine::query::{FastPaths, QueryEngine};
use moraine::write::{Insert, Op, StagedBatch, commit_batch};

use crate::harness::Backend;

/// A small deterministic generator (`SplitMix64`), so a failing seed replays.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub fn seed() -> u64 {
    std::env::var("MORAINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| u64::from(d.subsec_nanos()) ^ d.as_secs())
        })
}

/// The generated catalog's ids, for the queries.
pub struct Shape {
    pub tables: Vec<i64>,
    mapping_ids: Vec<i64>,
    file_ids: Vec<i64>,
    snapshots: i64,
}

/// Writes a random catalog in several commits and returns its ids.
pub async fn generate(catalog: &moraine::catalog::Catalog, rng: &mut Rng) -> Shape {
    let tables: Vec<i64> = (0..12).map(|i| i * 3 - 7).collect();
    let mut next_id: i64 = -40;
    let mut shape = Shape {
        tables: tables.clone(),
        mapping_ids: Vec::new(),
        file_ids: Vec::new(),
        snapshots: 12,
    };
    let mut shared = None;
    for commit in 0..6 {
        let (mut maps, mut names, mut files) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..40 {
            // Skewed: the first tables own most mappings.
            let table = tables[usize::try_from(rng.below(4) * rng.below(4)).expect("small")];
            let mapping_id = next_id;
            next_id += 1 + i64::try_from(rng.below(3)).expect("small");
            maps.push(ColumnMappingRow {
                mapping_id: Some(mapping_id),
                table_id: Some(table),
                map_type: Some("map_by_name".into()),
            });
            shape.mapping_ids.push(mapping_id);
            if commit == 2 && shared.is_none() {
                shared = Some(mapping_id);
            }
            let columns = 1 + rng.below(9);
            for column in 0..columns {
                let column_id = i64::try_from(column).expect("small");
                let parent = (column > 0 && rng.chance(60))
                    .then(|| i64::try_from(rng.below(column)).expect("small"));
                names.push(NameMappingRow {
                    mapping_id: Some(mapping_id),
                    column_id: Some(column_id),
                    source_name: Some(format!("c{}", rng.below(1000))),
                    target_field_id: Some(i64::try_from(rng.below(50)).expect("small")),
                    parent_column: parent,
                    is_partition: Some(parent.is_none() && rng.chance(10)),
                });
            }
            for _ in 0..rng.below(3) {
                let data_file_id = next_id;
                next_id += 1;
                let begin = i64::try_from(rng.below(10)).expect("small");
                files.push(file(data_file_id, table, Some(mapping_id), begin, rng));
                shape.file_ids.push(data_file_id);
            }
        }
        for _ in 0..10 {
            let data_file_id = next_id;
            next_id += 1;
            let table = tables[usize::try_from(rng.below(12)).expect("small")];
            let begin = i64::try_from(rng.below(10)).expect("small");
            files.push(file(data_file_id, table, None, begin, rng));
            shape.file_ids.push(data_file_id);
        }
        let mut batch = StagedBatch::new();
        batch
            .push(Op::Insert(Insert::column_mappings(&maps)))
            .push(Op::Insert(Insert::name_mappings(&names)))
            .push(Op::Insert(Insert::data_files(&files)));
        commit_batch(catalog, &batch).await.expect("commit");
    }
    // A second table uses an existing mapping id: the SQL join crosses them.
    if let Some(mapping_id) = shared {
        let table = tables[11];
        let mut batch = StagedBatch::new();
        batch
            .push(Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
                mapping_id: Some(mapping_id),
                table_id: Some(table),
                map_type: Some("map_by_name".into()),
            }])))
            .push(Op::Insert(Insert::name_mappings(&[NameMappingRow {
                mapping_id: Some(mapping_id),
                column_id: Some(0),
                source_name: Some("shared".into()),
                target_field_id: Some(1),
                parent_column: None,
                is_partition: Some(false),
            }])));
        commit_batch(catalog, &batch).await.expect("shared id");
    }
    shape
}

fn file(id: i64, table: i64, mapping: Option<i64>, begin: i64, rng: &mut Rng) -> DataFileRow {
    DataFileRow {
        data_file_id: Some(id),
        table_id: Some(table),
        begin_snapshot: Some(begin),
        end_snapshot: rng
            .chance(30)
            .then(|| begin + 1 + i64::try_from(rng.below(3)).expect("small")),
        path: Some(format!("/lake/t{table}/f{id}.parquet")),
        path_is_relative: Some(false),
        file_format: Some("parquet".into()),
        record_count: Some(i64::try_from(rng.below(1000)).expect("small")),
        mapping_id: mapping,
        ..DataFileRow::default()
    }
}

/// The queries, with ids drawn from the catalog.
#[expect(
    clippy::many_single_char_names,
    reason = "ids drawn for the templates, named as in SQL examples"
)]
fn queries(shape: &Shape, rng: &mut Rng) -> Vec<String> {
    let pick = |rng: &mut Rng, from: &[i64]| {
        from[usize::try_from(rng.below(from.len() as u64)).expect("small")]
    };
    let load = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id)";
    let order = " ORDER BY mapping_id, parent_column NULLS FIRST";
    let mut out = vec![
        "SELECT * FROM ducklake_name_mapping".to_owned(),
        "SELECT * FROM ducklake_column_mapping".to_owned(),
        "SELECT * FROM ducklake_data_file".to_owned(),
        format!("{load}{order}"),
        "SELECT table_id, count(*) FROM ducklake_column_mapping GROUP BY table_id".to_owned(),
    ];
    for _ in 0..6 {
        let t = pick(rng, &shape.tables);
        let u = pick(rng, &shape.tables);
        let v = pick(rng, &shape.tables);
        let m = pick(rng, &shape.mapping_ids);
        let f = pick(rng, &shape.file_ids);
        let g = pick(rng, &shape.file_ids);
        let s = i64::try_from(rng.below(u64::try_from(shape.snapshots).expect("small")))
            .expect("small");
        out.extend([
            format!("{load} WHERE mapping_id >= {m}{order}"),
            format!("{load} WHERE table_id = {t}{order}"),
            format!("{load} WHERE table_id IN ({t}, {u}, {v}){order}"),
            format!("{load} WHERE table_id > {t}{order}"),
            format!("{load} WHERE table_id = {t} AND mapping_id >= {m}{order}"),
            format!("SELECT m.mapping_id, m.table_id, n.column_id, n.source_name FROM ducklake_column_mapping m JOIN ducklake_name_mapping n ON m.mapping_id = n.mapping_id WHERE m.table_id = {t}"),
            format!("SELECT * FROM ducklake_column_mapping WHERE table_id = {t}"),
            format!("SELECT * FROM ducklake_column_mapping WHERE table_id BETWEEN {t} AND {u}"),
            format!("SELECT * FROM ducklake_column_mapping WHERE mapping_id IN ({m}, {}, 999999)", m + 1),
            format!("SELECT * FROM ducklake_name_mapping WHERE mapping_id >= {m}"),
            format!("SELECT * FROM ducklake_name_mapping WHERE mapping_id = {m}"),
            format!("SELECT * FROM ducklake_data_file WHERE table_id = {t} AND {s} >= begin_snapshot AND ({s} < end_snapshot OR end_snapshot IS NULL)"),
            format!("SELECT * FROM ducklake_data_file WHERE data_file_id IN ({f}, {g})"),
            format!("SELECT data_file_id, table_id FROM ducklake_data_file WHERE data_file_id >= {f} AND table_id IN ({t}, {u})"),
            format!("SELECT count(*) FROM ducklake_data_file WHERE table_id < {t}"),
        ]);
    }
    out
}

/// The rows of `batches` as text, one string per row.
fn rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<ArrayFormatter<'_>> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"))
            .collect();
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect(),
            );
        }
    }
    out
}

async fn run(engine: &QueryEngine, sql: &str) -> Vec<RecordBatch> {
    engine
        .execute(sql, Vec::new())
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
        .try_collect()
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// Whether the rows are in DuckLake's load order: `mapping_id`, then `parent_column` NULLS
/// FIRST.
fn in_load_order(batches: &[RecordBatch]) -> bool {
    let mut keys = Vec::new();
    for batch in batches {
        let ids = batch
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let parents = batch
            .column(6)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        for row in 0..batch.num_rows() {
            keys.push((
                ids.value(row),
                parents.is_valid(row).then(|| parents.value(row)),
            ));
        }
    }
    keys.windows(2).all(|w| w[0] <= w[1])
}

async fn differential(backend: Backend) {
    let seed = seed();
    let mut rng = Rng(seed);
    let t = backend.open().await;
    let catalog = t.catalog();
    let shape = generate(&catalog, &mut rng).await;
    let fast = QueryEngine::new(catalog.clone());
    let plain = QueryEngine::with_fast_paths(catalog.clone(), FastPaths::NONE);
    let single = [
        FastPaths {
            key_ranges: true,
            ..FastPaths::NONE
        },
        FastPaths {
            mapping_load: true,
            ..FastPaths::NONE
        },
        FastPaths {
            partitions: true,
            ..FastPaths::NONE
        },
    ]
    .map(|paths| QueryEngine::with_fast_paths(catalog.clone(), paths));
    let mut checked = BTreeMap::new();
    for sql in queries(&shape, &mut rng) {
        let want_batches = run(&plain, &sql).await;
        let mut want = rows(&want_batches);
        want.sort();
        for (name, engine) in std::iter::once(("all", &fast)).chain(
            ["key ranges", "mapping load", "partitions"]
                .into_iter()
                .zip(single.iter()),
        ) {
            let got_batches = run(engine, &sql).await;
            let mut got = rows(&got_batches);
            got.sort();
            assert_eq!(
                got, want,
                "{name} fast path differs from the plain plan (MORAINE_SEED={seed}): {sql}"
            );
            if sql.contains("NULLS FIRST") {
                assert!(
                    in_load_order(&got_batches),
                    "{name}: out of DuckLake's order (MORAINE_SEED={seed}): {sql}"
                );
            }
        }
        checked.insert(sql, want.len());
    }
    assert!(
        checked.values().filter(|rows| **rows > 0).count() > checked.len() / 2,
        "most queries return rows: {checked:?}"
    );
}

/// `EXPLAIN` of `sql`, as one string.
async fn explain(engine: &QueryEngine, sql: &str) -> String {
    let batches = run(engine, &format!("EXPLAIN {sql}")).await;
    batches
        .iter()
        .flat_map(|b| {
            let plans = b.column(1).as_string::<i32>();
            (0..plans.len())
                .map(|i| plans.value(i).to_owned())
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_return_the_rows_of_the_plain_plan_on_redb() {
    differential(Backend::Redb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_return_the_rows_of_the_plain_plan_in_memory() {
    differential(Backend::Memory).await;
}

#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_paths_return_the_rows_of_the_plain_plan_on_tikv() {
    differential(Backend::Tikv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_id_filters_read_table_ranges_not_the_whole_table() {
    let t = Backend::Memory.open().await;
    let engine = QueryEngine::new(t.catalog());
    let load = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id)";
    let order = " ORDER BY mapping_id, parent_column NULLS FIRST";
    for (sql, reads) in [
        (format!("{load} WHERE table_id = 5{order}"), "table ranges [5]"),
        (
            format!("{load} WHERE table_id IN (5, 9){order}"),
            "merge of tables [5, 9]",
        ),
        (
            "SELECT * FROM ducklake_data_file WHERE table_id = 5 AND 3 >= begin_snapshot AND (3 < end_snapshot OR end_snapshot IS NULL)".to_owned(),
            "table ranges [5]",
        ),
        (
            "SELECT * FROM ducklake_column_mapping WHERE table_id IN (5, 6, 7)".to_owned(),
            "table ranges [5..=7]",
        ),
        (format!("{load} WHERE mapping_id >= 40{order}"), "id index [40..]"),
    ] {
        let plan = explain(&engine, &sql).await;
        assert!(plan.contains(reads), "{sql}:\n{plan}");
        assert!(!plan.contains("full scan"), "{sql}:\n{plan}");
        assert!(
            !plan.contains("SortExec") && !plan.contains("HashJoinExec"),
            "{sql}:\n{plan}"
        );
    }
    // Without the fast path the same filter is a full scan: the check above can fail.
    let plain = QueryEngine::with_fast_paths(t.catalog(), FastPaths::NONE);
    let unpushed = explain(
        &plain,
        "SELECT * FROM ducklake_data_file WHERE table_id = 5",
    )
    .await;
    assert!(unpushed.contains("full scan"), "{unpushed}");
}

/// Collects the rows of `sql` run on `engine`, sorted.
async fn sorted_rows(engine: &QueryEngine, sql: &str) -> Vec<Vec<String>> {
    let mut got = rows(&run(engine, sql).await);
    got.sort();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_plan_reads_the_snapshot_of_each_execution() {
    let seed = seed();
    let mut rng = Rng(seed);
    let t = Backend::Redb.open().await;
    let catalog = t.catalog();
    let shape = generate(&catalog, &mut rng).await;
    let sqls = queries(&shape, &mut rng);
    let kept = QueryEngine::new(catalog.clone());
    let kept_plain = QueryEngine::with_fast_paths(catalog.clone(), FastPaths::NONE);
    let mut before = Vec::new();
    for sql in &sqls {
        before.push(sorted_rows(&kept, sql).await);
        sorted_rows(&kept_plain, sql).await;
    }
    // More rows in every table, after both engines kept their plans.
    let (mut maps, mut names, mut files) = (Vec::new(), Vec::new(), Vec::new());
    for (i, table) in (10_000..).zip(&shape.tables) {
        maps.push(ColumnMappingRow {
            mapping_id: Some(i),
            table_id: Some(*table),
            map_type: Some("map_by_name".into()),
        });
        names.push(NameMappingRow {
            mapping_id: Some(i),
            column_id: Some(0),
            source_name: Some(format!("later{i}")),
            target_field_id: Some(1),
            parent_column: None,
            is_partition: Some(false),
        });
        files.push(file(i + 1_000, *table, Some(i), 0, &mut rng));
    }
    let mut batch = StagedBatch::new();
    batch
        .push(Op::Insert(Insert::column_mappings(&maps)))
        .push(Op::Insert(Insert::name_mappings(&names)))
        .push(Op::Insert(Insert::data_files(&files)));
    commit_batch(&catalog, &batch).await.expect("later rows");

    let fresh = QueryEngine::with_fast_paths(catalog.clone(), FastPaths::NONE);
    let mut changed = 0;
    for (sql, before) in sqls.iter().zip(before) {
        let want = sorted_rows(&fresh, sql).await;
        // Two executions of one kept plan at once, each with its own state.
        let (a, b) = tokio::join!(sorted_rows(&kept, sql), sorted_rows(&kept, sql));
        let plain = sorted_rows(&kept_plain, sql).await;
        for (name, got) in [("fast", a), ("fast, concurrent", b), ("plain", plain)] {
            assert_eq!(
                got, want,
                "{name}: a kept plan read another snapshot (MORAINE_SEED={seed}): {sql}"
            );
        }
        changed += usize::from(want != before);
    }
    assert!(
        changed > sqls.len() / 2,
        "the later rows change most results ({changed} of {})",
        sqls.len()
    );
}

/// DuckLake's mapping load, and the ORDER BY it ends with.
const LOAD: &str = "SELECT mapping_id, table_id, type, column_id, source_name, \
                    target_field_id, parent_column, is_partition FROM ducklake_column_mapping \
                    JOIN ducklake_name_mapping USING (mapping_id)";
const LOAD_ORDER: &str = "ORDER BY mapping_id, parent_column NULLS FIRST";

/// DuckLake's full load over more index pages than one returns the rows of the plain plan,
/// in DuckLake's order: 20,000 mappings whose ids interleave 40 tables, with ids shared by a
/// second table (all of those around the first index page's end, where a group of records of
/// one `mapping_id` spans two pages and the batch builder carries it over). So do its
/// table-scoped forms, for tables whose ids another table shares (found through the store's
/// marks of shared ids) and for one whose ids no other table holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_over_many_index_pages_returns_the_rows_of_the_plain_plan() {
    let seed = seed();
    let mut rng = Rng(seed);
    let t = Backend::Redb.open().await;
    let catalog = t.catalog();
    let (mut maps, mut names) = (Vec::new(), Vec::new());
    let mut shared = Vec::new();
    for i in 0..20_000_i64 {
        let mapping_id = i * 2 + i64::try_from(rng.below(2)).expect("small");
        let table = i64::try_from(rng.below(8) * rng.below(5)).expect("small");
        maps.push(ColumnMappingRow {
            mapping_id: Some(mapping_id),
            table_id: Some(table),
            map_type: Some("map_by_name".into()),
        });
        for column in 0..=rng.below(3) {
            let column_id = i64::try_from(column).expect("small");
            names.push(NameMappingRow {
                mapping_id: Some(mapping_id),
                column_id: Some(column_id),
                source_name: Some(format!("c{column}")),
                target_field_id: Some(column_id),
                parent_column: (column > 0 && rng.chance(50)).then_some(0),
                is_partition: Some(false),
            });
        }
        // Every id of a stretch holding the end of the first index page, and some others.
        if i % 97 == 0 || (7_000..9_500).contains(&i) {
            shared.push((mapping_id, table + 40));
        }
    }
    let mut batch = StagedBatch::new();
    batch
        .push(Op::Insert(Insert::column_mappings(&maps)))
        .push(Op::Insert(Insert::name_mappings(&names)));
    commit_batch(&catalog, &batch).await.expect("mappings");
    let (first_of_shared, second_of_shared) = shared[0];
    // The second tables' mappings of the shared ids, each id once in this batch.
    let (maps, names): (Vec<_>, Vec<_>) = shared
        .into_iter()
        .map(|(mapping_id, table)| {
            (
                ColumnMappingRow {
                    mapping_id: Some(mapping_id),
                    table_id: Some(table),
                    map_type: Some("map_by_name".into()),
                },
                NameMappingRow {
                    mapping_id: Some(mapping_id),
                    column_id: Some(7),
                    source_name: Some("shared".into()),
                    target_field_id: Some(7),
                    parent_column: None,
                    is_partition: Some(false),
                },
            )
        })
        .unzip();
    let mut batch = StagedBatch::new();
    batch
        .push(Op::Insert(Insert::column_mappings(&maps)))
        .push(Op::Insert(Insert::name_mappings(&names)));
    commit_batch(&catalog, &batch).await.expect("shared ids");
    let fast = QueryEngine::new(catalog.clone());
    let plain = QueryEngine::with_fast_paths(catalog.clone(), FastPaths::NONE);
    let (load, order) = (LOAD, LOAD_ORDER);
    for sql in [
        format!("{load} {order}"),
        format!("{load} WHERE mapping_id >= 9001 {order}"),
        format!("{load} WHERE mapping_id BETWEEN 3000 AND 31000 {order}"),
    ] {
        assert!(
            explain(&fast, &sql).await.contains("id index"),
            "the fast plan reads in id order: {sql}"
        );
        let got = run(&fast, &sql).await;
        assert!(in_load_order(&got), "out of DuckLake's order: {sql}");
        let mut got = rows(&got);
        got.sort();
        let mut want = rows(&run(&plain, &sql).await);
        want.sort();
        assert!(want.len() > 10_000, "{} rows: {sql}", want.len());
        assert_eq!(got, want, "(MORAINE_SEED={seed}) {sql}");
    }
    let first_table = maps_table(&catalog, first_of_shared).await;
    table_loads_match_the_plain_plan(&fast, &plain, seed, [first_table, second_of_shared]).await;
}

/// The table-scoped forms of DuckLake's load return the rows of the plain plan, with the
/// name rows of other tables' mappings of shared ids: for `tables`, the two tables of a
/// shared id, and for a table no mapping is in.
async fn table_loads_match_the_plain_plan(
    fast: &QueryEngine,
    plain: &QueryEngine,
    seed: u64,
    tables: [i64; 2],
) {
    let [first_table, second_of_shared] = tables;
    let (load, order) = (LOAD, LOAD_ORDER);
    for sql in [
        format!("{load} WHERE table_id = {first_table} {order}"),
        format!("{load} WHERE table_id = {second_of_shared} {order}"),
        format!("{load} WHERE table_id IN ({first_table}, 1, 3) {order}"),
        // Tables 40 and up hold shared ids only; no table holds 39.
        format!("{load} WHERE table_id = 39 {order}"),
    ] {
        let got = run(fast, &sql).await;
        assert!(in_load_order(&got), "out of DuckLake's order: {sql}");
        let got = rows(&got);
        let mut want = rows(&run(plain, &sql).await);
        let mut sorted = got.clone();
        sorted.sort();
        want.sort();
        assert_eq!(sorted, want, "(MORAINE_SEED={seed}) {sql}");
        if !sql.contains("= 39") {
            let shared_names = got
                .iter()
                .filter(|row| row.iter().any(|cell| cell == "shared"))
                .count();
            assert!(shared_names > 0, "another table's name rows join: {sql}");
        }
    }
}

/// The table whose mapping `mapping_id` was written first: the least table holding it.
async fn maps_table(catalog: &moraine::catalog::Catalog, mapping_id: i64) -> i64 {
    let engine = QueryEngine::new(catalog.clone());
    let sql = format!(
        "SELECT min(table_id) AS t FROM ducklake_column_mapping WHERE mapping_id = {mapping_id}"
    );
    let batches = run(&engine, &sql).await;
    batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0)
}

/// A query planned once is classified from the plan cache, without parsing it again, exactly
/// as parsing classifies it: no write statement, and read whole or not; a write statement is
/// still one.
#[tokio::test]
async fn planned_queries_are_classified_as_parsing_classifies_them() {
    use moraine::model::CatalogTable;
    let t = Backend::Redb.open().await;
    let engine = QueryEngine::new(t.catalog());
    let load = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, \
                parent_column, is_partition FROM ducklake_column_mapping \
                JOIN ducklake_name_mapping USING (mapping_id) WHERE table_id = 3 \
                ORDER BY mapping_id, parent_column NULLS FIRST";
    for (sql, whole) in [
        (
            "SELECT * FROM ducklake_name_mapping",
            Some(CatalogTable::NameMapping),
        ),
        (
            "select * from main.DUCKLAKE_DATA_FILE",
            Some(CatalogTable::DataFile),
        ),
        (
            "SELECT * FROM moraine.main.ducklake_column_mapping",
            Some(CatalogTable::ColumnMapping),
        ),
        (
            "SELECT * FROM ducklake_name_mapping WHERE mapping_id > 3",
            None,
        ),
        ("SELECT mapping_id FROM ducklake_column_mapping", None),
        (load, None),
    ] {
        assert_eq!(engine.whole_table(sql), whole, "parsed: {sql}");
        engine.shape(sql).await.expect("plans");
        assert_eq!(engine.whole_table(sql), whole, "cached: {sql}");
        assert!(
            engine.write_statement(sql).expect("a query").is_none(),
            "{sql}"
        );
    }
    let delete = "DELETE FROM ducklake_data_file WHERE data_file_id = 1";
    assert!(engine.write_statement(delete).expect("a write").is_some());
}
