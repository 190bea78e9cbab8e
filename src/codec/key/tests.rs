use proptest::prelude::*;

use super::*;

fn unhex(text: &str) -> Vec<u8> {
    let text: String = text.split_whitespace().collect();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2).expect("even length"), 16).expect("hex"))
        .collect()
}

/// Persisted key bytes are frozen. If one of these fails, the change broke every existing
/// store: restore the layout, or add a new key version beside this one. Never edit a literal.
#[test]
fn golden_key_vectors() {
    let plain = Keyspace::default();
    let lake = Keyspace::new(KeyPrefix::new("lake-a").expect("valid prefix"));
    let cases: [(&str, Vec<u8>, &str); 15] = [
        (
            "unique index data_file_id -1 (any table)",
            plain.index_key(RowKey {
                kind: Kind::DataFile,
                table_id: TableId(i64::MAX),
                id: -1,
            }),
            "02 03 7fffffffffffffff",
        ),
        (
            "prefixed unique index data_file_id 9",
            lake.row_key(Kind::DataFileById, TableId(2), 9),
            "6c616b652d61 02 03 8000000000000009",
        ),
        (
            "guard of table 7's mappings",
            plain.guard_key(Kind::Mapping, TableId(7)),
            "03 01 8000000000000007",
        ),
        (
            "guard of table -1's data files",
            plain.guard_key(Kind::DataFile, TableId(-1)),
            "03 02 7fffffffffffffff",
        ),
        (
            "index mapping_id 5 -> table 1",
            plain.row_key(Kind::MappingById, TableId(1), 5),
            "02 01 8000000000000005 8000000000000001",
        ),
        (
            "index data_file_id -1 -> table i64::MAX",
            plain.row_key(Kind::DataFileByIdV1, TableId(i64::MAX), -1),
            "02 02 7fffffffffffffff ffffffffffffffff",
        ),
        (
            "prefixed index data_file_id 9 -> table 2",
            lake.row_key(Kind::DataFileByIdV1, TableId(2), 9),
            "6c616b652d61 02 02 8000000000000009 8000000000000002",
        ),
        (
            "mapping (1, 0)",
            plain.mapping_key(TableId(1), MappingId(0)),
            "01 01 8000000000000001 8000000000000000",
        ),
        (
            "data_file (1, 1)",
            plain.data_file_key(TableId(1), DataFileId(1)),
            "01 02 8000000000000001 8000000000000001",
        ),
        (
            "mapping (0, 0)",
            plain.mapping_key(TableId(0), MappingId(0)),
            "01 01 8000000000000000 8000000000000000",
        ),
        (
            "mapping (-1, i64::MAX)",
            plain.mapping_key(TableId(-1), MappingId(i64::MAX)),
            "01 01 7fffffffffffffff ffffffffffffffff",
        ),
        (
            "data_file (i64::MIN, -5)",
            plain.data_file_key(TableId(i64::MIN), DataFileId(-5)),
            "01 02 0000000000000000 7ffffffffffffffb",
        ),
        (
            "prefixed data_file (42, i64::MAX)",
            lake.data_file_key(TableId(42), DataFileId(i64::MAX)),
            "6c616b652d61 01 02 800000000000002a ffffffffffffffff",
        ),
        (
            "prefixed mapping (i64::MAX, 7)",
            lake.mapping_key(TableId(i64::MAX), MappingId(7)),
            "6c616b652d61 01 01 ffffffffffffffff 8000000000000007",
        ),
        (
            "prefixed mapping (-3, -1)",
            lake.mapping_key(TableId(-3), MappingId(-1)),
            "6c616b652d61 01 01 7ffffffffffffffd 7fffffffffffffff",
        ),
    ];
    for (what, actual, golden) in cases {
        assert_eq!(
            hex(&actual),
            hex(&unhex(golden)),
            "key bytes of {what} changed: stored keys are a contract. \
             Add a new key version instead of editing this vector."
        );
    }
}

