use arrow_flight::FlightData;
use bytes::{Buf as _, Bytes};
use datafusion::arrow::array::Array as _;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use http_body_util::BodyExt as _;
use prost::Message as _;
use tonic::codegen::http::HeaderMap;

use super::{GrpcBody, ticket_of};
use crate::flight::encode::tests::{batch, schema};
use crate::flight::encode::{self, message_stream};

/// What a response body sends: its data frames, and its trailers.
struct Sent {
    data: Vec<Bytes>,
    trailers: HeaderMap,
}

async fn send(batches: Vec<Result<RecordBatch, DataFusionError>>, limit: usize) -> Sent {
    let rows = RecordBatchStreamAdapter::new(schema(), futures::stream::iter(batches));
    let mut body = GrpcBody::new(message_stream(&schema(), Box::pin(rows)), limit);
    let mut sent = Sent {
        data: Vec::new(),
        trailers: HeaderMap::new(),
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("a body of frames, never an error");
        match frame.into_data() {
            Ok(data) => sent.data.push(data),
            Err(frame) => {
                sent.trailers = frame.into_trailers().expect("data or trailers");
                assert!(body.frame().await.is_none(), "the trailers end the body");
            }
        }
    }
    sent
}

/// The gRPC messages of a response's data, each read as the `FlightData` a client decodes.
fn messages(sent: &Sent) -> Vec<FlightData> {
    let mut bytes: Bytes = sent.data.concat().into();
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert_eq!(bytes.get_u8(), 0, "an uncompressed message");
        let length = usize::try_from(bytes.get_u32()).expect("a length");
        out.push(FlightData::decode(bytes.split_to(length)).expect("a FlightData"));
    }
    out
}

async fn decoded(messages: Vec<FlightData>) -> Vec<RecordBatch> {
    let (read, batches) = encode::tests::decoded(messages).await;
    assert_eq!(read, schema());
    batches
}

/// A trailer's value, empty when it is missing.
fn trailer<'a>(trailers: &'a HeaderMap, name: &str) -> &'a str {
    trailers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
}

/// A framed result reads back, through arrow-flight's decoder, as exactly the rows sent: a
/// batch over the message limit cut into messages, a dictionary column with its dictionary,
/// nulls, a batch without rows; the call ends OK.
#[tokio::test]
async fn a_framed_result_reads_back_as_sent() {
    let sent = vec![batch(3, 4), batch(60_000, 48), batch(0, 4), batch(1_000, 8)];
    let response = send(sent.iter().cloned().map(Ok).collect(), 16 << 20).await;
    assert_eq!(trailer(&response.trailers, "grpc-status"), "0");
    let messages = messages(&response);
    assert!(messages.len() >= 1 + 3 + 2, "{} messages", messages.len());
    let rows = |b: &[RecordBatch]| concat_batches(&schema(), b).expect("concatenated");
    assert_eq!(rows(&decoded(messages).await), rows(&sent));
}

/// The long buffers of a batch go to the transport as they are: a data frame is the very
/// memory the column's values were built in.
#[tokio::test]
async fn long_columns_are_sent_from_where_they_were_built() {
    let sent = batch(50_000, 8);
    let ids = sent.column(0).to_data();
    let values = ids.buffers().first().expect("the values buffer").as_ptr();
    let response = send(vec![Ok(sent.clone())], 16 << 20).await;
    assert!(
        response.data.iter().any(|data| data.as_ptr() == values),
        "no data frame is the id column's buffer"
    );
    assert_eq!(decoded(messages(&response)).await, vec![sent]);
}

/// An error in the rows ends the call with that error's status, after the messages before it.
#[tokio::test]
async fn an_error_ends_the_call_with_its_status() {
    let response = send(
        vec![
            Ok(batch(10, 4)),
            Err(DataFusionError::Execution("the store went away".into())),
            Ok(batch(10, 4)),
        ],
        16 << 20,
    )
    .await;
    let code = trailer(&response.trailers, "grpc-status");
    assert!(!matches!(code, "" | "0"), "grpc-status {code:?}");
    let message = trailer(&response.trailers, "grpc-message");
    assert!(message.contains("went"), "grpc-message {message:?}");
    assert_eq!(decoded(messages(&response)).await, vec![batch(10, 4)]);
}

/// A message over the response limit is not sent: the call ends `OUT_OF_RANGE`, naming the
/// limit.
#[tokio::test]
async fn a_message_over_the_limit_ends_the_call_out_of_range() {
    let response = send(vec![Ok(batch(10, 4)), Ok(batch(5_000, 40))], 64 << 10).await;
    assert_eq!(
        trailer(&response.trailers, "grpc-status"),
        (tonic::Code::OutOfRange as i32).to_string()
    );
    let message = trailer(&response.trailers, "grpc-message");
    assert!(message.contains("65536"), "grpc-message {message:?}");
    assert_eq!(decoded(messages(&response)).await, vec![batch(10, 4)]);
}

/// A request body is read as a Ticket only when it is one uncompressed message and nothing
/// else; every other body goes to the Flight service as it came.
#[test]
fn a_request_is_a_ticket_only_when_it_is_one_plain_message() {
    let ticket = arrow_flight::Ticket {
        ticket: Bytes::from_static(b"handle"),
    };
    let message = ticket.encode_to_vec();
    let framed = |flag: u8, length: usize, extra: &[u8]| {
        let mut out = vec![flag];
        out.extend_from_slice(&u32::try_from(length).expect("short").to_be_bytes());
        out.extend_from_slice(&message);
        out.extend_from_slice(extra);
        out
    };
    assert_eq!(ticket_of(&framed(0, message.len(), b"")), Some(ticket));
    assert_eq!(ticket_of(&framed(1, message.len(), b"")), None);
    assert_eq!(ticket_of(&framed(0, message.len() + 1, b"")), None);
    assert_eq!(ticket_of(&framed(0, message.len(), b"\0")), None);
    assert_eq!(ticket_of(&[0, 0, 0]), None);
}
