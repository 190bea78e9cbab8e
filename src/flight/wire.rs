//! `DoGet`'s rows sent without copying them: the gRPC messages of a statement's result are
//! framed here, each message's body left in the Arrow buffers the rows were built in.
//!
//! tonic's codec encodes each `FlightData` into its own buffer, copying the body once more
//! after the IPC writer copied it into one; on a full read those two copies were about a
//! tenth of the server's time. [`DirectGet`] answers the `DoGet` calls that stream a
//! statement's rows (a statement's or a prepared statement's ticket) itself, with the same
//! checks, the same handlers and the same gRPC framing; every other call, and any request it
//! does not read as one Ticket message, goes to the Flight service as before.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use arrow_flight::flight_service_server::FlightServiceServer;
use bytes::{BufMut as _, Bytes, BytesMut};
use futures::StreamExt as _;
use http_body::Frame;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use prost::Message as _;
use tonic::Status;
use tonic::codegen::Service;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::server::NamedService;

use super::encode::{BoxedStream, Message, message_stream};
use super::plain::{MoraineFlightService, RowsTicket};

type Body = tonic::body::Body;

/// The `DoGet` method's path.
const DO_GET: &str = "/arrow.flight.protocol.FlightService/DoGet";

/// `FlightData.data_header`: field 2, length-delimited.
const HEADER_KEY: u8 = 2 << 3 | 2;
/// `FlightData.data_body`: field 1000, length-delimited, as a varint.
const BODY_KEY: [u8; 2] = [0xc2, 0x3e];

/// Body pieces shorter than this are copied into their message's frame rather than sent as
/// a chunk of their own, which would cost more than the copy.
const COPY_BELOW: usize = 4096;

/// Message size limits, as the Flight service has them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request message read.
    pub decoding: usize,
    /// Largest response message sent.
    pub encoding: usize,
}

/// The Flight service, with the `DoGet` calls that stream a statement's rows answered here.
#[derive(Clone)]
pub struct DirectGet {
    inner: FlightServiceServer<MoraineFlightService>,
    flight: MoraineFlightService,
    limits: Limits,
}

impl DirectGet {
    /// `flight`'s gRPC service, with its message size `limits`, and its rows sent directly.
    #[must_use]
    pub fn new(flight: MoraineFlightService, limits: Limits) -> Self {
        let inner = FlightServiceServer::new(flight.clone())
            .max_decoding_message_size(limits.decoding)
            .max_encoding_message_size(limits.encoding);
        Self {
            inner,
            flight,
            limits,
        }
    }
}

impl NamedService for DirectGet {
    const NAME: &'static str = <FlightServiceServer<MoraineFlightService> as NamedService>::NAME;
}

impl Service<http::Request<Body>> for DirectGet {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Service::<http::Request<Body>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DO_GET {
            return Box::pin(self.inner.call(request));
        }
        // The clone is not ready; the one polled ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let flight = self.flight.clone();
        let limits = self.limits;
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = match read_request(body, limits.decoding).await {
                Ok(bytes) => bytes,
                Err(status) => return Ok(status.into_http()),
            };
            let rows = ticket_of(&bytes)
                .and_then(|ticket| Some((RowsTicket::of(&ticket.ticket)?, ticket)));
            let Some((rows, ticket)) = rows else {
                // Everything else, including requests tonic refuses (compressed, cut short),
                // goes to the Flight service as it came.
                let request = http::Request::from_parts(parts, Body::new(Full::new(bytes)));
                return inner.call(request).await;
            };
            let request = tonic::Request::from_http(http::Request::from_parts(parts, ticket));
            Ok(match flight.ticket_rows(rows, request).await {
                Ok(rows) => {
                    let schema = rows.schema();
                    let body = GrpcBody::new(message_stream(&schema, rows), limits.encoding);
                    let mut response = http::Response::new(Body::new(body));
                    response.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/grpc"),
                    );
                    response
                }
                Err(status) => status.into_http(),
            })
        })
    }
}

