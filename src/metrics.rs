//! What a running server is doing, as Prometheus metrics: one registry for the process, as
//! TiKV keeps its metrics, recorded where things happen and served as Prometheus text by
//! `moraine serve --metrics HOST:PORT` (see [`serve`]).
//!
//! Names follow Prometheus' conventions: counters end in `_total`, durations are seconds and
//! sizes bytes. Labels take values from small fixed sets only (the RPC, the Flight SQL
//! command kind, the status code, the store operation): no SQL text, user name or id ever
//! becomes a label.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::error::{Error, Result};

/// An RPC and, for Flight SQL, the command it carried.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    /// The gRPC method: `GetFlightInfo`, `DoGet`, …
    pub rpc: &'static str,
    /// The Flight SQL command or action (`CommandStatementQuery`, `BeginTransaction`, …),
    /// `path` for a path descriptor, `none` when the call carries none.
    pub command: &'static str,
}

/// An RPC's outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The gRPC method.
    pub rpc: &'static str,
    /// The Flight SQL command or action.
    pub command: &'static str,
    /// The gRPC status code, as a name (`OK`, `ABORTED`, …).
    pub code: &'static str,
}

/// A store operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    /// `get`, `batch_get`, `scan_page` or `divide`.
    pub op: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 100 µs to about 53 min, doubling.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 25))
}

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    /// Requests by RPC, command and status code.
    pub requests: Family<RequestLabels, Counter>,
    /// Request latency by RPC and command, to the end of a streamed response.
    pub request_seconds: Histograms<RpcLabels>,
    /// Rows streamed to clients.
    pub rows_streamed: Counter,
    /// Bytes of Flight data streamed to clients.
    pub bytes_streamed: Counter,
    /// Commits applied.
    pub commits: Counter,
    /// Commits refused for a conflict with a concurrent commit.
    pub conflicts: Counter,
    /// Writes refused by validation (RFC 0018's rules, references, shapes of rows); a
    /// refusal for a limit is counted by its status code only.
    pub refusals: Counter,
    /// Commits whose outcome the store could not tell.
    pub unknown: Counter,
    /// Transactions open now.
    pub transactions_open: Gauge,
    /// Transactions rolled back for sitting idle.
    pub transactions_expired: Counter,
    /// Store reads by operation.
    pub store_read_seconds: Histograms<StoreLabels>,
    /// Store commits.
    pub store_commit_seconds: Histogram,
    /// The most bytes one transaction has held staged.
    pub staged_bytes_peak: Gauge,
    peak: AtomicU64,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("moraine");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "rpc_requests",
            "Requests, by RPC, Flight SQL command and gRPC status code",
            requests.clone(),
        );
        let request_seconds = Histograms::<RpcLabels>::new_with_constructor(latency);
        registry.register_with_unit(
            "rpc_duration",
            "Request latency, to the end of a streamed response",
            Unit::Seconds,
            request_seconds.clone(),
        );
        let rows_streamed = Counter::default();
        registry.register(
            "rows_streamed",
            "Rows streamed to clients",
            rows_streamed.clone(),
        );
        let bytes_streamed = Counter::default();
        registry.register_with_unit(
            "streamed",
            "Flight data streamed to clients",
            Unit::Bytes,
            bytes_streamed.clone(),
        );
        let commits = Counter::default();
        registry.register("commits", "Commits applied", commits.clone());
        let conflicts = Counter::default();
        registry.register(
            "commit_conflicts",
            "Commits refused for a conflict with a concurrent commit",
            conflicts.clone(),
        );
        let refusals = Counter::default();
        registry.register(
            "validation_refusals",
            "Commits and writes refused by validation",
            refusals.clone(),
        );
        let unknown = Counter::default();
        registry.register(
            "commits_unknown",
            "Commits whose outcome the store could not tell",
            unknown.clone(),
        );
        let transactions_open = Gauge::default();
        registry.register(
            "transactions_open",
            "Transactions open now",
            transactions_open.clone(),
        );
        let transactions_expired = Counter::default();
        registry.register(
            "transactions_expired",
            "Transactions rolled back after sitting idle",
            transactions_expired.clone(),
        );
        let store_read_seconds = Histograms::<StoreLabels>::new_with_constructor(latency);
        registry.register_with_unit(
            "store_read_duration",
            "Store reads, by operation",
            Unit::Seconds,
            store_read_seconds.clone(),
        );
        let store_commit_seconds = latency();
        registry.register_with_unit(
            "store_commit_duration",
            "Store commits",
            Unit::Seconds,
            store_commit_seconds.clone(),
        );
        let staged_bytes_peak = Gauge::default();
        registry.register_with_unit(
            "staged_peak",
            "The most bytes one transaction has held staged since the server started",
            Unit::Bytes,
            staged_bytes_peak.clone(),
        );
        Self {
            registry,
            requests,
            request_seconds,
            rows_streamed,
            bytes_streamed,
            commits,
            conflicts,
            refusals,
            unknown,
            transactions_open,
            transactions_expired,
            store_read_seconds,
            store_commit_seconds,
            staged_bytes_peak,
            peak: AtomicU64::new(0),
        }
    }

    /// Counts a store commit's outcome: applied, a conflict, or unknown.
    pub fn commit_outcome<T>(&self, outcome: &Result<T>) {
        match outcome {
            Ok(_) => self.commits.inc(),
            Err(Error::CommitConflict { .. }) => self.conflicts.inc(),
            Err(Error::CommitUnknown { .. }) => self.unknown.inc(),
            Err(_) => 0,
        };
    }

    /// Counts an error sent to a client that is a validation refusal.
    pub fn refused(&self, err: &Error) {
        if matches!(err, Error::Validation(_) | Error::BadRows { .. }) {
            self.refusals.inc();
        }
    }

    /// A transaction holds `bytes` staged.
    pub fn staged(&self, bytes: u64) {
        let before = self.peak.fetch_max(bytes, Ordering::Relaxed);
        if bytes > before {
            self.staged_bytes_peak
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// Times one store read of `op`.
    pub fn time_read<T>(&self, op: &'static str, started: Instant, result: T) -> T {
        self.store_read_seconds
            .get_or_create(&StoreLabels { op })
            .observe(started.elapsed().as_secs_f64());
        result
    }

    /// The metrics as Prometheus text.
    ///
    /// # Errors
    /// [`Error::Internal`] when they do not encode (a bug).
    pub fn text(&self) -> Result<String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).map_err(|err| {
            Error::Internal {
                context: "encoding metrics",
                reason: err.to_string(),
            }
        })?;
        Ok(out)
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
#[must_use]
pub fn get() -> &'static Metrics {
    &METRICS
}

