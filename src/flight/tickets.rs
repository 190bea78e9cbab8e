//! Tickets: self-contained, versioned, opaque to clients.
//!
//! A ticket carries everything needed to produce its stream (the SQL and its bound
//! parameters, or the table to stream), so it works on any connection, any server node, and
//! concurrently. Layout: `b"mrn"`, a version byte, a protobuf body, then an HMAC-SHA-256 of
//! everything before it under the server's [`TicketKey`]: a ticket a client made or altered
//! is refused before anything in it is read.
//!
//! Tickets travel inside Flight SQL's `TicketStatementQuery.statement_handle`.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use prost::Message as _;

use crate::error::{Error, Part, Result};
use crate::model::CatalogTable;

const MAGIC: &[u8] = b"mrn";
const VERSION: u8 = 2;
const MAC_LEN: usize = 32;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The key tickets are signed with: random per process unless configured (servers that
/// share one, behind a load balancer, must share the key).
#[derive(Clone)]
pub struct TicketKey([u8; 32]);

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(…)")
    }
}

impl TicketKey {
    /// A key from the operating system's generator.
    ///
    /// # Errors
    /// [`Error::Internal`] when the generator is unavailable.
    pub fn random() -> Result<Self> {
        crate::auth::random_bytes::<32>().map(Self)
    }

    /// The key derived from a configured secret.
    #[must_use]
    pub fn from_secret(secret: &str) -> Self {
        Self(crate::auth::token_digest(secret))
    }

    fn mac(&self) -> HmacSha256 {
        use hmac::Mac as _;
        // HMAC takes keys of any length.
        HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("any key length"))
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct TicketBody {
    /// A SQL statement, when the ticket is a query.
    #[prost(string, optional, tag = "1")]
    sql: Option<String>,
    /// The bound parameters: an Arrow IPC stream of one row.
    #[prost(bytes = "vec", tag = "2")]
    params: Vec<u8>,
    /// A served table, when the ticket streams a table.
    #[prost(string, optional, tag = "3")]
    table: Option<String>,
    /// Only the rows of this DuckLake table.
    #[prost(int64, optional, tag = "4")]
    table_id: Option<i64>,
    /// The transaction whose view a query reads.
    #[prost(string, optional, tag = "5")]
    txn: Option<String>,
    /// The affected-row count of a write statement already executed.
    #[prost(int64, optional, tag = "6")]
    affected: Option<i64>,
    /// The held snapshot a part of a whole-table read reads.
    #[prost(bytes = "vec", optional, tag = "7")]
    snapshot: Option<Vec<u8>>,
    /// The part's serial among the endpoints of its snapshot.
    #[prost(uint32, tag = "8")]
    serial: u32,
    /// The part's least table id.
    #[prost(int64, tag = "9")]
    tables_from: i64,
    /// The part's greatest table id.
    #[prost(int64, tag = "10")]
    tables_to: i64,
}

/// What a ticket streams.
#[derive(Debug, Clone, PartialEq)]
pub enum TicketKind {
    /// A query with its bound parameters.
    Statement {
        /// The SQL.
        sql: String,
        /// Positional parameters.
        params: Vec<ScalarValue>,
        /// Read in this transaction's view, not the latest state.
        txn: Option<String>,
    },
    /// The result of a write statement that already ran: one row, its affected-row count.
    Affected {
        /// The count.
        rows: i64,
    },
    /// One part of a whole-table read: the rows of a range of DuckLake tables at a held
    /// snapshot.
    Part {
        /// The table.
        table: CatalogTable,
        /// The DuckLake tables, by id.
        tables: std::ops::RangeInclusive<i64>,
        /// The held snapshot.
        snapshot: super::held::HeldId,
        /// This endpoint among those of the snapshot.
        serial: u32,
    },
    /// A whole table, or one DuckLake table's rows of it.
    Table {
        /// The table.
        table: CatalogTable,
        /// Only this `table_id`.
        table_id: Option<i64>,
    },
}

impl TicketKind {
    /// The ticket's bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when a parameter cannot be encoded.
    pub fn encode(&self, key: &TicketKey) -> Result<Vec<u8>> {
        let body = match self {
            TicketKind::Statement { sql, params, txn } => TicketBody {
                sql: Some(sql.clone()),
                params: encode_params(params)?,
                txn: txn.clone(),
                ..TicketBody::default()
            },
            TicketKind::Table { table, table_id } => TicketBody {
                table: Some(table.name().to_owned()),
                table_id: *table_id,
                ..TicketBody::default()
            },
            TicketKind::Affected { rows } => TicketBody {
                affected: Some(*rows),
                ..TicketBody::default()
            },
            TicketKind::Part {
                table,
                tables,
                snapshot,
                serial,
            } => TicketBody {
                table: Some(table.name().to_owned()),
                snapshot: Some(snapshot.to_vec()),
                serial: *serial,
                tables_from: *tables.start(),
                tables_to: *tables.end(),
                ..TicketBody::default()
            },
        };
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        body.encode(&mut out)
            .map_err(|err| invalid(format!("ticket does not encode: {err}")))?;
        let mut mac = key.mac();
        hmac::Mac::update(&mut mac, &out);
        out.extend_from_slice(&hmac::Mac::finalize(mac).into_bytes());
        Ok(out)
    }

