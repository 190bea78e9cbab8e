//! Fuzz targets: each takes arbitrary bytes, feeds them to one decoder or checker that client
//! or stored bytes reach, and asserts what must hold whatever the bytes are (no panic, and
//! round trips where a decode succeeds).
//!
//! The same functions run under libFuzzer (`fuzz/`, `just fuzz`, nightly) and, for a short
//! deterministic run on stable, in the test suite (`fuzz::tests`), over seeds and mutations of
//! them.

use std::sync::OnceLock;

use crate::catalog::Catalog;
use crate::codec::{
    KeyPrefix, Keyspace, decode_data_file, decode_mapping, encode_data_file, encode_mapping,
    read_data_file, read_mapping,
};
use crate::model::{CatalogTable, ColumnMappingRow, MappingId, NameMappingRow, TableId};
use crate::query::QueryEngine;
use crate::write::decode::{MissingColumns, RowDecoder, RowShape};
use crate::write::{Insert, Op, StagedBatch};

/// A fuzz target: arbitrary bytes in, a panic when something that must hold does not.
pub type Target = fn(&[u8]);

/// The fuzz targets, by name, for the harnesses.
pub const TARGETS: [(&str, Target); 5] = [
    ("key", key),
    ("value", value),
    ("fold", fold),
    ("ingest", ingest),
    ("sql", sql),
];

/// Key decoding: every key either fails with a typed error or decodes to a row whose key is
/// the same bytes.
pub fn key(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let prefix = if choice & 1 == 0 { "" } else { "lake-a" };
    let keyspace = Keyspace::new(KeyPrefix::new(prefix).unwrap_or_default());
    let (key, value) = rest.split_at(rest.len().min(usize::from(choice >> 1)));
    let _ = keyspace.decode_head(key);
    if let Ok(row) = keyspace.decode(key) {
        assert_eq!(keyspace.row_key(row.kind, row.table_id, row.id), key);
    }
    if let Ok(row) = keyspace.decode_entry(key, value) {
        assert_eq!(keyspace.row_key(row.kind, row.table_id, row.id), key);
    }
}

/// Value decoding: a stored record either fails with a typed error or decodes; a decoded one
/// encodes and decodes to itself.
pub fn value(data: &[u8]) {
    if let Ok(record) = read_mapping(data) {
        let _ = record.head();
        let _ = record.names().count();
    }
    if let Ok(mapping) = decode_mapping(data) {
        let again = decode_mapping(&encode_mapping(&mapping)).expect("a re-encoded mapping");
        assert_eq!(again, mapping);
    }
    if let Ok(record) = read_data_file(data) {
        let _ = (record.table_id(), record.data_file_id());
    }
    if let Ok(file) = decode_data_file(data)
        && let Ok(bytes) = encode_data_file(&file)
    {
        assert_eq!(decode_data_file(&bytes).expect("a re-encoded file"), file);
    }
}

