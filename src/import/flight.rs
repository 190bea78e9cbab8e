//! `moraine import --server URI --from DIR`: an export (`moraine export`) staged back through
//! a server's write path over Flight SQL, in atomic batches. Each batch is one transaction
//! (`BeginTransaction`, `CommandStatementIngest` of its rows with the transaction's id,
//! `EndTransaction` commit): first the mappings, `--batch` per transaction with their name
//! rows, then the data files, `--batch` per transaction (a data file refers to a mapping, or
//! to none, so every mapping is in before any file).
//!
//! Nothing is staged before every file of the export matches its manifest checksum. The
//! files are read a batch at a time, on a blocking thread one batch ahead of the commits, so
//! memory holds about two batches whatever the export's size. An export's name rows follow
//! their mappings' order (both files are in key order), so a batch's name rows are the runs
//! that follow one another in the name file, one per mapping.
//!
//! A refused batch stops the import: after a refused commit the client's transaction is gone
//! (ADBC-like clients lose it too), and going on would leave a gap. The error says which batch
//! it was, what it held, the server's code and message, and how many batches landed before
//! it, which stay committed; `--skip-mappings` and `--skip-files` resume after them, with
//! any `--batch`.

use std::path::Path;

use arrow_flight::sql::EndTransaction;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;

use crate::batch::{Columns, column_mapping, data_file, name_mapping};
use crate::client::Client;
use crate::config::FlightImport;
use crate::error::{Error, Result};
use crate::export::files::file_error;
use crate::export::{Manifest, TableReader};
use crate::model::{CatalogTable, DuckLakeVersion};
use crate::progress::{Progress, Total};

/// Batches read ahead of the one being committed.
const READ_AHEAD: usize = 1;

/// What became of a batch that stopped the import.
const READ_FAILED: &str = "It could not be read, so nothing of it was staged";
const NOTHING_STAGED: &str = "Nothing of it was staged";
const ROLLED_BACK: &str = "Nothing of it was written: its transaction was rolled back";
const COMMIT_REFUSED: &str = "Its commit was refused, so nothing of it was written, and its \
                              transaction is gone (a refused commit ends it)";
const OUTCOME_UNKNOWN: &str = "Whether its commit landed is unknown: export the server's \
                               catalog to see before resuming";

/// What an import staged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    /// Batches committed.
    pub committed: usize,
    /// Mappings committed.
    pub mappings: u64,
    /// Name rows committed.
    pub names: u64,
    /// Data files committed.
    pub files: u64,
}

/// One batch: the rows of one transaction.
struct Unit {
    /// Its rows, per table, in the order ingested.
    parts: Vec<(CatalogTable, RecordBatch)>,
    /// What it holds, for messages.
    what: String,
    /// Mappings and data files of the export up to and including it.
    through: (u64, u64),
}

impl Unit {
    fn rows(&self, table: CatalogTable) -> u64 {
        self.parts
            .iter()
            .filter(|(t, _)| *t == table)
            .map(|(_, rows)| u64::try_from(rows.num_rows()).unwrap_or(u64::MAX))
            .sum()
    }
}

/// A table's file, read a row range at a time.
struct Cursor {
    reader: TableReader,
    /// What is left of the batch read last.
    rest: Option<RecordBatch>,
}

impl Cursor {
    fn new(reader: TableReader) -> Self {
        Self { reader, rest: None }
    }