    /// Parses a ticket signed with `key`.
    ///
    /// # Errors
    /// [`Error::Malformed`] for bytes that are not a ticket this server issued.
    pub fn decode(bytes: &[u8], key: &TicketKey) -> Result<Self> {
        let (signed, tag) = bytes
            .split_at_checked(bytes.len().saturating_sub(MAC_LEN))
            .filter(|(signed, _)| signed.len() > MAGIC.len())
            .ok_or_else(|| ticket("is not a moraine ticket"))?;
        let mut mac = key.mac();
        hmac::Mac::update(&mut mac, signed);
        if hmac::Mac::verify_slice(mac, tag).is_err() {
            return Err(ticket(
                "is not one this server issued (its signature does not match)",
            ));
        }
        let rest = signed
            .strip_prefix(MAGIC)
            .ok_or_else(|| ticket("is not a moraine ticket"))?;
        let (&version, body) = rest.split_first().ok_or_else(|| ticket("is truncated"))?;
        if version != VERSION {
            return Err(ticket(format!(
                "has version {version}, which is not supported (this server issues {VERSION})"
            )));
        }
        let body =
            TicketBody::decode(body).map_err(|err| ticket(format!("is malformed: {err}")))?;
        match (body.sql, body.table) {
            (Some(sql), None) => Ok(TicketKind::Statement {
                sql,
                params: decode_params(&body.params)?,
                txn: body.txn,
            }),
            (None, None) if body.affected.is_some() => Ok(TicketKind::Affected {
                rows: body.affected.unwrap_or_default(),
            }),
            (None, Some(table)) => {
                let table = CatalogTable::from_name(&table).ok_or_else(|| {
                    ticket(format!(
                        "names unknown table {}",
                        crate::error::excerpt(&table)
                    ))
                })?;
                match body.snapshot {
                    None => Ok(TicketKind::Table {
                        table,
                        table_id: body.table_id,
                    }),
                    Some(snapshot) => Ok(TicketKind::Part {
                        table,
                        tables: body.tables_from..=body.tables_to,
                        snapshot: snapshot
                            .try_into()
                            .map_err(|_| ticket("is malformed: a snapshot id of the wrong size"))?,
                        serial: body.serial,
                    }),
                }
            }
            _ => Err(ticket("is malformed: neither a query nor a table")),
        }
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidRequest { reason }
}

fn ticket(problem: impl Into<String>) -> Error {
    Error::Malformed {
        part: Part::Ticket,
        problem: problem.into(),
    }
}

fn parameters(problem: String) -> Error {
    Error::Malformed {
        part: Part::Parameters,
        problem,
    }
}

fn encode_params(params: &[ScalarValue]) -> Result<Vec<u8>> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    let arrays: Vec<ArrayRef> = params
        .iter()
        .map(ScalarValue::to_array)
        .collect::<Result<_, _>>()
        .map_err(|err| invalid(format!("parameter does not encode: {err}")))?;
    let fields: Vec<Field> = arrays
        .iter()
        .enumerate()
        .map(|(i, a)| Field::new(i.to_string(), a.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|err| invalid(format!("parameters do not encode: {err}")))?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|err| invalid(format!("parameters do not encode: {err}")))?;
    writer
        .write(&batch)
        .and_then(|()| writer.finish())
        .map_err(|err| invalid(format!("parameters do not encode: {err}")))?;
    drop(writer);
    Ok(out)
}

fn decode_params(bytes: &[u8]) -> Result<Vec<ScalarValue>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |err: &dyn std::fmt::Display| ticket(format!("has malformed parameters: {err}"));
    let mut reader = StreamReader::try_new(bytes, None).map_err(|e| bad(&e))?;
    let batch = reader
        .next()
        .ok_or_else(|| ticket("has malformed parameters: no row"))?
        .map_err(|e| bad(&e))?;
    params_of_row(&batch, 0)
}