/// The child-row fold: a mapping with name rows made from the bytes (column ids, parents,
/// partition flags) is staged and committed on an in-memory store. It is either refused, with
/// nothing stored, or stored with exactly its name rows in `column_id` order, each parent a
/// column of the mapping before its child.
pub fn fold(data: &[u8]) {
    let names: Vec<(i64, Option<i64>, bool)> = data
        .chunks(2)
        .take(64)
        .map(|pair| {
            let column = i64::from(pair.first().copied().unwrap_or(0) % 16);
            let parent = pair.get(1).copied().unwrap_or(0xff);
            let parent = (parent < 0x80).then(|| i64::from(parent % 16));
            (column, parent, pair.get(1).is_some_and(|b| b & 0x40 != 0))
        })
        .collect();
    let rows: Vec<NameMappingRow> = names
        .iter()
        .map(|&(column_id, parent_column, is_partition)| NameMappingRow {
            mapping_id: Some(1),
            column_id: Some(column_id),
            source_name: Some(format!("c{column_id}")),
            target_field_id: Some(column_id + 100),
            parent_column,
            is_partition: Some(is_partition),
        })
        .collect();
    let mut batch_of_ops = StagedBatch::new();
    batch_of_ops.push(Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
        mapping_id: Some(1),
        table_id: Some(1),
        map_type: Some("map_by_name".into()),
    }])));
    batch_of_ops.push(Op::Insert(Insert::name_mappings(&rows)));
    let catalog = Catalog::new(crate::kv::Store::memory(), Keyspace::default());
    let committed =
        futures::executor::block_on(crate::write::commit_batch(&catalog, &batch_of_ops));
    let snapshot = futures::executor::block_on(catalog.snapshot()).expect("snapshot");
    let stored =
        futures::executor::block_on(snapshot.mapping(TableId(1), MappingId(1))).expect("read back");
    match (committed, stored) {
        (Ok(_), Some(mapping)) => {
            let mut want: Vec<i64> = names.iter().map(|n| n.0).collect();
            want.sort_unstable();
            let got: Vec<i64> = mapping.names.iter().map(|n| n.column_id.0).collect();
            assert_eq!(
                got, want,
                "the stored rows are the rows sent, in column order"
            );
            for (at, name) in mapping.names.iter().enumerate() {
                if let Some(parent) = name.parent_column {
                    assert!(
                        mapping.names.iter().take(at).any(|n| n.column_id == parent),
                        "parent {parent:?} of column {:?} is not a column before it",
                        name.column_id
                    );
                }
            }
        }
        (Err(_), None) => {}
        (committed, stored) => panic!("commit {committed:?} but stored {stored:?}"),
    }
}

/// Upload decoding: the bytes, cut into Flight messages (a length-prefixed header and body
/// each), go through the checks and the decoder a `DoPut` stream goes through. Whatever they
/// are, the result is batches or a typed error.
pub fn ingest(data: &[u8]) {
    let mut messages = Vec::new();
    let mut rest = data;
    while rest.len() >= 4 && messages.len() < 16 {
        let take = |rest: &mut &[u8]| -> Vec<u8> {
            let Some((len, tail)) = rest.split_first_chunk::<2>() else {
                return Vec::new();
            };
            let len = usize::from(u16::from_le_bytes(*len)).min(tail.len());
            let (part, tail) = tail.split_at(len);
            *rest = tail;
            part.to_vec()
        };
        let header = take(&mut rest);
        let body = take(&mut rest);
        messages.push(arrow_flight::FlightData {
            data_header: header.into(),
            data_body: body.into(),
            ..Default::default()
        });
    }
    let mut stream = crate::flight::upload::decoded(
        futures::stream::iter(messages.into_iter().map(Ok)),
        std::sync::Arc::default(),
    );
    let mut decoder: Option<RowDecoder> = None;
    futures::executor::block_on(async {
        use futures::StreamExt as _;
        while let Some(Ok(batch)) = stream.next().await {
            let decoder = match &mut decoder {
                Some(decoder) => decoder,
                None => match RowDecoder::new(
                    RowShape::Table(CatalogTable::DataFile),
                    crate::model::DuckLakeVersion::default(),
                    &batch.schema(),
                    MissingColumns::Refuse,
                ) {
                    Ok(fresh) => decoder.insert(fresh),
                    Err(_) => return,
                },
            };
            let _ = decoder.decode(&batch);
        }
    });
}

/// SQL: any text is checked against the limits, parsed, normalized and, when it is a write
/// statement, turned into one, without a panic.
pub fn sql(data: &[u8]) {
    static ENGINE: OnceLock<QueryEngine> = OnceLock::new();
    let text = String::from_utf8_lossy(data);
    if crate::query::limits::check_sql(&text).is_err() {
        return;
    }
    let engine = ENGINE.get_or_init(|| {
        QueryEngine::new(Catalog::new(
            crate::kv::Store::memory(),
            Keyspace::default(),
        ))
    });
    let _ = engine.write_statement(&text);
    let dialect = datafusion::sql::sqlparser::dialect::GenericDialect {};
    if let Ok(statements) = datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, &text) {
        for mut statement in statements {
            crate::query::rewrite::normalize(&mut statement, true);
            let _ = statement.to_string();
        }
    }
}