    /// The rows not yet taken of the current batch, reading the next one when it is used up;
    /// `None` at the end of the file.
    fn current(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(rest) = &self.rest
                && rest.num_rows() > 0
            {
                return Ok(Some(rest.clone()));
            }
            match self.reader.next() {
                None => return Ok(None),
                Some(batch) => self.rest = Some(batch?),
            }
        }
    }

    fn advance(&mut self, rows: usize) {
        if let Some(rest) = &mut self.rest {
            let rows = rows.min(rest.num_rows());
            *rest = rest.slice(rows, rest.num_rows() - rows);
        }
    }

    /// Up to `rows` rows.
    fn take(&mut self, rows: usize) -> Result<Vec<RecordBatch>> {
        let mut taken = Vec::new();
        let mut left = rows;
        while left > 0 {
            let Some(rest) = self.current()? else { break };
            let n = left.min(rest.num_rows());
            taken.push(rest.slice(0, n));
            self.advance(n);
            left -= n;
        }
        Ok(taken)
    }

    /// The rows from here on whose `column` is `value`.
    fn take_run(&mut self, column: usize, value: Option<i64>) -> Result<Vec<RecordBatch>> {
        let mut taken = Vec::new();
        while let Some(rest) = self.current()? {
            let columns = Columns::new(&rest, self.reader.version().columns(self.reader.table()))
                .map_err(|err| file_error(self.reader.path(), err))?;
            let n = (0..columns.len())
                .take_while(|&row| columns.int(column, row) == value)
                .count();
            if n > 0 {
                taken.push(rest.slice(0, n));
                self.advance(n);
            }
            if n < columns.len() {
                break;
            }
        }
        Ok(taken)
    }

    /// `pieces` as one batch.
    fn join(&self, pieces: &[RecordBatch]) -> Result<Option<RecordBatch>> {
        let Some(first) = pieces.first() else {
            return Ok(None);
        };
        concat_batches(&first.schema(), pieces)
            .map(Some)
            .map_err(|err| file_error(self.reader.path(), err))
    }
}