/// A unary request's body, read whole: its one message is at most `limit` bytes.
async fn read_request(body: Body, limit: usize) -> Result<Bytes, Status> {
    // The message's 5-byte prefix comes on top of the message.
    match Limited::new(body, limit.saturating_add(5)).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => Err(Status::out_of_range(
            format!("the request message is over the limit of {limit} bytes"),
        )),
        Err(err) => Err(Status::cancelled(format!(
            "the request was not read whole: {err}"
        ))),
    }
}

/// The Ticket a request body holds, when it is one uncompressed message and nothing else.
fn ticket_of(bytes: &[u8]) -> Option<arrow_flight::Ticket> {
    let (&[compressed, a, b, c, d], message) = bytes.split_first_chunk::<5>()?;
    let length = usize::try_from(u32::from_be_bytes([a, b, c, d])).ok()?;
    if compressed != 0 || length != message.len() {
        return None;
    }
    arrow_flight::Ticket::decode(message).ok()
}

/// A server-streaming gRPC response body: each message framed as a `FlightData`, then the
/// call's status as trailers (an error's, if the stream ends with one).
pub(crate) struct GrpcBody {
    messages: BoxedStream<Message>,
    /// Framed bytes not yet handed to the transport.
    pending: VecDeque<Bytes>,
    /// Largest message sent.
    limit: usize,
    ended: bool,
}

impl GrpcBody {
    pub(crate) fn new(messages: BoxedStream<Message>, limit: usize) -> Self {
        Self {
            messages,
            pending: VecDeque::new(),
            limit,
            ended: false,
        }
    }
}

impl http_body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(piece) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let status = match ready!(this.messages.poll_next_unpin(cx)) {
                Some(Ok(message)) => match frame(&message, this.limit, &mut this.pending) {
                    Ok(()) => continue,
                    Err(status) => status,
                },
                Some(Err(status)) => status,
                None => Status::ok(""),
            };
            this.ended = true;
            return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}

/// A call's status as gRPC trailers.
fn trailers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert(
            "grpc-status",
            HeaderValue::from(tonic::Code::Internal as i32),
        );
    }
    headers
}

/// Appends `message`, framed as one gRPC message holding a `FlightData`, to `out`: its
/// prefix, header and short body pieces copied, its long body pieces as they are.
///
/// # Errors
/// `OUT_OF_RANGE` for a message over `limit` bytes.
fn frame(message: &Message, limit: usize, out: &mut VecDeque<Bytes>) -> Result<(), Status> {
    let field = |len: usize, key: usize| {
        if len == 0 {
            0
        } else {
            key + prost::encoding::encoded_len_varint(len as u64) + len
        }
    };
    let header = message.header.len();
    let body = message.body_len();
    let length = field(header, 1) + field(body, BODY_KEY.len());
    let prefixed = u32::try_from(length)
        .ok()
        .filter(|_| length <= limit)
        .ok_or_else(|| {
            Status::out_of_range(format!(
                "a result message of {length} bytes is over the limit of {limit} bytes"
            ))
        })?;
    let small: usize = message
        .body
        .iter()
        .map(Bytes::len)
        .filter(|&len| len < COPY_BELOW)
        .sum();
    let mut head = BytesMut::with_capacity(5 + field(header, 1) + 12 + small);
    head.put_u8(0);
    head.put_u32(prefixed);
    if header > 0 {
        head.put_u8(HEADER_KEY);
        prost::encoding::encode_varint(header as u64, &mut head);
        head.put_slice(&message.header);
    }
    if body > 0 {
        head.put_slice(&BODY_KEY);
        prost::encoding::encode_varint(body as u64, &mut head);
    }
    for piece in &message.body {
        if piece.len() < COPY_BELOW {
            head.put_slice(piece);
        } else {
            if !head.is_empty() {
                out.push_back(head.split().freeze());
            }
            out.push_back(piece.clone());
        }
    }
    if !head.is_empty() {
        out.push_back(head.freeze());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
