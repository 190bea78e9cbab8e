//! Protocol glue: Arrow Flight SQL (and plain Flight) over gRPC. Handlers decode, call the
//! domain and encode; the one error-to-status mapping lives in [`status`].

pub(crate) mod admin;
pub(crate) mod encode;
pub mod gate;
pub mod held;
pub(crate) mod ingest;
pub mod metadata;
pub mod plain;
pub mod prepared;
pub mod service;
pub(crate) mod session;
pub mod status;
pub mod tickets;
pub(crate) mod upload;
pub mod wire;

pub use plain::MoraineFlightService;
pub use service::MoraineSqlService;
