//! `moraine export`: the catalog's tables, read from a server over plain Flight, written to
//! one file per table ([`files`]) with a manifest of their checksums ([`manifest`]).
//!
//! For each table the exporter asks `GetFlightInfo` of the path `[table]`; once the first
//! answer names a snapshot (its `app_metadata`, `{"snapshot": "<hex>", "expires_in_ms": n}`),
//! the later tables are asked at that snapshot, `[table, "@<hex>"]`, so every file holds the
//! catalog as of one instant. Every `FlightInfo` is asked for before any endpoint is read.
//! The endpoints of a table cover disjoint, ascending ranges of its key, so their rows in
//! endpoint order are the table in key order.
//!
//! Endpoints are read concurrently, at most `--parallel` at once, each into a channel of
//! [`BATCHES_AHEAD`] batches; one writer, on a blocking thread, takes the endpoints in order
//! and writes each table's file. So memory is bounded by the readers' channels whatever the
//! catalog's size, and the files come out in the same order however the reads interleave.

pub mod files;
pub mod manifest;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_flight::{FlightEndpoint, FlightInfo, Ticket};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt as _;
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc};

pub use self::files::{TableReader, WrittenFile, file_name, sha256_of};
pub use self::manifest::{Manifest, ducklake_version_field};
use crate::client::Client;
use crate::config::{ExportConfig, ExportFormat};
use crate::error::{Error, Named, Result};
use crate::model::{CatalogTable, DuckLakeVersion};
use crate::progress::{Progress, Total};

/// Batches one endpoint's reader may hold for the writer.
pub const BATCHES_AHEAD: usize = 2;

/// Longest snapshot name taken from a server.
const MAX_SNAPSHOT: usize = 64;

/// What the exporter tells about a snapshot the server let go of.
const SNAPSHOT_ADVICE: &str = "; the server no longer holds the snapshot this export reads: \
                               re-run the export, or raise the server's --snapshot-ttl";

/// One endpoint to read.
#[derive(Debug, Clone)]
struct Part {
    table: CatalogTable,
    /// Its position among the table's endpoints, from 0.
    index: usize,
    /// How many endpoints the table has.
    of: usize,
    ticket: Ticket,
    /// The server's estimate of its bytes.
    volume: Option<u64>,
}

impl Part {
    fn name(&self) -> String {
        format!(
            "endpoint {} of {} of {}",
            self.index + 1,
            self.of,
            self.table
        )
    }
}

/// What an export reads: the snapshot, and every table's endpoints in the order written.
#[derive(Debug)]
struct Plan {
    snapshot: Option<String>,
    /// The DuckLake version the server's `ducklake_data_file` schema is of (0.3 when it is
    /// not exported: the other tables are the same in every version).
    ducklake: DuckLakeVersion,
    tables: Vec<(CatalogTable, Vec<Part>)>,
}

/// What arrives from one endpoint's reader.
enum Piece {
    Batch(RecordBatch),
    /// The endpoint's stream ended, complete.
    End,
}

