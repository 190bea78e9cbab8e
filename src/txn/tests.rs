use super::*;
use crate::clock::Clock;
use crate::codec::{KeyPrefix, Keyspace};
use crate::kv::Store;
use crate::model::{ColumnMappingRow, NameMappingRow};
use crate::write::Insert;

fn transactions(config: TxnConfig) -> Transactions {
    timed(config, Clock::system())
}

fn timed(config: TxnConfig, clock: Clock) -> Transactions {
    Transactions::with_clock(
        Catalog::new(Store::memory(), Keyspace::new(KeyPrefix::none())),
        config,
        clock,
    )
}

fn mapping(id: i64) -> Vec<Op> {
    vec![mappings_of(&[id]), names_of(&[(id, "id")])]
}

/// A store that takes every commit and never says whether it applied it.
#[derive(Debug, Default)]
struct Unanswered(crate::kv::memory::MemoryBackend);

#[async_trait::async_trait]
impl crate::kv::KvBackend for Unanswered {
    fn name(&self) -> &'static str {
        "unanswered"
    }

    async fn snapshot(
        &self,
    ) -> std::result::Result<Arc<dyn crate::kv::KvSnapshot>, crate::kv::KvError> {
        self.0.snapshot().await
    }

    async fn commit(
        &self,
        _: Arc<crate::kv::StagedWrites>,
    ) -> std::result::Result<crate::kv::CommitOutcome, crate::kv::KvError> {
        Ok(crate::kv::CommitOutcome::Unknown {
            reason: "the store did not answer".into(),
        })
    }
}

#[tokio::test]
async fn an_unknown_outcome_is_told_by_every_later_call() {
    let store = Store::new(
        Arc::new(Unanswered::default()),
        crate::kv::StoreLimits::embedded(),
    );
    let txns = Transactions::new(
        Catalog::new(store, Keyspace::new(KeyPrefix::none())),
        TxnConfig::default(),
    );
    let id = txns.begin(Some("s"), true).expect("begin");
    txns.stage(&id, mapping(1)).await.expect("staged");
    let unknown = |err: &Error| {
        let status = crate::flight::status::to_status(err);
        status.code() == tonic::Code::Unavailable && status.message().contains("outcome unknown")
    };
    let err = txns.commit(&id).await.expect_err("outcome unknown");
    assert!(unknown(&err), "{err}");
    // Not "nothing was written", and not a rollback that pretends to have discarded it.
    let err = txns.rollback(&id).expect_err("cannot roll back");
    assert!(
        unknown(&err) && err.to_string().contains(&id.to_string()),
        "{err}"
    );
    let err = txns.stage(&id, mapping(2)).await.expect_err("ended");
    assert!(unknown(&err), "{err}");
    let err = txns.commit(&id).await.expect_err("ended");
    assert!(unknown(&err), "{err}");
}

#[tokio::test]
async fn an_idle_transaction_pins_nothing_and_expires() {
    let clock = Clock::manual();
    let txns = timed(
        TxnConfig {
            idle_timeout: Duration::from_mins(5),
            ..TxnConfig::default()
        },
        clock.clone(),
    );
    let id = txns.begin(Some("s"), true).expect("begin");
    assert_eq!(txns.of_session("s"), Some(id.clone()));
    // Used just before its timeout: still open, and its idle time starts over.
    clock.advance(Duration::from_secs(299));
    assert!(txns.is_open(&id));
    txns.stage(&id, Vec::new()).await.expect("still open");
    clock.advance(Duration::from_secs(299));
    assert!(txns.is_open(&id), "use resets the idle time");
    clock.advance(Duration::from_secs(1));
    let err = txns
        .stage(&id, vec![mapping(1).remove(0)])
        .await
        .expect_err("expired");
    assert!(
        matches!(&err, Error::TransactionNotOpen { state, .. } if state.contains("expired")),
        "{err}"
    );
    assert_eq!(txns.of_session("s"), None);
}

