//! Typed settings, parsed from flags and environment variables and validated once at startup.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The `moraine` command line.
#[derive(Debug, Parser)]
#[command(
    name = "moraine",
    version,
    about = "Arrow Flight SQL server for DuckLake's mapping catalog"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A `moraine` subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the catalog over Arrow Flight SQL.
    Serve(ServeConfig),
}

/// Settings of `moraine serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "MORAINE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Directory of the embedded store, created if missing.
    #[arg(long, env = "MORAINE_DATA", default_value = "./moraine-data")]
    pub data: PathBuf,
}
