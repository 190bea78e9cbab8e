//! The files of an export, one per table: Parquet (zstd) or Arrow IPC, with the table's
//! canonical schema. Rows pass through a re-chunker on their way in, which rebuilds them
//! into fresh batches of [`BATCH_ROWS`] rows, so a file's bytes depend on its rows alone and
//! not on how the server happened to batch its stream. A file is written under a `.partial`
//! name and renamed once complete, its SHA-256 taken of the bytes as they are written.
//!
//! Reading is streaming: [`TableReader`] yields the file's batches one at a time.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read as _, Write};
use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sha2::{Digest as _, Sha256};

use crate::batch::{ColumnBuilder, Columns, served_schema};
use crate::config::ExportFormat;
use crate::error::{Error, Result};
use crate::model::{CatalogTable, DuckLakeVersion};

/// Rows per batch written, whatever the server's batches held.
pub const BATCH_ROWS: usize = 8192;
/// Rows per Parquet row group (a whole number of batches). A row group is buffered, encoded,
/// until it is complete: this bounds the writer's memory.
pub const ROW_GROUP_ROWS: usize = 8 * BATCH_ROWS;
/// zstd's level for Parquet pages.
const ZSTD_LEVEL: i32 = 3;
/// Rows per batch read back from a file.
const READ_BATCH_ROWS: usize = BATCH_ROWS;

/// The error for `path`.
pub(crate) fn file_error(path: &Path, problem: impl std::fmt::Display) -> Error {
    Error::ExportFile {
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

/// The file name of `table` in an export of `format`.
#[must_use]
pub fn file_name(table: CatalogTable, format: ExportFormat) -> String {
    let extension = match format {
        ExportFormat::Parquet => "parquet",
        ExportFormat::Arrow => "arrow",
    };
    format!("{}.{extension}", table.name())
}

/// The positions of the key columns a table's rows are exported in the order of, when the
/// rows carry them: `(table_id, id)`. Name rows carry no `table_id`.
fn key_columns(table: CatalogTable) -> Option<(usize, usize)> {
    use crate::batch::{column_mapping, data_file};
    match table {
        CatalogTable::ColumnMapping => Some((column_mapping::TABLE_ID, column_mapping::MAPPING_ID)),
        CatalogTable::DataFile => Some((data_file::TABLE_ID, data_file::DATA_FILE_ID)),
        CatalogTable::NameMapping => None,
    }
}

/// Checks that `schema` has `table`'s columns in DuckLake `version`, by name and in order
/// (types are checked where the batch is read, by [`Columns::new`]).
fn check_columns(
    table: CatalogTable,
    version: DuckLakeVersion,
    schema: &SchemaRef,
) -> std::result::Result<(), String> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let expected: Vec<&str> = version.columns(table).iter().map(|c| c.name).collect();
    if names == expected {
        return Ok(());
    }
    let other = (table == CatalogTable::DataFile)
        .then(|| DuckLakeVersion::of_data_file_columns(&names))
        .flatten()
        .map_or_else(String::new, |v| format!(" (DuckLake {v}'s)"));
    Err(format!(
        "rows of {table} have the columns {names:?}{other}, expected DuckLake {version}'s \
         {expected:?}"
    ))
}

/// Rows of one table, rebuilt into fresh batches of [`BATCH_ROWS`] rows (the last one
/// shorter) in the table's canonical schema. It also counts rows that arrive out of key
/// order.
pub(crate) struct Rechunker {
    table: CatalogTable,
    version: DuckLakeVersion,
    schema: SchemaRef,
    builders: Vec<ColumnBuilder>,
    rows: usize,
    last_key: Option<(Option<i64>, Option<i64>)>,
    disordered: u64,
}

impl Rechunker {
    pub(crate) fn new(table: CatalogTable, version: DuckLakeVersion) -> Self {
        Self {
            table,
            version,
            schema: served_schema(version, table),
            builders: Self::builders(table, version),
            rows: 0,
            last_key: None,
            disordered: 0,
        }
    }

    fn builders(table: CatalogTable, version: DuckLakeVersion) -> Vec<ColumnBuilder> {
        version
            .columns(table)
            .iter()
            .map(|c| ColumnBuilder::new(c.ty, BATCH_ROWS))
            .collect()
    }

    /// Rows that came after a row with a greater key.
    pub(crate) fn disordered(&self) -> u64 {
        self.disordered
    }

    /// Takes the rows of `batch`; the batches of [`BATCH_ROWS`] rows they complete.
    ///
    /// # Errors
    /// A message saying how `batch` is not of the table's shape.
    pub(crate) fn push(
        &mut self,
        batch: &RecordBatch,
    ) -> std::result::Result<Vec<RecordBatch>, String> {
        check_columns(self.table, self.version, &batch.schema())?;
        let columns =
            Columns::new(batch, self.version.columns(self.table)).map_err(|err| err.to_string())?;
        let keys = key_columns(self.table);
        let mut full = Vec::new();
        for row in 0..columns.len() {
            if let Some((table_id, id)) = keys {
                let key = (columns.int(table_id, row), columns.int(id, row));
                if self.last_key.is_some_and(|last| last > key) {
                    self.disordered += 1;
                }
                self.last_key = Some(key);
            }
            for (i, builder) in self.builders.iter_mut().enumerate() {
                builder.cell(columns.cell(i, row));
            }
            self.rows += 1;
            if self.rows == BATCH_ROWS {
                full.push(self.take()?);
            }
        }
        Ok(full)
    }

    /// The rows taken and not yet handed out, if any.
    ///
    /// # Errors
    /// A message saying how the rows do not fit the table's schema.
    pub(crate) fn finish(&mut self) -> std::result::Result<Option<RecordBatch>, String> {
        if self.rows == 0 {
            return Ok(None);
        }
        self.take().map(Some)
    }

    fn take(&mut self) -> std::result::Result<RecordBatch, String> {
        let arrays = self
            .builders
            .iter_mut()
            .map(ColumnBuilder::finish)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|err| err.to_string())?;
        self.builders = Self::builders(self.table, self.version);
        self.rows = 0;
        // The canonical schema holds DuckLake's NOT NULL: a NULL there is refused here.
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|err| err.to_string())
    }
}