#[test]
fn golden_range_vectors() {
    let plain = Keyspace::default();
    let lake = Keyspace::new(KeyPrefix::new("lake-a").expect("valid prefix"));
    let cases = [
        (
            plain.table_range(Kind::Mapping, TableId(7)),
            "01 01 8000000000000007",
            "01 01 8000000000000008",
        ),
        (
            plain.table_range(Kind::DataFile, TableId(i64::MAX)),
            "01 02 ffffffffffffffff",
            "01 03",
        ),
        (plain.kind_range(Kind::Mapping), "01 01", "01 02"),
        (
            plain.id_span(Kind::MappingById, 10..=i64::MAX),
            "02 01 800000000000000a",
            "02 02",
        ),
        (
            plain.id_span(Kind::DataFileByIdV1, 3..=4),
            "02 02 8000000000000003",
            "02 02 8000000000000005",
        ),
        (
            plain.id_span(Kind::DataFileById, 3..=4),
            "02 03 8000000000000003",
            "02 03 8000000000000005",
        ),
        (
            lake.table_range(Kind::DataFile, TableId(-1)),
            "6c616b652d61 01 02 7fffffffffffffff",
            "6c616b652d61 01 02 8000000000000000",
        ),
    ];
    for (range, start, end) in cases {
        assert_eq!(
            (hex(&range.start), hex(&range.end)),
            (hex(&unhex(start)), hex(&unhex(end))),
            "range bytes changed: add a new key version instead of editing this vector"
        );
    }
}

#[test]
fn invalid_prefixes_are_refused() {
    for bad in [
        "with space",
        "slash/",
        "nul\0",
        "ünïcode",
        &"x".repeat(MAX_PREFIX_LEN + 1),
    ] {
        assert!(
            matches!(
                KeyPrefix::new(bad),
                Err(CodecError::InvalidKeyPrefix { .. })
            ),
            "{bad:?} accepted"
        );
    }
    assert!(KeyPrefix::new(&"x".repeat(MAX_PREFIX_LEN)).is_ok());
}

#[test]
fn bad_keys_are_typed_errors() {
    let plain = Keyspace::default();
    let lake = Keyspace::new(KeyPrefix::new("lake").expect("valid prefix"));
    let good = plain.mapping_key(TableId(1), MappingId(2));

    for len in 0..good.len() {
        let truncated = good.get(..len).expect("in bounds");
        assert!(
            matches!(
                plain.decode(truncated),
                Err(CodecError::KeyLength { actual, .. }) if actual == len
            ),
            "truncated key of {len} bytes: {:?}",
            plain.decode(truncated)
        );
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        plain.decode(&long),
        Err(CodecError::KeyLength { actual: 19, .. })
    ));

    assert!(matches!(
        lake.decode(&good),
        Err(CodecError::ForeignPrefix { .. })
    ));
    let other_lake = Keyspace::new(KeyPrefix::new("lake2").expect("valid prefix"));
    let other_key = other_lake.mapping_key(TableId(1), MappingId(2));
    assert!(matches!(
        lake.decode(&other_key),
        Err(CodecError::UnknownSubspace { subspace: b'2', .. })
    ));

    let mut bad_subspace = good.clone();
    bad_subspace[0] = 0x07;
    assert!(matches!(
        plain.decode(&bad_subspace),
        Err(CodecError::UnknownSubspace { subspace: 0x07, .. })
    ));
    let mut bad_kind = good.clone();
    bad_kind[1] = 0x09;
    assert!(matches!(
        plain.decode(&bad_kind),
        Err(CodecError::UnknownKind { kind: 0x09, .. })
    ));
    let mut index_kind = good.clone();
    index_kind[0] = Subspace::Index as u8;
    index_kind[1] = 0x04;
    assert!(matches!(
        plain.decode(&index_kind),
        Err(CodecError::UnknownKind { kind: 0x04, .. })
    ));
    // The unique index holds one id: two are too many, and its table is in the value.
    let mut unique = good;
    unique[0] = Subspace::Index as u8;
    unique[1] = 0x03;
    assert!(matches!(
        plain.decode_head(&unique),
        Err(CodecError::KeyLength {
            expected: 10,
            actual: 18,
            ..
        })
    ));
    let entry = plain.row_key(Kind::DataFileById, TableId(4), 9);
    assert!(matches!(
        plain.decode(&entry),
        Err(CodecError::TableInValue { .. })
    ));
    assert_eq!(
        plain
            .decode_entry(
                &entry,
                &Keyspace::index_value(Kind::DataFileById, TableId(4))
            )
            .expect("entry decodes"),
        RowKey {
            kind: Kind::DataFileById,
            table_id: TableId(4),
            id: 9
        }
    );
    assert!(matches!(
        plain.decode_entry(&entry, b"four"),
        Err(CodecError::IndexValue { len: 4, .. })
    ));
}

