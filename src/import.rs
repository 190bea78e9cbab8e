//! Bulk import of DuckLake commits from a JSON dump of the rows each commit added and
//! removed (the format of `integration/fixtures/ducklake-0.3/steps.json`), replayed through
//! the staged write path, one atomic batch per commit.
//!
//! Per commit: `added` rows of the three tables are inserts; a data file both removed and
//! added with only `end_snapshot` changed is DuckLake's end transition; a data file only
//! removed is a delete. Other tables (`ducklake_snapshot`, …) are ignored.
//!
//! [`flight`] is the other import: an export of `moraine export`, staged through a running
//! server.

pub mod flight;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::{
    CatalogTable, Cell, ColumnMappingRow, DataFileId, DataFileRow, DuckLakeVersion, NameMappingRow,
    SqlType,
};
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

/// A row of `table` from a dump's JSON array, column by column in DuckLake `version`'s order.
fn row_of<'a, R>(
    table: CatalogTable,
    version: DuckLakeVersion,
    row: &'a [Value],
    from_cells: impl FnOnce(Vec<Cell<'a>>) -> Option<R>,
) -> Result<R> {
    let columns = version.columns(table);
    if row.len() < columns.len() {
        return Err(bad(format!(
            "{table} row has {} values, expected {}",
            row.len(),
            columns.len()
        )));
    }
    let cells = columns
        .iter()
        .zip(row)
        .map(|(column, value)| {
            let cell = match (column.ty, value) {
                (_, Value::Null) => Some(Cell::Null),
                (SqlType::BigInt, value) => value.as_i64().map(Cell::BigInt),
                (SqlType::Varchar, value) => value.as_str().map(Cell::Varchar),
                (SqlType::Boolean, value) => value.as_bool().map(Cell::Boolean),
            };
            cell.ok_or_else(|| {
                bad(format!(
                    "{table} column {} is {}, got {value}",
                    column.name, column.ty
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    from_cells(version.to_stored(table, cells, &Cell::Null))
        .ok_or_else(|| bad(format!("{table} row does not convert")))
}

/// A `ducklake_column_mapping` row of a dump.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn column_mapping_row(row: &[Value]) -> Result<ColumnMappingRow> {
    row_of(
        CatalogTable::ColumnMapping,
        DuckLakeVersion::default(),
        row,
        ColumnMappingRow::from_cells,
    )
}

/// A `ducklake_name_mapping` row of a dump.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn name_mapping_row(row: &[Value]) -> Result<NameMappingRow> {
    row_of(
        CatalogTable::NameMapping,
        DuckLakeVersion::default(),
        row,
        NameMappingRow::from_cells,
    )
}

/// A `ducklake_data_file` row of a dump, in DuckLake `version`'s column order.
///
/// # Errors
/// [`Error::InvalidRequest`] for a row of the wrong shape.
pub fn data_file_row(row: &[Value], version: DuckLakeVersion) -> Result<DataFileRow> {
    row_of(
        CatalogTable::DataFile,
        version,
        row,
        DataFileRow::from_cells,
    )
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

/// A dump of DuckLake commits, parsed.
#[derive(Debug, Clone)]
pub struct Dump {
    /// The DuckLake version its rows are of: what its `"ducklake_version"` names, else 0.3.
    pub version: DuckLakeVersion,
    /// Its commits, in order; commits that change none of the three tables are left out.
    pub commits: Vec<ImportedCommit>,
}

/// The commits of a dump, whose rows are in the column order of the DuckLake version its
/// `"ducklake_version"` names (0.3 when it names none).
///
/// # Errors
/// [`Error::InvalidRequest`] for text that is not such a dump, or names a version moraine
/// does not serve.
pub fn ducklake_steps(json: &str) -> Result<Dump> {
    let dump: Value = serde_json::from_str(json).map_err(|err| bad(format!("not JSON: {err}")))?;
    let version = crate::export::ducklake_version_field(&dump)
        .map_err(|problem| bad(format!("the dump {problem}")))?;
    let steps = dump
        .get("steps")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no \"steps\" object".into()))?;
    let mut commits = Vec::new();
    for (name, step) in steps {
        let batch = commit_of(name, step, version)?;
        if !batch.is_empty() {
            commits.push(ImportedCommit {
                name: name.clone(),
                batch,
            });
        }
    }
    Ok(Dump { version, commits })
}

fn commit_of(name: &str, step: &Value, version: DuckLakeVersion) -> Result<StagedBatch> {
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
        let file = data_file_row(row, version)?;
        let id = file
            .data_file_id
            .ok_or_else(|| bad(format!("{name}: removed data file without id")))?;
        removed_files.insert(id, file);
    }
    let mut new_files = Vec::new();
    let mut ends: BTreeMap<i64, Vec<DataFileId>> = BTreeMap::new();
    for row in rows(step, "ducklake_data_file", "added") {
        let file = data_file_row(row, version)?;
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
        batch.push(Op::Insert(Insert::column_mappings(&mappings)));
    }
    if !names.is_empty() {
        batch.push(Op::Insert(Insert::name_mappings(&names)));
    }
    for (end_snapshot, ids) in ends {
        batch.push(Op::Update(Update::EndDataFiles {
            end_snapshot,
            target: EndTarget::DataFiles(ids),
        }));
    }
    if !new_files.is_empty() {
        batch.push(Op::Insert(Insert::data_files(&new_files)));
    }
    Ok(batch)
}