#[tokio::test]
async fn the_reaper_ends_abandoned_transactions_without_any_lookup() {
    let clock = Clock::manual();
    let timeout = Duration::from_mins(5);
    let txns = timed(
        TxnConfig {
            idle_timeout: timeout,
            ..TxnConfig::default()
        },
        clock.clone(),
    );
    let mut passes = txns.reaper_passes();
    txns.spawn_reaper();
    let abandoned = txns.begin(Some("gone"), true).expect("begin");
    // Each advance is one reaper period (a quarter of the timeout, at most 10 s); the
    // transaction is reaped at the first pass past its timeout, and not before.
    let period = Duration::from_secs(10);
    let mut waited = Duration::ZERO;
    while waited < timeout {
        clock.advance(period);
        waited += period;
        passes.changed().await.expect("the reaper runs");
        let open = !txns.registry().open.is_empty();
        assert_eq!(open, waited < timeout, "open after {waited:?} idle: {open}");
    }
    let registry = txns.registry();
    assert!(registry.sessions.is_empty(), "the session still names it");
    assert_eq!(
        registry.ended.get(&abandoned).map(|e| e.how),
        Some(Ending::Expired)
    );
}

#[tokio::test]
async fn a_pending_violation_waits_for_the_commit_and_a_final_one_is_refused_at_once() {
    let txns = transactions(TxnConfig::default());
    let id = txns.begin(None, true).expect("begin");
    let mut ops = mapping(4);
    // The mapping before its name rows: pending, accepted.
    assert_eq!(
        txns.stage(&id, vec![ops.remove(0)]).await.expect("staged"),
        1
    );
    // The same mapping again: final, refused, and the transaction is unchanged.
    let err = txns
        .stage(&id, vec![mapping(4).remove(0)])
        .await
        .expect_err("duplicate");
    assert!(err.to_string().contains("mapping 4"), "{err}");
    assert_eq!(
        txns.stage(&id, vec![ops.remove(0)]).await.expect("staged"),
        1
    );
    let report = txns.commit(&id).await.expect("committed");
    assert_eq!(report.summary.mappings_created, 1);
    // Rolling back after the commit is a late call.
    assert!(matches!(
        txns.rollback(&id),
        Err(Error::TransactionNotOpen { .. })
    ));
}

/// A rollback while a request stages into the transaction (holding it) or waits for it
/// ends the transaction for that request too: it is refused, not reported as staged,
/// and nothing of it can be committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_during_a_request_refuses_it() {
    let txns = Arc::new(transactions(TxnConfig::default()));
    let id = txns.begin(None, true).expect("begin");
    let (signal, started) = tokio::sync::oneshot::channel::<()>();
    let (feed, requests) = tokio::sync::mpsc::channel::<Result<Vec<Op>>>(1);
    // Signals its first poll, which happens with the transaction held, then yields what
    // is fed.
    let ops = futures::stream::unfold(
        (Some(signal), requests),
        |(signal, mut requests)| async move {
            if let Some(signal) = signal {
                let _ = signal.send(());
            }
            let next = requests.recv().await?;
            Some((next, (None, requests)))
        },
    );
    let staging = tokio::spawn({
        let txns = Arc::clone(&txns);
        let id = id.clone();
        async move { txns.stage_stream(&id, ops).await }
    });
    started.await.expect("the request holds the transaction");
    // Another request comes while the first holds the transaction.
    let waiting = tokio::spawn({
        let txns = Arc::clone(&txns);
        let id = id.clone();
        async move { txns.stage(&id, mapping(5)).await }
    });
    txns.rollback(&id).expect("rolled back");
    feed.send(Ok(mapping(4))).await.expect("fed");
    drop(feed);
    for request in [staging, waiting] {
        let err = request
            .await
            .expect("joined")
            .expect_err("refused after the rollback");
        assert!(
            matches!(&err, Error::TransactionNotOpen { state, .. } if state.contains("rolled back")),
            "{err}"
        );
    }
    assert!(matches!(
        txns.commit(&id).await,
        Err(Error::TransactionNotOpen { .. })
    ));
}

