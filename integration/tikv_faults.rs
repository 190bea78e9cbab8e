//! The TiKV backend under the fake cluster's faults, each injected during commits and during
//! scans. What must hold every time: a commit lands entirely or not at all and says which (or
//! says the outcome is unknown, and then a later read finds all or nothing); no acknowledged
//! commit is lost; a scan returns each key exactly once; an unreachable PD is reported as
//! unavailable within the connect timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use moraine::kv::tikv::{TikvBackend, TikvOptions};
use moraine::kv::{
    CommitOutcome, KeyRange, KvError, KvPair, PageSize, Store, StoreLimits, WriteSet,
};

use crate::fake_tikv::{FakeCluster, Fault, Rpc};
use crate::harness::tikv::{fake, three_regions_and_more};

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

async fn setup() -> (Arc<FakeCluster>, TikvBackend, Store) {
    let (cluster, backend) = fake(three_regions_and_more()).await;
    let store = Store::new(Arc::new(backend.clone()), StoreLimits::default());
    (cluster, backend, store)
}

/// A write set putting generation `generation` on keys `0..n` (spanning every region).
fn generation(n: u32, generation: u32) -> WriteSet {
    let mut writes = WriteSet::new();
    for i in 0..n {
        writes.put(key(i * 7), value(i * 7, generation));
    }
    writes
}

async fn scan(store: &Store, rows: usize) -> Vec<KvPair> {
    let snapshot = store.snapshot().await.expect("snapshot");
    snapshot
        .scan_pages(
            everything(),
            PageSize {
                rows,
                bytes: 1 << 20,
            },
        )
        .map_ok(|page| page.to_pairs())
        .try_concat()
        .await
        .expect("scan")
}

/// Every key `0..n` holds one and the same generation, each exactly once, in order.
async fn assert_one_generation(store: &Store, n: u32) -> u32 {
    let pairs = scan(store, 16).await;
    let keys: Vec<Vec<u8>> = pairs.iter().map(|p| p.key.clone()).collect();
    assert_eq!(
        keys,
        (0..n).map(|i| key(i * 7)).collect::<Vec<_>>(),
        "each key exactly once, in order"
    );
    let generations: Vec<u32> = (0..n)
        .filter_map(|i| {
            let pair = pairs.get(usize::try_from(i).ok()?)?;
            (0..100).find(|g| pair.value == value(i * 7, *g))
        })
        .collect();
    let first = generations.first().copied().expect("a generation");
    assert!(
        generations.iter().all(|g| *g == first),
        "one commit's writes are all visible or none: {generations:?}"
    );
    first
}

/// Commits `writes` and returns whether it landed for sure.
async fn commit_reporting(store: &Store, writes: WriteSet) -> bool {
    match store.commit(writes).await {
        Ok(CommitOutcome::Committed) => true,
        Ok(CommitOutcome::Unknown { reason }) => {
            assert!(!reason.is_empty(), "an unknown outcome says why");
            false
        }
        Ok(CommitOutcome::Conflict(conflict)) => panic!("unexpected conflict {conflict}"),
        Err(err) => {
            assert!(
                matches!(
                    err,
                    KvError::Unavailable {
                        backend: "tikv",
                        ..
                    } | KvError::Backend {
                        backend: "tikv",
                        ..
                    }
                ),
                "a failed commit is a clear storage error: {err:?}"
            );
            false
        }
    }
}