/// A writer that hashes and counts what passes through it.
struct Hashing {
    inner: BufWriter<File>,
    hasher: Sha256,
    bytes: u64,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let written = buf.get(..n).unwrap_or(buf);
        self.hasher.update(written);
        self.bytes += u64::try_from(n).unwrap_or(u64::MAX);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

enum Sink {
    Parquet(Box<ArrowWriter<Hashing>>),
    Arrow(Box<FileWriter<Hashing>>),
}

/// A table's file as written: what the manifest says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    /// The table.
    pub table: CatalogTable,
    /// Its file name in the export's directory.
    pub file: String,
    /// Rows.
    pub rows: u64,
    /// Bytes.
    pub bytes: u64,
    /// SHA-256 of the bytes, lower-case hex.
    pub sha256: String,
}

/// One table's file being written.
pub(crate) struct TableWriter {
    table: CatalogTable,
    file: String,
    path: PathBuf,
    partial: PathBuf,
    sink: Sink,
    rechunker: Rechunker,
    rows: u64,
}

impl TableWriter {
    /// Starts `table`'s file in `dir`, under its `.partial` name, with DuckLake `version`'s
    /// columns.
    ///
    /// # Errors
    /// [`Error::ExportFile`] when it cannot be created.
    pub(crate) fn create(
        dir: &Path,
        table: CatalogTable,
        version: DuckLakeVersion,
        format: ExportFormat,
    ) -> Result<Self> {
        let file = file_name(table, format);
        let path = dir.join(&file);
        let partial = dir.join(format!("{file}.partial"));
        let out = File::create(&partial).map_err(|err| file_error(&partial, err))?;
        let hashing = Hashing {
            inner: BufWriter::with_capacity(1 << 20, out),
            hasher: Sha256::new(),
            bytes: 0,
        };
        let schema = served_schema(version, table);
        let sink = match format {
            ExportFormat::Parquet => {
                let level = ZstdLevel::try_new(ZSTD_LEVEL).map_err(|err| Error::Internal {
                    context: "choosing the zstd level",
                    reason: err.to_string(),
                })?;
                let properties = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(level))
                    .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                    .set_max_row_group_bytes(None)
                    .build();
                Sink::Parquet(Box::new(
                    ArrowWriter::try_new(hashing, schema, Some(properties))
                        .map_err(|err| file_error(&partial, err))?,
                ))
            }
            ExportFormat::Arrow => Sink::Arrow(Box::new(
                FileWriter::try_new(hashing, &schema).map_err(|err| file_error(&partial, err))?,
            )),
        };
        Ok(Self {
            table,
            file,
            path,
            partial,
            sink,
            rechunker: Rechunker::new(table, version),
            rows: 0,
        })
    }

    /// Takes the rows of `batch`, as the server sent them.
    ///
    /// # Errors
    /// [`Error::ExportFile`] when they are not the table's rows or cannot be written.
    pub(crate) fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let full = self
            .rechunker
            .push(batch)
            .map_err(|problem| file_error(&self.path, problem))?;
        self.rows += u64::try_from(batch.num_rows()).unwrap_or(u64::MAX);
        for batch in &full {
            self.write(batch)?;
        }
        Ok(())
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match &mut self.sink {
            Sink::Parquet(writer) => writer
                .write(batch)
                .map_err(|err| file_error(&self.partial, err)),
            Sink::Arrow(writer) => writer
                .write(batch)
                .map_err(|err| file_error(&self.partial, err)),
        }
    }

    /// Completes the file, syncs it and gives it its name.
    ///
    /// # Errors
    /// [`Error::ExportFile`] when it cannot be completed.
    pub(crate) fn finish(mut self) -> Result<WrittenFile> {
        if let Some(last) = self
            .rechunker
            .finish()
            .map_err(|problem| file_error(&self.path, problem))?
        {
            self.write(&last)?;
        }
        if self.rechunker.disordered() > 0 {
            tracing::warn!(
                table = %self.table,
                rows = self.rechunker.disordered(),
                "the server sent rows out of key order: this file holds the right rows, but \
                 its bytes depend on how the server scanned, so they may differ between \
                 exports, and an import of this export may be refused; export again from a \
                 server that streams each endpoint in key order"
            );
        }
        let partial = self.partial.clone();
        let hashing = match self.sink {
            Sink::Parquet(writer) => writer.into_inner().map_err(|err| file_error(&partial, err)),
            Sink::Arrow(writer) => writer.into_inner().map_err(|err| file_error(&partial, err)),
        }?;
        let Hashing {
            inner,
            hasher,
            bytes,
        } = hashing;
        let out = inner
            .into_inner()
            .map_err(|err| file_error(&partial, err.error()))?;
        out.sync_all().map_err(|err| file_error(&partial, err))?;
        drop(out);
        std::fs::rename(&partial, &self.path).map_err(|err| file_error(&self.path, err))?;
        Ok(WrittenFile {
            table: self.table,
            file: self.file,
            rows: self.rows,
            bytes,
            sha256: hex(&hasher.finalize()),
        })
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The SHA-256 (lower-case hex) and length of the file at `path`, read in bounded memory.
///
/// # Errors
/// [`Error::ExportFile`] when it cannot be read.
pub fn sha256_of(path: &Path) -> Result<(String, u64)> {
    let mut file = File::open(path).map_err(|err| file_error(path, err))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|err| file_error(path, err))?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or_default());
        bytes += u64::try_from(n).unwrap_or(u64::MAX);
    }
    Ok((hex(&hasher.finalize()), bytes))
}

