use proptest::prelude::*;

use super::*;
use crate::codec::hex;

fn sample_mapping() -> ColumnMapping {
    ColumnMapping {
        mapping_id: MappingId(0),
        table_id: TableId(1),
        map_type: Some("map_by_name".into()),
        names: vec![
            NameMapping {
                column_id: ColumnId(0),
                source_name: "s".into(),
                target_field_id: FieldId(2),
                parent_column: None,
                is_partition: false,
            },
            NameMapping {
                column_id: ColumnId(1),
                source_name: "a".into(),
                target_field_id: FieldId(3),
                parent_column: Some(ColumnId(0)),
                is_partition: false,
            },
            NameMapping {
                column_id: ColumnId(2),
                source_name: "part".into(),
                target_field_id: FieldId(17),
                parent_column: None,
                is_partition: true,
            },
        ],
    }
}

fn sample_data_file() -> DataFile {
    DataFile {
        data_file_id: DataFileId(1),
        table_id: TableId(1),
        begin_snapshot: Some(2),
        end_snapshot: None,
        file_order: None,
        path: Some("/lake/ext/part=x/f1.parquet".into()),
        path_is_relative: Some(false),
        file_format: Some("parquet".into()),
        record_count: Some(2),
        file_size_bytes: Some(1339),
        footer_size: Some(930),
        row_id_start: Some(0),
        partition_id: None,
        encryption_key: None,
        partial_file_info: None,
        mapping_id: Some(MappingId(0)),
    }
}

/// Stored value bytes are frozen. If one of these fails, the change broke every existing
/// store: restore the format, or add a new format version beside this one. Never edit a
/// literal. `just golden` prints the current bytes.
#[test]
fn golden_value_vectors() {
    let cases = [
        ("mapping", encode_mapping(&sample_mapping()), GOLDEN_MAPPING),
        (
            "data_file",
            encode_data_file(&sample_data_file()),
            GOLDEN_DATA_FILE,
        ),
    ];
    for (what, actual, golden) in cases {
        println!("{what}: {}", hex(&actual));
        assert_eq!(
            hex(&actual),
            golden,
            "value bytes of {what} changed: stored values are a contract. \
             Add a new format version instead of editing this vector."
        );
    }
    assert_eq!(decode_mapping(&unhex(GOLDEN_MAPPING)), Ok(sample_mapping()));
    assert_eq!(
        decode_data_file(&unhex(GOLDEN_DATA_FILE)),
        Ok(sample_data_file())
    );
}

const GOLDEN_MAPPING: &str = "0110011a0b6d61705f62795f6e616d65220512017318022209080112016118032000220c0802120470617274181128014fd825cd";
const GOLDEN_DATA_FILE: &str = "01080110011802321b2f6c616b652f6578742f706172743d782f66312e706172717565743800420770617271756574480250bb0a58a2076000800100f4ced699";

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn unknown_format_version_is_a_typed_error() {
    let mut bytes = encode_mapping(&sample_mapping());
    bytes[0] = FORMAT_V1 + 1;
    assert_eq!(
        decode_mapping(&bytes),
        Err(CodecError::UnknownFormatVersion {
            found: FORMAT_V1 + 1,
            supported: FORMAT_V1
        })
    );
    assert_eq!(decode_data_file(&[]), Err(CodecError::EmptyValue));
    assert_eq!(
        decode_data_file(&[FORMAT_V1, 0, 0]),
        Err(CodecError::TruncatedValue { len: 3 })
    );
}

#[test]
fn a_flipped_bit_fails_the_checksum() {
    let mut bytes = encode_data_file(&sample_data_file());
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    assert!(matches!(
        decode_data_file(&bytes),
        Err(CodecError::ChecksumMismatch { .. })
    ));
}

#[test]
fn a_record_of_the_wrong_kind_is_malformed_not_a_panic() {
    // A sealed envelope around bytes that are not a mapping: field 4 with a varint wire type.
    let mut bytes = vec![FORMAT_V1, 0x20, 0x01];
    let checksum = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&checksum.to_be_bytes());
    assert!(matches!(
        decode_mapping(&bytes),
        Err(CodecError::MalformedValue {
            record: "mapping",
            ..
        })
    ));
}

fn any_name() -> impl Strategy<Value = NameMapping> {
    (
        any::<i64>(),
        ".{0,12}",
        any::<i64>(),
        proptest::option::of(any::<i64>()),
        any::<bool>(),
    )
        .prop_map(
            |(column_id, source_name, field, parent, is_partition)| NameMapping {
                column_id: ColumnId(column_id),
                source_name,
                target_field_id: FieldId(field),
                parent_column: parent.map(ColumnId),
                is_partition,
            },
        )
}

fn any_mapping() -> impl Strategy<Value = ColumnMapping> {
    (
        any::<i64>(),
        any::<i64>(),
        proptest::option::of(".{0,16}"),
        proptest::collection::vec(any_name(), 0..20),
    )
        .prop_map(|(mapping_id, table_id, map_type, names)| ColumnMapping {
            mapping_id: MappingId(mapping_id),
            table_id: TableId(table_id),
            map_type,
            names,
        })
}

fn any_data_file() -> impl Strategy<Value = DataFile> {
    use proptest::option::of;
    (
        (
            any::<i64>(),
            any::<i64>(),
            of(any::<i64>()),
            of(any::<i64>()),
            of(any::<i64>()),
        ),
        (
            of(".{0,24}"),
            of(any::<bool>()),
            of(".{0,8}"),
            of(any::<i64>()),
            of(any::<i64>()),
        ),
        (
            of(any::<i64>()),
            of(any::<i64>()),
            of(any::<i64>()),
            of(".{0,8}"),
            of(".{0,8}"),
        ),
        of(any::<i64>()),
    )
        .prop_map(|(a, b, c, mapping_id)| DataFile {
            data_file_id: DataFileId(a.0),
            table_id: TableId(a.1),
            begin_snapshot: a.2,
            end_snapshot: a.3,
            file_order: a.4,
            path: b.0,
            path_is_relative: b.1,
            file_format: b.2,
            record_count: b.3,
            file_size_bytes: b.4,
            footer_size: c.0,
            row_id_start: c.1,
            partition_id: c.2,
            encryption_key: c.3,
            partial_file_info: c.4,
            mapping_id: mapping_id.map(MappingId),
        })
}

proptest! {
    #[test]
    fn mappings_round_trip(mapping in any_mapping()) {
        prop_assert_eq!(decode_mapping(&encode_mapping(&mapping)), Ok(mapping));
    }

    #[test]
    fn data_files_round_trip(file in any_data_file()) {
        prop_assert_eq!(decode_data_file(&encode_data_file(&file)), Ok(file));
    }

    #[test]
    fn any_corruption_is_an_error(
        mapping in any_mapping(),
        at in any::<prop::sample::Index>(),
        flip in 1_u8..,
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = encode_mapping(&mapping);
        let mut flipped = bytes.clone();
        flipped[at.index(bytes.len())] ^= flip;
        prop_assert!(decode_mapping(&flipped).is_err());
        let truncated = &bytes[..cut.index(bytes.len())];
        prop_assert!(decode_mapping(truncated).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode_mapping(&bytes);
        let _ = decode_data_file(&bytes);
    }
}
