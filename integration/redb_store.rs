//! What only the embedded backend promises: a committed write survives the process.

use std::sync::Arc;

use futures::TryStreamExt as _;
use moraine::kv::redb::RedbBackend;
use moraine::kv::{CommitOutcome, KvError, PageSize, Store, StoreLimits, WriteSet};

async fn open(dir: &std::path::Path) -> Result<Store, KvError> {
    Ok(Store::new(
        Arc::new(RedbBackend::open(dir).await?),
        StoreLimits::default(),
    ))
}

#[tokio::test]
async fn committed_data_survives_reopening_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = open(dir.path()).await.expect("open");
        let mut writes = WriteSet::new();
        writes
            .insert(b"a".to_vec(), b"1".to_vec())
            .put(b"b".to_vec(), b"2".to_vec());
        assert_eq!(store.commit(writes).await, Ok(CommitOutcome::Committed));
        let mut writes = WriteSet::new();
        writes
            .delete(b"b".to_vec())
            .put(b"c".to_vec(), b"3".to_vec());
        assert_eq!(store.commit(writes).await, Ok(CommitOutcome::Committed));
    }
    let store = open(dir.path()).await.expect("reopen");
    let snapshot = store.snapshot().await.expect("snapshot");
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = snapshot
        .scan_pages(
            moraine::kv::KeyRange::new(vec![], vec![0xff]),
            PageSize::default(),
        )
        .map_ok(|page| page.to_pairs())
        .try_concat()
        .await
        .expect("scan")
        .into_iter()
        .map(|p| (p.key, p.value))
        .collect();
    assert_eq!(
        pairs,
        vec![
            (b"a".to_vec(), b"1".to_vec()),
            (b"c".to_vec(), b"3".to_vec())
        ]
    );
    // The insert's key is still there for insert-if-absent after the restart.
    let mut writes = WriteSet::new();
    writes.insert(b"a".to_vec(), b"again".to_vec());
    assert!(matches!(
        store.commit(writes).await,
        Ok(CommitOutcome::Conflict(_))
    ));
}

#[tokio::test]
async fn a_store_held_open_elsewhere_is_unavailable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let _first = open(dir.path()).await.expect("open");
    assert!(matches!(
        open(dir.path()).await,
        Err(KvError::Unavailable {
            backend: "redb",
            ..
        })
    ));
}

#[tokio::test]
async fn an_unusable_directory_is_unavailable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    assert!(matches!(
        open(&file).await,
        Err(KvError::Unavailable { .. })
    ));
}
