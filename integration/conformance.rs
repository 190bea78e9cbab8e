//! The storage conformance suite: every backend must pass every test here, and must agree with
//! the in-memory reference model on random transactions.
//!
//! Each test is a plain async function over a [`Backend`]; [`conformance!`] instantiates the
//! whole list once per backend. A new backend joins by adding one line at the bottom.

use std::collections::BTreeMap;

use futures::{StreamExt as _, TryStreamExt as _};
use moraine::kv::{
    CommitOutcome, Conflict, Digest, Digester, KeyRange, KvError, KvPair, PageSize, Snapshot,
    Store, StoreLimits, WriteSet,
};

use moraine::fuzz::Rng;

use crate::harness::Backend;

fn key(i: u32) -> Vec<u8> {
    let mut key = b"k".to_vec();
    key.extend_from_slice(&i.to_be_bytes());
    key
}

fn value(i: u32, generation: u32) -> Vec<u8> {
    format!("value {i} gen {generation}").into_bytes()
}

fn everything() -> KeyRange {
    KeyRange::new(vec![], vec![0xff; 8])
}

async fn commit(store: &Store, writes: WriteSet) -> CommitOutcome {
    store
        .commit(writes)
        .await
        .expect("commit reaches the store")
}

async fn scan_all(snapshot: &Snapshot, range: KeyRange, page: PageSize) -> Vec<KvPair> {
    snapshot
        .scan_pages(range, page)
        .map_ok(|page| page.to_pairs())
        .try_concat()
        .await
        .expect("scan")
}

async fn contents(store: &Store) -> Vec<KvPair> {
    let snapshot = store.snapshot().await.expect("snapshot");
    scan_all(&snapshot, everything(), PageSize::default()).await
}

async fn put_range(store: &Store, keys: impl IntoIterator<Item = u32>, generation: u32) {
    let mut writes = WriteSet::new();
    for i in keys {
        writes.put(key(i), value(i, generation));
    }
    assert_eq!(commit(store, writes).await, CommitOutcome::Committed);
}

pub async fn snapshot_isolation(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, 0..10, 1).await;
    let before = t.store.snapshot().await.expect("snapshot");

    let mut writes = WriteSet::new();
    writes
        .put(key(0), value(0, 2))
        .delete(key(1))
        .put(key(100), value(100, 2));
    assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);

    assert_eq!(before.get(&key(0)).await.expect("get"), Some(value(0, 1)));
    assert_eq!(before.get(&key(1)).await.expect("get"), Some(value(1, 1)));
    assert_eq!(before.get(&key(100)).await.expect("get"), None);
    let old = scan_all(
        &before,
        everything(),
        PageSize {
            rows: 3,
            bytes: 1 << 20,
        },
    )
    .await;
    assert_eq!(old.len(), 10, "the old snapshot scans the old state");
    assert_eq!(old[0].value, value(0, 1));

    let after = t.store.snapshot().await.expect("snapshot");
    assert_eq!(after.get(&key(0)).await.expect("get"), Some(value(0, 2)));
    assert_eq!(after.get(&key(1)).await.expect("get"), None);
    assert_eq!(
        after.get(&key(100)).await.expect("get"),
        Some(value(100, 2))
    );
    assert_eq!(contents(&t.store).await.len(), 10);
}

