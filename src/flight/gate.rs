//! The gate every call passes before the Flight service sees it: it hands the call's
//! `authorization` header to the [`Authenticator`], refuses the call as UNAUTHENTICATED when
//! that finds no caller, and otherwise puts the caller's [`Session`] in the request's
//! extensions for the handlers (which check roles). A call that opened a session answers
//! with its token as `authorization: Bearer …`.
//!
//! [`Session`]: crate::auth::Session

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::Service;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::status::to_status;
use crate::auth::Authenticator;
use crate::error::{Error, Result};

/// Calls that open a session for a caller that has none, on an unauthenticated server: the
/// ones ADBC makes first and then replays the returned header on.
const SESSION_OPENING: [&str; 4] = [
    "/arrow.flight.protocol.FlightService/Handshake",
    "/arrow.flight.protocol.FlightService/GetFlightInfo",
    "/arrow.flight.protocol.FlightService/DoPut",
    "/arrow.flight.protocol.FlightService/DoAction",
];

/// Longest `authorization` header looked at.
const MAX_HEADER: usize = 4096;

/// The `authorization` header of a call, if it has one.
///
/// # Errors
/// [`Error::Unauthenticated`] for a header over [`MAX_HEADER`] bytes or not ASCII.
fn authorization(headers: &HeaderMap) -> Result<Option<&str>> {
    match headers.get(http::header::AUTHORIZATION) {
        None => Ok(None),
        Some(value) if value.len() > MAX_HEADER => Err(Error::Unauthenticated {
            reason: "the authorization header is too long",
        }),
        Some(value) => value
            .to_str()
            .map(Some)
            .map_err(|_| Error::Unauthenticated {
                reason: "the authorization header is not ASCII",
            }),
    }
}

/// The connection a call came on, as its peer and local addresses (`None` where the
/// transport does not say): a pre-issued token's session is one per connection.
fn connection_of(extensions: &http::Extensions) -> Option<String> {
    let tcp = extensions.get::<TcpConnectInfo>().cloned().or_else(|| {
        extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .map(|tls| tls.get_ref().clone())
    })?;
    Some(format!("{}>{}", tcp.remote_addr?, tcp.local_addr?))
}

/// The token the gate issued to the call, in its extensions: the Handshake answers with it.
#[derive(Debug, Clone)]
pub struct IssuedToken(pub String);

/// The Flight service behind the gate.
#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    auth: Arc<Authenticator>,
}

impl<S> Gate<S> {
    /// `inner`, reachable only through `auth`.
    pub fn new(inner: S, auth: Arc<Authenticator>) -> Self {
        Self { inner, auth }
    }
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

type Body = tonic::body::Body;

impl<S> Service<http::Request<Body>> for Gate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone is not ready; the one polled ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = Arc::clone(&self.auth);
        Box::pin(async move {
            let started = std::time::Instant::now();
            let rpc = crate::metrics::rpc_of_path(request.uri().path());
            let command = Arc::new(crate::metrics::CallCommand::default());
            request.extensions_mut().insert(Arc::clone(&command));
            let opens_session = SESSION_OPENING.contains(&request.uri().path());
            let connection = connection_of(request.extensions());
            let admitted = match authorization(request.headers()) {
                Ok(header) => {
                    auth.admit(header, opens_session, connection.as_deref())
                        .await
                }
                Err(err) => Err(err),
            };
            let admitted = match admitted {
                Ok(admitted) => admitted,
                Err(err) => {
                    let status = to_status(&err);
                    let code = crate::metrics::code_name(status.code());
                    crate::metrics::record(rpc, "none", code, started);
                    return Ok(status.into_http());
                }
            };
            request.extensions_mut().insert(admitted.session);
            if let Some(token) = &admitted.issued {
                request.extensions_mut().insert(IssuedToken(token.clone()));
            }
            let mut response = inner.call(request).await?;
            if let Some(token) = admitted.issued
                && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
            {
                response
                    .headers_mut()
                    .insert(http::header::AUTHORIZATION, value);
            }
            let code = crate::metrics::code_in(response.headers());
            Ok(response.map(|body| {
                Body::new(crate::metrics::Observed::new(
                    body, rpc, command, started, code,
                ))
            }))
        })
    }
}
