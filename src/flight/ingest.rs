//! Writes over Flight: Flight SQL ingest, write statements, and the one-stream plain-Flight
//! upload. Each stages what it reads as it reads it, into the caller's transaction or into
//! one atomic commit of its own.

use arrow_flight::sql::CommandStatementIngest;
use datafusion::common::ScalarValue;

use super::service::MoraineSqlService;
use super::upload::Upload;
use crate::auth::{Role, Session};
use crate::catalog::CatalogSnapshot;
use crate::error::{Error, Named, Result};
use crate::model::CatalogTable;
use crate::query::dml::WriteStatement;
use crate::txn::TxnId;
use crate::write::Op;
use crate::write::decode::{MissingColumns, RowShape};

/// The app metadata that makes a one-stream `DoPut` commit, on the stream's last message.
pub const COMMIT_MARKER: &[u8] = b"commit";

impl MoraineSqlService {
    /// Stages `ops` in `txn`, or commits them at once outside a transaction; the rows they
    /// affect.
    pub(super) async fn apply(
        &self,
        ops: Vec<Op>,
        txn: Option<&TxnId>,
        base: Option<CatalogSnapshot>,
    ) -> Result<i64> {
        if ops.is_empty() {
            return Ok(0);
        }
        let affected = match txn {
            Some(id) => self.txns.stage(id, ops).await?,
            None => self.txns.autocommit(ops, base).await?.affected.iter().sum(),
        };
        Ok(i64::try_from(affected).unwrap_or(i64::MAX))
    }

    /// Runs a write statement in `txn` (or on its own) and returns the rows it affected.
    pub(super) async fn run_write(
        &self,
        write: &WriteStatement,
        params: Vec<ScalarValue>,
        txn: Option<&TxnId>,
        session: &Session,
    ) -> Result<i64> {
        session.require(Role::Writer, "a write statement")?;
        let view = self.view(txn).await?;
        let ops = self.engine.write_ops(&view, write, params).await?;
        self.apply(ops, txn, Some(view)).await
    }

    /// A one-stream plain-Flight upload to `path`: one atomic batch, staged as it is read and
    /// committed only when the stream's last message carries [`COMMIT_MARKER`]. Returns the
    /// put result's JSON.
    pub(crate) async fn plain_put(&self, path: &[String], upload: Upload) -> Result<String> {
        let (shape, missing) = match path {
            [name] if name == "ducklake_mapping" => (RowShape::MappingLoad, MissingColumns::Refuse),
            [name] if name == "ducklake_commit" => (RowShape::Commit, MissingColumns::Null),
            [name] if name == CatalogTable::DataFile.name() => (
                RowShape::Table(CatalogTable::DataFile),
                MissingColumns::Refuse,
            ),
            _ => {
                return Err(Error::NotFound {
                    what: Named::UploadPath(path.join("/")),
                });
            }
        };
        let (changes, tally) = upload.changes(shape, self.engine.catalog().ducklake(), missing);
        let marker = tally.clone();
        let report = self
            .txns
            .autocommit_stream(changes, None, move || {
                if marker.last_metadata().as_ref() == COMMIT_MARKER {
                    return Ok(());
                }
                Err(Error::NotCommitted {
                    reason: format!(
                        "upload to {path:?} not committed: the stream ended without the commit marker (app_metadata {:?} on its last message); nothing of its {} rows was written",
                        String::from_utf8_lossy(COMMIT_MARKER),
                        marker.rows()
                    ),
                })
            })
            .await?;
        Ok(format!(
            "{{\"committed\": true, \"rows\": {}, \"mappings\": {}, \"data_files\": {}}}",
            tally.rows(),
            report.summary.mappings_created,
            report.summary.files_created
        ))
    }

    /// A Flight SQL ingest of `cmd`'s table, into the caller's transaction (the one it names,
    /// else its session's open one) or committed on its own; the rows it read.
    pub(super) async fn ingest(
        &self,
        cmd: &CommandStatementIngest,
        upload: Upload,
        session: &Session,
    ) -> Result<i64> {
        session.require(Role::Writer, "ingest")?;
        let table = ingest_target(cmd)?;
        let txn = self.txn_of(cmd.transaction_id.as_ref(), session)?;
        let (changes, tally) = upload.changes(
            RowShape::Table(table),
            self.engine.catalog().ducklake(),
            MissingColumns::Refuse,
        );
        // Staged batch by batch as the stream is read; a stream that fails stages nothing.
        if let Some(id) = txn {
            self.txns.stage_stream(&id, changes).await?;
        } else {
            self.txns
                .autocommit_stream(changes, None, || Ok(()))
                .await?;
        }
        Ok(i64::try_from(tally.rows()).unwrap_or(i64::MAX))
    }
}

fn ingest_target(cmd: &CommandStatementIngest) -> Result<CatalogTable> {
    use arrow_flight::sql::{TableExistsOption, TableNotExistOption};
    if cmd.temporary {
        return Err(Error::InvalidRequest {
            reason: format!(
                "cannot ingest into a temporary table {}",
                crate::error::excerpt(&cmd.table)
            ),
        });
    }
    let catalog_ok = cmd
        .catalog
        .as_deref()
        .is_none_or(|c| c.is_empty() || c.eq_ignore_ascii_case(crate::query::CATALOG_NAME));
    let schema_ok = cmd
        .schema
        .as_deref()
        .is_none_or(|s| s.is_empty() || s.eq_ignore_ascii_case(crate::query::SCHEMA_NAME));
    let options = cmd.table_definition_options.unwrap_or_default();
    let table = CatalogTable::from_name(&cmd.table).filter(|_| catalog_ok && schema_ok);
    let Some(table) = table else {
        if TableNotExistOption::try_from(options.if_not_exist) == Ok(TableNotExistOption::Create) {
            return Err(Error::Unsupported {
                what: format!(
                    "cannot create table {}: the catalog tables are fixed ({})",
                    crate::error::excerpt(&cmd.table),
                    CatalogTable::ALL.map(CatalogTable::name).join(", ")
                ),
            });
        }
        return Err(Error::NotFound {
            what: Named::Table(cmd.table.clone()),
        });
    };
    match TableExistsOption::try_from(options.if_exists) {
        Ok(TableExistsOption::Append | TableExistsOption::Unspecified) | Err(_) => Ok(table),
        Ok(TableExistsOption::Fail) => Err(Error::AlreadyExists {
            what: Named::CatalogTable(table),
            remedy: "ingest into it with mode append",
        }),
        Ok(TableExistsOption::Replace) => Err(Error::Unsupported {
            what: format!(
                "replacing table {table} is not supported; DELETE its rows and append instead"
            ),
        }),
    }
}