#[tokio::test]
async fn staging_limits_refuse_the_request_and_keep_the_transaction() {
    let txns = transactions(TxnConfig {
        max_rows: 1,
        ..TxnConfig::default()
    });
    let id = txns.begin(None, true).expect("begin");
    let mut ops = mapping(4);
    txns.stage(&id, vec![ops.remove(0)])
        .await
        .expect("first row fits");
    let err = txns
        .stage(&id, vec![ops.remove(0)])
        .await
        .expect_err("over");
    assert!(matches!(err, Error::LimitExceeded { .. }), "{err}");
    txns.rollback(&id).expect("rolled back");
    txns.rollback(&id).expect("a second rollback is harmless");
}

fn mappings_of(ids: &[i64]) -> Op {
    let rows: Vec<ColumnMappingRow> = ids
        .iter()
        .map(|&id| ColumnMappingRow {
            mapping_id: Some(id),
            table_id: Some(1),
            map_type: Some("map_by_name".into()),
        })
        .collect();
    Op::Insert(Insert::column_mappings(&rows))
}

fn names_of(named: &[(i64, &str)]) -> Op {
    let rows: Vec<NameMappingRow> = named
        .iter()
        .map(|&(id, source)| NameMappingRow {
            mapping_id: Some(id),
            column_id: Some(0),
            source_name: Some(source.into()),
            target_field_id: Some(1),
            parent_column: None,
            is_partition: Some(false),
        })
        .collect();
    Op::Insert(Insert::name_mappings(&rows))
}

/// Every stored mapping record, as `(mapping_id, its name rows' source names)`.
async fn stored_names(catalog: &Catalog) -> Vec<(i64, Vec<String>)> {
    use futures::TryStreamExt as _;
    let snapshot = catalog.snapshot().await.expect("snapshot");
    let pages: Vec<crate::kv::Page> = snapshot
        .pages(
            vec![catalog.keyspace().kind_range(crate::codec::Kind::Mapping)],
            crate::kv::PageSize::default(),
        )
        .try_collect()
        .await
        .expect("scan");
    pages
        .iter()
        .flat_map(crate::kv::Page::iter)
        .map(|(_, value)| {
            let record = crate::codec::decode_mapping(value).expect("a mapping record");
            let names = record.names.into_iter().map(|n| n.source_name).collect();
            (record.mapping_id.0, names)
        })
        .collect()
}

/// Name rows reach their mapping's record where the mapping's insert staged it, not by
/// its key: that place must follow requests taken back (their records' places are reused)
/// and a mapping deleted and inserted again (which keeps its place).
#[tokio::test]
async fn name_rows_reach_their_records_across_requests_taken_back_and_reinserts() {
    let txns = transactions(TxnConfig::default());
    let id = txns.begin(None, true).expect("begin");
    txns.stage(&id, vec![mappings_of(&[1, 2])])
        .await
        .expect("mappings 1 and 2");
    // Refused whole (mapping 1 again): 3 and 4 are taken back with it.
    let err = txns
        .stage(&id, vec![mappings_of(&[3, 4]), mappings_of(&[1])])
        .await
        .expect_err("mapping 1 twice");
    assert!(err.to_string().contains("mapping 1"), "{err}");
    // Staged where mapping 3's record was, before it was taken back.
    txns.stage(&id, vec![mappings_of(&[5])])
        .await
        .expect("mapping 5");
    txns.stage(&id, vec![names_of(&[(1, "one"), (2, "two"), (5, "five")])])
        .await
        .expect("names");
    // Mapping 2 deleted, inserted again, named again: the new record only.
    txns.stage(
        &id,
        vec![
            Op::Delete(crate::write::Delete::ColumnMappings(vec![
                crate::model::MappingId(2),
            ])),
            mappings_of(&[2]),
            names_of(&[(2, "two again")]),
        ],
    )
    .await
    .expect("mapping 2 again");
    txns.commit(&id).await.expect("committed");
    assert_eq!(
        stored_names(txns.catalog()).await,
        vec![
            (1, vec!["one".to_owned()]),
            (2, vec!["two again".to_owned()]),
            (5, vec!["five".to_owned()]),
        ]
    );
}
