//! Bulk import of DuckLake commits from a JSON dump of the rows each commit added and
//! removed (the format of `integration/fixtures/ducklake-0.3/steps.json`), replayed through
//! the staged write path, one atomic batch per commit.
//!
//! Per commit: `added` rows of the three tables are inserts; a data file both removed and
//! added with only `end_snapshot` changed is DuckLake's end transition; a data file only
//! removed is a delete. Other tables (`ducklake_snapshot`, …) are ignored.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::{ColumnMappingRow, DataFileId, DataFileRow, NameMappingRow};
use crate::write::{Delete, EndTarget, Insert, Op, StagedBatch, Update};

/// One DuckLake commit of a dump, as a staged batch.
#[derive(Debug, Clone)]
pub struct ImportedCommit {
    /// The commit's name in the dump.
    pub name: String,
    /// Its changes.
    pub batch: StagedBatch,
}

fn bad(reason: String) -> Error {
    Error::InvalidRequest { reason }
}

fn cell<T>(
    row: &[Value],
    i: usize,
    table: &str,
    read: impl Fn(&Value) -> Option<T>,
) -> Result<Option<T>> {
    let value = row.get(i).ok_or_else(|| {
        bad(format!(
            "{table} row has {} values, expected more",
            row.len()
        ))
    })?;
    if value.is_null() {
        return Ok(None);
    }
    read(value).map(Some).ok_or_else(|| {
        bad(format!(
            "{table} column {i} has an unexpected value {value}"
        ))
    })
}

fn int(row: &[Value], i: usize, table: &str) -> Result<Option<i64>> {
    cell(row, i, table, Value::as_i64)
}

fn text(row: &[Value], i: usize, table: &str) -> Result<Option<String>> {
    cell(row, i, table, |v| v.as_str().map(str::to_owned))
}

fn boolean(row: &[Value], i: usize, table: &str) -> Result<Option<bool>> {
    cell(row, i, table, Value::as_bool)
}

/// A `ducklake_column_mapping` row of a dump.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn column_mapping_row(row: &[Value]) -> Result<ColumnMappingRow> {
    let t = "ducklake_column_mapping";
    Ok(ColumnMappingRow {
        mapping_id: int(row, 0, t)?,
        table_id: int(row, 1, t)?,
        map_type: text(row, 2, t)?,
    })
}

/// A `ducklake_name_mapping` row of a dump.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn name_mapping_row(row: &[Value]) -> Result<NameMappingRow> {
    let t = "ducklake_name_mapping";
    Ok(NameMappingRow {
        mapping_id: int(row, 0, t)?,
        column_id: int(row, 1, t)?,
        source_name: text(row, 2, t)?,
        target_field_id: int(row, 3, t)?,
        parent_column: int(row, 4, t)?,
        is_partition: boolean(row, 5, t)?,
    })
}

/// A `ducklake_data_file` row of a dump.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn data_file_row(row: &[Value]) -> Result<DataFileRow> {
    let t = "ducklake_data_file";
    Ok(DataFileRow {
        data_file_id: int(row, 0, t)?,
        table_id: int(row, 1, t)?,
        begin_snapshot: int(row, 2, t)?,
        end_snapshot: int(row, 3, t)?,
        file_order: int(row, 4, t)?,
        path: text(row, 5, t)?,
        path_is_relative: boolean(row, 6, t)?,
        file_format: text(row, 7, t)?,
        record_count: int(row, 8, t)?,
        file_size_bytes: int(row, 9, t)?,
        footer_size: int(row, 10, t)?,
        row_id_start: int(row, 11, t)?,
        partition_id: int(row, 12, t)?,
        encryption_key: text(row, 13, t)?,
        partial_file_info: text(row, 14, t)?,
        mapping_id: int(row, 15, t)?,
    })
}

/// The `which` (`"added"` or `"removed"`) rows of `table` in one commit of a dump.
#[must_use]
pub fn rows<'a>(step: &'a Value, table: &str, which: &str) -> Vec<&'a [Value]> {
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

/// The commits of a dump, in order; commits that change none of the three tables are left
/// out.
///
/// # Errors
/// [`Error::InvalidRequest`] for text that is not such a dump.
pub fn ducklake_steps(json: &str) -> Result<Vec<ImportedCommit>> {
    let dump: Value = serde_json::from_str(json).map_err(|err| bad(format!("not JSON: {err}")))?;
    let steps = dump
        .get("steps")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no \"steps\" object".into()))?;
    let mut out = Vec::new();
    for (name, step) in steps {
        let batch = commit_of(name, step)?;
        if !batch.is_empty() {
            out.push(ImportedCommit {
                name: name.clone(),
                batch,
            });
        }
    }
    Ok(out)
}

fn commit_of(name: &str, step: &Value) -> Result<StagedBatch> {
    let mut batch = StagedBatch::new();
    let mappings = rows(step, "ducklake_column_mapping", "added")
        .into_iter()
        .map(column_mapping_row)
        .collect::<Result<Vec<_>>>()?;
    let names = rows(step, "ducklake_name_mapping", "added")
        .into_iter()
        .map(name_mapping_row)
        .collect::<Result<Vec<_>>>()?;
    let removed_mappings: Vec<_> = rows(step, "ducklake_column_mapping", "removed")
        .into_iter()
        .map(column_mapping_row)
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .filter_map(|m| m.mapping_id.map(crate::model::MappingId))
        .collect();
    let mut removed_files = BTreeMap::new();
    for row in rows(step, "ducklake_data_file", "removed") {
        let file = data_file_row(row)?;
        let id = file
            .data_file_id
            .ok_or_else(|| bad(format!("{name}: removed data file without id")))?;
        removed_files.insert(id, file);
    }
    let mut new_files = Vec::new();
    let mut ends: BTreeMap<i64, Vec<DataFileId>> = BTreeMap::new();
    for row in rows(step, "ducklake_data_file", "added") {
        let file = data_file_row(row)?;
        let Some(id) = file.data_file_id else {
            new_files.push(file);
            continue;
        };
        match removed_files.remove(&id) {
            None => new_files.push(file),
            Some(old) => {
                let ended = DataFileRow {
                    end_snapshot: file.end_snapshot,
                    ..old.clone()
                };
                match file.end_snapshot {
                    Some(end) if old.end_snapshot.is_none() && ended == file => {
                        ends.entry(end).or_default().push(DataFileId(id));
                    }
                    _ => {
                        return Err(bad(format!(
                            "{name}: data file {id} changes other than by its end transition"
                        )));
                    }
                }
            }
        }
    }
    if !removed_mappings.is_empty() {
        batch.push(Op::Delete(Delete::ColumnMappings(removed_mappings)));
    }
    if !removed_files.is_empty() {
        batch.push(Op::Delete(Delete::DataFiles(
            removed_files.into_keys().map(DataFileId).collect(),
        )));
    }
    if !mappings.is_empty() {
        batch.push(Op::Insert(Insert::ColumnMappings(mappings)));
    }
    if !names.is_empty() {
        batch.push(Op::Insert(Insert::NameMappings(names)));
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
    Ok(batch)
}