pub async fn scans_are_ordered_and_exact_across_pages(backend: Backend) {
    let t = backend.open().await;
    // Written out of order, over several commits.
    let mut order: Vec<u32> = (0..500).map(|i| (i * 7919) % 500).collect();
    for chunk in order.chunks(97) {
        put_range(&t.store, chunk.iter().copied(), 1).await;
    }
    order.sort_unstable();
    let snapshot = t.store.snapshot().await.expect("snapshot");

    for rows in [1, 7, 100, 499, 500, 501, 10_000] {
        let pages: Vec<Vec<KvPair>> = snapshot
            .scan_pages(
                everything(),
                PageSize {
                    rows,
                    bytes: usize::MAX,
                },
            )
            .map_ok(|page| page.to_pairs())
            .try_collect()
            .await
            .expect("scan");
        assert!(
            pages.iter().all(|p| !p.is_empty() && p.len() <= rows),
            "page sizes for {rows}"
        );
        let keys: Vec<Vec<u8>> = pages.into_iter().flatten().map(|p| p.key).collect();
        assert_eq!(
            keys,
            order.iter().map(|i| key(*i)).collect::<Vec<_>>(),
            "rows={rows}"
        );
    }

    // Byte-bounded pages: each page stops after the pair that reaches the bound.
    let pair_len = key(0).len() + value(0, 1).len();
    let pages: Vec<Vec<KvPair>> = snapshot
        .scan_pages(
            everything(),
            PageSize {
                rows: 1000,
                bytes: 3 * pair_len,
            },
        )
        .map_ok(|page| page.to_pairs())
        .try_collect()
        .await
        .expect("scan");
    assert!(pages.iter().all(|p| p.len() <= 3));
    assert_eq!(pages.iter().map(Vec::len).sum::<usize>(), 500);

    // Bounds: start inclusive, end exclusive, keys between stored keys, empty ranges.
    let sub = scan_all(
        &snapshot,
        KeyRange::new(key(10), key(20)),
        PageSize {
            rows: 4,
            bytes: 1 << 20,
        },
    )
    .await;
    assert_eq!(
        sub.iter().map(|p| p.key.clone()).collect::<Vec<_>>(),
        (10..20).map(key).collect::<Vec<_>>()
    );
    let mut between = key(10);
    between.push(0);
    let sub = scan_all(
        &snapshot,
        KeyRange::new(between, key(12)),
        PageSize::default(),
    )
    .await;
    assert_eq!(
        sub.iter().map(|p| p.key.clone()).collect::<Vec<_>>(),
        vec![key(11)]
    );
    assert!(
        scan_all(
            &snapshot,
            KeyRange::new(key(30), key(30)),
            PageSize::default()
        )
        .await
        .is_empty()
    );
    assert!(
        scan_all(
            &snapshot,
            KeyRange::new(key(30), key(10)),
            PageSize::default()
        )
        .await
        .is_empty()
    );
    assert!(
        scan_all(
            &snapshot,
            KeyRange::new(key(600), key(700)),
            PageSize::default()
        )
        .await
        .is_empty()
    );
}

pub async fn scan_stops_when_the_consumer_stops(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, 0..100, 1).await;
    let snapshot = t.store.snapshot().await.expect("snapshot");
    let before = t.reads.pages();
    let mut pages = snapshot.scan_pages(
        everything(),
        PageSize {
            rows: 10,
            bytes: 1 << 20,
        },
    );
    let first = pages.next().await.expect("a page").expect("ok");
    let second = pages.next().await.expect("a page").expect("ok");
    assert_eq!((first.len(), second.len()), (10, 10));
    drop(pages);
    assert_eq!(
        t.reads.pages() - before,
        2,
        "no page read ahead or after drop"
    );

    // A page that ends exactly at the end of the range needs no extra read to know it is last.
    let before = t.reads.pages();
    let all = scan_all(
        &snapshot,
        everything(),
        PageSize {
            rows: 1000,
            bytes: 1 << 20,
        },
    )
    .await;
    assert_eq!(all.len(), 100);
    assert_eq!(t.reads.pages() - before, 1);
}

pub async fn batch_get_keeps_order_and_reports_missing(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [1, 3], 1).await;
    let snapshot = t.store.snapshot().await.expect("snapshot");
    let got = snapshot
        .batch_get(&[key(3), key(2), key(1), key(3)])
        .await
        .expect("batch get");
    assert_eq!(
        got,
        vec![
            Some(value(3, 1)),
            None,
            Some(value(1, 1)),
            Some(value(3, 1))
        ]
    );
    assert_eq!(
        snapshot.batch_get(&[]).await.expect("batch get"),
        Vec::<Option<Vec<u8>>>::new()
    );
}

