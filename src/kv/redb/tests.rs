use super::*;
use crate::kv::{Conflict, WriteSet};

fn staged(build: impl FnOnce(&mut WriteSet)) -> Arc<StagedWrites> {
    let mut writes = WriteSet::new();
    build(&mut writes);
    Arc::new(writes.into_staged().expect("staged"))
}

fn contents(db: &Database) -> Vec<(Vec<u8>, Vec<u8>)> {
    let txn = db.begin_read().expect("read");
    let table = txn.open_table(DATA).expect("table");
    table
        .iter()
        .expect("iter")
        .map(|item| {
            let (key, value) = item.expect("item");
            (key.value().to_vec(), value.value().to_vec())
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    items
        .iter()
        .map(|(key, value)| (key.as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect()
}

/// A writer thread over a fresh store in `dir`, and the store's file.
fn writer_in(dir: &Path) -> (Arc<Database>, Writer) {
    let db = Arc::new(Database::create(dir.join(FILE_NAME)).expect("db"));
    let (log, _, _) = recover(&db, dir, &RedbOptions::default()).expect("tables and log");
    let writer = Writer::start(
        Arc::clone(&db),
        log,
        0,
        Duration::from_hours(1),
        Arc::new(AtomicBool::new(false)),
        Unapplied::default(),
    )
    .expect("writer");
    (db, writer)
}

/// Commits `requests` as one group, waits until the applier has put it in the file (made
/// durable without emptying the log), and returns each commit's outcome.
fn commit_and_apply(
    writer: &mut Writer,
    requests: impl IntoIterator<Item = Arc<StagedWrites>>,
) -> Vec<CommitOutcome> {
    let mut answers = Vec::new();
    let group = requests
        .into_iter()
        .map(|writes| {
            let (reply, answer) = tokio::sync::oneshot::channel();
            answers.push(answer);
            Request { writes, reply }
        })
        .collect();
    writer.commit_group(group);
    writer.applier.checkpoint().expect("applied");
    answers
        .into_iter()
        .map(|mut answer| answer.try_recv().expect("answered").expect("no error"))
        .collect()
}

/// A group's commits are checked one after another against what the ones before them
/// left, so a group ends as if they had been committed in turn.
#[test]
fn a_group_ends_as_its_commits_would_one_after_another() {
    let dir = tempfile::tempdir().expect("dir");
    let (db, mut writer) = writer_in(dir.path());
    let requests = [
        staged(|w| {
            w.insert(&b"k"[..], &b"first"[..]).put(&b"a"[..], &b"1"[..]);
        }),
        // The first commit's insert is seen: this one conflicts and writes nothing.
        staged(|w| {
            w.insert(&b"k"[..], &b"second"[..])
                .put(&b"b"[..], &b"2"[..]);
        }),
        // Requires what the first commit wrote, and deletes it.
        staged(|w| {
            w.require_present(&b"a"[..])
                .delete(&b"a"[..])
                .put(&b"c"[..], &b"3"[..]);
        }),
        // Requires what the third deleted.
        staged(|w| {
            w.require_present(&b"a"[..]).put(&b"d"[..], &b"4"[..]);
        }),
    ];
    let outcomes = commit_and_apply(&mut writer, requests);
    assert_eq!(
        outcomes,
        vec![
            CommitOutcome::Committed,
            CommitOutcome::Conflict(Conflict::AlreadyExists { key: b"k".to_vec() }),
            CommitOutcome::Committed,
            CommitOutcome::Conflict(Conflict::Missing { key: b"a".to_vec() }),
        ]
    );
    assert_eq!(contents(&db), pairs(&[("c", "3"), ("k", "first")]));
    // The group is in the log as one record, holding only the accepted commits' writes, in
    // commit order; within a commit (where each key appears once) in the order they were staged.
    drop(writer);
    let (_, records) = log::tests::read(dir.path());
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, 1);
    assert_eq!(
        records[0].1,
        vec![
            (b"k".to_vec(), Some(b"first".to_vec())),
            (b"a".to_vec(), Some(b"1".to_vec())),
            (b"a".to_vec(), None),
            (b"c".to_vec(), Some(b"3".to_vec())),
        ]
    );
}

/// Writes staged in an order of their own, unsealed, as a large transaction reaches a
/// backend that [orders writes](KvBackend::orders_writes): `(key, value)`, `None` deleting.
fn unsealed(writes: &[(String, Option<&str>)]) -> Arc<StagedWrites> {
    let mut staged = StagedWrites::new();
    let mut undo = crate::kv::Undo::off();
    for (key, value) in writes {
        match value {
            Some(value) => staged.put(key, value, &mut undo),
            None => staged.delete(key, &mut undo),
        }
        .expect("staged");
    }
    assert!(!staged.is_sealed());
    Arc::new(staged)
}

/// Keys `prefix00000` to `prefix{n-1}`, staged from the last, each with value `value`.
fn descending(prefix: &str, n: usize, value: &'static str) -> Vec<(String, Option<&'static str>)> {
    (0..n)
        .rev()
        .map(|i| (format!("{prefix}{i:05}"), Some(value)))
        .collect()
}

/// A group's writes that came unsealed are in key order once it is logged (those of the
/// writer's own thread and those sealed beside the log write alike), and the log holds each
/// commit's writes in the order they were staged.
#[test]
fn a_group_is_logged_and_sealed_together() {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::create(dir.path().join(FILE_NAME)).expect("db");
    let (mut log, _, _) = recover(&db, dir.path(), &RedbOptions::default()).expect("log");
    let large = descending("u", 3_000, "1");
    let small = vec![("b".to_owned(), Some("2")), ("a".to_owned(), None)];
    let mut group: Vec<Request> = [
        unsealed(&large),
        staged(|w| {
            w.put(&b"s"[..], &b"3"[..]);
        }),
        unsealed(&small),
    ]
    .into_iter()
    .map(|writes| Request {
        writes,
        reply: tokio::sync::oneshot::channel().0,
    })
    .collect();
    log_and_seal(&mut log, 7, &mut group).expect("logged");
    for request in &group {
        assert!(request.writes.is_sealed());
        let keys: Vec<&[u8]> = request.writes.iter().map(|(key, _)| key).collect();
        assert!(keys.is_sorted(), "{} keys out of order", keys.len());
    }
    drop(log);
    let (_, records) = log::tests::read(dir.path());
    let logged: Vec<(Vec<u8>, Option<Vec<u8>>)> = large
        .iter()
        .map(|(key, value)| (key.as_str(), *value))
        .chain([("s", Some("3"))])
        .chain(small.iter().map(|(key, value)| (key.as_str(), *value)))
        .map(|(key, value)| {
            (
                key.as_bytes().to_vec(),
                value.map(|v| v.as_bytes().to_vec()),
            )
        })
        .collect();
    assert_eq!(records, vec![(7, logged)]);
}

/// A group of unsealed commits ends as the same commits sealed would: a commit checked
/// against an unsealed one before it in the group sees its writes (the conflict and the
/// requirement met below), and the file holds what the accepted ones wrote.
#[test]
fn unsealed_commits_end_as_sealed_ones_would() {
    let dir = tempfile::tempdir().expect("dir");
    let (db, mut writer) = writer_in(dir.path());
    let first = descending("u", 2_000, "1");
    let mut inserting = StagedWrites::new();
    let mut undo = crate::kv::Undo::off();
    inserting
        .insert(b"u00010", b"again", &mut undo)
        .expect("staged");
    inserting.put(b"x", b"lost", &mut undo).expect("staged");
    let mut requiring = StagedWrites::new();
    requiring
        .require_present(b"u00007", &mut undo)
        .expect("staged");
    requiring.delete(b"u00007", &mut undo).expect("staged");
    requiring.put(b"y", b"2", &mut undo).expect("staged");
    let last = descending("w", 2_000, "3");
    let requests = [
        unsealed(&first),
        // Conflicts with the first: nothing of it is written.
        Arc::new(inserting),
        // Requires what the first wrote, and deletes it.
        Arc::new(requiring),
        unsealed(&last),
    ];
    let outcomes = commit_and_apply(&mut writer, requests);
    assert_eq!(
        outcomes,
        vec![
            CommitOutcome::Committed,
            CommitOutcome::Conflict(Conflict::AlreadyExists {
                key: b"u00010".to_vec()
            }),
            CommitOutcome::Committed,
            CommitOutcome::Committed,
        ]
    );
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = first
        .iter()
        .chain(&last)
        .filter(|(key, _)| key != "u00007")
        .map(|(key, value)| {
            (
                key.as_bytes().to_vec(),
                value.unwrap_or_default().as_bytes().to_vec(),
            )
        })
        .chain([(b"y".to_vec(), b"2".to_vec())])
        .collect();
    expected.sort();
    assert_eq!(contents(&db), expected);
}

/// A group is acknowledged before its writes reach the file; a snapshot taken meanwhile
/// reads the file through them, in commit order.
#[tokio::test]
async fn a_snapshot_sees_acknowledged_writes_not_yet_in_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let backend = RedbBackend::open(dir.path()).await.expect("open");
    // The file holds a=1, b=2 (written directly: the writer thread stays idle).
    let txn = backend.db.begin_write().expect("write");
    {
        let mut table = txn.open_table(DATA).expect("table");
        table.insert(&b"a"[..], &b"1"[..]).expect("insert");
        table.insert(&b"b"[..], &b"2"[..]).expect("insert");
    }
    txn.commit().expect("commit");
    // Two commits of a group acknowledged, their apply still to come.
    backend.committer.unapplied.visible().writes.extend([
        staged(|w| {
            w.put(&b"a"[..], &b"3"[..]).delete(&b"b"[..]);
        }),
        staged(|w| {
            w.put(&b"a"[..], &b"5"[..]).put(&b"c"[..], &b"4"[..]);
        }),
    ]);
    let snapshot = backend.snapshot().await.expect("snapshot");
    assert_eq!(snapshot.get(b"a").await.expect("get"), Some(b"5".to_vec()));
    assert_eq!(snapshot.get(b"b").await.expect("get"), None);
    let page = snapshot
        .scan_page(&KeyRange::new(vec![], vec![0xff]), PageSize::default())
        .await
        .expect("scan");
    let seen: Vec<_> = page.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
    assert_eq!(seen, pairs(&[("a", "5"), ("c", "4")]));
    assert_eq!(contents(&backend.db), pairs(&[("a", "1"), ("b", "2")]));
}

/// What the log holds beyond the file's durable state is applied on open; records the
/// file already holds are not applied twice.
#[tokio::test]
async fn opening_replays_the_log_past_the_last_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    {
        let backend = RedbBackend::open(dir.path()).await.expect("open");
        let writes = staged(|w| {
            w.put(&b"kept"[..], &b"1"[..]);
        });
        assert_eq!(
            backend.commit(writes).await.expect("commit"),
            CommitOutcome::Committed
        );
        // Dropping the backend checkpoints: the file holds group 1, and the log starts
        // over (its one record, redundant, is written over by the next).
    }
    {
        let (mut log, records) = log::tests::read(dir.path());
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(
            seqs,
            vec![1],
            "a clean stop leaves only what the file holds"
        );
        log.reset().expect("start over");
        // What a crash leaves: group 1 again (the log not yet started over), and group 2,
        // acknowledged but not checkpointed.
        let stale = staged(|w| {
            w.put(&b"kept"[..], &b"stale"[..])
                .put(&b"gone"[..], &b"x"[..]);
        });
        log.append(1, &std::iter::once(stale.as_ref()))
            .expect("append");
        let fresh = staged(|w| {
            w.put(&b"new"[..], &b"2"[..]).delete(&b"kept"[..]);
        });
        log.append(2, &std::iter::once(fresh.as_ref()))
            .expect("append");
    }
    let backend = RedbBackend::open(dir.path()).await.expect("reopen");
    assert_eq!(contents(&backend.db), pairs(&[("new", "2")]));
    // The replay was made durable and the log started over: the next group is written at
    // its start, over the records replayed.
    let writes = staged(|w| {
        w.put(&b"later"[..], &b"3"[..]);
    });
    assert_eq!(
        backend.commit(writes).await.expect("commit"),
        CommitOutcome::Committed
    );
    drop(backend);
    let (_, records) = log::tests::read(dir.path());
    assert_eq!(records.first().map(|(seq, _)| *seq), Some(3));
    let backend = RedbBackend::open(dir.path()).await.expect("reopen");
    assert_eq!(
        contents(&backend.db),
        pairs(&[("later", "3"), ("new", "2")])
    );
}

/// `build`'s writes, stating what the snapshot of `version` held.
fn staged_at(version: Option<u64>, build: impl FnOnce(&mut WriteSet)) -> Arc<StagedWrites> {
    let mut writes = WriteSet::new();
    build(&mut writes);
    Arc::new(writes.into_staged_at(version).expect("staged"))
}

/// Every pair a fresh snapshot of `backend` reads.
async fn visible(backend: &RedbBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
    let snapshot = backend.snapshot().await.expect("snapshot");
    let page = snapshot
        .scan_page(&KeyRange::new(vec![], vec![0xff]), PageSize::default())
        .await
        .expect("scan");
    page.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

/// Commits staged against one snapshot's version are checked against what was committed
/// since: the second insert of one key conflicts, an insert of another key does not, and
/// a range requirement sees an insert into its range.
#[tokio::test]
async fn commits_staged_at_a_version_see_what_was_committed_since() {
    let dir = tempfile::tempdir().expect("dir");
    let backend = RedbBackend::open(dir.path()).await.expect("open");
    let first = staged(|w| {
        w.put(&b"m"[..], &b"1"[..]);
    });
    assert_eq!(backend.commit(first).await, Ok(CommitOutcome::Committed));
    let version = backend.snapshot().await.expect("snapshot").version();
    assert_eq!(version, Some(1));
    let insert = |key: &'static [u8]| {
        staged_at(version, |w| {
            w.insert(key, &b"v"[..]);
        })
    };
    assert_eq!(
        backend.commit(insert(b"a")).await,
        Ok(CommitOutcome::Committed)
    );
    assert_eq!(
        backend.commit(insert(b"a")).await,
        Ok(CommitOutcome::Conflict(Conflict::AlreadyExists {
            key: b"a".to_vec()
        }))
    );
    assert_eq!(
        backend.commit(insert(b"b")).await,
        Ok(CommitOutcome::Committed)
    );
    // Read whole at the version, when "a" and "b" were not there yet.
    let range = KeyRange::new(b"a".to_vec(), b"c".to_vec());
    let empty = crate::kv::Digester::new().finish();
    let held = staged_at(version, |w| {
        w.require_range(range.clone(), empty)
            .put(&b"z"[..], &b"1"[..]);
    });
    assert!(matches!(
        backend.commit(held).await,
        Ok(CommitOutcome::Conflict(Conflict::RangeChanged { .. }))
    ));
    assert_eq!(
        visible(&backend).await,
        pairs(&[("a", "v"), ("b", "v"), ("m", "1")])
    );
}

/// A commit staged at a version older than the writes the store keeps for this check, or
/// older than one large commit, is checked against the file, and its conflict found.
#[tokio::test]
async fn commits_staged_long_ago_are_checked_against_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let backend = RedbBackend::open(dir.path()).await.expect("open");
    let version = backend.snapshot().await.expect("snapshot").version();
    let insert_a = || {
        staged_at(version, |w| {
            w.insert(&b"a"[..], &b"late"[..]);
        })
    };
    // "a", then more small commits than the store keeps.
    let a = staged(|w| {
        w.put(&b"a"[..], &b"early"[..]);
    });
    assert_eq!(backend.commit(a).await, Ok(CommitOutcome::Committed));
    for i in 0..=HISTORY_GROUPS {
        let other = staged(|w| {
            w.put(format!("o{i:05}").into_bytes(), &b"x"[..]);
        });
        assert_eq!(backend.commit(other).await, Ok(CommitOutcome::Committed));
    }
    assert_eq!(
        backend.commit(insert_a()).await,
        Ok(CommitOutcome::Conflict(Conflict::AlreadyExists {
            key: b"a".to_vec()
        }))
    );
    // One commit too large to keep, writing "b", after the version.
    let version = backend.snapshot().await.expect("snapshot").version();
    let large = staged(|w| {
        w.put(&b"b"[..], vec![7_u8; HISTORY_COMMIT_BYTES + 1]);
    });
    assert_eq!(backend.commit(large).await, Ok(CommitOutcome::Committed));
    let insert_b = staged_at(version, |w| {
        w.insert(&b"b"[..], &b"late"[..]);
    });
    assert_eq!(
        backend.commit(insert_b).await,
        Ok(CommitOutcome::Conflict(Conflict::AlreadyExists {
            key: b"b".to_vec()
        }))
    );
}

