//! Scan throughput of the embedded store: one table's mapping records, read page by page from
//! a snapshot and decoded, against the in-memory model as the anchor of the same run.
#![allow(missing_docs, reason = "benchmark binary")]

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt as _;
use moraine::codec::{Keyspace, Kind, decode_mapping, encode_mapping};
use moraine::kv::redb::RedbBackend;
use moraine::kv::{Store, StoreLimits, WriteSet};
use moraine::model::{ColumnId, ColumnMapping, FieldId, MappingId, NameMapping, TableId};

const MAPPINGS: i64 = 20_000;

fn record(mapping_id: i64) -> ColumnMapping {
    ColumnMapping {
        mapping_id: MappingId(mapping_id),
        table_id: TableId(1),
        map_type: Some("map_by_name".into()),
        names: (0..17)
            .map(|i| NameMapping {
                column_id: ColumnId(i),
                source_name: format!("column_{i}"),
                target_field_id: FieldId(i + 1),
                parent_column: (i > 0).then(|| ColumnId((i - 1) / 2)),
                is_partition: false,
            })
            .collect(),
    }
}

async fn load(store: &Store, keyspace: &Keyspace) {
    for chunk in (0..MAPPINGS).collect::<Vec<_>>().chunks(5_000) {
        let mut writes = WriteSet::new();
        for id in chunk {
            writes.insert(
                keyspace.mapping_key(TableId(1), MappingId(*id)),
                encode_mapping(&record(*id)),
            );
        }
        let outcome = store.commit(writes).await.expect("commit");
        assert_eq!(outcome, moraine::kv::CommitOutcome::Committed);
    }
}

async fn scan_decode(store: &Store, keyspace: &Keyspace) -> usize {
    let snapshot = store.snapshot().await.expect("snapshot");
    let mut pages = snapshot.scan(keyspace.table_range(Kind::Mapping, TableId(1)));
    let mut names = 0;
    while let Some(page) = pages.next().await {
        for (_, value) in page.expect("page").iter() {
            names += decode_mapping(value).expect("decode").names.len();
        }
    }
    names
}

fn scan(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let keyspace = Keyspace::default();
    let dir = tempfile::tempdir().expect("temp dir");
    let redb = runtime.block_on(async {
        let backend = RedbBackend::open(dir.path()).await.expect("open");
        Store::new(Arc::new(backend), StoreLimits::default())
    });
    let memory = Store::memory();
    runtime.block_on(load(&redb, &keyspace));
    runtime.block_on(load(&memory, &keyspace));

    let mut group = c.benchmark_group("scan_one_table");
    group.throughput(Throughput::Elements(MAPPINGS.unsigned_abs()));
    group.sample_size(10);
    for (name, store) in [("memory", &memory), ("redb", &redb)] {
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(scan_decode(store, &keyspace)));
        });
    }
    group.finish();
}

criterion_group!(benches, scan);
criterion_main!(benches);