#[test]
fn empty_table_span_is_empty() {
    let plain = Keyspace::default();
    assert!(
        plain
            .table_span(Kind::Mapping, TableId(5)..=TableId(4))
            .is_empty()
    );
    assert!(
        !plain
            .table_span(Kind::Mapping, TableId(4)..=TableId(4))
            .is_empty()
    );
}

#[test]
fn neighbouring_tables_merge_into_one_range() {
    let plain = Keyspace::default();
    let ranges = plain.tables_ranges(
        Kind::DataFile,
        [
            TableId(3),
            TableId(1),
            TableId(2),
            TableId(9),
            TableId(2),
            TableId(i64::MAX),
        ],
    );
    assert_eq!(
        ranges,
        vec![
            plain.table_span(Kind::DataFile, TableId(1)..=TableId(3)),
            plain.table_range(Kind::DataFile, TableId(9)),
            plain.table_range(Kind::DataFile, TableId(i64::MAX)),
        ]
    );
}

fn any_kind() -> impl Strategy<Value = Kind> {
    proptest::sample::select(Kind::ALL.to_vec())
}

fn any_row_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Mapping), Just(Kind::DataFile)]
}

fn any_keyspace() -> impl Strategy<Value = Keyspace> {
    "[A-Za-z0-9._-]{0,12}".prop_map(|p| Keyspace::new(KeyPrefix::new(&p).expect("valid prefix")))
}

