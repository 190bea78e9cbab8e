//! `moraine serve` start-up: a clear error, and no hang, when the store cannot be had.

use clap::Parser as _;
use moraine::Error;
use moraine::config::{Cli, Command, ServeConfig};
use moraine::model::DuckLakeVersion;

fn config(pd: &[String], key_prefix: &str) -> ServeConfig {
    let data = tempfile::tempdir().expect("dir").path().join("unused");
    let mut args = vec![
        "moraine".to_owned(),
        "serve".to_owned(),
        "--listen=127.0.0.1:0".to_owned(),
        format!("--data={}", data.display()),
        format!("--key-prefix={key_prefix}"),
    ];
    if !pd.is_empty() {
        args.push(format!("--pd={}", pd.join(",")));
    }
    serve_config(args)
}

/// `moraine serve` with `args` (the program name first), parsed.
fn serve_config<T: Into<std::ffi::OsString> + Clone>(
    args: impl IntoIterator<Item = T>,
) -> ServeConfig {
    match Cli::try_parse_from(args).expect("parses").command {
        Command::Serve(config) => *config,
        other => panic!("parsed as {other:?}"),
    }
}

#[tokio::test]
async fn a_public_address_without_credentials_is_refused_unless_insecure_is_explicit() {
    let mut public = config(&[], "");
    public.listen = "0.0.0.0:0".parse().expect("addr");
    let err = moraine::server::serve(public).await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Config {
                setting: "listen",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--insecure-no-auth"), "{err}");
}

#[tokio::test]
async fn an_auth_file_that_lists_nobody_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("auth");
    std::fs::write(&file, "# nobody\n").expect("write");
    let mut empty = config(&[], "");
    empty.auth_file = Some(file);
    let err = moraine::server::serve(empty).await.expect_err("refused");
    assert!(
        err.to_string().contains("lists no user and no token"),
        "{err}"
    );
}

#[tokio::test]
async fn an_invalid_key_prefix_is_refused_before_anything_starts() {
    let err = moraine::server::serve(config(&[], "no spaces"))
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
        moraine::server::serve(config(&[addr], "lake")),
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

#[test]
fn ducklake_versions_parse_as_ducklake_spells_them_and_others_are_refused() {
    let parse = |version: &str| {
        Cli::try_parse_from(["moraine", "serve", "--ducklake-version", version]).map(
            |cli| match cli.command {
                Command::Serve(config) => config.ducklake_version,
                other => panic!("parsed as {other:?}"),
            },
        )
    };
    assert_eq!(parse("0.3").ok(), Some(Some(DuckLakeVersion::V0_3)));
    assert_eq!(parse("0.4").ok(), Some(Some(DuckLakeVersion::V1_0)));
    assert_eq!(parse("1.1-dev1").ok(), Some(Some(DuckLakeVersion::V1_1)));
    let err = parse("2.0").expect_err("an unknown version");
    let message = err.to_string();
    assert!(
        message.contains("DuckLake 2.0") && message.contains("0.3, 1.0, 1.1"),
        "{message}"
    );
}

#[test]
fn the_command_lines_store_defaults_are_the_embedded_stores_own() {
    // `moraine serve` and a program opening the store through the library get the same
    // cache and checkpoint settings unless told otherwise.
    assert_eq!(
        serve_config(["moraine", "serve"]).redb_options(),
        moraine::kv::redb::RedbOptions::default()
    );
    let config = serve_config(["moraine", "serve", "--redb-cache-mb", "48"]);
    assert_eq!(config.redb_options().cache_bytes, 48 << 20);
}