pub async fn insert_if_absent_fails_the_whole_commit(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [5], 1).await;

    let mut writes = WriteSet::new();
    writes
        .insert(key(1), value(1, 2))
        .put(key(2), value(2, 2))
        .insert(key(5), value(5, 2))
        .delete(key(6));
    assert_eq!(
        commit(&t.store, writes).await,
        CommitOutcome::Conflict(Conflict::AlreadyExists { key: key(5) })
    );
    assert_eq!(
        contents(&t.store).await,
        vec![KvPair {
            key: key(5),
            value: value(5, 1)
        }]
    );

    // Within one write set: inserting a key the set already wrote contradicts itself.
    let mut writes = WriteSet::new();
    writes
        .insert(key(7), value(7, 1))
        .put(key(8), value(8, 1))
        .insert(key(7), value(7, 2));
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::ContradictoryWriteSet { key: k, .. }) if k == key(7)
    ));
    let mut writes = WriteSet::new();
    writes.put(key(9), value(9, 1)).insert(key(9), value(9, 2));
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::ContradictoryWriteSet { .. })
    ));
    assert_eq!(
        contents(&t.store).await.len(),
        1,
        "refused write sets wrote nothing"
    );

    // Delete, then insert, in one set: the insert sees the key absent.
    let mut writes = WriteSet::new();
    writes.delete(key(5)).insert(key(5), value(5, 3));
    assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);
    assert_eq!(
        contents(&t.store).await,
        vec![KvPair {
            key: key(5),
            value: value(5, 3)
        }]
    );

    // An insert of an absent key succeeds and a second one conflicts.
    let mut writes = WriteSet::new();
    writes.insert(key(10), value(10, 1));
    assert_eq!(
        commit(&t.store, writes.clone()).await,
        CommitOutcome::Committed
    );
    assert_eq!(
        commit(&t.store, writes).await,
        CommitOutcome::Conflict(Conflict::AlreadyExists { key: key(10) })
    );
}

pub async fn require_present_fails_the_whole_commit(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [1], 1).await;
    let mut writes = WriteSet::new();
    writes
        .require_present(key(1))
        .require_present(key(2))
        .put(key(3), value(3, 1));
    assert_eq!(
        commit(&t.store, writes).await,
        CommitOutcome::Conflict(Conflict::Missing { key: key(2) })
    );
    assert_eq!(contents(&t.store).await.len(), 1);

    let mut writes = WriteSet::new();
    writes.require_present(key(1)).put(key(3), value(3, 1));
    assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);
    assert_eq!(contents(&t.store).await.len(), 2);

    let mut writes = WriteSet::new();
    writes.delete(key(1)).require_present(key(1));
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::ContradictoryWriteSet { .. })
    ));
}

pub async fn a_failed_commit_leaves_nothing(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [0, 999], 1).await;
    let before = contents(&t.store).await;
    // Many writes, with the one that fails sorting first, in the middle, and last.
    for clash in [0, 999] {
        let mut writes = WriteSet::new();
        for i in 1..999 {
            writes.put(key(i), value(i, 2));
        }
        writes.delete(key(if clash == 0 { 999 } else { 0 }));
        writes.insert(key(clash), value(clash, 2));
        assert!(matches!(
            commit(&t.store, writes).await,
            CommitOutcome::Conflict(_)
        ));
        assert_eq!(contents(&t.store).await, before);
    }
}

pub async fn deletes_remove_keys(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, 0..20, 1).await;
    let mut writes = WriteSet::new();
    for i in (0..20).step_by(2) {
        writes.delete(key(i));
    }
    writes.delete(key(1000)); // absent: a no-op
    assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);
    let keys: Vec<Vec<u8>> = contents(&t.store)
        .await
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert_eq!(keys, (1..20).step_by(2).map(key).collect::<Vec<_>>());
    let snapshot = t.store.snapshot().await.expect("snapshot");
    assert_eq!(snapshot.get(&key(0)).await.expect("get"), None);
}

pub async fn limits_are_enforced_before_the_backend(backend: Backend) {
    let limits = StoreLimits {
        max_key_bytes: 16,
        max_value_bytes: 64,
        max_write_set_ops: 10,
        max_write_set_bytes: 400,
    };
    let t = backend.open_with(limits).await;
    let mut writes = WriteSet::new();
    writes.put(key(1), value(1, 1)).put(vec![b'k'; 17], vec![]);
    assert_eq!(
        t.store.commit(writes).await,
        Err(KvError::KeyTooLarge { len: 17, max: 16 })
    );
    let mut writes = WriteSet::new();
    writes.put(key(1), vec![0; 65]);
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::ValueTooLarge {
            len: 65,
            max: 64,
            ..
        })
    ));
    let mut writes = WriteSet::new();
    for i in 0..11 {
        writes.delete(key(i));
    }
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::WriteSetTooLarge { ops: 11, .. })
    ));
    let mut writes = WriteSet::new();
    for i in 0..7 {
        writes.put(key(i), vec![0; 60]);
    }
    assert!(matches!(
        t.store.commit(writes).await,
        Err(KvError::WriteSetTooLarge { ops: 7, .. })
    ));
    assert!(
        contents(&t.store).await.is_empty(),
        "nothing of a refused write set was written"
    );

    // At the limits exactly, everything is accepted.
    let mut writes = WriteSet::new();
    writes.put(vec![b'k'; 16], vec![0; 64]);
    assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);
}