/// The applier, not the writer, waits for the file: while the file cannot be written (a
/// write transaction held here, as a large transaction's apply holds it), commits are still
/// checked, acknowledged and seen, against the writes not yet in the file; once the file is
/// free they reach it, and a reopened store holds them.
#[tokio::test]
async fn commits_are_acknowledged_while_the_file_waits_for_their_apply() {
    let dir = tempfile::tempdir().expect("dir");
    // No checkpoint falls due while the file is held: a checkpoint waits for the applier.
    let options = RedbOptions {
        checkpoint_every: Duration::from_hours(1),
        ..RedbOptions::default()
    };
    let backend = RedbBackend::open_with(dir.path(), options)
        .await
        .expect("open");
    // The file holds a=1 (written directly: the writer thread stays idle), and is held.
    let txn = backend.db.begin_write().expect("write");
    txn.open_table(DATA)
        .expect("table")
        .insert(&b"a"[..], &b"1"[..])
        .expect("insert");
    txn.commit().expect("commit");
    let held = backend.db.begin_write().expect("hold the file");
    // Each commit is bounded in time only so that a writer waiting for the file fails the
    // test instead of hanging it.
    let commit = |writes: Arc<StagedWrites>| {
        let backend = backend.clone();
        async move {
            tokio::time::timeout(Duration::from_mins(1), backend.commit(writes))
                .await
                .expect("acknowledged while the file is held")
        }
    };
    assert_eq!(
        commit(staged(|w| {
            w.insert(&b"k"[..], &b"1"[..]);
        }))
        .await,
        Ok(CommitOutcome::Committed)
    );
    // Checked against "k", which is not in the file yet.
    assert_eq!(
        commit(staged(|w| {
            w.insert(&b"k"[..], &b"2"[..]);
        }))
        .await,
        Ok(CommitOutcome::Conflict(Conflict::AlreadyExists {
            key: b"k".to_vec()
        }))
    );
    let empty = crate::kv::Digester::new().finish();
    assert!(matches!(
        commit(staged(|w| {
            w.require_range(KeyRange::new(b"j".to_vec(), b"l".to_vec()), empty)
                .put(&b"z"[..], &b"1"[..]);
        }))
        .await,
        Ok(CommitOutcome::Conflict(Conflict::RangeChanged { .. }))
    ));
    assert_eq!(
        commit(staged(|w| {
            w.require_present(&b"k"[..])
                .delete(&b"a"[..])
                .put(&b"d"[..], &b"4"[..]);
        }))
        .await,
        Ok(CommitOutcome::Committed)
    );
    assert_eq!(visible(&backend).await, pairs(&[("d", "4"), ("k", "1")]));
    assert_eq!(
        contents(&backend.db),
        pairs(&[("a", "1")]),
        "nothing applied while held"
    );
    drop(held);
    // Closing waits for the applier and checkpoints.
    drop(backend);
    let backend = RedbBackend::open(dir.path()).await.expect("reopen");
    assert_eq!(contents(&backend.db), pairs(&[("d", "4"), ("k", "1")]));
}

