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

fn sample_data_file() -> DataFileRow {
    DataFileRow {
        data_file_id: Some(1),
        table_id: Some(1),
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
        mapping_id: Some(0),
        partial_max: None,
        row_group_count: None,
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
            encode_data_file(&sample_data_file()).expect("encodes"),
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
    let mut bytes = encode_data_file(&sample_data_file()).expect("encodes");
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

/// A name row; some have a source name long enough that the row's body takes a length of
/// two bytes or more.
fn any_name() -> impl Strategy<Value = NameMapping> {
    (
        any::<i64>(),
        prop_oneof![4 => ".{0,12}", 1 => ".{100,700}"],
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

fn any_data_file() -> impl Strategy<Value = DataFileRow> {
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
        (of(any::<i64>()), of(any::<i64>()), of(any::<i64>())),
    )
        .prop_map(|(a, b, c, d)| DataFileRow {
            data_file_id: Some(a.0),
            table_id: Some(a.1),
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
            mapping_id: d.0,
            partial_max: d.1,
            row_group_count: d.2,
        })
}

/// The same record through prost's generated types: the reference encoding.
fn wire_mapping(mapping: &ColumnMapping) -> crate::codec::wire::MappingValue {
    crate::codec::wire::MappingValue {
        mapping_id: mapping.mapping_id.0,
        table_id: mapping.table_id.0,
        map_type: mapping.map_type.clone(),
        names: mapping
            .names
            .iter()
            .map(|n| crate::codec::wire::NameMapping {
                column_id: n.column_id.0,
                source_name: n.source_name.clone(),
                target_field_id: n.target_field_id.0,
                parent_column: n.parent_column.map(|c| c.0),
                is_partition: n.is_partition,
            })
            .collect(),
    }
}

fn wire_data_file(file: &DataFileRow) -> crate::codec::wire::DataFileValue {
    crate::codec::wire::DataFileValue {
        data_file_id: file.data_file_id.unwrap_or_default(),
        table_id: file.table_id.unwrap_or_default(),
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
        mapping_id: file.mapping_id,
        partial_max: file.partial_max,
        row_group_count: file.row_group_count,
    }
}

/// A value sealed around a body prost encoded.
fn sealed(message: &impl prost::Message) -> Vec<u8> {
    let mut out = vec![FORMAT_V1];
    message.encode(&mut out).expect("a Vec grows");
    let checksum = crc32fast::hash(&out);
    out.extend_from_slice(&checksum.to_be_bytes());
    out
}

#[test]
fn unknown_fields_are_skipped_and_the_last_scalar_wins() {
    use prost::Message as _;
    // A newer writer's field 9 (varint) and 10 (bytes), and mapping_id twice.
    let mut body = Vec::new();
    prost::encoding::int64::encode(1, &5, &mut body);
    prost::encoding::int64::encode(9, &77, &mut body);
    prost::encoding::string::encode(10, &"future".to_owned(), &mut body);
    prost::encoding::int64::encode(1, &6, &mut body);
    prost::encoding::int64::encode(2, &3, &mut body);
    let name = crate::codec::wire::NameMapping {
        column_id: 0,
        source_name: "id".into(),
        target_field_id: 1,
        parent_column: None,
        is_partition: false,
    };
    prost::encoding::message::encode(4, &name, &mut body);
    let mut value = vec![FORMAT_V1];
    value.extend_from_slice(&body);
    let checksum = crc32fast::hash(&value);
    value.extend_from_slice(&checksum.to_be_bytes());
    let mapping = decode_mapping(&value).expect("decodes");
    assert_eq!(
        (mapping.mapping_id, mapping.table_id),
        (MappingId(6), TableId(3))
    );
    assert_eq!(mapping.names.len(), 1);
    assert_eq!(
        crate::codec::wire::MappingValue::decode(&body[..]).map(|m| m.mapping_id),
        Ok(6),
        "prost reads it the same way"
    );
}

#[test]
fn a_known_field_of_the_wrong_wire_type_is_malformed() {
    let mut body = Vec::new();
    prost::encoding::string::encode(1, &"not an int".to_owned(), &mut body);
    let mut value = vec![FORMAT_V1];
    value.extend_from_slice(&body);
    let checksum = crc32fast::hash(&value);
    value.extend_from_slice(&checksum.to_be_bytes());
    assert!(matches!(
        decode_mapping(&value),
        Err(CodecError::MalformedValue { .. })
    ));
    assert!(matches!(
        decode_data_file(&value),
        Err(CodecError::MalformedValue { .. })
    ));
}

/// Name rows read by the general name reader only.
struct General<'a>(Vec<RawName<'a>>);

impl<'a> NameSink<'a> for General<'a> {
    fn name(&mut self, message: &'a [u8]) -> Result<(), CodecError> {
        self.0.push(general_name(message)?);
        Ok(())
    }

    fn start_over(&mut self) {}
}

/// A mapping body read: its head and its name rows.
type Read<'a> = (MappingHead<'a>, Vec<RawName<'a>>);

/// A body as the straight path reads it, if it does, and as the general reader does.
fn both_readers(body: &[u8]) -> (Option<Read<'_>>, Result<Read<'_>, CodecError>) {
    let mut straight = Vec::new();
    let fast = canonical_mapping(
        body,
        &mut Collect {
            names: &mut straight,
            before: 0,
        },
    )
    .map(|head| (head, straight));
    let mut general = General(Vec::new());
    let slow = general_mapping(body, &mut general).map(|head| (head, general.0));
    (fast, slow)
}

proptest! {
    /// Every record this codec writes is read on the straight path, and that path agrees
    /// with the general reader on every body it accepts: written ones, and any bytes at all.
    #[test]
    fn the_straight_path_agrees_with_the_general_reader(
        mapping in any_mapping(),
        bytes in proptest::collection::vec(any::<u8>(), 0..96),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let value = encode_mapping(&mapping);
        let body = &value[1..value.len() - 4];
        let (fast, slow) = both_readers(body);
        prop_assert!(fast.is_some(), "a written record takes the straight path");
        prop_assert_eq!(fast, Some(slow.expect("a written record reads")));
        let mut changed = body.to_vec();
        if !changed.is_empty() {
            let at = at.index(changed.len());
            changed[at] = byte;
        }
        for body in [&changed[..], &bytes[..]] {
            if let (Some(fast), slow) = both_readers(body) {
                prop_assert_eq!(Ok(fast), slow);
            }
        }
    }

    #[test]
    fn mappings_round_trip(mapping in any_mapping()) {
        prop_assert_eq!(decode_mapping(&encode_mapping(&mapping)), Ok(mapping));
    }

    #[test]
    fn data_files_round_trip(file in any_data_file()) {
        let bytes = encode_data_file(&file).expect("encodes");
        prop_assert_eq!(decode_data_file(&bytes), Ok(file));
    }

    /// The hand-written codec writes exactly the bytes prost writes, and reads what prost
    /// writes: the format is prost's, field for field.
    #[test]
    fn the_codec_agrees_with_prost(mapping in any_mapping(), file in any_data_file()) {
        let reference = sealed(&wire_mapping(&mapping));
        prop_assert_eq!(&encode_mapping(&mapping), &reference);
        prop_assert_eq!(decode_mapping(&reference), Ok(mapping));
        let reference = sealed(&wire_data_file(&file));
        prop_assert_eq!(&encode_data_file(&file).expect("encodes"), &reference);
        prop_assert_eq!(decode_data_file(&reference), Ok(file));
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
        // Past the envelope too: a valid checksum around arbitrary protobuf.
        let mut value = vec![FORMAT_V1];
        value.extend_from_slice(&bytes);
        let checksum = crc32fast::hash(&value);
        value.extend_from_slice(&checksum.to_be_bytes());
        let _ = decode_mapping(&value);
        let _ = decode_data_file(&value);
    }
}

/// Varints are protobuf's: seven bits a byte, low groups first, the high bit set on every
/// byte but the last; read back as written.
#[test]
fn varints_are_written_as_protobuf_writes_them() {
    let cases: [(u64, &[u8]); 6] = [
        (0, &[0x00]),
        (0x7f, &[0x7f]),
        (0x80, &[0x80, 0x01]),
        (300, &[0xac, 0x02]),
        (
            1 << 56,
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
        ),
        (
            u64::MAX,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
    ];
    for (value, expected) in cases {
        let mut out = vec![0xee];
        put_varint(&mut out, value);
        assert_eq!(&out[1..], expected, "{value:#x}");
        assert_eq!(varint_at(&out[1..]), Some((value, &[][..])), "{value:#x}");
    }
}