/// Arms `fault` for the next `rpc`, commits a generation over every region, and checks that it
/// landed whole; then arms it for a scan and checks the scan.
async fn commit_and_scan_through(rpc_commit: Rpc, fault: impl Fn() -> Fault) {
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(60, 1)).await);

    cluster.arm(rpc_commit, fault());
    assert!(
        commit_reporting(&store, generation(60, 2)).await,
        "the client rides out the fault"
    );
    assert_eq!(cluster.armed(), 0, "the fault fired");
    assert_eq!(assert_one_generation(&store, 60).await, 2);

    cluster.arm(Rpc::Scan, fault());
    assert_eq!(assert_one_generation(&store, 60).await, 2);
    assert_eq!(cluster.armed(), 0, "the fault fired");
    assert_eq!(cluster.lock_count(), 0, "no lock left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_mid_transaction_changes_the_epoch_under_it() {
    // Splits inside the key space: the request in flight carries the old epoch.
    commit_and_scan_through(Rpc::Prewrite, || Fault::Split(key(100))).await;
    commit_and_scan_through(Rpc::Commit, || Fault::Split(key(5))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_leader_with_a_new_leader_named() {
    commit_and_scan_through(Rpc::Prewrite, || Fault::MoveLeader {
        key: key(0),
        hint: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_leader_without_a_new_leader_named() {
    commit_and_scan_through(Rpc::Prewrite, || Fault::MoveLeader {
        key: key(300),
        hint: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_commit_answer_is_retried_to_a_definite_outcome() {
    let (cluster, _backend, store) = setup().await;
    cluster.arm(Rpc::Commit, Fault::LoseResponse);
    // The primary's commit applied but its answer was lost: the client asks again, and the
    // store answers that the transaction committed.
    let landed = commit_reporting(&store, generation(60, 1)).await;
    assert_eq!(assert_one_generation(&store, 60).await, 1);
    assert!(landed, "a commit that applied is not reported as failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_writers_lock_is_resolved_after_its_ttl() {
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(60, 1)).await);
    // A writer prewrote key 7 and died: its lock lives 1.5 s.
    cluster
        .crashed_writer_lock(&key(7), b"never committed", 1500)
        .await;
    let started = Instant::now();
    // A reader waits it out, rolls it back, and sees the committed value.
    assert_eq!(assert_one_generation(&store, 60).await, 1);
    assert!(started.elapsed() >= Duration::from_millis(500), "it waited");
    assert_eq!(cluster.lock_count(), 0, "the reader resolved the lock");

    // A writer meeting such a lock does the same.
    cluster
        .crashed_writer_lock(&key(14), b"never committed", 1500)
        .await;
    assert!(commit_reporting(&store, generation(60, 2)).await);
    assert_eq!(assert_one_generation(&store, 60).await, 2);
    assert_eq!(cluster.lock_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pd_restart_loses_no_acknowledged_commit() {
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(30, 0)).await);
    let mut acknowledged = 0;
    // Commits before PD stops, one begun after it stopped (its client's PD connection is
    // dead: it must reconnect to the restarted PD, or fail clearly), and commits after.
    for g in 1..=3 {
        if commit_reporting(&store, generation(30, g)).await {
            acknowledged = g;
        }
    }
    cluster.stop_pd().await;
    let during = {
        let store = store.clone();
        tokio::spawn(async move {
            let committed = commit_reporting(&store, generation(30, 4)).await;
            match store.snapshot().await {
                Ok(_) | Err(KvError::Unavailable { .. }) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
            committed
        })
    };
    cluster.start_pd().await;
    if during.await.expect("commit during the outage") {
        acknowledged = 4;
    }
    for g in 5..=6 {
        if commit_reporting(&store, generation(30, g)).await {
            acknowledged = g;
        }
    }
    assert!(acknowledged >= 5, "commits went through once PD was back");
    let seen = assert_one_generation(&store, 30).await;
    assert!(seen >= acknowledged, "no acknowledged commit lost");
    // Timestamps stayed monotonic across the restart: a new commit is seen over the old ones.
    assert!(commit_reporting(&store, generation(30, 50)).await);
    assert_eq!(assert_one_generation(&store, 30).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_answering_unavailable_for_a_while() {
    // Short outages are ridden out by the client's retries, for commits and scans alike.
    commit_and_scan_through(Rpc::Prewrite, || {
        Fault::StoreUnavailable(Duration::from_millis(300))
    })
    .await;

    // A longer one fails the commit clearly, and all or nothing of it is there afterwards.
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(60, 1)).await);
    cluster.arm(Rpc::Prewrite, Fault::StoreDown);
    let landed = commit_reporting(&store, generation(60, 2)).await;
    assert!(
        !landed,
        "a commit through a store that stays down is not acknowledged"
    );
    cluster.bring_stores_up();
    let seen = assert_one_generation(&store, 60).await;
    if landed {
        assert_eq!(seen, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_listening_and_comes_back() {
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(60, 1)).await);
    cluster.stop_store(1).await;
    let failed = commit_reporting(&store, generation(60, 2)).await;
    let scan_while_down = store
        .snapshot()
        .await
        .expect("snapshot: PD is up")
        .scan(everything())
        .map_ok(|page| page.to_pairs())
        .try_concat()
        .await;
    assert!(
        matches!(
            scan_while_down,
            Err(KvError::Unavailable {
                backend: "tikv",
                ..
            })
        ),
        "a scan of an unreachable store is unavailable: {scan_while_down:?}"
    );
    cluster.start_store(1).await;
    let seen = assert_one_generation(&store, 60).await;
    if failed {
        assert_eq!(seen, 2, "an acknowledged commit is there");
    }
    assert!(commit_reporting(&store, generation(60, 3)).await);
    assert_eq!(assert_one_generation(&store, 60).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_never_passes_an_open_snapshot() {
    let (cluster, backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(5, 1)).await);
    let old = store.snapshot().await.expect("snapshot");
    for g in 2..5 {
        assert!(commit_reporting(&store, generation(5, g)).await);
    }
    let safe_point = backend.advance_gc(Duration::ZERO).await.expect("gc");
    assert!(safe_point > 0);
    assert_eq!(cluster.state().safe_point, safe_point);
    assert_eq!(
        old.get(&key(7)).await.expect("get"),
        Some(value(7, 1)),
        "the open snapshot still reads its versions"
    );
    drop(old);
    assert_eq!(backend.open_snapshots(), 0);
    let later = backend.advance_gc(Duration::ZERO).await.expect("gc");
    assert!(later > safe_point, "GC moves on once the snapshot is gone");
    assert_eq!(
        cluster.state().mvcc.version_count(&key(7)),
        1,
        "old versions are collected"
    );
    assert_eq!(assert_one_generation(&store, 5).await, 4);

    // The background task does the same on its own.
    let task = backend.spawn_gc(Duration::from_millis(50), Duration::ZERO);
    assert!(commit_reporting(&store, generation(5, 5)).await);
    cluster.until_safe_point_above(later).await;
    drop(task);
}

/// Two deployments share a cluster. The one with an old snapshot open registers it with PD;
/// the other's GC then stops below it, and moves on once the snapshot is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_sharing_a_cluster_never_collect_what_another_reads() {
    let (cluster, reader, reader_store) = setup().await;
    let reader = reader.with_gc_service("moraine-lake-a");
    let writer = TikvBackend::connect_with(cluster.pd_endpoints(), reader.options())
        .await
        .expect("a second deployment connects")
        .with_gc_service("moraine-lake-b");
    let writer_store = Store::new(Arc::new(writer.clone()), StoreLimits::default());
    assert!(commit_reporting(&writer_store, generation(5, 1)).await);
    let old = reader_store.snapshot().await.expect("snapshot");
    reader
        .advance_gc(Duration::ZERO)
        .await
        .expect("the reader registers its snapshot");
    let registered = cluster.state().service_safe_points[b"moraine-lake-a".as_slice()].0;
    for g in 2..5 {
        assert!(commit_reporting(&writer_store, generation(5, g)).await);
    }
    let safe_point = writer.advance_gc(Duration::ZERO).await.expect("gc");
    assert!(
        safe_point <= registered,
        "the writer's GC went to {safe_point}, past the reader's {registered}"
    );
    assert_eq!(
        old.get(&key(7)).await.expect("get"),
        Some(value(7, 1)),
        "the other deployment's snapshot still reads its versions"
    );
    drop(old);
    reader
        .advance_gc(Duration::ZERO)
        .await
        .expect("the reader moves on");
    let later = writer.advance_gc(Duration::ZERO).await.expect("gc");
    assert!(
        later > safe_point,
        "GC moves on once no deployment reads the old versions"
    );
    assert_eq!(cluster.state().mvcc.version_count(&key(7)), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_pd_is_unavailable_within_the_timeout() {
    let options = TikvOptions {
        connect_timeout: Duration::from_secs(1),
        ..TikvOptions::default()
    };
    // A port that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr").to_string();
    let started = Instant::now();
    let err = TikvBackend::connect_with(vec![silent_addr], options)
        .await
        .expect_err("a silent PD");
    assert!(
        matches!(
            err,
            KvError::Unavailable {
                backend: "tikv",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "within the timeout"
    );
    drop(silent);

    // A closed port.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let closed_addr = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let started = Instant::now();
    let err = TikvBackend::connect(vec![closed_addr], Duration::from_secs(1))
        .await
        .expect_err("a closed port");
    assert!(
        matches!(
            err,
            KvError::Unavailable {
                backend: "tikv",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(err.to_string().contains("unavailable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_are_many_and_encoded_for_the_client() {
    let (cluster, _backend, store) = setup().await;
    assert!(cluster.state().regions.len() >= 3);
    assert!(commit_reporting(&store, generation(60, 1)).await);
    // One scan touched several regions: one KvScan each.
    let before = cluster
        .state()
        .rpc_counts
        .get("KvScan")
        .copied()
        .unwrap_or(0);
    assert_eq!(scan(&store, 1000).await.len(), 60);
    let after = cluster
        .state()
        .rpc_counts
        .get("KvScan")
        .copied()
        .unwrap_or(0);
    assert!(after - before >= 3, "{} scans", after - before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_switched_between_operations() {
    let (cluster, _backend, store) = setup().await;
    assert!(commit_reporting(&store, generation(60, 1)).await);
    // The client's region cache is stale after each of these; the next operations find out.
    cluster.split(&key(140));
    cluster.move_leader(&key(0), false);
    cluster.move_leader(&key(300), true);
    assert_eq!(assert_one_generation(&store, 60).await, 1);
    assert!(commit_reporting(&store, generation(60, 2)).await);
    cluster.store_unavailable(2, Duration::from_millis(300));
    assert!(commit_reporting(&store, generation(60, 3)).await);
    assert_eq!(assert_one_generation(&store, 60).await, 3);
    assert!(cluster.state().regions.len() >= 5);
}

/// A scan whose answer outgrows the client's gRPC message limit (4 MiB) is asked again for
/// fewer rows, until it fits: every row comes back, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_answer_over_the_message_limit_is_asked_again_smaller() {
    let (cluster, _backend, store) = setup().await;
    let big = |i: u32| {
        let mut value = vec![u8::try_from(i % 251).expect("small"); 512 << 10];
        value.extend_from_slice(&i.to_be_bytes());
        value
    };
    let mut writes = WriteSet::new();
    for i in 0..24 {
        writes.put(key(i), big(i));
    }
    assert!(commit_reporting(&store, writes).await);
    let scans = || {
        cluster
            .state()
            .rpc_counts
            .get("KvScan")
            .copied()
            .unwrap_or(0)
    };
    let scans_before = scans();
    let snapshot = store.snapshot().await.expect("snapshot");
    let page = snapshot
        .page(
            &everything(),
            PageSize {
                rows: 24,
                bytes: usize::MAX,
            },
        )
        .await
        .expect("the scan is asked again smaller");
    let pairs = page.to_pairs();
    assert!(
        !pairs.is_empty() && pairs.len() < 24,
        "{} rows",
        pairs.len()
    );
    for (i, pair) in (0..).zip(&pairs) {
        assert_eq!((&pair.key, &pair.value), (&key(i), &big(i)));
    }
    assert!(
        scans() - scans_before >= 2,
        "the first, too large, answer was asked again"
    );
}
