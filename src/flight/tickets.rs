//! Tickets: self-contained, versioned, opaque to clients.
//!
//! A ticket carries everything needed to produce its stream (the SQL and its bound
//! parameters, or the table to stream), so it works on any connection, any server node, and
//! concurrently. Layout: `b"mrn"`, a version byte, then a protobuf body.
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

use crate::error::{Error, Result};
use crate::model::CatalogTable;

const MAGIC: &[u8] = b"mrn";
const VERSION: u8 = 1;

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
    pub fn encode(&self) -> Result<Vec<u8>> {
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
        };
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        body.encode(&mut out)
            .map_err(|err| invalid(format!("ticket does not encode: {err}")))?;
        Ok(out)
    }

    /// Parses a ticket.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for bytes that are not a ticket of this server.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let rest = bytes
            .strip_prefix(MAGIC)
            .ok_or_else(|| invalid("not a moraine ticket".into()))?;
        let (&version, body) = rest
            .split_first()
            .ok_or_else(|| invalid("truncated ticket".into()))?;
        if version != VERSION {
            return Err(invalid(format!(
                "ticket version {version} is not supported (this server issues {VERSION})"
            )));
        }
        let body =
            TicketBody::decode(body).map_err(|err| invalid(format!("malformed ticket: {err}")))?;
        match (body.sql, body.table) {
            (Some(sql), None) => Ok(TicketKind::Statement {
                sql,
                params: decode_params(&body.params)?,
                txn: body.txn,
            }),
            (None, None) if body.affected.is_some() => Ok(TicketKind::Affected {
                rows: body.affected.unwrap_or_default(),
            }),
            (None, Some(table)) => Ok(TicketKind::Table {
                table: CatalogTable::from_name(&table)
                    .ok_or_else(|| invalid(format!("ticket names unknown table {table}")))?,
                table_id: body.table_id,
            }),
            _ => Err(invalid(
                "malformed ticket: neither a query nor a table".into(),
            )),
        }
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidRequest { reason }
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
    let bad = |err: &dyn std::fmt::Display| invalid(format!("malformed ticket parameters: {err}"));
    let mut reader = StreamReader::try_new(bytes, None).map_err(|e| bad(&e))?;
    let batch = reader
        .next()
        .ok_or_else(|| invalid("malformed ticket parameters: no row".into()))?
        .map_err(|e| bad(&e))?;
    params_of_row(&batch, 0)
}

/// The values of row `row` of a parameter batch, in column order.
///
/// # Errors
/// [`Error::InvalidRequest`] when the row does not exist or a value cannot be read.
pub fn params_of_row(batch: &RecordBatch, row: usize) -> Result<Vec<ScalarValue>> {
    if row >= batch.num_rows() {
        return Err(invalid(format!(
            "parameter row {row} does not exist in a batch of {} rows",
            batch.num_rows()
        )));
    }
    batch
        .columns()
        .iter()
        .map(|column| {
            ScalarValue::try_from_array(column, row)
                .map_err(|err| invalid(format!("parameter does not decode: {err}")))
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
        ];
        for ticket in cases {
            let bytes = ticket.encode().expect("encodes");
            assert_eq!(TicketKind::decode(&bytes).expect("decodes"), ticket);
        }
    }

    #[test]
    fn foreign_or_future_tickets_are_refused() {
        assert!(matches!(
            TicketKind::decode(b"hello"),
            Err(Error::InvalidRequest { .. })
        ));
        let mut bytes = TicketKind::Table {
            table: CatalogTable::NameMapping,
            table_id: None,
        }
        .encode()
        .expect("encodes");
        bytes[3] = 9;
        let err = TicketKind::decode(&bytes).expect_err("future version");
        assert!(err.to_string().contains("version 9"), "{err}");
        assert!(TicketKind::decode(b"mrn\x01\xff\xff").is_err());
    }
}
