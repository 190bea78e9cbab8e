//! Codec throughput: encoding and decoding mapping records the size DuckLake writes for a
//! nested table (17 name rows), and building keys.
#![allow(missing_docs, reason = "benchmark binary")]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moraine::codec::{Keyspace, decode_mapping, encode_mapping};
use moraine::model::{ColumnId, ColumnMapping, FieldId, MappingId, NameMapping, TableId};

fn mapping(names: i64) -> ColumnMapping {
    ColumnMapping {
        mapping_id: MappingId(42),
        table_id: TableId(7),
        map_type: Some("map_by_name".into()),
        names: (0..names)
            .map(|i| NameMapping {
                column_id: ColumnId(i),
                source_name: format!("column_{i}"),
                target_field_id: FieldId(i + 1),
                parent_column: (i > 0).then(|| ColumnId((i - 1) / 2)),
                is_partition: i == names - 1,
            })
            .collect(),
    }
}

fn codec(c: &mut Criterion) {
    let record = mapping(17);
    let bytes = encode_mapping(&record);
    let mut group = c.benchmark_group("mapping_record");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("encode", |b| {
        b.iter(|| encode_mapping(std::hint::black_box(&record)));
    });
    group.bench_function("decode", |b| {
        b.iter(|| decode_mapping(std::hint::black_box(&bytes)));
    });
    group.finish();

    let keyspace = Keyspace::default();
    c.bench_function("mapping_key", |b| {
        b.iter(|| keyspace.mapping_key(TableId(std::hint::black_box(7)), MappingId(42)));
    });
}

criterion_group!(benches, codec);
criterion_main!(benches);
