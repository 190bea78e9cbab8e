//! Commit latency on the embedded store, beside a bulk load: how long a small commit takes to
//! be acknowledged right after a large transaction's commit was, against the same small
//! commit on an idle store. The large transaction's writes are applied to the redb file after
//! its acknowledgement; a small commit behind it should not wait for that.
//!
//! `cargo bench --bench commit`. Each round opens the store (in a temporary directory, on
//! disk), times 20 small commits on the idle store, commits one transaction of
//! `MORAINE_BULK_KEYS` keys (default 400 000, about a 100k-mapping load's keys) and times
//! the small commit that follows it; closing the store waits for the apply. It prints the
//! median of each over `MORAINE_ROUNDS` rounds (default 5), and their ratio.
#![allow(missing_docs, reason = "benchmark binary")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use moraine::kv::redb::RedbBackend;
use moraine::kv::{CommitOutcome, KvBackend, StagedWrites, WriteSet};

/// Bytes of each bulk value: about a data file's or a mapping's record.
const VALUE_BYTES: usize = 200;
const IDLE_COMMITS: usize = 20;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// One transaction writing `keys` fresh keys under `round` (puts: it requires nothing of the
/// store, so that its commit is the log write and its apply).
fn bulk(round: u32, keys: usize) -> Arc<StagedWrites> {
    let mut writes = WriteSet::new();
    let value = vec![7_u8; VALUE_BYTES];
    for i in 0..keys as u64 {
        let mut key = b"b".to_vec();
        key.extend_from_slice(&round.to_be_bytes());
        key.extend_from_slice(&i.to_be_bytes());
        writes.put(key, value.clone());
    }
    Arc::new(writes.into_staged().expect("bulk writes"))
}

/// One small commit's writes: a record and its index entry, as one mapping is, each required
/// absent (so that the commit reads the store, through the writes not yet in the file).
fn small(round: u32, i: usize) -> Arc<StagedWrites> {
    let mut writes = WriteSet::new();
    let key = format!("s{round:08}{i:08}");
    writes
        .insert(key.clone().into_bytes(), vec![1_u8; VALUE_BYTES])
        .insert(format!("i{key}").into_bytes(), b"1".to_vec());
    Arc::new(writes.into_staged().expect("small writes"))
}

async fn timed(backend: &RedbBackend, writes: Arc<StagedWrites>) -> Duration {
    let start = Instant::now();
    let outcome = backend.commit(writes).await.expect("commit");
    assert_eq!(outcome, CommitOutcome::Committed);
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn main() {
    let keys = setting("MORAINE_BULK_KEYS", 400_000);
    let rounds = setting("MORAINE_ROUNDS", 5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let (mut idle, mut acked, mut after) = (Vec::new(), Vec::new(), Vec::new());
    runtime.block_on(async {
        for round in 0..u32::try_from(rounds).expect("rounds") {
            let backend = RedbBackend::open(dir.path()).await.expect("open");
            let mut times = Vec::new();
            for i in 0..IDLE_COMMITS {
                times.push(timed(&backend, small(round, i)).await);
            }
            idle.push(median(times));
            let large = bulk(round, keys);
            acked.push(timed(&backend, large).await);
            after.push(timed(&backend, small(round, IDLE_COMMITS)).await);
            drop(backend);
        }
    });
    let (idle, acked, after) = (median(idle), median(acked), median(after));
    println!(
        "commit latency, embedded store, {keys} keys in the bulk transaction, medians of {rounds} rounds"
    );
    println!("  small commit, idle store:            {idle:>12.3?}");
    println!("  bulk commit, until acknowledged:     {acked:>12.3?}");
    println!("  small commit right after the bulk:   {after:>12.3?}");
    println!(
        "  after the bulk / idle:               {:>11.1}x",
        after.as_secs_f64() / idle.as_secs_f64().max(f64::MIN_POSITIVE)
    );
}
