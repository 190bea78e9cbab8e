//! The value envelope and the record codecs.
//!
//! | bytes    | field                                                        |
//! |----------|--------------------------------------------------------------|
//! | 1        | format version ([`FORMAT_V1`])                               |
//! | n        | protobuf body: a [`wire`](super::wire) message, by key kind  |
//! | 4        | CRC-32 (IEEE) of the version byte and the body, big-endian   |
//!
//! The version comes first so that a reader can refuse a format it does not know before it
//! reads anything else; the checksum turns a torn or flipped value into a typed error instead
//! of a plausible wrong row.

use super::CodecError;
use super::wire::{DataFileValue, MappingValue, NameMapping as WireNameMapping};
use crate::model::{
    ColumnId, ColumnMapping, DataFile, DataFileId, FieldId, MappingId, NameMapping, TableId,
};

/// The first (and current) value format.
pub const FORMAT_V1: u8 = 1;

const CHECKSUM_LEN: usize = 4;

/// Encodes a mapping record.
#[must_use]
pub fn encode_mapping(mapping: &ColumnMapping) -> Vec<u8> {
    let wire = MappingValue {
        mapping_id: mapping.mapping_id.0,
        table_id: mapping.table_id.0,
        map_type: mapping.map_type.clone(),
        names: mapping
            .names
            .iter()
            .map(|name| WireNameMapping {
                column_id: name.column_id.0,
                source_name: name.source_name.clone(),
                target_field_id: name.target_field_id.0,
                parent_column: name.parent_column.map(|c| c.0),
                is_partition: name.is_partition,
            })
            .collect(),
    };
    seal(&wire)
}

/// Decodes a mapping record.
///
/// # Errors
/// A [`CodecError`] for an unknown version, a checksum mismatch or a malformed body.
pub fn decode_mapping(bytes: &[u8]) -> Result<ColumnMapping, CodecError> {
    let wire: MappingValue = open(bytes, "mapping")?;
    Ok(ColumnMapping {
        mapping_id: MappingId(wire.mapping_id),
        table_id: TableId(wire.table_id),
        map_type: wire.map_type,
        names: wire
            .names
            .into_iter()
            .map(|name| NameMapping {
                column_id: ColumnId(name.column_id),
                source_name: name.source_name,
                target_field_id: FieldId(name.target_field_id),
                parent_column: name.parent_column.map(ColumnId),
                is_partition: name.is_partition,
            })
            .collect(),
    })
}

/// Encodes a data-file record.
#[must_use]
pub fn encode_data_file(file: &DataFile) -> Vec<u8> {
    let wire = DataFileValue {
        data_file_id: file.data_file_id.0,
        table_id: file.table_id.0,
        begin_snapshot: file.begin_snapshot,
        end_snapshot: file.end_snapshot,
        file_order: file.file_order,
        path: file.path.clone(),
        path_is_relative: file.path_is_relative,
        file_format: file.file_format.clone(),
        record_count: file.record_count,
        file_size_bytes: file.file_size_bytes,
        footer_size: file.footer_size,
        row_id_start: file.row_id_start,
        partition_id: file.partition_id,
        encryption_key: file.encryption_key.clone(),
        partial_file_info: file.partial_file_info.clone(),
        mapping_id: file.mapping_id.map(|m| m.0),
    };
    seal(&wire)
}

/// Decodes a data-file record.
///
/// # Errors
/// A [`CodecError`] for an unknown version, a checksum mismatch or a malformed body.
pub fn decode_data_file(bytes: &[u8]) -> Result<DataFile, CodecError> {
    let wire: DataFileValue = open(bytes, "data_file")?;
    Ok(DataFile {
        data_file_id: DataFileId(wire.data_file_id),
        table_id: TableId(wire.table_id),
        begin_snapshot: wire.begin_snapshot,
        end_snapshot: wire.end_snapshot,
        file_order: wire.file_order,
        path: wire.path,
        path_is_relative: wire.path_is_relative,
        file_format: wire.file_format,
        record_count: wire.record_count,
        file_size_bytes: wire.file_size_bytes,
        footer_size: wire.footer_size,
        row_id_start: wire.row_id_start,
        partition_id: wire.partition_id,
        encryption_key: wire.encryption_key,
        partial_file_info: wire.partial_file_info,
        mapping_id: wire.mapping_id.map(MappingId),
    })
}

fn seal(message: &impl prost::Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + message.encoded_len() + CHECKSUM_LEN);
    out.push(FORMAT_V1);
    message
        .encode(&mut out)
        .unwrap_or_else(|_| unreachable!("a Vec grows to fit any message"));
    let checksum = crc32fast::hash(&out);
    out.extend_from_slice(&checksum.to_be_bytes());
    out
}

fn open<M: prost::Message + Default>(bytes: &[u8], record: &'static str) -> Result<M, CodecError> {
    let Some(&version) = bytes.first() else {
        return Err(CodecError::EmptyValue);
    };
    if version != FORMAT_V1 {
        return Err(CodecError::UnknownFormatVersion {
            found: version,
            supported: FORMAT_V1,
        });
    }
    let (sealed, checksum) = bytes
        .split_last_chunk::<CHECKSUM_LEN>()
        .filter(|(sealed, _)| !sealed.is_empty())
        .ok_or(CodecError::TruncatedValue { len: bytes.len() })?;
    let stored = u32::from_be_bytes(*checksum);
    let computed = crc32fast::hash(sealed);
    if stored != computed {
        return Err(CodecError::ChecksumMismatch { stored, computed });
    }
    let body = sealed.get(1..).unwrap_or_default();
    M::decode(body).map_err(|err| CodecError::MalformedValue {
        record,
        reason: err.to_string(),
    })
}

#[cfg(test)]
mod tests;