/// Tallies of the pairs under `b"r"` by their first two bytes, as the tests' stores keep them.
fn test_tally(unit: usize) -> Tally {
    Tally {
        range: KeyRange::new(b"r".to_vec(), b"s".to_vec()),
        unit,
    }
}

async fn open_tallied(dir: &Path, tally: Option<Tally>) -> RedbBackend {
    let options = RedbOptions {
        tally,
        ..RedbOptions::default()
    };
    RedbBackend::open_with(dir, options).await.expect("open")
}

/// The tallies the file holds, by unit.
fn tallies(db: &Database) -> Vec<(Vec<u8>, u64)> {
    let txn = db.begin_read().expect("read");
    let table = txn.open_table(tally::TALLIES).expect("tallies");
    table
        .iter()
        .expect("iter")
        .map(|item| {
            let (unit, bytes) = item.expect("item");
            (unit.value().to_vec(), bytes.value())
        })
        .collect()
}

/// What the tallies must be: the file walked, its pairs in `rule`'s range summed by unit.
fn walked(db: &Database, rule: &Tally) -> Vec<(Vec<u8>, u64)> {
    let mut sums: Vec<(Vec<u8>, u64)> = Vec::new();
    for (key, value) in contents(db) {
        if !rule.range.contains(&key) {
            continue;
        }
        let unit = key[..key.len().min(rule.unit)].to_vec();
        let bytes = (key.len() + value.len()) as u64;
        match sums.last_mut() {
            Some((last, sum)) if *last == unit => *sum += bytes,
            _ => sums.push((unit, bytes)),
        }
    }
    sums
}

