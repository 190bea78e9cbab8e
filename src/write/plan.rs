//! A staged batch evaluated against a snapshot: the fold, every validation, and the resulting
//! write set.
//!
//! The batch's changes apply in order to an overlay of the snapshot, so a later change sees
//! the earlier ones (a delete then an insert of the same key, an insert then an end
//! transition). Reads stay on the key ranges the batch names: a table's range for
//! `table_id IN (...)`, the id indexes for `mapping_id`/`data_file_id IN (...)`, point reads
//! for inserted keys.

use futures::TryStreamExt as _;
use std::collections::{BTreeMap, BTreeSet};

use super::fold::{NameGroups, fold_mapping};
use super::validate::{ValidationError, Violation};
use super::{Delete, EndTarget, Insert, Op, StagedBatch, Update};
use crate::catalog::CatalogSnapshot;
use crate::codec::{Keyspace, Kind, RowKey, encode_data_file, encode_mapping};
use crate::error::{Error, Result};
use crate::kv::{PageSize, WriteSet};
use crate::model::{
    CatalogTable, ColumnMapping, ColumnMappingRow, DataFile, DataFileId, DataFileRow, MappingId,
    TableId,
};

/// What committing a batch will do.
#[derive(Debug)]
pub struct CommitPlan {
    /// The mutations, for one atomic commit.
    pub writes: WriteSet,
    /// Rows each of the batch's changes affected, in the batch's order.
    pub affected: Vec<u64>,
    /// Counts of the net effect.
    pub summary: PlanSummary,
}

/// The net effect of a batch on the stored records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Mapping records created.
    pub mappings_created: u64,
    /// Mapping records deleted.
    pub mappings_deleted: u64,
    /// Data files created.
    pub files_created: u64,
    /// Data files changed (end transitions).
    pub files_updated: u64,
    /// Data files deleted.
    pub files_deleted: u64,
}

/// A batch evaluated against a snapshot, violations and all.
#[derive(Debug)]
pub struct Evaluation {
    /// What committing would do. Meaningful as a view of the batch even with violations: rows
    /// that break a constraint are left out of it.
    pub plan: CommitPlan,
    /// Every violation, in the order the batch's rows were checked.
    pub violations: Vec<Violation>,
}

impl Evaluation {
    /// The plan, or every violation as an [`Error::Validation`].
    ///
    /// # Errors
    /// [`Error::Validation`] when there is a violation.
    pub fn into_plan(self) -> Result<CommitPlan> {
        if self.violations.is_empty() {
            Ok(self.plan)
        } else {
            Err(Error::Validation(ValidationError {
                violations: self.violations,
            }))
        }
    }
}

/// Evaluates `batch` against `snapshot`.
///
/// # Errors
/// [`Error::Validation`] with every violation of the batch; [`Error::Kv`] or
/// [`Error::Codec`] when reading the snapshot fails.
pub async fn plan_batch(snapshot: &CatalogSnapshot, batch: &StagedBatch) -> Result<CommitPlan> {
    evaluate(snapshot, batch).await?.into_plan()
}

/// Evaluates `batch` against `snapshot`, collecting violations instead of failing on them.
///
/// # Errors
/// [`Error::Kv`] or [`Error::Codec`] when reading the snapshot fails.
pub async fn evaluate(snapshot: &CatalogSnapshot, batch: &StagedBatch) -> Result<Evaluation> {
    let mut violations = Vec::new();
    let mut groups = NameGroups::default();
    let mut name_rows = 0;
    for op in batch.ops() {
        if let Op::Insert(Insert::NameMappings(rows)) = op {
            groups.add(rows, name_rows, &mut violations);
            name_rows += rows.len();
        }
    }

    let mut overlay = Overlay::new(snapshot);
    let mut affected = Vec::with_capacity(batch.ops().len());
    let mut positions = Positions::default();
    for op in batch.ops() {
        let rows = match op {
            Op::Insert(Insert::ColumnMappings(rows)) => {
                let first = positions.take(CatalogTable::ColumnMapping, rows.len());
                overlay
                    .insert_mappings(rows, first, &mut groups, &mut violations)
                    .await?
            }
            Op::Insert(Insert::NameMappings(rows)) => rows.len() as u64,
            Op::Insert(Insert::DataFiles(rows)) => {
                let first = positions.take(CatalogTable::DataFile, rows.len());
                overlay.insert_files(rows, first, &mut violations).await?
            }
            Op::Delete(delete) => overlay.delete(delete, &mut violations).await?,
            Op::Update(update) => overlay.update(update, &mut violations).await?,
        };
        affected.push(rows);
    }
    violations.extend(groups.into_orphans());
    let (writes, summary) = overlay.into_writes(&mut violations).await?;
    Ok(Evaluation {
        plan: CommitPlan {
            writes,
            affected,
            summary,
        },
        violations,
    })
}

