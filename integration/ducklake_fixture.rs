//! The rows real DuckLake wrote (`fixtures/ducklake-0.3/steps.json`, a copy of the shared
//! fixture), as staged batches and as the catalog state after each step.

use std::collections::BTreeMap;

use moraine::model::{ColumnMappingRow, DataFileId, DataFileRow, NameMappingRow};
use moraine::write::{EndTarget, Insert, Op, StagedBatch, Update};
use serde_json::Value;

use crate::harness::CatalogRows;

/// One DuckLake commit of the fixture.
pub struct Step {
    pub name: String,
    /// The commit as DuckLake staged it.
    pub batch: StagedBatch,
    /// The three tables after the commit.
    pub expected: CatalogRows,
}

fn int(v: &Value) -> Option<i64> {
    v.as_i64()
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn boolean(v: &Value) -> Option<bool> {
    v.as_bool()
}

pub fn column_mapping_row(v: &[Value]) -> ColumnMappingRow {
    ColumnMappingRow {
        mapping_id: int(&v[0]),
        table_id: int(&v[1]),
        map_type: text(&v[2]),
    }
}

pub fn name_mapping_row(v: &[Value]) -> NameMappingRow {
    NameMappingRow {
        mapping_id: int(&v[0]),
        column_id: int(&v[1]),
        source_name: text(&v[2]),
        target_field_id: int(&v[3]),
        parent_column: int(&v[4]),
        is_partition: boolean(&v[5]),
    }
}

pub fn data_file_row(v: &[Value]) -> DataFileRow {
    DataFileRow {
        data_file_id: int(&v[0]),
        table_id: int(&v[1]),
        begin_snapshot: int(&v[2]),
        end_snapshot: int(&v[3]),
        file_order: int(&v[4]),
        path: text(&v[5]),
        path_is_relative: boolean(&v[6]),
        file_format: text(&v[7]),
        record_count: int(&v[8]),
        file_size_bytes: int(&v[9]),
        footer_size: int(&v[10]),
        row_id_start: int(&v[11]),
        partition_id: int(&v[12]),
        encryption_key: text(&v[13]),
        partial_file_info: text(&v[14]),
        mapping_id: int(&v[15]),
    }
}

fn rows<'a>(step: &'a Value, table: &str, which: &str) -> Vec<&'a [Value]> {
    step.get(table)
        .and_then(|t| t.get(which))
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r.as_array().map(Vec::as_slice))
                .collect()
        })
        .unwrap_or_default()
}

/// The fixture's steps that changed the mapping or data-file tables, in order.
pub fn steps() -> Vec<Step> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/integration/fixtures/ducklake-0.3/steps.json"
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture"))
        .expect("fixture is JSON");
    let steps = json["steps"].as_object().expect("steps");
    let mut state = CatalogRows::default();
    let mut out = Vec::new();
    for (name, step) in steps {
        let mut batch = StagedBatch::new();
        let added_maps: Vec<_> = rows(step, "ducklake_column_mapping", "added")
            .into_iter()
            .map(column_mapping_row)
            .collect();
        let added_names: Vec<_> = rows(step, "ducklake_name_mapping", "added")
            .into_iter()
            .map(name_mapping_row)
            .collect();
        assert!(
            rows(step, "ducklake_column_mapping", "removed").is_empty(),
            "1.4 never deletes mappings"
        );
        let removed_files: BTreeMap<i64, DataFileRow> = rows(step, "ducklake_data_file", "removed")
            .into_iter()
            .map(data_file_row)
            .map(|r| (r.data_file_id.expect("id"), r))
            .collect();
        let mut new_files = Vec::new();
        let mut ends: BTreeMap<i64, Vec<DataFileId>> = BTreeMap::new();
        for file in rows(step, "ducklake_data_file", "added")
            .into_iter()
            .map(data_file_row)
        {
            let id = file.data_file_id.expect("id");
            match removed_files.get(&id) {
                // Same row, end_snapshot set: DuckLake's end transition.
                Some(old)
                    if DataFileRow {
                        end_snapshot: file.end_snapshot,
                        ..old.clone()
                    } == file =>
                {
                    ends.entry(file.end_snapshot.expect("ended"))
                        .or_default()
                        .push(DataFileId(id));
                }
                Some(_) => panic!("fixture step {name} changes file {id} in an unexpected way"),
                None => new_files.push(file),
            }
        }
        if !added_maps.is_empty() {
            batch.push(Op::Insert(Insert::ColumnMappings(added_maps.clone())));
        }
        if !added_names.is_empty() {
            batch.push(Op::Insert(Insert::NameMappings(added_names.clone())));
        }
        for (end_snapshot, ids) in ends {
            batch.push(Op::Update(Update::EndDataFiles {
                end_snapshot,
                target: EndTarget::DataFiles(ids),
            }));
        }
        if !new_files.is_empty() {
            batch.push(Op::Insert(Insert::DataFiles(new_files)));
        }
        if batch.is_empty() {
            continue;
        }
        state.column_mappings.extend(added_maps);
        state.name_mappings.extend(added_names);
        state
            .data_files
            .retain(|f| !removed_files.contains_key(&f.data_file_id.expect("id")));
        state.data_files.extend(
            rows(step, "ducklake_data_file", "added")
                .into_iter()
                .map(data_file_row),
        );
        state = state.sorted();
        out.push(Step {
            name: name.clone(),
            batch,
            expected: state.clone(),
        });
    }
    out
}