async fn commit_all(backend: &RedbBackend, commits: Vec<Arc<StagedWrites>>) {
    for writes in commits {
        assert_eq!(
            backend.commit(writes).await.expect("commit"),
            CommitOutcome::Committed
        );
    }
}

/// The tallies follow every kind of write (insert, overwrite with a longer or shorter value,
/// delete, a unit emptied), through the applier and through a replay of the log; pairs
/// outside the tallied range are not tallied.
#[tokio::test]
async fn tallies_follow_every_write_applied_or_replayed() {
    let dir = tempfile::tempdir().expect("dir");
    let rule = test_tally(2);
    {
        let backend = open_tallied(dir.path(), Some(rule.clone())).await;
        commit_all(
            &backend,
            vec![
                staged(|w| {
                    w.put(&b"ra1"[..], &b"x"[..])
                        .put(&b"ra2"[..], &b"yyyy"[..])
                        .put(&b"rb1"[..], &b"z"[..])
                        .put(&b"rc"[..], &b"c"[..])
                        .put(&b"a"[..], &b"outside"[..])
                        .put(&b"s1"[..], &b"outside"[..]);
                }),
                staged(|w| {
                    w.put(&b"ra1"[..], &b"longer value"[..])
                        .put(&b"ra2"[..], &b""[..])
                        .delete(&b"rb1"[..])
                        .put(&b"rd9"[..], &b"dd"[..]);
                }),
            ],
        )
        .await;
        // Dropping the backend applies and checkpoints.
    }
    {
        let backend = open_tallied(dir.path(), Some(rule.clone())).await;
        let expected = pairs(&[
            ("ra1", "longer value"),
            ("ra2", ""),
            ("rc", "c"),
            ("rd9", "dd"),
        ]);
        let in_range: Vec<_> = contents(&backend.db)
            .into_iter()
            .filter(|(key, _)| rule.range.contains(key))
            .collect();
        assert_eq!(in_range, expected);
        assert_eq!(
            tallies(&backend.db),
            vec![
                (b"ra".to_vec(), 3 + 12 + 3),
                (b"rc".to_vec(), 2 + 1),
                (b"rd".to_vec(), 3 + 2),
            ]
        );
    }
    {
        // What a crash leaves: a group logged and not checkpointed, replayed on open.
        let (mut log, _) = log::tests::read(dir.path());
        let lost = staged(|w| {
            w.delete(&b"ra1"[..])
                .put(&b"rb2"[..], &b"back"[..])
                .delete(&b"rc"[..]);
        });
        log.append(3, &std::iter::once(lost.as_ref()))
            .expect("append");
    }
    let backend = open_tallied(dir.path(), Some(rule.clone())).await;
    assert_eq!(tallies(&backend.db), walked(&backend.db, &rule));
    assert_eq!(
        tallies(&backend.db),
        vec![
            (b"ra".to_vec(), 3),
            (b"rb".to_vec(), 3 + 4),
            (b"rd".to_vec(), 3 + 2),
        ]
    );
}