/// The tables `names` asks for (all of them when empty), in the catalog's order.
fn tables_of(names: &[String]) -> Result<Vec<CatalogTable>> {
    if names.is_empty() {
        return Ok(CatalogTable::ALL.to_vec());
    }
    let mut tables = names
        .iter()
        .map(|name| {
            CatalogTable::from_name(name.trim()).ok_or_else(|| Error::NotFound {
                what: Named::Table(name.clone()),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    tables.sort();
    tables.dedup();
    Ok(tables)
}

/// Refuses `out` when it holds an export already.
fn check_out(out: &Path) -> Result<()> {
    let manifest = out.join(manifest::MANIFEST);
    if manifest.exists() {
        return Err(files::file_error(
            &manifest,
            "exists: the directory holds an export already; choose another --out, or remove \
             it first",
        ));
    }
    Ok(())
}

/// `out`, created if missing.
fn prepare(out: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(out).map_err(|err| files::file_error(out, err))?;
    check_out(out)?;
    Ok(out.to_owned())
}

/// The JSON object of some `app_metadata`, if it holds one.
fn metadata_object(metadata: &[u8], of: &str) -> Option<serde_json::Map<String, Value>> {
    if metadata.is_empty() {
        return None;
    }
    if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(metadata) {
        Some(object)
    } else {
        tracing::warn!("the app_metadata of {of} is not a JSON object; ignored");
        None
    }
}

/// The snapshot a `FlightInfo` names, and for how long the server holds it.
fn snapshot_of(info: &FlightInfo, of: &str) -> Option<(String, Option<u64>)> {
    let object = metadata_object(&info.app_metadata, of)?;
    let snapshot = object.get("snapshot")?.as_str()?;
    if snapshot.is_empty()
        || snapshot.len() > MAX_SNAPSHOT
        || !snapshot.bytes().all(|b| b.is_ascii_hexdigit())
    {
        tracing::warn!("{of} names a snapshot that is not hex; read without one");
        return None;
    }
    let expires = object.get("expires_in_ms").and_then(Value::as_u64);
    Some((snapshot.to_ascii_lowercase(), expires))
}

/// The endpoints of `table`'s `FlightInfo`, checked.
fn parts_of(table: CatalogTable, info: FlightInfo) -> Result<Vec<Part>> {
    let of = info.endpoint.len();
    info.endpoint
        .into_iter()
        .enumerate()
        .map(|(index, endpoint)| part_of(table, index, of, endpoint))
        .collect()
}

fn part_of(table: CatalogTable, index: usize, of: usize, endpoint: FlightEndpoint) -> Result<Part> {
    let name = format!("endpoint {} of {of} of {table}", index + 1);
    // No location, or the one that means "this connection": this server.
    if endpoint
        .location
        .iter()
        .any(|location| !location.uri.starts_with("arrow-flight-reuse-connection:"))
    {
        return Err(Error::Unsupported {
            what: format!(
                "{name} is to be read from {:?}; moraine export reads only from the server it \
                 asked",
                endpoint
                    .location
                    .iter()
                    .map(|l| l.uri.as_str())
                    .collect::<Vec<_>>()
            ),
        });
    }
    let ticket = endpoint.ticket.ok_or_else(|| Error::Remote {
        call: format!("GetFlightInfo [{table:?}]"),
        code: "OK",
        message: format!("{name} has no ticket"),
        advice: "",
    })?;
    let volume = metadata_object(&endpoint.app_metadata, &name)
        .and_then(|object| object.get("volume").and_then(Value::as_u64));
    Ok(Part {
        table,
        index,
        of,
        ticket,
        volume,
    })
}

/// Asks for every table's `FlightInfo`, the later tables at the snapshot the first names.
async fn plan(client: &mut Client, tables: &[CatalogTable]) -> Result<Plan> {
    let mut snapshot: Option<String> = None;
    let mut ducklake = DuckLakeVersion::default();
    let mut planned = Vec::new();
    for (i, &table) in tables.iter().enumerate() {
        let mut path = vec![table.name().to_owned()];
        if let Some(snapshot) = &snapshot {
            path.push(format!("@{snapshot}"));
        }
        let call = format!("GetFlightInfo {path:?}");
        let info = client.flight_info(path).await?;
        let named = snapshot_of(&info, &call);
        match (&snapshot, named) {
            (None, Some((named, expires))) if i == 0 => {
                tracing::info!(
                    snapshot = %named,
                    expires_in_ms = expires,
                    "reading every table at the server's snapshot"
                );
                snapshot = Some(named);
            }
            (None, _) => {
                if i == 0 {
                    tracing::info!(
                        "the server names no snapshot: each table is read as of its own read"
                    );
                }
            }
            (Some(asked), Some((named, _))) if *asked == named => {}
            (Some(asked), named) => {
                return Err(Error::Remote {
                    call,
                    code: "OK",
                    message: format!(
                        "asked for snapshot {asked}, the answer names {}",
                        named.map_or_else(|| "none".to_owned(), |(named, _)| named)
                    ),
                    advice: "",
                });
            }
        }
        if table == CatalogTable::DataFile {
            ducklake = version_of(&info, &call)?;
        }
        planned.push((table, parts_of(table, info)?));
    }
    Ok(Plan {
        snapshot,
        ducklake,
        tables: planned,
    })
}

/// The DuckLake version whose `ducklake_data_file` columns the `FlightInfo` of that table
/// has.
fn version_of(info: &FlightInfo, call: &str) -> Result<DuckLakeVersion> {
    let remote = |message: String| Error::Remote {
        call: call.to_owned(),
        code: "OK",
        message,
        advice: "",
    };
    let schema = info
        .clone()
        .try_decode_schema()
        .map_err(|err| remote(format!("the schema does not decode: {err}")))?;
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    DuckLakeVersion::of_data_file_columns(&names).ok_or_else(|| {
        remote(format!(
            "the columns {names:?} are no DuckLake version's ducklake_data_file"
        ))
    })
}

/// An error of reading an endpoint, with advice when the snapshot has expired.
fn advised(err: Error) -> Error {
    match err {
        Error::Remote {
            call,
            code: code @ "FAILED_PRECONDITION",
            message,
            advice: _,
        } if message.to_ascii_lowercase().contains("snapshot") => Error::Remote {
            call,
            code,
            message,
            advice: SNAPSHOT_ADVICE,
        },
        other => other,
    }
}

/// Reads one endpoint into `out`, ending with [`Piece::End`] once its stream is complete.
async fn fetch(
    mut client: Client,
    part: Part,
    out: mpsc::Sender<Result<Piece>>,
    wire: Arc<AtomicU64>,
) {
    let mut stream = match client.read(part.ticket.clone(), &part.name(), wire).await {
        Ok(stream) => stream,
        Err(err) => {
            let _ = out.send(Err(advised(err))).await;
            return;
        }
    };
    while let Some(item) = stream.next().await {
        let failed = item.is_err();
        let sent = out.send(item.map(Piece::Batch).map_err(advised)).await;
        if sent.is_err() || failed {
            return;
        }
    }
    let _ = out.send(Ok(Piece::End)).await;
}

/// Starts the endpoints' readers in order, at most `parallel` reading at once, and hands
/// their channels to the writer in the same order.
async fn schedule(
    client: Client,
    parts: Vec<Part>,
    parallel: usize,
    readers: mpsc::Sender<mpsc::Receiver<Result<Piece>>>,
    wire: Arc<AtomicU64>,
) {
    let permits = Arc::new(Semaphore::new(parallel));
    for part in parts {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let (tx, rx) = mpsc::channel(BATCHES_AHEAD);
        if readers.send(rx).await.is_err() {
            // The writer stopped.
            return;
        }
        let client = client.clone();
        let wire = Arc::clone(&wire);
        tokio::spawn(async move {
            fetch(client, part, tx, wire).await;
            drop(permit);
        });
    }
}

/// The writer: each table's file from its endpoints' channels, in order.
fn write_tables(
    dir: &Path,
    format: ExportFormat,
    ducklake: DuckLakeVersion,
    layout: &[(CatalogTable, usize)],
    mut readers: mpsc::Receiver<mpsc::Receiver<Result<Piece>>>,
    progress: &Progress,
    wire: &AtomicU64,
) -> Result<Vec<WrittenFile>> {
    let mut written = Vec::new();
    let mut counted = 0;
    for &(table, endpoints) in layout {
        let mut writer = files::TableWriter::create(dir, table, ducklake, format)?;
        let mut read_endpoints = || -> Result<()> {
            for index in 0..endpoints {
                let mut reader = readers.blocking_recv().ok_or_else(|| Error::Internal {
                    context: "exporting",
                    reason: "the endpoint readers stopped".into(),
                })?;
                loop {
                    match reader.blocking_recv() {
                        Some(Ok(Piece::Batch(batch))) => {
                            writer.push(&batch)?;
                            let now = wire.load(Ordering::Relaxed);
                            progress.add(
                                u64::try_from(batch.num_rows()).unwrap_or(u64::MAX),
                                now.saturating_sub(counted),
                            );
                            counted = now;
                        }
                        Some(Ok(Piece::End)) => break,
                        Some(Err(err)) => return Err(err),
                        None => {
                            return Err(Error::Internal {
                                context: "exporting",
                                reason: format!(
                                    "the reader of endpoint {} of {table} stopped before its end",
                                    index + 1
                                ),
                            });
                        }
                    }
                }
                progress.step();
            }
            Ok(())
        };
        if let Err(err) = read_endpoints() {
            let partial = dir.join(format!("{}.partial", file_name(table, format)));
            drop(writer);
            let _ = std::fs::remove_file(partial);
            return Err(err);
        }
        let file = writer.finish()?;
        tracing::info!(
            table = %table,
            rows = file.rows,
            bytes = file.bytes,
            file = %file.file,
            "table exported"
        );
        written.push(file);
    }
    Ok(written)
}

/// Runs `moraine export`: reads the tables from the server and writes their files and the
/// manifest (last, so a directory with a manifest holds a complete export).
///
/// # Errors
/// [`Error::NotFound`] for a table not served; [`Error::ExportFile`] when the directory or a
/// file cannot be written, or holds an export already; [`Error::Config`] or
/// [`Error::Remote`] when the server cannot be reached, refuses the credentials, or refuses a
/// read (an expired snapshot says so, with what to do).
pub async fn export(config: ExportConfig) -> Result<Manifest> {
    let started = std::time::SystemTime::now();
    let tables = tables_of(&config.tables)?;
    check_out(&config.out)?;
    let client = Client::connect(&config.server, &config.client).await?;
    let plan = plan(&mut client.clone(), &tables).await?;
    let dir = prepare(&config.out)?;
    let parts: Vec<Part> = plan
        .tables
        .iter()
        .flat_map(|(_, parts)| parts.iter().cloned())
        .collect();
    let volumes: Option<Vec<u64>> = parts.iter().map(|p| p.volume).collect();
    let total = match volumes {
        Some(volumes) if !parts.is_empty() => Total::Bytes(volumes.iter().sum()),
        _ => Total::Steps {
            count: u64::try_from(parts.len()).unwrap_or(u64::MAX),
            unit: "endpoints",
        },
    };
    tracing::info!(
        tables = tables.len(),
        endpoints = parts.len(),
        out = %dir.display(),
        "exporting"
    );
    let layout: Vec<(CatalogTable, usize)> = plan
        .tables
        .iter()
        .map(|(table, parts)| (*table, parts.len()))
        .collect();
    let progress = Arc::new(Progress::new("export", total));
    let wire = Arc::new(AtomicU64::new(0));
    let parallel = usize::try_from(config.parallel).unwrap_or(1).max(1);
    let (readers_tx, readers_rx) = mpsc::channel(parallel);
    let scheduler = tokio::spawn(schedule(
        client,
        parts,
        parallel,
        readers_tx,
        Arc::clone(&wire),
    ));
    let written = {
        let dir = dir.clone();
        let progress = Arc::clone(&progress);
        let format = config.format;
        let ducklake = plan.ducklake;
        tokio::task::spawn_blocking(move || {
            write_tables(
                &dir, format, ducklake, &layout, readers_rx, &progress, &wire,
            )
        })
        .await
        .map_err(|err| Error::Internal {
            context: "writing the export",
            reason: err.to_string(),
        })
        .and_then(|written| written)
    };
    scheduler.abort();
    let written = match written {
        Ok(written) => written,
        Err(err) => {
            progress.abandon();
            return Err(err);
        }
    };
    progress.finish();
    let manifest = Manifest {
        file_format: config.format,
        server: config.server,
        exported_at: manifest::rfc3339(started),
        snapshot: plan.snapshot,
        ducklake: plan.ducklake,
        files: written,
    };
    manifest.write(&dir)?;
    tracing::info!(
        manifest = %dir.join(manifest::MANIFEST).display(),
        "export complete"
    );
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_named_by_ducklakes_names_and_kept_in_catalog_order() {
        let names =
            |list: &[&str]| tables_of(&list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(names(&[]).expect("all"), CatalogTable::ALL.to_vec());
        assert_eq!(
            names(&[
                "ducklake_data_file",
                "DUCKLAKE_COLUMN_MAPPING",
                "ducklake_data_file"
            ])
            .expect("two"),
            vec![CatalogTable::ColumnMapping, CatalogTable::DataFile]
        );
        let err = names(&["ducklake_snapshot"]).expect_err("not served");
        assert!(err.to_string().contains("ducklake_snapshot"), "{err}");
    }

    #[test]
    fn a_snapshot_is_taken_from_the_info_only_when_well_formed() {
        let info = |metadata: &str| FlightInfo::new().with_app_metadata(metadata.to_owned());
        assert_eq!(snapshot_of(&info(""), "t"), None);
        assert_eq!(snapshot_of(&info("not json"), "t"), None);
        assert_eq!(snapshot_of(&info(r#"{"snapshot": "../x"}"#), "t"), None);
        assert_eq!(
            snapshot_of(
                &info(r#"{"snapshot": "00FF00ff00ff00ff00ff00ff00ff00ff", "expires_in_ms": 5}"#),
                "t"
            ),
            Some(("00ff00ff00ff00ff00ff00ff00ff00ff".into(), Some(5)))
        );
    }

    #[test]
    fn endpoints_elsewhere_or_without_a_ticket_are_refused() {
        let ticket = Ticket::new("t");
        let here = FlightEndpoint::new()
            .with_ticket(ticket.clone())
            .with_app_metadata(r#"{"volume": 42}"#);
        let part = part_of(CatalogTable::DataFile, 0, 1, here).expect("this server");
        assert_eq!(part.volume, Some(42));
        let reuse = FlightEndpoint::new()
            .with_ticket(ticket.clone())
            .with_location("arrow-flight-reuse-connection://?");
        assert!(part_of(CatalogTable::DataFile, 0, 1, reuse).is_ok());
        let elsewhere = FlightEndpoint::new()
            .with_ticket(ticket)
            .with_location("grpc://elsewhere:1");
        let err = part_of(CatalogTable::DataFile, 0, 1, elsewhere).expect_err("elsewhere");
        assert!(err.to_string().contains("grpc://elsewhere:1"), "{err}");
        let err =
            part_of(CatalogTable::DataFile, 0, 1, FlightEndpoint::new()).expect_err("no ticket");
        assert!(err.to_string().contains("no ticket"), "{err}");
    }

    #[test]
    fn an_expired_snapshot_comes_with_advice() {
        let err = advised(Error::Remote {
            call: "DoGet".into(),
            code: "FAILED_PRECONDITION",
            message: "snapshot 00ff has expired".into(),
            advice: "",
        });
        assert!(err.to_string().contains("--snapshot-ttl"), "{err}");
    }
}
