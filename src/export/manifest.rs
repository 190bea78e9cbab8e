//! `manifest.json`, what an export holds: the format and its version, the server it was read
//! from and when, the snapshot it read (when the server named one), and per table its file,
//! rows, bytes and SHA-256. `moraine import --from` trusts a file only once its bytes match.
//!
//! ```json
//! {
//!   "format": "moraine-export",
//!   "version": 1,
//!   "file_format": "parquet",
//!   "server": "grpc://127.0.0.1:50051",
//!   "exported_at": "2026-12-02T05:06:31Z",
//!   "snapshot": "0123456789abcdef0123456789abcdef",
//!   "tables": [
//!     {"table": "ducklake_column_mapping", "file": "ducklake_column_mapping.parquet",
//!      "rows": 7, "bytes": 2262, "sha256": "…64 hex digits…"}
//!   ]
//! }
//! ```

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::files::{WrittenFile, file_error, sha256_of};
use crate::config::ExportFormat;
use crate::error::Result;
use crate::model::{CatalogTable, DuckLakeVersion};

/// The manifest's file name in an export's directory.
pub const MANIFEST: &str = "manifest.json";
/// The manifest's `format`.
pub const FORMAT: &str = "moraine-export";
/// The manifest's `version` this build writes, and the newest it reads.
pub const VERSION: u64 = 1;

/// What an export holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The files' format.
    pub file_format: ExportFormat,
    /// The server URI the export read.
    pub server: String,
    /// When, RFC 3339 in UTC.
    pub exported_at: String,
    /// The snapshot every table was read at, when the server named one.
    pub snapshot: Option<String>,
    /// The DuckLake version whose columns the files hold (written as
    /// `"ducklake_version"`; 0.3 for a manifest that names none).
    pub ducklake: DuckLakeVersion,
    /// The tables' files, in the order written.
    pub files: Vec<WrittenFile>,
}

/// The DuckLake version a JSON object (a manifest, a dump of commits) says its rows are of,
/// in its `"ducklake_version"`: 0.3 when it names none.
///
/// # Errors
/// What is wrong with the field, as a message that follows the object's name.
pub fn ducklake_version_field(object: &Value) -> std::result::Result<DuckLakeVersion, String> {
    match object.get("ducklake_version") {
        None => Ok(DuckLakeVersion::default()),
        Some(name) => name
            .as_str()
            .and_then(DuckLakeVersion::parse)
            .ok_or_else(|| {
                format!("names DuckLake version {name}, which this moraine does not serve")
            }),
    }
}

fn format_name(format: ExportFormat) -> &'static str {
    match format {
        ExportFormat::Parquet => "parquet",
        ExportFormat::Arrow => "arrow",
    }
}

/// Whether `name` is a plain file name: nothing an import would resolve outside the
/// export's directory.
fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).file_name().is_some_and(|f| f == name)
}