/// A store opened with another rule than it records, or with none, or written before it
/// tallied anything, is tallied afresh; one opened without a rule forgets its tallies, so
/// that a later open with a rule does not trust tallies it did not keep.
#[tokio::test]
async fn a_store_opened_under_another_rule_is_tallied_afresh() {
    let dir = tempfile::tempdir().expect("dir");
    let writes = || {
        vec![staged(|w| {
            w.put(&b"ra1"[..], &b"1"[..])
                .put(&b"rb1"[..], &b"22"[..])
                .put(&b"rb2"[..], &b"333"[..]);
        })]
    };
    {
        let backend = open_tallied(dir.path(), None).await;
        commit_all(&backend, writes()).await;
    }
    let coarse = test_tally(1);
    {
        let backend = open_tallied(dir.path(), Some(test_tally(2))).await;
        assert_eq!(tallies(&backend.db), walked(&backend.db, &test_tally(2)));
        assert_eq!(tallies(&backend.db).len(), 2);
    }
    {
        let backend = open_tallied(dir.path(), Some(coarse.clone())).await;
        assert_eq!(
            tallies(&backend.db),
            vec![(b"r".to_vec(), 3 + 1 + 3 + 2 + 3 + 3)]
        );
    }
    {
        let backend = open_tallied(dir.path(), None).await;
        assert!(tallies(&backend.db).is_empty());
        // Written while nothing is tallied.
        commit_all(
            &backend,
            vec![staged(|w| {
                w.delete(&b"rb2"[..]).put(&b"rc1"[..], &b"4"[..]);
            })],
        )
        .await;
    }
    let backend = open_tallied(dir.path(), Some(coarse.clone())).await;
    assert_eq!(tallies(&backend.db), walked(&backend.db, &coarse));
}