/// A small deterministic generator (xorshift), for the fuzz harness and the randomized
/// tests, so a failing input or sequence can be found again from its seed. Not for secrets.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % (n.max(1) as u64)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `input` changed a little: bytes flipped, cut, repeated or inserted.
    fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(out.len() + 1);
            match rng.below(5) {
                0 if !out.is_empty() => {
                    let at = at.min(out.len() - 1);
                    out[at] ^= 1 << rng.below(8);
                }
                1 => out.truncate(at),
                2 => {
                    let byte = u8::try_from(rng.below(256)).unwrap_or(0);
                    out.insert(at, byte);
                }
                3 if !out.is_empty() => {
                    let from = rng.below(out.len());
                    let chunk: Vec<u8> = out[from..out.len().min(from + 8)].to_vec();
                    out.splice(at..at, chunk);
                }
                _ => out.push(u8::try_from(rng.below(256)).unwrap_or(0)),
            }
        }
        out
    }

    /// Valid inputs for each target, to mutate from.
    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let keyspace = Keyspace::default();
        match target {
            "key" => {
                let mut key = vec![36_u8];
                key.extend(keyspace.mapping_key(TableId(3), MappingId(9)));
                let mut entry = vec![20_u8];
                entry.extend(keyspace.row_key(crate::codec::Kind::DataFileById, TableId(4), 7));
                entry.extend(Keyspace::index_value(
                    crate::codec::Kind::DataFileById,
                    TableId(4),
                ));
                vec![key, entry]
            }
            "value" => {
                let mapping = crate::model::ColumnMapping {
                    mapping_id: MappingId(1),
                    table_id: TableId(2),
                    map_type: Some("map_by_name".into()),
                    names: vec![crate::model::NameMapping {
                        column_id: crate::model::ColumnId(0),
                        source_name: "id".into(),
                        target_field_id: crate::model::FieldId(1),
                        parent_column: None,
                        is_partition: false,
                    }],
                };
                vec![encode_mapping(&mapping)]
            }
            "fold" => vec![vec![0, 0xff, 1, 0, 2, 1, 3, 0x80], vec![0, 0xff]],
            "ingest" => vec![ipc_seed()],
            _ => vec![
                b"SELECT * FROM ducklake_data_file WHERE table_id = 1".to_vec(),
                b"UPDATE ducklake_data_file SET end_snapshot = 3 WHERE end_snapshot IS NULL AND data_file_id IN (1, 2)".to_vec(),
                b"DELETE FROM ducklake_column_mapping WHERE table_id IN (4)".to_vec(),
                b"INSERT INTO ducklake_column_mapping VALUES (1, 2, 'map_by_name')".to_vec(),
            ],
        }
    }

    /// A `DoPut` stream of one data-file row, in the framing [`ingest`] reads.
    fn ipc_seed() -> Vec<u8> {
        let row = crate::model::DataFileRow {
            data_file_id: Some(1),
            table_id: Some(1),
            ..Default::default()
        };
        let batch = Insert::data_files(&[row]).rows().clone();
        let messages = arrow_flight::utils::batches_to_flight_data(&batch.schema(), vec![batch])
            .expect("encodes");
        let mut out = Vec::new();
        for message in messages {
            for part in [&message.data_header, &message.data_body] {
                let len = u16::try_from(part.len()).expect("small");
                out.extend(len.to_le_bytes());
                out.extend_from_slice(part);
            }
        }
        out
    }

    #[test]
    fn every_target_holds_over_seeds_and_their_mutations() {
        let runs: usize = std::env::var("MORAINE_FUZZ_RUNS")
            .ok()
            .and_then(|runs| runs.parse().ok())
            .unwrap_or(300);
        for (name, target) in TARGETS {
            let seeds = seeds(name);
            let mut rng = Rng(0x5eed ^ name.len() as u64);
            for seed in &seeds {
                target(seed);
            }
            for _ in 0..runs {
                let seed = &seeds[rng.below(seeds.len())];
                let input = mutate(&mut rng, seed);
                target(&input);
            }
        }
    }

    #[test]
    fn the_fold_stores_a_valid_tree() {
        // Two roots, a child of the first, in pre-order: accepted and stored.
        fold(&[0, 0xff, 1, 0, 2, 0xff]);
    }
}