enum Source {
    Parquet(ParquetRecordBatchReader),
    Arrow(FileReader<BufReader<File>>),
}

/// One table's file being read, a batch at a time.
pub struct TableReader {
    path: PathBuf,
    table: CatalogTable,
    version: DuckLakeVersion,
    source: Source,
}

impl TableReader {
    /// Opens `table`'s file at `path`, written in `format` with DuckLake `version`'s columns.
    ///
    /// # Errors
    /// [`Error::ExportFile`] when it cannot be opened, is not of `format`, or does not hold
    /// the table's columns.
    pub fn open(
        path: &Path,
        table: CatalogTable,
        version: DuckLakeVersion,
        format: ExportFormat,
    ) -> Result<Self> {
        let file = File::open(path).map_err(|err| file_error(path, err))?;
        let (source, schema) = match format {
            ExportFormat::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                    .map_err(|err| file_error(path, err))?;
                let schema = builder.schema().clone();
                let reader = builder
                    .with_batch_size(READ_BATCH_ROWS)
                    .build()
                    .map_err(|err| file_error(path, err))?;
                (Source::Parquet(reader), schema)
            }
            ExportFormat::Arrow => {
                let reader = FileReader::try_new(BufReader::new(file), None)
                    .map_err(|err| file_error(path, err))?;
                let schema = reader.schema();
                (Source::Arrow(reader), schema)
            }
        };
        check_columns(table, version, &schema).map_err(|problem| file_error(path, problem))?;
        Ok(Self {
            path: path.to_owned(),
            table,
            version,
            source,
        })
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The table.
    #[must_use]
    pub fn table(&self) -> CatalogTable {
        self.table
    }

    /// The DuckLake version whose columns the file holds.
    #[must_use]
    pub fn version(&self) -> DuckLakeVersion {
        self.version
    }
}