/// A range made of whole units divides from the tallies, at units' first keys, into the
/// volumes a walk measures; a range that splits a unit is walked.
#[tokio::test]
async fn a_range_of_whole_units_divides_from_its_tallies() {
    let dir = tempfile::tempdir().expect("dir");
    let rule = test_tally(2);
    let backend = open_tallied(dir.path(), Some(rule.clone())).await;
    let value = vec![b'v'; 97];
    commit_all(
        &backend,
        vec![staged(|w| {
            for unit in [b"ra", b"rb", b"rc", b"rd"] {
                for i in 0..10u8 {
                    let mut key = unit.to_vec();
                    key.push(i);
                    w.put(key, value.clone());
                }
            }
        })],
    )
    .await;
    drop(backend);
    let backend = open_tallied(dir.path(), Some(rule.clone())).await;
    let snapshot = backend.snapshot().await.expect("snapshot");
    let division = Division {
        span_bytes: 1000,
        max_spans: 4,
    };
    // Each unit holds 10 pairs of 3 + 97 bytes.
    let whole = KeyRange::new(b"r".to_vec(), b"s".to_vec());
    let divided = snapshot.divide(&whole, division).await.expect("divide");
    assert_eq!(
        divided,
        Divided {
            cuts: vec![b"rb".to_vec(), b"rc".to_vec(), b"rd".to_vec()],
            volumes: Some(vec![1000; 4]),
        }
    );
    // Within one unit the tallies cannot say where to cut: the range is walked, and its
    // 500 bytes cut into two spans inside the unit.
    let within = KeyRange::new(b"rb".to_vec(), b"rb\x05".to_vec());
    assert!(!rule.covers(&within));
    let divided = snapshot
        .divide(
            &within,
            Division {
                span_bytes: 200,
                max_spans: 4,
            },
        )
        .await
        .expect("divide");
    assert_eq!(
        divided,
        Divided {
            cuts: vec![b"rb\x02".to_vec()],
            volumes: Some(vec![200, 300]),
        }
    );
}

/// `stored` with `writes` applied in turn (`None` deletes): what a file must hold after them.
fn written<'a>(
    mut stored: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    writes: impl IntoIterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    for (key, value) in writes {
        match value {
            Some(value) => stored.insert(key.clone(), value.clone()),
            None => stored.remove(key),
        };
    }
    stored.into_iter().collect()
}

/// Pairs of a file, and units with their bytes.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
type Units = Vec<(Vec<u8>, u64)>;

/// Marks of the keys under `b"r"` that share their first two bytes, as the tests' stores
/// keep them.
fn test_twins() -> Twins {
    Twins {
        range: KeyRange::new(b"r".to_vec(), b"s".to_vec()),
        prefix: 2,
    }
}

/// The prefixes the file marks.
fn marks(db: &Database) -> Vec<Vec<u8>> {
    let txn = db.begin_read().expect("read");
    let table = txn.open_table(twins::TWINS).expect("twins");
    table
        .iter()
        .expect("iter")
        .map(|item| item.expect("item").0.value().to_vec())
        .collect()
}

/// What the marks must be after `stored`, then `writes`, are applied in key order: the
/// prefix (under `b"r"`, two bytes) of every new key that another key held when it went in.
fn marks_by_replay<'a>(
    stored: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    writes: impl IntoIterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)>,
) -> Vec<Vec<u8>> {
    let mut held = std::collections::BTreeSet::new();
    let mut marked = std::collections::BTreeSet::new();
    let all = stored
        .iter()
        .map(|(key, value)| (key.clone(), Some(value.clone())))
        .chain(writes.into_iter().map(|(k, v)| (k.clone(), v.clone())));
    for (key, value) in all {
        if value.is_none() {
            held.remove(&key);
            continue;
        }
        if key.len() >= 2 && key[0] == b'r' && !held.contains(&key) {
            let twin = held
                .iter()
                .any(|other: &Vec<u8>| other.starts_with(&key[..2]));
            if twin {
                marked.insert(key[..2].to_vec());
            }
        }
        held.insert(key);
    }
    marked.into_iter().collect()
}