/// Positions of inserted rows among a batch's inserts into each table, for messages.
#[derive(Default)]
struct Positions(BTreeMap<CatalogTable, usize>);

impl Positions {
    fn take(&mut self, table: CatalogTable, rows: usize) -> usize {
        let next = self.0.entry(table).or_default();
        let first = *next;
        *next += rows;
        first
    }
}

#[derive(Debug)]
struct MappingEntry {
    in_base: bool,
    now: MappingState,
}

#[derive(Debug)]
enum MappingState {
    /// As in the snapshot (present iff `in_base`).
    Base,
    Deleted,
    Inserted(ColumnMapping),
}

impl MappingEntry {
    fn exists(&self) -> bool {
        match self.now {
            MappingState::Base => self.in_base,
            MappingState::Deleted => false,
            MappingState::Inserted(_) => true,
        }
    }
}

#[derive(Debug)]
struct FileEntry {
    base: Option<DataFile>,
    now: Option<DataFile>,
    inserted_here: bool,
}

struct Overlay<'s> {
    snapshot: &'s CatalogSnapshot,
    mappings: BTreeMap<(TableId, MappingId), MappingEntry>,
    files: BTreeMap<DataFileId, FileEntry>,
    /// Tables whose stored mappings are all in `mappings`.
    mapping_tables: BTreeSet<TableId>,
    /// Tables whose stored files are all in `files`.
    file_tables: BTreeSet<TableId>,
}

impl<'s> Overlay<'s> {
    fn new(snapshot: &'s CatalogSnapshot) -> Self {
        Self {
            snapshot,
            mappings: BTreeMap::new(),
            files: BTreeMap::new(),
            mapping_tables: BTreeSet::new(),
            file_tables: BTreeSet::new(),
        }
    }

    /// Reads whether the snapshot holds each of `keys` not yet in the overlay, in one batch.
    async fn load_mappings(&mut self, keys: &[(TableId, MappingId)]) -> Result<()> {
        let missing: Vec<(TableId, MappingId)> = keys
            .iter()
            .filter(|key| !self.mappings.contains_key(key))
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let present = self.snapshot.mappings_exist(&missing).await?;
        for (key, in_base) in missing.into_iter().zip(present) {
            self.mappings.insert(
                key,
                MappingEntry {
                    in_base,
                    now: MappingState::Base,
                },
            );
        }
        Ok(())
    }

    async fn load_mapping_tables(&mut self, tables: &[TableId]) -> Result<()> {
        let wanted: Vec<TableId> = tables
            .iter()
            .filter(|t| !self.mapping_tables.contains(t))
            .copied()
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let ranges = self
            .snapshot
            .keyspace()
            .tables_ranges(Kind::Mapping, wanted.iter().copied());
        let mut pages = self.snapshot.mapping_keys(ranges, PageSize::default());
        while let Some(page) = pages.try_next().await? {
            for row in page {
                self.mappings
                    .entry((row.table_id, MappingId(row.id)))
                    .or_insert(MappingEntry {
                        in_base: true,
                        now: MappingState::Base,
                    });
            }
        }
        self.mapping_tables.extend(wanted);
        Ok(())
    }

    async fn load_mapping_ids(&mut self, ids: &[MappingId]) -> Result<()> {
        let rows = self
            .snapshot
            .index_lookup(Kind::MappingById, ids.iter().map(|id| id.0))
            .await?;
        for row in rows {
            self.mappings
                .entry((row.table_id, MappingId(row.id)))
                .or_insert(MappingEntry {
                    in_base: true,
                    now: MappingState::Base,
                });
        }
        Ok(())
    }

    fn cache_files(&mut self, files: Vec<DataFile>) {
        for file in files {
            self.files.entry(file.data_file_id).or_insert(FileEntry {
                base: Some(file.clone()),
                now: Some(file),
                inserted_here: false,
            });
        }
    }