/// Commits what `build` stages for each of `writers` concurrent writers, and returns the
/// writers whose commit landed. Every other outcome goes to `lost`, which checks it.
async fn race(
    store: &Store,
    writers: u32,
    build: impl Fn(u32, &mut WriteSet),
    lost: impl Fn(CommitOutcome),
) -> Vec<u32> {
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let mut set = WriteSet::new();
            build(writer, &mut set);
            let store = store.clone();
            tokio::spawn(async move { (writer, store.commit(set).await.expect("commit")) })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            (writer, CommitOutcome::Committed) => winners.push(writer),
            (_, other) => lost(other),
        }
    }
    winners
}

pub async fn concurrent_inserts_have_one_winner(backend: Backend) {
    let t = backend.open().await;
    let winners = race(
        &t.store,
        16,
        |writer, writes| {
            writes
                .insert(key(1), value(1, writer))
                .put(key(1000 + writer), value(writer, 0));
        },
        |outcome| match outcome {
            CommitOutcome::Conflict(Conflict::AlreadyExists { key: k }) => assert_eq!(k, key(1)),
            other => panic!("unexpected outcome {other:?}"),
        },
    )
    .await;
    assert_eq!(winners.len(), 1, "exactly one insert wins");
    let winner = winners[0];
    assert_eq!(
        contents(&t.store).await,
        vec![
            KvPair {
                key: key(1),
                value: value(1, winner)
            },
            KvPair {
                key: key(1000 + winner),
                value: value(winner, 0)
            },
        ],
        "only the winner's writes are stored"
    );
}

/// Many commits that each take the same key away: whichever lands first wins, and every
/// later one, even one committed in the same group by the backend, sees the key gone.
pub async fn concurrent_takes_of_one_key_have_one_winner(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [0], 0).await;
    let winners = race(
        &t.store,
        32,
        |writer, writes| {
            writes
                .require_present(key(0))
                .delete(key(0))
                .put(key(100 + writer), value(writer, 1));
        },
        |outcome| match outcome {
            CommitOutcome::Conflict(
                Conflict::Missing { key: k } | Conflict::WriteConflict { key: Some(k) },
            ) => assert_eq!(k, key(0)),
            other => panic!("unexpected outcome {other:?}"),
        },
    )
    .await;
    assert_eq!(winners.len(), 1, "exactly one take wins: {winners:?}");
    assert_eq!(
        contents(&t.store).await,
        vec![KvPair {
            key: key(100 + winners[0]),
            value: value(winners[0], 1)
        }]
    );
}

/// The digest of what `store` holds in `range` now.
async fn range_digest(store: &Store, range: &KeyRange) -> Digest {
    let snapshot = store.snapshot().await.expect("snapshot");
    let pairs = scan_all(&snapshot, range.clone(), PageSize::rows(2)).await;
    Digester::of_pairs(pairs.iter().map(|p| (p.key.as_slice(), p.value.as_slice())))
}

/// An update commits only while the record is still the one read: a change or delete of it in
/// between is a conflict, and nothing of the update is written.
pub async fn updates_require_the_record_they_read(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [1, 2], 0).await;
    let read = Digest::of_value(&value(1, 0));
    put_range(&t.store, [1], 1).await;
    let mut stale = WriteSet::new();
    stale
        .require_unchanged(key(1), read)
        .put(key(1), value(1, 2))
        .put(key(3), value(3, 2));
    assert_eq!(
        commit(&t.store, stale).await,
        CommitOutcome::Conflict(Conflict::Changed { key: key(1) })
    );
    let mut fresh = WriteSet::new();
    fresh
        .require_unchanged(key(1), Digest::of_value(&value(1, 1)))
        .put(key(1), value(1, 2));
    assert_eq!(commit(&t.store, fresh).await, CommitOutcome::Committed);
    let mut gone = WriteSet::new();
    gone.delete(key(2));
    assert_eq!(commit(&t.store, gone).await, CommitOutcome::Committed);
    let mut of_deleted = WriteSet::new();
    of_deleted
        .require_unchanged(key(2), Digest::of_value(&value(2, 0)))
        .delete(key(2));
    assert_eq!(
        commit(&t.store, of_deleted).await,
        CommitOutcome::Conflict(Conflict::Missing { key: key(2) })
    );
    assert_eq!(
        contents(&t.store).await,
        vec![KvPair {
            key: key(1),
            value: value(1, 2)
        }]
    );
}