/// The file's pairs, its tallies and its tallies as a walk finds them, and its marks, after
/// `stored` is written one key at a time and then `writes` (ascending keys) through
/// [`put_in_order`], in one transaction each.
fn after_ordered_writes(
    stored: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
    writes: &std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> (Pairs, Units, Units, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::create(dir.path().join(FILE_NAME)).expect("db");
    let rule = test_tally(2);
    let options = RedbOptions {
        tally: Some(rule.clone()),
        twins: Some(test_twins()),
        ..RedbOptions::default()
    };
    recover(&db, dir.path(), &options).expect("tables and log");
    for (ordered, pairs) in [
        (
            false,
            stored
                .iter()
                .map(|(key, value)| (key.as_slice(), Some(value.as_slice())))
                .collect::<Vec<_>>(),
        ),
        (
            true,
            writes
                .iter()
                .map(|(key, value)| (key.as_slice(), value.as_deref()))
                .collect(),
        ),
    ] {
        let txn = db.begin_write().expect("write");
        {
            let mut changes = Derived::recorded(&txn).expect("rules");
            let mut table = txn.open_table(DATA).expect("table");
            if ordered {
                put_in_order(&mut table, &mut changes, pairs.into_iter()).expect("ordered");
            } else {
                for (key, value) in pairs {
                    put(&mut table, &mut changes, key, value).expect("put");
                }
            }
            drop(table);
            changes.apply(&txn, 0).expect("tallied and marked");
        }
        txn.commit().expect("commit");
    }
    (contents(&db), tallies(&db), walked(&db, &rule), marks(&db))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Writes applied through a cursor (new keys in runs before, between and after stored
    /// ones, replacements longer and shorter, deletes of stored and of absent keys) leave the
    /// file as the same writes applied one key at a time would, the tallies as a walk finds
    /// them, and the marks as a replay in key order finds them: among them, every prefix two
    /// keys of the file share.
    #[test]
    fn ordered_writes_end_as_single_writes_would(
        stored in proptest::collection::btree_map(
            proptest::collection::vec(b'q'..=b's', 1..6),
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            0..200,
        ),
        writes in proptest::collection::btree_map(
            proptest::collection::vec(b'q'..=b's', 1..6),
            proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)),
            0..300,
        ),
    ) {
        let expected = written(stored.clone(), &writes);
        let (pairs, tallied, walked, marked) = after_ordered_writes(&stored, &writes);
        for twins in pairs.windows(2) {
            let [(a, _), (b, _)] = twins else { continue };
            if a.len() >= 2 && a[0] == b'r' && b.starts_with(&a[..2]) {
                proptest::prop_assert!(marked.contains(&a[..2].to_vec()), "{:?} unmarked", &a[..2]);
            }
        }
        proptest::prop_assert_eq!(pairs, expected);
        proptest::prop_assert_eq!(tallied, walked);
        proptest::prop_assert_eq!(marked, marks_by_replay(&stored, &writes));
    }
}

/// A commit as large as bulk loads make goes to the file through the cursor, and its
/// writes are all there after a reopen.
#[tokio::test]
async fn a_large_commit_is_applied_in_order() {
    let dir = tempfile::tempdir().expect("dir");
    let rule = test_tally(2);
    let key = |unit: u8, i: u16| {
        let mut key = vec![b'r', unit];
        key.extend_from_slice(&i.to_be_bytes());
        key
    };
    // Every third key of two units stored; then, over three units, every fourth key written
    // and the one after it deleted (stored or not).
    let first: Vec<(Vec<u8>, Option<Vec<u8>>)> = [b'a', b'c']
        .into_iter()
        .flat_map(|unit| (0..600).step_by(3).map(move |i| (unit, i)))
        .map(|(unit, i)| (key(unit, i), Some(vec![b'x'; usize::from(i % 7)])))
        .collect();
    let second: Vec<(Vec<u8>, Option<Vec<u8>>)> = [b'a', b'b', b'c']
        .into_iter()
        .flat_map(|unit| (0..600).map(move |i| (unit, i)))
        .filter_map(|(unit, i)| match i % 4 {
            0 => Some((key(unit, i), Some(vec![b'y'; usize::from(i % 11)]))),
            1 => Some((key(unit, i), None)),
            _ => None,
        })
        .collect();
    let staged_of = |writes: &[(Vec<u8>, Option<Vec<u8>>)]| {
        staged(|w| {
            for (key, value) in writes {
                match value {
                    Some(value) => w.put(key.clone(), value.clone()),
                    None => w.delete(key.clone()),
                };
            }
        })
    };
    let expected = written(
        std::collections::BTreeMap::new(),
        first.iter().chain(&second).map(|(key, value)| (key, value)),
    );
    {
        let backend = open_tallied(dir.path(), Some(rule.clone())).await;
        let (first, second) = (staged_of(&first), staged_of(&second));
        assert!(second.len() >= CURSOR_APPLY_PAIRS);
        commit_all(&backend, vec![first, second]).await;
    }
    let backend = open_tallied(dir.path(), Some(rule.clone())).await;
    assert_eq!(contents(&backend.db), expected);
    assert_eq!(tallies(&backend.db), walked(&backend.db, &rule));
}

async fn open_marked(dir: &Path, twins: Option<Twins>) -> RedbBackend {
    let options = RedbOptions {
        twins,
        ..RedbOptions::default()
    };
    RedbBackend::open_with(dir, options).await.expect("open")
}

/// The marks a snapshot of `backend` gives for `start..end`.
async fn twins_of(backend: &RedbBackend, start: &str, end: &str) -> Option<Vec<Vec<u8>>> {
    let range = KeyRange::new(start.as_bytes().to_vec(), end.as_bytes().to_vec());
    let snapshot = backend.snapshot().await.expect("snapshot");
    snapshot.twins(&range).await.expect("twins")
}

fn heads(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|item| item.as_bytes().to_vec()).collect()
}