/// The canonical name of a gRPC status code, as the gRPC specification spells it: metrics
/// labels and the client commands' messages use it.
#[must_use]
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Serves the metrics as Prometheus text on `listener`, at any path (`/metrics` by
/// convention), over HTTP/1.1, until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;

    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let answer = service_fn(|_request| async {
                match get().text() {
                    Ok(text) => hyper::Response::builder()
                        .header(
                            hyper::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )
                        .body(Full::new(Bytes::from(text))),
                    Err(err) => hyper::Response::builder()
                        .status(hyper::StatusCode::INTERNAL_SERVER_ERROR)
                        .body(Full::new(Bytes::from(err.to_string()))),
                }
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), answer)
                .await
            {
                tracing::debug!("metrics connection ended: {err}");
            }
        });
    }
}

/// Binds `addr` for [`serve`].
///
/// # Errors
/// [`Error::Config`] when it cannot be bound.
pub async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| Error::Config {
            setting: "metrics",
            reason: format!("cannot bind {addr}: {err}"),
        })?;
    let bound = listener.local_addr().map_err(|err| Error::Config {
        setting: "metrics",
        reason: err.to_string(),
    })?;
    Ok((listener, bound))
}

/// The Flight SQL command or action a call carried, set by its handler for the call's
/// request metrics. Travels in the request's extensions.
#[derive(Debug, Default)]
pub struct CallCommand(std::sync::OnceLock<&'static str>);

impl CallCommand {
    /// The command noted, `none` when the handler noted none.
    #[must_use]
    pub fn get(&self) -> &'static str {
        self.0.get().copied().unwrap_or("none")
    }
}

/// Notes the command of the call whose extensions are `extensions`.
pub fn note_command(extensions: &tonic::Extensions, command: &'static str) {
    if let Some(slot) = extensions.get::<std::sync::Arc<CallCommand>>() {
        let _ = slot.0.set(command);
    }
}

