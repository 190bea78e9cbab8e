//! The `moraine` binary: parse the command line, run it. No logic lives here.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;
use moraine::config::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(config) => moraine::server::serve(config).await,
        Command::Import(config) => moraine::server::import(config).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            ExitCode::FAILURE
        }
    }
}
