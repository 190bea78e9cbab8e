use futures::TryStreamExt as _;

use super::*;
use crate::codec::KeyPrefix;
use crate::kv::WriteSet;
use crate::model::{ColumnMappingRow, NameMappingRow};
use crate::write::{Insert, Op, StagedBatch, commit_batch};

/// Index entries per page in these tests: far fewer than the mappings, so that tables are read
/// ahead across pages and cursors carry rows from one page to the next.
const ENTRIES: PageSize = PageSize {
    rows: 5,
    bytes: usize::MAX,
};

/// 400 mappings over 13 tables, interleaved by id as DuckLake's are (consecutive ids in
/// different tables), skewed (table 0 owns about a third), ids with gaps, one id shared by
/// two tables. Returns the catalog and its `(mapping_id, table_id)` pairs.
async fn interleaved() -> (Catalog, Vec<(i64, i64)>) {
    let catalog = Catalog::new(Store::memory(), Keyspace::new(KeyPrefix::none()));
    let mut pairs = Vec::new();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut id = -50_i64;
    for _ in 0..400 {
        let roll = next() % 39;
        let table = if roll < 13 {
            0
        } else {
            i64::try_from(roll % 13).unwrap_or(1)
        };
        pairs.push((id, table));
        id += 1 + i64::try_from(next() % 3).unwrap_or(0);
    }
    // Ids two tables share.
    for i in (3..400).step_by(23) {
        pairs.push((
            pairs[i].0,
            (pairs[i].1 + 1 + i64::try_from(i % 12).unwrap_or(0)) % 13,
        ));
    }
    let mut batch = StagedBatch::new();
    for &(mapping_id, table_id) in &pairs {
        batch
            .push(Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
                mapping_id: Some(mapping_id),
                table_id: Some(table_id),
                map_type: Some("map_by_name".into()),
            }])))
            .push(Op::Insert(Insert::name_mappings(&[NameMappingRow {
                mapping_id: Some(mapping_id),
                column_id: Some(table_id),
                source_name: Some(format!("c{mapping_id}")),
                target_field_id: Some(1),
                parent_column: None,
                is_partition: Some(false),
            }])));
        commit_batch(&catalog, &batch).await.expect("committed");
        batch = StagedBatch::new();
    }
    pairs.sort_unstable();
    (catalog, pairs)
}

/// The `(mapping_id, table_id)` of each row read in id order, and the sizes of the pages. The
/// index pages grow from one entry to [`ENTRIES`].
async fn read(
    catalog: &Catalog,
    ids: Vec<RangeInclusive<i64>>,
    keep: Option<id_order::Keep>,
) -> Result<(Vec<(i64, i64)>, Vec<usize>)> {
    let snapshot = catalog.snapshot().await?;
    let pages: Vec<Page> =
        id_order::rows_in_id_order(&snapshot, Kind::Mapping, ids, keep, 1, ENTRIES)
            .try_collect()
            .await?;
    let mut rows = Vec::new();
    for page in &pages {
        for (key, value) in page.iter() {
            check_mapping(snapshot.keyspace(), key, value)?;
            let row = snapshot.keyspace().decode(key)?;
            rows.push((row.id, row.table_id.0));
        }
    }
    Ok((rows, pages.iter().map(Page::len).collect()))
}

/// Writes `writes` straight to the store, past the write path and its index upkeep.
async fn commit_raw(catalog: &Catalog, writes: WriteSet) {
    let outcome = catalog.store.commit(writes).await.expect("committed");
    assert!(matches!(outcome, CommitOutcome::Committed), "{outcome:?}");
}

/// Whether `err` reports an index and rows that disagree.
fn is_dangling(err: &crate::Error) -> bool {
    matches!(
        err,
        crate::Error::Codec(CodecError::DanglingIndexEntry { .. })
    )
}