proptest! {
    #[test]
    fn id_encoding_preserves_order(a in any::<i64>(), b in any::<i64>()) {
        prop_assert_eq!(a.cmp(&b), encode_i64(a).cmp(&encode_i64(b)));
        prop_assert_eq!(decode_i64(encode_i64(a)), a);
    }

    #[test]
    fn keys_round_trip_and_sort_like_their_tuples(
        keyspace in any_keyspace(),
        a in (any_kind(), any::<i64>(), any::<i64>()),
        b in (any_kind(), any::<i64>(), any::<i64>()),
    ) {
        let key_a = keyspace.row_key(a.0, TableId(a.1), a.2);
        let key_b = keyspace.row_key(b.0, TableId(b.1), b.2);
        // What a key holds, in its order: a key of one id holds the row id of an index and
        // the table of a guard.
        let sort_key = |(kind, table, id): (Kind, i64, i64)| {
            let order = (kind.subspace(), kind.tag());
            match (kind.subspace() == Subspace::Index, kind.arity()) {
                (true, 2) => (order, id, Some(table)),
                (true, _) => (order, id, None),
                (false, 2) => (order, table, Some(id)),
                (false, _) => (order, table, None),
            }
        };
        prop_assert_eq!(key_a.cmp(&key_b), sort_key(a).cmp(&sort_key(b)));
        let value = Keyspace::index_value(a.0, TableId(a.1));
        let decoded = keyspace.decode_entry(&key_a, &value).expect("own key decodes");
        let id = if a.0.arity() == 1 && a.0.subspace() == Subspace::Guard { 0 } else { a.2 };
        prop_assert_eq!(decoded, RowKey { kind: a.0, table_id: TableId(a.1), id });
    }

    #[test]
    fn table_range_holds_exactly_that_table(
        keyspace in any_keyspace(),
        kind in any_row_kind(),
        table in any::<i64>(),
        other_table in any::<i64>(),
        id in any::<i64>(),
    ) {
        let range = keyspace.table_range(kind, TableId(table));
        prop_assert!(range.contains(&keyspace.row_key(kind, TableId(table), id)));
        for other_kind in Kind::ALL.into_iter().filter(|k| *k != kind) {
            prop_assert!(!range.contains(&keyspace.row_key(other_kind, TableId(table), id)));
        }
        for neighbour in [table.checked_sub(1), table.checked_add(1), Some(other_table)]
            .into_iter()
            .flatten()
            .filter(|t| *t != table)
        {
            prop_assert!(!range.contains(&keyspace.row_key(kind, TableId(neighbour), id)));
        }
    }

    #[test]
    fn table_set_ranges_hold_exactly_those_tables(
        tables in proptest::collection::vec(-4_i64..12, 0..8),
        probe in -6_i64..14,
        id in any::<i64>(),
    ) {
        let keyspace = Keyspace::default();
        let ranges = keyspace.tables_ranges(Kind::Mapping, tables.iter().copied().map(TableId));
        let key = keyspace.row_key(Kind::Mapping, TableId(probe), id);
        let hits = ranges.iter().filter(|r| r.contains(&key)).count();
        prop_assert_eq!(hits, usize::from(tables.contains(&probe)));
        prop_assert!(ranges.windows(2).all(|w| w[0].end < w[1].start), "sorted and disjoint");
    }

    #[test]
    fn id_span_holds_exactly_those_ids(
        lo in any::<i64>(),
        hi in any::<i64>(),
        probe in any::<i64>(),
        table in any::<i64>(),
    ) {
        let keyspace = Keyspace::default();
        let span = keyspace.id_span(Kind::DataFileById, lo..=hi);
        let key = keyspace.row_key(Kind::DataFileById, TableId(table), probe);
        prop_assert_eq!(span.contains(&key), lo <= probe && probe <= hi);
        let row = keyspace.row_key(Kind::DataFile, TableId(table), probe);
        prop_assert!(!span.contains(&row));
        let value = Keyspace::index_value(Kind::DataFileById, TableId(table));
        let decoded = keyspace.decode_entry(&key, &value).expect("index entry decodes");
        prop_assert_eq!(decoded.table_id, TableId(table));
        prop_assert_eq!(keyspace.index_key(RowKey { kind: Kind::DataFile, ..decoded }), key);
    }

    #[test]
    fn prefixes_never_interleave(
        a in any_keyspace(),
        b in any_keyspace(),
        key in (any_kind(), any::<i64>(), any::<i64>()),
    ) {
        prop_assume!(a != b);
        let key_b = b.row_key(key.0, TableId(key.1), key.2);
        for kind in Kind::ALL {
            prop_assert!(!a.kind_range(kind).contains(&key_b));
        }
        prop_assert!(a.decode(&key_b).is_err());
    }
}

proptest! {
    /// A division at any key falls between tables: every table lies wholly before or wholly
    /// after the table `first_table_from` names.
    #[test]
    fn a_cut_falls_between_tables(table in any::<i64>(), id in any::<i64>(), cut_len in 0usize..20) {
        let keyspace = Keyspace::new(KeyPrefix::new("lake").expect("valid prefix"));
        let key = keyspace.row_key(Kind::Mapping, TableId(table), id);
        let cut = key.get(..cut_len.min(key.len())).expect("in bounds").to_vec();
        let after = keyspace.first_table_from(Kind::Mapping, &cut);
        let kind = keyspace.kind_range(Kind::Mapping);
        match after {
            Some(first) => {
                let start = keyspace.table_range(Kind::Mapping, TableId(first)).start;
                prop_assert!(cut <= start, "table {first} starts before the cut");
                if first > i64::MIN {
                    let before = keyspace.table_range(Kind::Mapping, TableId(first - 1));
                    prop_assert!(before.start < cut || cut <= kind.start);
                }
                if cut.len() >= kind.start.len() + 8 {
                    prop_assert!(first == table || first == table.wrapping_add(1));
                }
            }
            None => prop_assert!(table == i64::MAX && cut > keyspace.table_range(Kind::Mapping, TableId(table)).start),
        }
        prop_assert_eq!(
            keyspace.first_table_from(Kind::Mapping, &keyspace.table_range(Kind::Mapping, TableId(table)).start),
            Some(table)
        );
    }
}