    async fn load_files(&mut self, ids: &[DataFileId]) -> Result<()> {
        let missing: Vec<DataFileId> = ids
            .iter()
            .filter(|id| !self.files.contains_key(id))
            .copied()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let found = self.snapshot.data_files_by_id(&missing).await?;
        self.cache_files(found);
        for id in missing {
            self.files.entry(id).or_insert(FileEntry {
                base: None,
                now: None,
                inserted_here: false,
            });
        }
        Ok(())
    }

    async fn load_file_tables(&mut self, tables: &[TableId]) -> Result<()> {
        let wanted: Vec<TableId> = tables
            .iter()
            .filter(|t| !self.file_tables.contains(t))
            .copied()
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let ranges = self
            .snapshot
            .keyspace()
            .tables_ranges(Kind::DataFile, wanted.iter().copied());
        let mut pages = self.snapshot.data_files(ranges, PageSize::default());
        while let Some(page) = pages.try_next().await? {
            self.cache_files(page);
        }
        self.file_tables.extend(wanted);
        Ok(())
    }

    async fn insert_mappings(
        &mut self,
        rows: &[ColumnMappingRow],
        first: usize,
        groups: &mut NameGroups,
        violations: &mut Vec<Violation>,
    ) -> Result<u64> {
        let keys: Vec<(TableId, MappingId)> = rows
            .iter()
            .filter_map(|row| Some((TableId(row.table_id?), MappingId(row.mapping_id?))))
            .collect();
        self.load_mappings(&keys).await?;
        for (offset, row) in rows.iter().enumerate() {
            let null = |column, row_id| Violation::NullColumn {
                table: CatalogTable::ColumnMapping,
                column,
                row: first + offset,
                row_id,
            };
            let Some(mapping_id) = row.mapping_id else {
                violations.push(null("mapping_id", None));
                continue;
            };
            let group = groups.take(mapping_id);
            let Some(table_id) = row.table_id else {
                violations.push(null("table_id", Some(mapping_id)));
                continue;
            };
            let key = (TableId(table_id), MappingId(mapping_id));
            let Some(entry) = self.mappings.get_mut(&key) else {
                unreachable!("load_mappings loaded every key of this insert");
            };
            if matches!(entry.now, MappingState::Inserted(_)) {
                violations.push(Violation::DuplicateMappingInBatch {
                    table_id,
                    mapping_id,
                });
                continue;
            }
            if entry.exists() {
                violations.push(Violation::MappingExists {
                    table_id,
                    mapping_id,
                });
                continue;
            }
            if let Some(record) = fold_mapping(
                table_id,
                mapping_id,
                row.map_type.clone(),
                group,
                violations,
            ) {
                entry.now = MappingState::Inserted(record);
            }
        }
        Ok(rows.len() as u64)
    }

    async fn insert_files(
        &mut self,
        rows: &[DataFileRow],
        first: usize,
        violations: &mut Vec<Violation>,
    ) -> Result<u64> {
        let ids: Vec<DataFileId> = rows
            .iter()
            .filter_map(|row| row.data_file_id.map(DataFileId))
            .collect();
        self.load_files(&ids).await?;
        for (offset, row) in rows.iter().enumerate() {
            let null = |column, row_id| Violation::NullColumn {
                table: CatalogTable::DataFile,
                column,
                row: first + offset,
                row_id,
            };
            let Some(data_file_id) = row.data_file_id else {
                violations.push(null("data_file_id", None));
                continue;
            };
            let Some(table_id) = row.table_id else {
                violations.push(null("table_id", Some(data_file_id)));
                continue;
            };
            let Some(entry) = self.files.get_mut(&DataFileId(data_file_id)) else {
                unreachable!("load_files loaded every id of this insert");
            };
            if entry.now.is_some() {
                violations.push(if entry.inserted_here {
                    Violation::DuplicateDataFileInBatch { data_file_id }
                } else {
                    Violation::DataFileExists { data_file_id }
                });
                continue;
            }
            entry.now = Some(DataFile::from_row(row.clone(), data_file_id, table_id));
            entry.inserted_here = true;
        }
        Ok(rows.len() as u64)
    }