/// The values of row `row` of a parameter batch, in column order.
///
/// # Errors
/// [`Error::Malformed`] when the row does not exist or a value cannot be read.
pub fn params_of_row(batch: &RecordBatch, row: usize) -> Result<Vec<ScalarValue>> {
    if row >= batch.num_rows() {
        return Err(parameters(format!(
            "has no row {row}, only {} rows",
            batch.num_rows()
        )));
    }
    batch
        .columns()
        .iter()
        .map(|column| {
            ScalarValue::try_from_array(column, row)
                .map_err(|err| parameters(format!("does not decode: {err}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip() {
        let cases = [
            TicketKind::Statement {
                sql: "SELECT 1".into(),
                params: vec![],
                txn: None,
            },
            TicketKind::Statement {
                sql: "SELECT * FROM t WHERE a = $1 AND b = $2".into(),
                params: vec![ScalarValue::Int64(Some(7)), ScalarValue::Utf8(None)],
                txn: Some("0f".repeat(16)),
            },
            TicketKind::Affected { rows: 42 },
            TicketKind::Table {
                table: CatalogTable::DataFile,
                table_id: Some(-3),
            },
            TicketKind::Part {
                table: CatalogTable::NameMapping,
                tables: i64::MIN..=-7,
                snapshot: [9; 16],
                serial: 3,
            },
        ];
        let key = TicketKey::random().expect("key");
        for ticket in cases {
            let bytes = ticket.encode(&key).expect("encodes");
            assert_eq!(TicketKind::decode(&bytes, &key).expect("decodes"), ticket);
        }
    }

    #[test]
    fn foreign_forged_or_altered_tickets_are_refused() {
        let key = TicketKey::random().expect("key");
        assert!(matches!(
            TicketKind::decode(b"hello", &key),
            Err(Error::Malformed { .. })
        ));
        let ticket = TicketKind::Statement {
            sql: "SELECT 1".into(),
            params: vec![],
            txn: Some("0f".repeat(16)),
        };
        let bytes = ticket.encode(&key).expect("encodes");
        let other = TicketKey::random().expect("key");
        let err = TicketKind::decode(&bytes, &other).expect_err("another server's key");
        assert!(
            err.to_string().contains("not one this server issued"),
            "{err}"
        );
        for at in [3, 5, bytes.len() - 1] {
            let mut altered = bytes.clone();
            altered[at] ^= 1;
            assert!(
                TicketKind::decode(&altered, &key).is_err(),
                "byte {at} altered"
            );
        }
        assert!(TicketKind::decode(&bytes, &TicketKey::from_secret("s")).is_err());
        let shared = TicketKey::from_secret("shared secret");
        let bytes = ticket.encode(&shared).expect("encodes");
        assert_eq!(
            TicketKind::decode(&bytes, &TicketKey::from_secret("shared secret")).expect("decodes"),
            ticket
        );
    }
}