#[tokio::test]
async fn rows_of_interleaved_tables_come_in_id_then_table_order() {
    let (catalog, pairs) = interleaved().await;
    let (rows, sizes) = read(&catalog, vec![i64::MIN..=i64::MAX], None)
        .await
        .expect("read");
    assert_eq!(rows, pairs);
    // One row per index entry: the pages grow from one entry, doubling, to a full page.
    assert_eq!(
        sizes.get(..5),
        Some([1, 2, 4, 5, 5].as_slice()),
        "{sizes:?}"
    );
    assert!(sizes.iter().all(|&size| size <= ENTRIES.rows), "{sizes:?}");

    // Intervals end where the read-ahead must stop: rows past them are not the index's.
    let (low, high) = (pairs[40].0, pairs[300].0);
    let (gap_low, gap_high) = (pairs[320].0, pairs[330].0);
    let (rows, _) = read(&catalog, vec![low..=high - 1, gap_low..=gap_high], None)
        .await
        .expect("read");
    let expected: Vec<_> = pairs
        .iter()
        .copied()
        .filter(|(id, _)| (low..high).contains(id) || (gap_low..=gap_high).contains(id))
        .collect();
    assert_eq!(rows, expected);

    let even: id_order::Keep = Arc::new(|table: TableId| table.0 % 2 == 0);
    let (rows, _) = read(&catalog, vec![i64::MIN..=i64::MAX], Some(even))
        .await
        .expect("read");
    let expected: Vec<_> = pairs.iter().copied().filter(|(_, t)| t % 2 == 0).collect();
    assert_eq!(rows, expected);
}

#[tokio::test]
async fn an_index_entry_without_its_row_is_corruption() {
    let (catalog, pairs) = interleaved().await;
    let (id, table) = pairs[250];
    let mut writes = WriteSet::new();
    writes.delete(catalog.keyspace.row_key(Kind::Mapping, TableId(table), id));
    commit_raw(&catalog, writes).await;
    let err = read(&catalog, vec![i64::MIN..=i64::MAX], None)
        .await
        .expect_err("a dangling entry");
    assert!(is_dangling(&err), "{err}");
}

#[tokio::test]
async fn a_row_the_index_lacks_between_two_it_lists_is_corruption() {
    let (catalog, pairs) = interleaved().await;
    let snapshot = catalog.snapshot().await.expect("snapshot");
    // At every gap between two ids of one table (wherever the gap falls: inside a table's
    // read-ahead or where one read ends and the next begins), a row no index entry lists.
    let mut strays = 0;
    for table in 0..13 {
        let listed: Vec<i64> = pairs
            .iter()
            .filter(|(_, t)| *t == table)
            .map(|(id, _)| *id)
            .collect();
        let source = catalog
            .keyspace
            .row_key(Kind::Mapping, TableId(table), listed[0]);
        let value = snapshot.values(&[source]).await.expect("read")[0]
            .clone()
            .expect("stored");
        for pair in listed.windows(2).filter(|pair| pair[1] - pair[0] > 1) {
            let stray = catalog
                .keyspace
                .row_key(Kind::Mapping, TableId(table), pair[0] + 1);
            let mut writes = WriteSet::new();
            writes.put(stray.clone(), value.clone());
            commit_raw(&catalog, writes).await;
            let err = read(&catalog, vec![i64::MIN..=i64::MAX], None)
                .await
                .expect_err("a row the index lacks");
            assert!(
                is_dangling(&err),
                "table {table}, id {}: {err}",
                pair[0] + 1
            );
            let mut writes = WriteSet::new();
            writes.delete(stray);
            commit_raw(&catalog, writes).await;
            strays += 1;
        }
    }
    assert!(strays > 100, "only {strays} gaps");
}

#[tokio::test]
async fn growing_pages_double_from_the_first_size_to_the_full_one() {
    let catalog = Catalog::new(Store::memory(), Keyspace::new(KeyPrefix::none()));
    let mut writes = WriteSet::new();
    for i in 0_u8..40 {
        writes.put(vec![b'k', i], vec![i; 3]);
    }
    commit_raw(&catalog, writes).await;
    let snapshot = catalog.snapshot().await.expect("snapshot");
    let full = PageSize {
        rows: 16,
        bytes: usize::MAX,
    };
    let sizes = |first: PageSize| {
        let pages = snapshot.snapshot.scan_pages_growing(
            KeyRange::new(b"k".to_vec(), b"l".to_vec()),
            first,
            full,
        );
        async move {
            let pages: Vec<Page> = pages.try_collect().await.expect("scan");
            let keys: Vec<u8> = pages
                .iter()
                .flat_map(|page| page.iter().map(|(key, _)| key[1]))
                .collect();
            assert_eq!(keys, (0..40).collect::<Vec<u8>>());
            pages.iter().map(Page::len).collect::<Vec<_>>()
        }
    };
    assert_eq!(sizes(PageSize::rows(3)).await, [3, 6, 12, 16, 3]);
    // A first size above the full one is the full one.
    assert_eq!(sizes(PageSize::rows(100)).await, [16, 16, 8]);
    // The byte bound grows too: pairs of 5 bytes, the first page bounded at 10.
    let by_bytes = PageSize {
        rows: usize::MAX,
        bytes: 10,
    };
    assert_eq!(sizes(by_bytes).await, [2, 4, 8, 16, 10]);
}
