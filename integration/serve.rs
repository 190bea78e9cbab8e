//! `moraine serve` start-up: a clear error, and no hang, when the store cannot be had.

use moraine::Error;
use moraine::config::ServeConfig;

fn config(pd: Vec<String>, key_prefix: &str) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        data: tempfile::tempdir().expect("dir").path().join("unused"),
        pd,
        key_prefix: key_prefix.to_owned(),
        txn_idle_timeout: 300,
        txn_max_rows: 1000,
        txn_max_bytes: 1 << 20,
        max_open_transactions: 8,
        max_session_transactions: 2,
        max_prepared_statements: 8,
        max_session_prepared_statements: 2,
        query_memory_mb: 64,
        statement_timeout: 60,
        redb_cache_mb: 64,
        redb_checkpoint_ms: 1000,
    }
}

#[tokio::test]
async fn an_invalid_key_prefix_is_refused_before_anything_starts() {
    let err = moraine::server::serve(config(vec![], "no spaces"))
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::Codec(_)), "{err}");
    assert!(err.to_string().contains("no spaces"), "{err}");
}

#[tokio::test]
async fn an_unreachable_pd_is_a_clear_error() {
    // A port nothing listens on: the connection is refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        moraine::server::serve(config(vec![addr], "lake")),
    )
    .await
    .expect("serve gives up in time")
    .expect_err("no PD there");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    if cfg!(feature = "tikv") {
        assert!(
            matches!(err, Error::Kv(moraine::kv::KvError::Unavailable { .. })),
            "{err}"
        );
    } else {
        assert!(matches!(err, Error::Config { setting: "pd", .. }), "{err}");
    }
}