/// Many updates of one record read at the same version: one lands, every other is told the
/// record changed (the lost update the requirement exists for).
pub async fn concurrent_updates_of_one_record_have_one_winner(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [0], 0).await;
    let read = Digest::of_value(&value(0, 0));
    let winners = race(
        &t.store,
        16,
        |writer, writes| {
            writes
                .require_unchanged(key(0), read)
                .put(key(0), value(0, writer + 1));
        },
        |outcome| match outcome {
            CommitOutcome::Conflict(
                Conflict::Changed { key: k } | Conflict::WriteConflict { key: Some(k) },
            ) => assert_eq!(k, key(0)),
            other => panic!("unexpected outcome {other:?}"),
        },
    )
    .await;
    assert_eq!(winners.len(), 1, "exactly one update wins: {winners:?}");
    assert_eq!(
        contents(&t.store).await,
        vec![KvPair {
            key: key(0),
            value: value(0, winners[0] + 1)
        }]
    );
}

/// A change made to a write set, in a table of cases.
type Change = fn(&mut WriteSet);

/// A range requirement holds only while the range holds what was read: an insert, a change
/// and a delete in it each make it fail; writes next to it do not.
pub async fn range_requirements_see_every_change_in_their_range(backend: Backend) {
    let t = backend.open().await;
    put_range(&t.store, [10, 12, 14], 0).await;
    let range = KeyRange::new(key(10), key(15));
    let changes: [(&str, Change); 3] = [
        ("insert", |w| {
            w.put(key(11), value(11, 0));
        }),
        ("change", |w| {
            w.put(key(12), value(12, 1));
        }),
        ("delete", |w| {
            w.delete(key(14));
        }),
    ];
    for (what, change) in changes {
        let read = range_digest(&t.store, &range).await;
        // Outside the range: no effect on it.
        put_range(&t.store, [9, 15], 0).await;
        let mut unchanged = WriteSet::new();
        unchanged
            .require_range(range.clone(), read)
            .put(key(100), value(100, 0));
        assert_eq!(
            commit(&t.store, unchanged).await,
            CommitOutcome::Committed,
            "{what}: nothing changed yet"
        );
        let mut writes = WriteSet::new();
        change(&mut writes);
        assert_eq!(commit(&t.store, writes).await, CommitOutcome::Committed);
        let mut stale = WriteSet::new();
        stale
            .require_range(range.clone(), read)
            .delete(key(10))
            .put(key(101), value(101, 0));
        assert_eq!(
            commit(&t.store, stale).await,
            CommitOutcome::Conflict(Conflict::RangeChanged {
                start: key(10),
                end: key(15)
            }),
            "{what} in the range"
        );
        let snapshot = t.store.snapshot().await.expect("snapshot");
        assert!(snapshot.get(&key(10)).await.expect("get").is_some());
        assert!(snapshot.get(&key(101)).await.expect("get").is_none());
    }
}

/// A commit acting on a whole range (it requires the range as read and moves a guard key on)
/// races commits inserting into the range (each requires the guard as read): whichever
/// commits first, the other side loses, so no insert escapes the range's commit.
pub async fn a_range_holder_and_inserts_into_its_range_never_both_win(backend: Backend) {
    for round in 0..4 {
        let t = backend.open().await;
        put_range(&t.store, [20, 21], 0).await;
        let guard = key(5);
        let range = KeyRange::new(key(20), key(40));
        let read_range = range_digest(&t.store, &range).await;
        let winners = race(
            &t.store,
            8,
            |writer, writes| {
                if writer == round {
                    // The holder: deletes every row of the range it read.
                    writes
                        .require_range(range.clone(), read_range)
                        .insert(guard.clone(), value(5, 1))
                        .delete(key(20))
                        .delete(key(21));
                } else {
                    // An insert into the range, depending on the guard being absent.
                    writes
                        .require_absent(guard.clone())
                        .insert(key(22 + writer), value(22 + writer, 0));
                }
            },
            |outcome| match outcome {
                CommitOutcome::Conflict(
                    Conflict::RangeChanged { .. }
                    | Conflict::AlreadyExists { .. }
                    | Conflict::WriteConflict { .. },
                ) => {}
                other => panic!("unexpected outcome {other:?}"),
            },
        )
        .await;
        let holder_won = winners.contains(&round);
        assert!(!winners.is_empty(), "someone wins");
        assert!(
            !holder_won || winners.len() == 1,
            "round {round}: the holder won beside inserts {winners:?}"
        );
        let stored = contents(&t.store).await;
        let in_range = stored.iter().filter(|p| range.contains(&p.key)).count();
        assert_eq!(
            in_range,
            if holder_won { 0 } else { 2 + winners.len() },
            "round {round}: {stored:?}"
        );
    }
}