/// The Flight RPCs, by the last part of their gRPC path.
const RPCS: [&str; 10] = [
    "Handshake",
    "ListFlights",
    "GetFlightInfo",
    "PollFlightInfo",
    "GetSchema",
    "DoGet",
    "DoPut",
    "DoExchange",
    "DoAction",
    "ListActions",
];

/// The Flight SQL messages and actions, by name.
const COMMANDS: [&str; 31] = [
    "CommandStatementQuery",
    "CommandStatementUpdate",
    "CommandStatementIngest",
    "CommandStatementSubstraitPlan",
    "CommandPreparedStatementQuery",
    "CommandPreparedStatementUpdate",
    "CommandGetCatalogs",
    "CommandGetDbSchemas",
    "CommandGetTables",
    "CommandGetTableTypes",
    "CommandGetSqlInfo",
    "CommandGetXdbcTypeInfo",
    "CommandGetPrimaryKeys",
    "CommandGetExportedKeys",
    "CommandGetImportedKeys",
    "CommandGetCrossReference",
    "TicketStatementQuery",
    "CreatePreparedStatement",
    "ClosePreparedStatement",
    "CreatePreparedSubstraitPlan",
    "BeginTransaction",
    "EndTransaction",
    "BeginSavepoint",
    "EndSavepoint",
    "CancelQuery",
    "CloseSession",
    "SetSessionOptions",
    "GetSessionOptions",
    "CreateToken",
    "ListTokens",
    "RevokeToken",
];

/// The RPC a gRPC path names, `other` for any other.
#[must_use]
pub fn rpc_of_path(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or_default();
    RPCS.iter()
        .find(|rpc| **rpc == name)
        .copied()
        .unwrap_or("other")
}

/// A Flight SQL message (by its `Any` type URL) or action type as a label, `other` for one
/// this server does not know.
#[must_use]
pub fn command_label(name_or_type_url: &str) -> &'static str {
    let name = name_or_type_url
        .rsplit(['.', '/'])
        .next()
        .unwrap_or_default();
    COMMANDS
        .iter()
        .find(|command| **command == name)
        .copied()
        .unwrap_or("other")
}

/// The gRPC status code a response's headers or trailers carry.
#[must_use]
pub fn code_in(headers: &tonic::codegen::http::HeaderMap) -> Option<&'static str> {
    let value = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(code_name(tonic::Code::from_i32(value)))
}

/// A response body that records its call's request metrics when it ends: the RPC, the
/// command its handler noted, the status its trailers (or headers) carry, and the time from
/// the call's start to the last frame. A body dropped before its end (the client went away)
/// counts as `CANCELLED`.
pub struct Observed<B> {
    inner: B,
    rpc: &'static str,
    command: std::sync::Arc<CallCommand>,
    started: Instant,
    code: Option<&'static str>,
    done: bool,
}

impl<B> Observed<B> {
    /// `inner`, the body of a response whose headers carry `code` if the call ended at once.
    pub fn new(
        inner: B,
        rpc: &'static str,
        command: std::sync::Arc<CallCommand>,
        started: Instant,
        code: Option<&'static str>,
    ) -> Self {
        Self {
            inner,
            rpc,
            command,
            started,
            code,
            done: false,
        }
    }

    fn finish(&mut self, code: &'static str) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        record(self.rpc, self.command.get(), code, self.started);
    }
}

/// Counts one call.
pub fn record(rpc: &'static str, command: &'static str, code: &'static str, started: Instant) {
    let metrics = get();
    metrics
        .requests
        .get_or_create(&RequestLabels { rpc, command, code })
        .inc();
    metrics
        .request_seconds
        .get_or_create(&RpcLabels { rpc, command })
        .observe(started.elapsed().as_secs_f64());
}

impl<B> Drop for Observed<B> {
    fn drop(&mut self) {
        let code = self.code.unwrap_or("CANCELLED");
        self.finish(code);
    }
}

impl<B> http_body::Body for Observed<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(code_in) {
                    self.code = Some(code);
                }
            }
            std::task::Poll::Ready(Some(Err(_))) => self.code = Some("INTERNAL"),
            std::task::Poll::Ready(None) => {
                let code = self.code.unwrap_or("OK");
                self.finish(code);
            }
            std::task::Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
