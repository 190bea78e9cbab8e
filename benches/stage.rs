//! Staging throughput: one transaction's load as DuckLake sends it (its column mappings, then
//! their name rows, then one data file each, in requests of a few thousand rows, each request
//! kept or taken back whole), staged over an empty in-memory store and turned into the writes
//! a commit hands the store. No network and no store write: this is the write path's CPU.
//!
//! `cargo bench --bench stage`. With `MORAINE_STAGE_ONCE=1` the binary stages the load once
//! and exits, for `valgrind --tool=callgrind`, whose instruction counts do not depend on what
//! else the machine is doing; `MORAINE_STAGE_MAPPINGS` sets how many mappings the load has
//! (20,000 by default), to see how the cost per row grows with a transaction's size.
#![allow(missing_docs, reason = "benchmark binary")]

use criterion::{Criterion, Throughput, criterion_group};
use moraine::catalog::Catalog;
use moraine::codec::Keyspace;
use moraine::kv::Store;
use moraine::model::{ColumnMappingRow, DataFileRow, NameMappingRow};
use moraine::write::stage::Staging;
use moraine::write::{Insert, Op};

/// Mappings in the load, unless `MORAINE_STAGE_MAPPINGS` says otherwise.
const MAPPINGS: i64 = 20_000;
/// Rows per request, about what an ingest of 4 MiB batches sends.
const REQUEST_ROWS: usize = 8_192;

/// The load's requests: column mappings of 64 tables, 12 name rows each (a nested column,
/// partition columns), one data file each, ids from one counter as DuckLake allots them.
fn load_mappings() -> i64 {
    std::env::var("MORAINE_STAGE_MAPPINGS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(MAPPINGS)
}

fn requests() -> Vec<Op> {
    let mappings: Vec<ColumnMappingRow> = (0..load_mappings())
        .map(|i| ColumnMappingRow {
            mapping_id: Some(2 * i),
            table_id: Some(1 + i % 64),
            map_type: Some("map_by_name".into()),
        })
        .collect();
    let names: Vec<NameMappingRow> = (0..load_mappings())
        .flat_map(|i| {
            (0..12_i64).map(move |c| NameMappingRow {
                mapping_id: Some(2 * i),
                column_id: Some(c),
                source_name: Some(format!("column_{c}")),
                target_field_id: Some(c + 1),
                parent_column: (c == 4 || c == 5).then_some(3),
                is_partition: Some(c >= 10),
            })
        })
        .collect();
    let files: Vec<DataFileRow> = (0..load_mappings())
        .map(|i| DataFileRow {
            data_file_id: Some(2 * i + 1),
            table_id: Some(1 + i % 64),
            begin_snapshot: Some(7),
            file_order: Some(i),
            path: Some(format!("s3://lake/table_{}/part-{i:08}.parquet", i % 64)),
            path_is_relative: Some(false),
            file_format: Some("parquet".into()),
            record_count: Some(1_000),
            file_size_bytes: Some(1 << 20),
            footer_size: Some(4_096),
            row_id_start: Some(0),
            mapping_id: Some(2 * i),
            ..DataFileRow::default()
        })
        .collect();
    let mut ops: Vec<Op> = mappings
        .chunks(REQUEST_ROWS)
        .map(|chunk| Op::Insert(Insert::column_mappings(chunk)))
        .collect();
    ops.extend(
        names
            .chunks(REQUEST_ROWS)
            .map(|chunk| Op::Insert(Insert::name_mappings(chunk))),
    );
    ops.extend(
        files
            .chunks(REQUEST_ROWS)
            .map(|chunk| Op::Insert(Insert::data_files(chunk))),
    );
    ops
}

async fn stage(catalog: &Catalog, ops: &[Op]) -> usize {
    let mut staging = Staging::new(catalog.snapshot().await.expect("snapshot"));
    for op in ops {
        staging.begin_request();
        let mut violations = Vec::new();
        staging.apply(op, &mut violations).await.expect("staged");
        assert!(violations.is_empty(), "{violations:?}");
        staging.end_request(true);
    }
    let (writes, _, summary) = staging.into_writes().expect("nothing pending");
    assert_eq!(summary.mappings_created, load_mappings().unsigned_abs());
    writes.len()
}

fn staging(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let catalog = Catalog::new(Store::memory(), Keyspace::default());
    let ops = requests();
    let rows: usize = ops
        .iter()
        .map(|op| match op {
            Op::Insert(insert) => insert.len(),
            _ => 0,
        })
        .sum();
    let mut group = c.benchmark_group("stage_load");
    group.throughput(Throughput::Elements(rows as u64));
    group.sample_size(10);
    group.bench_function("memory", |b| {
        b.iter(|| runtime.block_on(stage(&catalog, &ops)));
    });
    group.finish();
}

criterion_group!(benches, staging);

fn main() {
    if std::env::var_os("MORAINE_STAGE_ONCE").is_some() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let catalog = Catalog::new(Store::memory(), Keyspace::default());
        let ops = requests();
        let started = std::time::Instant::now();
        let keys = runtime.block_on(stage(&catalog, &ops));
        println!("{keys} keys staged in {:?}", started.elapsed());
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