/// A number below `n`, as a key or value index.
fn pick(rng: &mut Rng, n: usize) -> u32 {
    u32::try_from(rng.below(n)).expect("small")
}

/// Random write sets on the backend and on the memory model side by side: every outcome, every
/// snapshot read and every scan must agree. Replay with `MORAINE_SEED=<seed>`.
pub async fn agrees_with_the_memory_model(backend: Backend) {
    let seed = std::env::var("MORAINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001_u64);
    let mut rng = Rng(seed | 1);
    let t = backend.open().await;
    let model = Backend::Memory.open().await;
    let mut old_snapshots: Vec<(Snapshot, Snapshot)> = Vec::new();
    for round in 0..150 {
        let mut writes = WriteSet::new();
        for _ in 0..=pick(&mut rng, 12) {
            let k = key(pick(&mut rng, 64));
            match pick(&mut rng, 8) {
                0..=2 => writes.put(k, value(pick(&mut rng, 1000), round)),
                3 | 4 => writes.insert(k, value(pick(&mut rng, 1000), round)),
                5 | 6 => writes.delete(k),
                _ => writes.require_present(k),
            };
        }
        let got = t.store.commit(writes.clone()).await;
        let want = model.store.commit(writes).await;
        assert_eq!(got, want, "seed {seed} round {round}: outcomes differ");
        if pick(&mut rng, 5) == 0 {
            old_snapshots.push((
                t.store.snapshot().await.expect("snapshot"),
                model.store.snapshot().await.expect("snapshot"),
            ));
        }
        for (ours, theirs) in &old_snapshots {
            let lo = pick(&mut rng, 70);
            let range = KeyRange::new(key(lo), key(lo + pick(&mut rng, 40)));
            let page = PageSize {
                rows: 1 + rng.below(9),
                bytes: 1 << 20,
            };
            assert_eq!(
                scan_all(ours, range.clone(), page).await,
                scan_all(theirs, range, page).await,
                "seed {seed} round {round}: scans differ"
            );
            let probe = key(pick(&mut rng, 64));
            assert_eq!(
                ours.get(&probe).await,
                theirs.get(&probe).await,
                "seed {seed} round {round}"
            );
        }
    }
    let final_state: BTreeMap<Vec<u8>, Vec<u8>> = contents(&t.store)
        .await
        .into_iter()
        .map(|p| (p.key, p.value))
        .collect();
    assert!(!final_state.is_empty(), "the sequence wrote something");
    assert_eq!(
        contents(&t.store).await,
        contents(&model.store).await,
        "seed {seed}"
    );
}

macro_rules! conformance {
    ($backend:ident: $($test:ident),* $(,)?) => {
        #[allow(non_snake_case)]
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::harness::Backend::$backend).await;
                }
            )*
        }
    };
}

/// The suite on each backend, with the tests named after `+` on that backend only.
macro_rules! conformance_suite {
    ($($backend:ident $(+ $extra:ident)*),*) => {
        $(
            conformance!($backend:
                snapshot_isolation,
                scans_are_ordered_and_exact_across_pages,
                scan_stops_when_the_consumer_stops,
                batch_get_keeps_order_and_reports_missing,
                insert_if_absent_fails_the_whole_commit,
                require_present_fails_the_whole_commit,
                a_failed_commit_leaves_nothing,
                deletes_remove_keys,
                limits_are_enforced_before_the_backend,
                concurrent_inserts_have_one_winner,
                concurrent_takes_of_one_key_have_one_winner,
                updates_require_the_record_they_read,
                concurrent_updates_of_one_record_have_one_winner,
                range_requirements_see_every_change_in_their_range,
                a_range_holder_and_inserts_into_its_range_never_both_win,
                $($extra,)*
            );
        )*
    };
}

// The memory backend is the model: comparing it with itself would check nothing.
conformance_suite!(Memory, Redb + agrees_with_the_memory_model);
#[cfg(feature = "tikv")]
conformance_suite!(Tikv + agrees_with_the_memory_model);