impl Manifest {
    /// The manifest as the JSON written.
    #[must_use]
    pub fn to_json(&self) -> String {
        let tables: Vec<Value> = self
            .files
            .iter()
            .map(|f| {
                json!({
                    "table": f.table.name(),
                    "file": f.file,
                    "rows": f.rows,
                    "bytes": f.bytes,
                    "sha256": f.sha256,
                })
            })
            .collect();
        let manifest = json!({
            "format": FORMAT,
            "version": VERSION,
            "file_format": format_name(self.file_format),
            "server": self.server,
            "exported_at": self.exported_at,
            "snapshot": self.snapshot,
            "ducklake_version": self.ducklake.name(),
            "tables": tables,
        });
        let mut text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The manifest of the export in `dir`.
    ///
    /// # Errors
    /// [`crate::Error::ExportFile`] when it cannot be read, or is not a manifest this build
    /// reads.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|err| {
            file_error(
                &path,
                format!("{err} (is {} an export of moraine export?)", dir.display()),
            )
        })?;
        Self::parse(&text).map_err(|problem| file_error(&path, problem))
    }

    /// A manifest from its JSON.
    ///
    /// # Errors
    /// What is wrong with it, as a message.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let manifest: Value =
            serde_json::from_str(text).map_err(|err| format!("is not JSON: {err}"))?;
        let text_of = |value: &Value, key: &str| -> std::result::Result<String, String> {
            value
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("has no string {key:?}"))
        };
        let count_of = |value: &Value, key: &str| -> std::result::Result<u64, String> {
            value
                .get(key)
                .and_then(Value::as_u64)
                .ok_or_else(|| format!("has no count {key:?}"))
        };
        if text_of(&manifest, "format")? != FORMAT {
            return Err(format!("is not a manifest of {FORMAT}"));
        }
        let version = count_of(&manifest, "version")?;
        if version > VERSION {
            return Err(format!(
                "has version {version}: written by a newer moraine (this one reads version \
                 {VERSION})"
            ));
        }
        let file_format = match text_of(&manifest, "file_format")?.as_str() {
            "parquet" => ExportFormat::Parquet,
            "arrow" => ExportFormat::Arrow,
            other => return Err(format!("names file format {other:?}")),
        };
        let snapshot = match manifest.get("snapshot") {
            None | Some(Value::Null) => None,
            Some(Value::String(snapshot)) => Some(snapshot.clone()),
            Some(other) => return Err(format!("names snapshot {other}, not a string")),
        };
        let ducklake = ducklake_version_field(&manifest)?;
        let mut files: Vec<WrittenFile> = Vec::new();
        let tables = manifest
            .get("tables")
            .and_then(Value::as_array)
            .ok_or("has no \"tables\" list")?;
        for entry in tables {
            let name = text_of(entry, "table")?;
            let table = CatalogTable::from_name(&name)
                .ok_or_else(|| format!("names table {name:?}, which moraine does not serve"))?;
            let file = text_of(entry, "file")?;
            if !plain_file_name(&file) {
                return Err(format!(
                    "names file {file:?} for {table}: not a plain file name"
                ));
            }
            let sha256 = text_of(entry, "sha256")?;
            if sha256.len() != 64
                || !sha256
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            {
                return Err(format!(
                    "names checksum {sha256:?} for {table}: not a SHA-256"
                ));
            }
            if files.iter().any(|f| f.table == table) {
                return Err(format!("lists {table} twice"));
            }
            files.push(WrittenFile {
                table,
                file,
                rows: count_of(entry, "rows")?,
                bytes: count_of(entry, "bytes")?,
                sha256,
            });
        }
        Ok(Self {
            file_format,
            server: text_of(&manifest, "server")?,
            exported_at: text_of(&manifest, "exported_at")?,
            snapshot,
            ducklake,
            files,
        })
    }

    /// Writes the manifest into `dir`: under a temporary name first, renamed once synced,
    /// so a directory holds a manifest only once the export is complete.
    ///
    /// # Errors
    /// [`crate::Error::ExportFile`] when it cannot be written.
    pub fn write(&self, dir: &Path) -> Result<()> {
        use std::io::Write as _;
        let path = dir.join(MANIFEST);
        let partial = dir.join(format!("{MANIFEST}.partial"));
        let mut file = std::fs::File::create(&partial).map_err(|err| file_error(&partial, err))?;
        file.write_all(self.to_json().as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|err| file_error(&partial, err))?;
        std::fs::rename(&partial, &path).map_err(|err| file_error(&path, err))
    }

    /// The file of `table`, if the export holds it.
    #[must_use]
    pub fn file(&self, table: CatalogTable) -> Option<&WrittenFile> {
        self.files.iter().find(|f| f.table == table)
    }

    /// Checks every file in `dir` against its length and checksum, reading each once.
    ///
    /// # Errors
    /// [`crate::Error::ExportFile`] naming the first file that is missing or does not match.
    pub fn verify(&self, dir: &Path) -> Result<()> {
        for file in &self.files {
            let path = dir.join(&file.file);
            let (sha256, bytes) = sha256_of(&path)?;
            if sha256 != file.sha256 || bytes != file.bytes {
                return Err(file_error(
                    &path,
                    format!(
                        "does not match the manifest: it has {bytes} bytes with SHA-256 \
                         {sha256}, the manifest says {} bytes with SHA-256 {}; the export is \
                         damaged or was changed, so nothing was imported",
                        file.bytes, file.sha256
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `time` as RFC 3339 in UTC, to the second.
#[must_use]
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let of_day = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm, for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            file_format: ExportFormat::Parquet,
            server: "grpc://127.0.0.1:1".into(),
            exported_at: "2026-12-02T05:06:31Z".into(),
            snapshot: None,
            ducklake: DuckLakeVersion::V1_1,
            files: vec![WrittenFile {
                table: CatalogTable::DataFile,
                file: "ducklake_data_file.parquet".into(),
                rows: 3,
                bytes: 10,
                sha256: "ab".repeat(32),
            }],
        }
    }

    #[test]
    fn manifests_read_back_as_written() {
        let mut m = manifest();
        assert_eq!(Manifest::parse(&m.to_json()), Ok(m.clone()));
        m.snapshot = Some("0123456789abcdef0123456789abcdef".into());
        m.file_format = ExportFormat::Arrow;
        assert_eq!(Manifest::parse(&m.to_json()), Ok(m));
    }

    #[test]
    fn manifests_that_cannot_be_trusted_are_refused() {
        let text = manifest().to_json();
        for (from, to, says) in [
            ("\"version\": 1", "\"version\": 2", "newer moraine"),
            ("moraine-export", "other", "not a manifest"),
            (
                "\"ducklake_data_file.parquet\"",
                "\"../x.parquet\"",
                "not a plain file name",
            ),
            ("\"ducklake_data_file\"", "\"t\"", "does not serve"),
            ("abababab", "zzzzzzzz", "not a SHA-256"),
        ] {
            let changed = text.replacen(from, to, 1);
            assert_ne!(changed, text, "{from}");
            let err = Manifest::parse(&changed).expect_err(from);
            assert!(err.contains(says), "{from}: {err}");
        }
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let at = UNIX_EPOCH + Duration::from_secs(1_796_187_991);
        assert_eq!(rfc3339(at), "2026-12-02T05:06:31Z");
        let leap = UNIX_EPOCH + Duration::from_hours(264_384);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }
}