impl Iterator for TableReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = match &mut self.source {
            Source::Parquet(reader) => reader.next(),
            Source::Arrow(reader) => reader.next(),
        }?;
        Some(
            next.map_err(|err| file_error(&self.path, err))
                .and_then(|batch| {
                    Columns::new(&batch, self.version.columns(self.table))
                        .map_err(|err| file_error(&self.path, err))?;
                    Ok(batch)
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int64Array, StringArray};

    use super::*;

    const V03: DuckLakeVersion = DuckLakeVersion::V0_3;

    fn mappings(ids: std::ops::Range<i64>) -> RecordBatch {
        RecordBatch::try_new(
            served_schema(V03, CatalogTable::ColumnMapping),
            vec![
                Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef,
                Arc::new(Int64Array::from_iter_values(ids.clone().map(|i| i / 100))),
                // NULLs, so that validity buffers are written too.
                Arc::new(
                    ids.clone()
                        .map(|i| (i % 7 != 0).then_some("map_by_name"))
                        .collect::<StringArray>(),
                ),
            ],
        )
        .expect("batch")
    }

    /// Writes `batches` as one table file; its checksum.
    fn write(dir: &Path, format: ExportFormat, batches: &[RecordBatch]) -> WrittenFile {
        let mut writer =
            TableWriter::create(dir, CatalogTable::ColumnMapping, V03, format).expect("create");
        for batch in batches {
            writer.push(batch).expect("push");
        }
        writer.finish().expect("finish")
    }

    #[test]
    fn the_bytes_depend_on_the_rows_not_on_their_batches() {
        let rows = 3 * BATCH_ROWS + 17;
        let end = i64::try_from(rows).expect("fits");
        let whole = mappings(0..end);
        // Batches of odd sizes, sliced (so with offsets) and not.
        let mut pieces = Vec::new();
        let mut at = 0;
        for size in [1, 999, 5000, 1, 12_345].into_iter().cycle() {
            if at >= rows {
                break;
            }
            let size = size.min(rows - at);
            pieces.push(whole.slice(at, size));
            at += size;
        }
        let fresh: Vec<RecordBatch> = pieces
            .iter()
            .map(|piece| {
                let start = piece
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("ids")
                    .value(0);
                mappings(start..start + i64::try_from(piece.num_rows()).expect("fits"))
            })
            .collect();
        for format in [ExportFormat::Parquet, ExportFormat::Arrow] {
            let files: Vec<WrittenFile> = [vec![whole.clone()], pieces.clone(), fresh.clone()]
                .iter()
                .map(|batches| {
                    let dir = tempfile::tempdir().expect("dir");
                    write(dir.path(), format, batches)
                })
                .collect();
            for file in &files {
                assert_eq!(file.rows, u64::try_from(rows).expect("fits"));
                assert_eq!(file.sha256, files[0].sha256, "{format:?}");
                assert_eq!(file.bytes, files[0].bytes, "{format:?}");
            }
        }
    }

    #[test]
    fn files_read_back_as_written_with_their_checksum() {
        let dir = tempfile::tempdir().expect("dir");
        let batch = mappings(0..20_000);
        for format in [ExportFormat::Parquet, ExportFormat::Arrow] {
            let written = write(dir.path(), format, std::slice::from_ref(&batch));
            let path = dir.path().join(&written.file);
            assert!(
                !dir.path()
                    .join(format!("{}.partial", written.file))
                    .exists()
            );
            assert_eq!(
                sha256_of(&path).expect("hash"),
                (written.sha256, written.bytes)
            );
            let reader =
                TableReader::open(&path, CatalogTable::ColumnMapping, V03, format).expect("opens");
            let back: Vec<RecordBatch> = reader.collect::<Result<_>>().expect("reads");
            assert!(back.iter().all(|b| b.num_rows() <= READ_BATCH_ROWS));
            let back =
                datafusion::arrow::compute::concat_batches(&batch.schema(), &back).expect("concat");
            assert_eq!(back, batch, "{format:?}");
            // Another table's file is refused by its columns.
            let err = TableReader::open(&path, CatalogTable::DataFile, V03, format)
                .err()
                .expect("refused");
            assert!(err.to_string().contains("expected"), "{err}");
        }
    }

    #[test]
    fn rows_out_of_key_order_are_counted() {
        let mut rechunker = Rechunker::new(CatalogTable::ColumnMapping, V03);
        rechunker.push(&mappings(100..200)).expect("push");
        assert_eq!(rechunker.disordered(), 0);
        rechunker.push(&mappings(0..10)).expect("push");
        assert_eq!(rechunker.disordered(), 1);
        let err = rechunker
            .push(&RecordBatch::new_empty(served_schema(
                V03,
                CatalogTable::DataFile,
            )))
            .expect_err("another table's rows");
        assert!(err.contains("expected"), "{err}");
    }
}