    async fn delete(&mut self, delete: &Delete, violations: &mut Vec<Violation>) -> Result<u64> {
        match delete {
            Delete::ColumnMappingsOfTables(tables) => {
                self.load_mapping_tables(tables).await?;
                let tables: BTreeSet<TableId> = tables.iter().copied().collect();
                Ok(self.delete_mappings_where(|(table, _)| tables.contains(table)))
            }
            Delete::ColumnMappings(ids) => {
                self.load_mapping_ids(ids).await?;
                let ids: BTreeSet<MappingId> = ids.iter().copied().collect();
                Ok(self.delete_mappings_where(|(_, id)| ids.contains(id)))
            }
            Delete::OrphanNameMappings => Ok(0),
            Delete::NameMappings(ids) => {
                self.load_mapping_ids(ids).await?;
                let ids: BTreeSet<MappingId> = ids.iter().copied().collect();
                for ((table_id, mapping_id), entry) in &self.mappings {
                    if ids.contains(mapping_id) && entry.exists() {
                        violations.push(Violation::LiveNameMappingDelete {
                            table_id: table_id.0,
                            mapping_id: mapping_id.0,
                        });
                    }
                }
                Ok(0)
            }
            Delete::DataFiles(ids) => {
                self.load_files(ids).await?;
                let ids: BTreeSet<DataFileId> = ids.iter().copied().collect();
                Ok(self.delete_files_where(|file| ids.contains(&file.data_file_id)))
            }
            Delete::DataFileIdRange(range) => {
                let found = self.snapshot.data_files_in_id_range(range.clone()).await?;
                self.cache_files(found);
                Ok(self.delete_files_where(|file| range.contains(&file.data_file_id.0)))
            }
            Delete::DataFilesOfTables(tables) => {
                self.load_file_tables(tables).await?;
                let tables: BTreeSet<TableId> = tables.iter().copied().collect();
                Ok(self.delete_files_where(|file| tables.contains(&file.table_id)))
            }
        }
    }

    fn delete_mappings_where(&mut self, matches: impl Fn(&(TableId, MappingId)) -> bool) -> u64 {
        let mut deleted = 0;
        for (key, entry) in &mut self.mappings {
            if matches(key) && entry.exists() {
                entry.now = MappingState::Deleted;
                deleted += 1;
            }
        }
        deleted
    }

    fn delete_files_where(&mut self, matches: impl Fn(&DataFile) -> bool) -> u64 {
        let mut deleted = 0;
        for entry in self.files.values_mut() {
            if entry.now.as_ref().is_some_and(&matches) {
                entry.now = None;
                deleted += 1;
            }
        }
        deleted
    }

    async fn update(&mut self, update: &Update, violations: &mut Vec<Violation>) -> Result<u64> {
        match update {
            Update::MappingTable(table) => {
                violations.push(Violation::MappingUpdate { table: *table });
                Ok(0)
            }
            Update::OtherDataFileUpdate { description } => {
                violations.push(Violation::UnsupportedDataFileUpdate {
                    reason: description.clone(),
                });
                Ok(0)
            }
            Update::EndDataFiles {
                end_snapshot,
                target,
            } => {
                let matches: Box<dyn Fn(&DataFile) -> bool + Send> = match target {
                    EndTarget::DataFiles(ids) => {
                        self.load_files(ids).await?;
                        let ids: BTreeSet<DataFileId> = ids.iter().copied().collect();
                        Box::new(move |file| ids.contains(&file.data_file_id))
                    }
                    EndTarget::Tables(tables) => {
                        self.load_file_tables(tables).await?;
                        let tables: BTreeSet<TableId> = tables.iter().copied().collect();
                        Box::new(move |file| tables.contains(&file.table_id))
                    }
                };
                let mut updated = 0;
                for entry in self.files.values_mut() {
                    if let Some(file) = entry
                        .now
                        .as_mut()
                        .filter(|f| f.end_snapshot.is_none() && matches(f))
                    {
                        file.end_snapshot = Some(*end_snapshot);
                        updated += 1;
                    }
                }
                Ok(updated)
            }
        }
    }