/// A new key that shares its prefix with a stored one marks the prefix, whether it goes in
/// one key at a time (a small commit, a replay of the log) or through the cursor (a large
/// commit, where the neighbour may be stored or a key of the same run); reads get the marks
/// of a range the rule covers, with a transaction's written keys laid over them. A store
/// opened without the rule forgets its marks, and one opened with it again marks afresh.
#[tokio::test]
async fn twins_are_marked_however_written_and_read_back() {
    let dir = tempfile::tempdir().expect("dir");
    let rule = test_twins();
    {
        let backend = open_marked(dir.path(), Some(rule.clone())).await;
        let mut large = staged(|w| {
            w.put(&b"ra3"[..], &b"3"[..]).put(&b"re2"[..], &b"2"[..]);
            for i in 0..300_u16 {
                let mut key = b"rc".to_vec();
                key.extend_from_slice(&i.to_be_bytes());
                w.put(key, &b"c"[..]);
            }
        });
        assert!(large.len() >= CURSOR_APPLY_PAIRS);
        commit_all(
            &backend,
            vec![
                staged(|w| {
                    w.put(&b"ra1"[..], &b"1"[..])
                        .put(&b"rb1"[..], &b"1"[..])
                        .put(&b"re1"[..], &b"1"[..])
                        .put(&b"s11"[..], &b"outside"[..])
                        .put(&b"rx"[..], &b"x"[..]);
                }),
                staged(|w| {
                    w.put(&b"ra1"[..], &b"overwritten"[..])
                        .put(&b"ra2"[..], &b"2"[..])
                        .put(&b"s12"[..], &b"outside"[..])
                        .delete(&b"rb1"[..])
                        .put(&b"rb2"[..], &b"2"[..]);
                }),
                std::mem::replace(&mut large, staged(|_| {})),
            ],
        )
        .await;
    }
    {
        // What a crash leaves: a group logged and not checkpointed, replayed on open.
        let (mut log, _) = log::tests::read(dir.path());
        let lost = staged(|w| {
            w.put(&b"rf1"[..], &b"1"[..]).put(&b"rf2"[..], &b"2"[..]);
        });
        log.append(4, &std::iter::once(lost.as_ref()))
            .expect("append");
    }
    let backend = open_marked(dir.path(), Some(rule.clone())).await;
    assert_eq!(marks(&backend.db), heads(&["ra", "rc", "re", "rf"]));
    assert_eq!(
        twins_of(&backend, "r", "s").await,
        Some(heads(&["ra", "rc", "re", "rf"]))
    );
    assert_eq!(
        twins_of(&backend, "rc\x00\x05", "re").await,
        Some(heads(&["rc"]))
    );
    assert_eq!(
        twins_of(&backend, "a", "rz").await,
        None,
        "not all under the rule"
    );
    // A transaction's view adds the keys it writes.
    let view = OverlaySnapshot {
        base: backend.snapshot().await.expect("snapshot"),
        writes: staged(|w| {
            w.put(&b"rg1"[..], &b"1"[..]).delete(&b"rx"[..]);
        }),
    };
    let range = KeyRange::new(b"r".to_vec(), b"s".to_vec());
    assert_eq!(
        view.twins(&range).await.expect("twins"),
        Some(heads(&["ra", "rc", "re", "rf", "rg1"]))
    );
    // Deleting a twin leaves its mark; marking afresh drops it.
    commit_all(
        &backend,
        vec![staged(|w| {
            w.delete(&b"ra2"[..]).delete(&b"ra3"[..]);
        })],
    )
    .await;
    assert_eq!(twins_of(&backend, "ra", "rb").await, Some(heads(&["ra"])));
    drop(backend);
    let backend = open_marked(dir.path(), None).await;
    assert_eq!(twins_of(&backend, "r", "s").await, None);
    assert!(marks(&backend.db).is_empty());
    drop(backend);
    let backend = open_marked(dir.path(), Some(rule)).await;
    assert_eq!(marks(&backend.db), heads(&["rc", "re", "rf"]));
}

/// A file that a build keeping no tallies or marks wrote to after one that kept them (an
/// upgrade, a downgrade, an upgrade again) is tallied and marked afresh when opened with
/// the rules again: its rules were not kept through every commit group it holds.
#[tokio::test]
async fn a_store_written_without_its_rules_is_tallied_and_marked_afresh() {
    let dir = tempfile::tempdir().expect("dir");
    let options = RedbOptions {
        tally: Some(test_tally(2)),
        twins: Some(test_twins()),
        ..RedbOptions::default()
    };
    {
        let backend = RedbBackend::open_with(dir.path(), options.clone())
            .await
            .expect("open");
        commit_all(
            &backend,
            vec![staged(|w| {
                w.put(&b"ra1"[..], &b"1"[..]).put(&b"rb1"[..], &b"1"[..]);
            })],
        )
        .await;
    }
    {
        // What an older build's apply does: the rows and the applied sequence number only.
        let db = Database::create(dir.path().join(FILE_NAME)).expect("db");
        let txn = db.begin_write().expect("write");
        {
            let mut data = txn.open_table(DATA).expect("data");
            data.insert(&b"rb2"[..], &b"22"[..]).expect("insert");
            let mut meta = txn.open_table(META).expect("meta");
            let applied = meta.get(APPLIED).expect("get").map_or(0, |seq| seq.value());
            meta.insert(APPLIED, applied + 1).expect("applied");
        }
        txn.commit().expect("commit");
    }
    let backend = RedbBackend::open_with(dir.path(), options)
        .await
        .expect("reopen");
    assert_eq!(marks(&backend.db), heads(&["rb"]));
    assert_eq!(tallies(&backend.db), walked(&backend.db, &test_tally(2)));
    assert_eq!(
        tallies(&backend.db),
        vec![(b"ra".to_vec(), 4), (b"rb".to_vec(), 4 + 5)]
    );
}