/// The first and last values of integer `column` of `batch`, as text; `batch` holds
/// DuckLake `version`'s columns of `table`.
fn span(
    batch: &RecordBatch,
    table: CatalogTable,
    version: DuckLakeVersion,
    columns: &[usize],
) -> (String, String) {
    let text = |row: usize| -> String {
        Columns::new(batch, version.columns(table)).map_or_else(
            |_| "?".to_owned(),
            |c| {
                columns
                    .iter()
                    .map(|&i| {
                        c.int(i, row)
                            .map_or_else(|| "NULL".to_owned(), |v| v.to_string())
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            },
        )
    };
    (text(0), text(batch.num_rows().saturating_sub(1)))
}

/// The export's batches, in the order committed.
struct Batches {
    mappings: Option<Cursor>,
    names: Option<Cursor>,
    files: Option<Cursor>,
    batch: usize,
    /// Mappings and data files to pass over before the first batch.
    skip: (u64, u64),
    mappings_done: u64,
    files_done: u64,
}

impl Batches {
    fn open(dir: &Path, manifest: &Manifest, batch: usize, skip: (u64, u64)) -> Result<Self> {
        let open = |table: CatalogTable| -> Result<Option<Cursor>> {
            manifest
                .file(table)
                .map(|file| {
                    TableReader::open(
                        &dir.join(&file.file),
                        table,
                        manifest.ducklake,
                        manifest.file_format,
                    )
                    .map(Cursor::new)
                })
                .transpose()
        };
        let mappings = open(CatalogTable::ColumnMapping)?;
        let names = open(CatalogTable::NameMapping)?;
        if let (None, Some(names)) = (&mappings, &names) {
            return Err(file_error(
                names.reader.path(),
                "holds name rows, but the export holds no ducklake_column_mapping file for \
                 them to belong to",
            ));
        }
        Ok(Self {
            mappings,
            names,
            files: open(CatalogTable::DataFile)?,
            batch,
            skip,
            mappings_done: 0,
            files_done: 0,
        })
    }

    /// Up to `left` rows, at most a batch.
    fn limit(&self, left: u64) -> usize {
        usize::try_from(left).map_or(self.batch, |left| left.min(self.batch))
    }

    /// The next batch, if any is left, after those to skip.
    fn next_unit(&mut self) -> Result<Option<Unit>> {
        while self.mappings_done < self.skip.0 {
            let limit = self.limit(self.skip.0 - self.mappings_done);
            if self.next_mappings(limit)?.is_none() {
                break;
            }
        }
        if let Some(unit) = self.next_mappings(self.batch)? {
            return Ok(Some(unit));
        }
        while self.files_done < self.skip.1 {
            let limit = self.limit(self.skip.1 - self.files_done);
            if self.next_files(limit)?.is_none() {
                break;
            }
        }
        self.next_files(self.batch)
    }

    /// The next `limit` mappings and their name rows.
    fn next_mappings(&mut self, limit: usize) -> Result<Option<Unit>> {
        let Some(mappings) = &mut self.mappings else {
            return Ok(None);
        };
        let pieces = mappings.take(limit)?;
        let Some(maps) = mappings.join(&pieces)? else {
            // Every mapping is in: every name row must have been taken with its mapping.
            if let Some(names) = &mut self.names
                && let Some(left) = names.current()?
            {
                let mapping_id = Columns::new(&left, CatalogTable::NameMapping.columns())
                    .ok()
                    .and_then(|c| c.int(name_mapping::MAPPING_ID, 0));
                return Err(file_error(
                    names.reader.path(),
                    format!(
                        "holds name rows of mapping {} that do not follow their mapping in the \
                         order of the export's ducklake_column_mapping file, as moraine export \
                         writes them (was it exported from a server that streams tables out \
                         of key order?); nothing was imported",
                        mapping_id.map_or_else(|| "NULL".to_owned(), |id| id.to_string())
                    ),
                ));
            }
            self.mappings = None;
            return Ok(None);
        };
        let mut name_pieces = Vec::new();
        if let Some(names) = &mut self.names {
            let columns = Columns::new(&maps, CatalogTable::ColumnMapping.columns())
                .map_err(|err| file_error(mappings.reader.path(), err))?;
            let mut previous = None;
            for row in 0..columns.len() {
                let mapping_id = columns.int(column_mapping::MAPPING_ID, row);
                // A mapping id shared by two tables' adjacent mappings: its runs were taken
                // with the first.
                if previous == Some(mapping_id) {
                    continue;
                }
                previous = Some(mapping_id);
                name_pieces.extend(names.take_run(name_mapping::MAPPING_ID, mapping_id)?);
            }
        }
        let names = match &self.names {
            Some(names) => names.join(&name_pieces)?,
            None => None,
        };
        let count = u64::try_from(maps.num_rows()).unwrap_or(u64::MAX);
        let (first, last) = span(
            &maps,
            CatalogTable::ColumnMapping,
            DuckLakeVersion::default(),
            &[column_mapping::TABLE_ID, column_mapping::MAPPING_ID],
        );
        let what = format!(
            "mappings {} to {} (table_id/mapping_id {first} to {last}) with {} name rows",
            self.mappings_done + 1,
            self.mappings_done + count,
            names.as_ref().map_or(0, RecordBatch::num_rows)
        );
        self.mappings_done += count;
        let mut parts = vec![(CatalogTable::ColumnMapping, maps)];
        parts.extend(names.map(|names| (CatalogTable::NameMapping, names)));
        Ok(Some(Unit {
            parts,
            what,
            through: (self.mappings_done, self.files_done),
        }))
    }

    /// The next `limit` data files.
    fn next_files(&mut self, limit: usize) -> Result<Option<Unit>> {
        let Some(files) = &mut self.files else {
            return Ok(None);
        };
        let pieces = files.take(limit)?;
        let Some(rows) = files.join(&pieces)? else {
            self.files = None;
            return Ok(None);
        };
        let count = u64::try_from(rows.num_rows()).unwrap_or(u64::MAX);
        let (first, last) = span(
            &rows,
            CatalogTable::DataFile,
            files.reader.version(),
            &[data_file::DATA_FILE_ID],
        );
        let what = format!(
            "data files {} to {} (data_file_id {first} to {last})",
            self.files_done + 1,
            self.files_done + count
        );
        self.files_done += count;
        Ok(Some(Unit {
            parts: vec![(CatalogTable::DataFile, rows)],
            what,
            through: (self.mappings_done, self.files_done),
        }))
    }
}

/// Reads the mappings and name rows of the export in `dir` as the import would batch them,
/// staging nothing: an export whose name rows do not follow their mappings' order is
/// refused before anything is staged, not midway.
fn check_order(dir: &Path, manifest: &Manifest, batch: usize) -> Result<()> {
    let mut batches = Batches::open(dir, manifest, batch, (0, 0))?;
    while batches.next_mappings(batch)?.is_some() {}
    Ok(())
}

/// Whether a refused commit may still have landed: the answer was lost, or the server says
/// it could not tell.
fn outcome_unknown(err: &Error) -> bool {
    match err {
        Error::Remote { code, .. } => !matches!(
            *code,
            "ABORTED"
                | "INVALID_ARGUMENT"
                | "ALREADY_EXISTS"
                | "FAILED_PRECONDITION"
                | "RESOURCE_EXHAUSTED"
                | "PERMISSION_DENIED"
                | "UNAUTHENTICATED"
                | "NOT_FOUND"
                | "UNIMPLEMENTED"
                | "OUT_OF_RANGE"
        ),
        _ => false,
    }
}

/// Stages `unit` in a transaction of its own and commits it. On failure, the error and what
/// became of the batch.
async fn commit(
    client: &mut Client,
    unit: &Unit,
) -> std::result::Result<(), (Error, &'static str)> {
    let txn = client
        .begin_transaction()
        .await
        .map_err(|err| (err, NOTHING_STAGED))?;
    for (table, rows) in &unit.parts {
        let sent = rows.num_rows();
        let staged = match client.ingest(*table, &txn, rows.clone()).await {
            Ok(read) if usize::try_from(read).ok() == Some(sent) => Ok(()),
            Ok(read) => Err(Error::Remote {
                call: format!("ingest into {table}"),
                code: "OK",
                message: format!("the server read {read} of the {sent} rows sent"),
                advice: "",
            }),
            Err(err) => Err(err),
        };
        if let Err(err) = staged {
            if let Err(rollback) = client.end_transaction(&txn, EndTransaction::Rollback).await {
                tracing::warn!("rolling back the refused batch's transaction: {rollback}");
            }
            return Err((err, ROLLED_BACK));
        }
    }
    client
        .end_transaction(&txn, EndTransaction::Commit)
        .await
        .map_err(|err| {
            let outcome = if outcome_unknown(&err) {
                OUTCOME_UNKNOWN
            } else {
                COMMIT_REFUSED
            };
            (err, outcome)
        })
}

/// How many batches of `batch` rows `rows` rows make.
fn batches_of(rows: u64, batch: usize) -> u64 {
    rows.div_ceil(u64::try_from(batch).unwrap_or(u64::MAX).max(1))
}

/// Reads the export's batches into `out`, in order, ending at the first error.
fn read_units(
    dir: &Path,
    manifest: &Manifest,
    batch: usize,
    skip: (u64, u64),
    out: &mpsc::Sender<Result<Unit>>,
) {
    let mut batches = match Batches::open(dir, manifest, batch, skip) {
        Ok(batches) => batches,
        Err(err) => {
            let _ = out.blocking_send(Err(err));
            return;
        }
    };
    loop {
        match batches.next_unit() {
            Ok(None) => return,
            Ok(Some(unit)) => {
                if out.blocking_send(Ok(unit)).is_err() {
                    return;
                }
            }
            Err(err) => {
                let _ = out.blocking_send(Err(err));
                return;
            }
        }
    }
}

/// Commits the batches arriving on `units`, each in a transaction of its own; stops at the
/// first that fails. `skipped` is what the reader passed over (`--skip-mappings`,
/// `--skip-files`).
async fn commit_all(
    client: &mut Client,
    units: &mut mpsc::Receiver<Result<Unit>>,
    skipped: (u64, u64),
    progress: &Progress,
) -> Result<Imported> {
    let mut imported = Imported::default();
    // Mappings and data files of the export committed so far, by this run or an earlier one.
    let mut committed = skipped;
    let mut number = 0;
    while let Some(unit) = units.recv().await {
        number += 1;
        let stopped = |what: String, outcome, cause| Error::ImportStopped {
            what,
            outcome,
            cause: Box::new(cause),
            landed: number - 1,
            skip_mappings: committed.0,
            skip_files: committed.1,
        };
        let unit = unit.map_err(|err| {
            stopped(
                format!("batch {number}, reading the export"),
                READ_FAILED,
                err,
            )
        })?;
        if let Err((cause, outcome)) = commit(client, &unit).await {
            return Err(stopped(
                format!("batch {number}: {}", unit.what),
                outcome,
                cause,
            ));
        }
        committed = (
            committed.0.max(unit.through.0),
            committed.1.max(unit.through.1),
        );
        imported.committed += 1;
        imported.mappings += unit.rows(CatalogTable::ColumnMapping);
        imported.names += unit.rows(CatalogTable::NameMapping);
        imported.files += unit.rows(CatalogTable::DataFile);
        tracing::debug!(batch = number, what = %unit.what, "committed");
        let (rows, bytes) = unit.parts.iter().fold((0, 0), |(rows, bytes), (_, batch)| {
            (
                rows + batch.num_rows(),
                bytes + batch.get_array_memory_size(),
            )
        });
        progress.add(
            u64::try_from(rows).unwrap_or(u64::MAX),
            u64::try_from(bytes).unwrap_or(u64::MAX),
        );
        progress.step();
    }
    Ok(imported)
}

/// Runs `moraine import --server … --from …`.
///
/// # Errors
/// [`Error::ExportFile`] when the manifest cannot be read or a file does not match it
/// (nothing is staged then); [`Error::Config`] or [`Error::Remote`] when the server cannot
/// be reached or refuses the login; [`Error::ImportStopped`] for a batch that was refused
/// or could not be read, after the batches before it were committed.
pub async fn import(config: FlightImport) -> Result<Imported> {
    let dir = config.from.clone();
    let manifest = Manifest::read(&dir)?;
    manifest.verify(&dir)?;
    tracing::info!(
        from = %dir.display(),
        exported_at = %manifest.exported_at,
        snapshot = manifest.snapshot.as_deref().unwrap_or("none"),
        "the export's files match its manifest"
    );
    let joined = |err: tokio::task::JoinError| Error::Internal {
        context: "reading the export",
        reason: err.to_string(),
    };
    {
        let (dir, manifest, batch) = (dir.clone(), manifest.clone(), config.batch);
        tokio::task::spawn_blocking(move || check_order(&dir, &manifest, batch))
            .await
            .map_err(joined)??;
    }
    let mut client = Client::connect(&config.server, &config.client).await?;
    let rows = |table| manifest.file(table).map_or(0, |f| f.rows);
    let skip = (config.skip_mappings, config.skip_files);
    let progress = Progress::new(
        "import",
        Total::Steps {
            count: batches_of(
                rows(CatalogTable::ColumnMapping).saturating_sub(skip.0),
                config.batch,
            ) + batches_of(
                rows(CatalogTable::DataFile).saturating_sub(skip.1),
                config.batch,
            ),
            unit: "batches",
        },
    );
    let (tx, mut rx) = mpsc::channel::<Result<Unit>>(READ_AHEAD);
    let reader = {
        let batch = config.batch;
        tokio::task::spawn_blocking(move || read_units(&dir, &manifest, batch, skip, &tx))
    };
    let result = commit_all(&mut client, &mut rx, skip, &progress).await;
    drop(rx);
    reader.await.map_err(joined)?;
    let imported = match result {
        Ok(imported) => imported,
        Err(err) => {
            progress.abandon();
            return Err(err);
        }
    };
    progress.finish();
    tracing::info!(
        batches = imported.committed,
        skipped_mappings = config.skip_mappings,
        skipped_files = config.skip_files,
        mappings = imported.mappings,
        name_rows = imported.names,
        data_files = imported.files,
        "import committed"
    );
    Ok(imported)
}