    /// Checks the references of inserted files and turns the overlay into mutations.
    async fn into_writes(
        mut self,
        violations: &mut Vec<Violation>,
    ) -> Result<(WriteSet, PlanSummary)> {
        let references: Vec<(DataFileId, TableId, MappingId)> = self
            .files
            .values()
            .filter(|entry| entry.base.is_none())
            .filter_map(|entry| entry.now.as_ref())
            .filter_map(|file| Some((file.data_file_id, file.table_id, file.mapping_id?)))
            .collect();
        let keys: Vec<(TableId, MappingId)> = references.iter().map(|(_, t, m)| (*t, *m)).collect();
        self.load_mappings(&keys).await?;

        let keyspace = self.snapshot.keyspace();
        let mut writes = WriteSet::new();
        let mut summary = PlanSummary::default();
        let mut required = BTreeSet::new();
        for (data_file_id, table_id, mapping_id) in references {
            let entry = self.mappings.get(&(table_id, mapping_id));
            match entry {
                Some(entry) if entry.exists() => {
                    if matches!(entry.now, MappingState::Base) {
                        // Stored before this batch: it must still be there when we commit.
                        required.insert(keyspace.mapping_key(table_id, mapping_id));
                    }
                }
                _ => violations.push(Violation::UnknownMapping {
                    data_file_id: data_file_id.0,
                    table_id: table_id.0,
                    mapping_id: mapping_id.0,
                }),
            }
        }
        for key in required {
            writes.require_present(key);
        }

        write_mappings(keyspace, self.mappings, &mut writes, &mut summary);
        write_files(keyspace, self.files, &mut writes, &mut summary);
        Ok((writes, summary))
    }
}

/// The mutations of the mapping entries.
fn write_mappings(
    keyspace: &Keyspace,
    mappings: BTreeMap<(TableId, MappingId), MappingEntry>,
    writes: &mut WriteSet,
    summary: &mut PlanSummary,
) {
    for ((table_id, mapping_id), entry) in mappings {
        let row = RowKey {
            kind: Kind::Mapping,
            table_id,
            id: mapping_id.0,
        };
        let key = keyspace.mapping_key(table_id, mapping_id);
        match (entry.in_base, entry.now) {
            (_, MappingState::Base) | (false, MappingState::Deleted) => {}
            (true, MappingState::Deleted) => {
                writes.delete(key).delete(keyspace.index_key(row));
                summary.mappings_deleted += 1;
            }
            (false, MappingState::Inserted(record)) => {
                writes
                    .insert(key, encode_mapping(&record))
                    .insert(keyspace.index_key(row), Vec::new());
                summary.mappings_created += 1;
            }
            (true, MappingState::Inserted(record)) => {
                writes
                    .put(key, encode_mapping(&record))
                    .put(keyspace.index_key(row), Vec::new());
                summary.mappings_created += 1;
                summary.mappings_deleted += 1;
            }
        }
    }
}

/// The mutations of the data-file entries.
fn write_files(
    keyspace: &Keyspace,
    files: BTreeMap<DataFileId, FileEntry>,
    writes: &mut WriteSet,
    summary: &mut PlanSummary,
) {
    for entry in files.into_values() {
        match (entry.base, entry.now) {
            (None, None) => {}
            (Some(base), Some(now)) if base == now => {}
            (Some(base), None) => {
                let row = file_row(&base);
                writes
                    .delete(keyspace.row_key(Kind::DataFile, base.table_id, row.id))
                    .delete(keyspace.index_key(row));
                summary.files_deleted += 1;
            }
            (None, Some(now)) => {
                let row = file_row(&now);
                writes
                    .insert(
                        keyspace.row_key(Kind::DataFile, now.table_id, row.id),
                        encode_data_file(&now),
                    )
                    .insert(keyspace.index_key(row), Vec::new());
                summary.files_created += 1;
            }
            (Some(base), Some(now)) => {
                let key = keyspace.row_key(Kind::DataFile, base.table_id, base.data_file_id.0);
                writes.require_present(key.clone());
                if base.table_id == now.table_id {
                    writes.put(key, encode_data_file(&now));
                } else {
                    // Deleted and re-inserted under another table within this batch.
                    writes
                        .delete(key)
                        .delete(keyspace.index_key(file_row(&base)));
                    writes
                        .insert(
                            keyspace.row_key(Kind::DataFile, now.table_id, now.data_file_id.0),
                            encode_data_file(&now),
                        )
                        .insert(keyspace.index_key(file_row(&now)), Vec::new());
                }
                summary.files_updated += 1;
            }
        }
    }
}

fn file_row(file: &DataFile) -> RowKey {
    RowKey {
        kind: Kind::DataFile,
        table_id: file.table_id,
        id: file.data_file_id.0,
    }
}
