//! The PD calls the TiKV backend needs that tikv-client 0.4 does not make: registering a
//! service GC safe point (`pdpb.PD/UpdateServiceGCSafePoint`), and finding the region
//! boundaries inside a key range (`pdpb.PD/GetRegion`, region after region) so that a large
//! read divides along them.
//!
//! Every deployment sharing a cluster registers the oldest timestamp it may still read under
//! a service id of its own, and PD answers with the minimum over every live registration.
//! A deployment then collects garbage only below that minimum, so none collects what another
//! still reads. A registration lapses after its time-to-live, so a deployment that stopped
//! holds nothing back for long.
//!
//! Only the fields these calls use are declared here; protobuf decoding skips the rest.

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;

/// How long one call to PD may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, PartialEq, prost::Message)]
struct RequestHeader {
    #[prost(uint64, tag = "1")]
    cluster_id: u64,
    #[prost(uint64, tag = "2")]
    sender_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PdError {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    cluster_id: u64,
    #[prost(message, optional, tag = "2")]
    error: Option<PdError>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetMembersRequest {
    #[prost(message, optional, tag = "1")]
    header: Option<RequestHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetMembersResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct UpdateServiceGcSafePointRequest {
    #[prost(message, optional, tag = "1")]
    header: Option<RequestHeader>,
    #[prost(bytes = "vec", tag = "2")]
    service_id: Vec<u8>,
    #[prost(int64, tag = "3")]
    ttl: i64,
    #[prost(uint64, tag = "4")]
    safe_point: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct UpdateServiceGcSafePointResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
    #[prost(uint64, tag = "4")]
    min_safe_point: u64,
}

/// Registers `safe_point` for `service` with the PD at one of `endpoints`, for `ttl`, and
/// returns the minimum service safe point of the cluster, this one included.
///
/// # Errors
/// Every endpoint's failure, joined, when none answered.
pub(super) async fn update_service_safe_point(
    endpoints: &[String],
    service: &str,
    ttl: Duration,
    safe_point: u64,
) -> Result<u64, String> {
    first_answer(endpoints, |endpoint| {
        update_at(endpoint, service, ttl, safe_point)
    })
    .await
}

/// The answer of the first of `endpoints` that gives one to `call` within [`CALL_TIMEOUT`].
///
/// # Errors
/// Every endpoint's failure, joined, when none answered.
async fn first_answer<'a, T, F, Fut>(endpoints: &'a [String], call: F) -> Result<T, String>
where
    F: Fn(&'a str) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match tokio::time::timeout(CALL_TIMEOUT, call(endpoint)).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(err)) => failures.push(format!("{endpoint}: {err}")),
            Err(_) => failures.push(format!("{endpoint}: no answer within {CALL_TIMEOUT:?}")),
        }
    }
    Err(failures.join("; "))
}

async fn update_at(
    endpoint: &str,
    service: &str,
    ttl: Duration,
    safe_point: u64,
) -> Result<u64, String> {
    let (mut grpc, cluster_id) = connect(endpoint).await?;
    let answer: UpdateServiceGcSafePointResponse = unary(
        &mut grpc,
        "/pdpb.PD/UpdateServiceGCSafePoint",
        UpdateServiceGcSafePointRequest {
            header: Some(RequestHeader {
                cluster_id,
                sender_id: 0,
            }),
            service_id: service.as_bytes().to_vec(),
            ttl: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            safe_point,
        },
    )
    .await?;
    checked(answer.header)?;
    Ok(answer.min_safe_point)
}

/// A channel to the PD at `endpoint`, and the cluster id PD checks on every request
/// (`GetMembers` tells it).
async fn connect(
    endpoint: &str,
) -> Result<(tonic::client::Grpc<tonic::transport::Channel>, u64), String> {
    let url = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    let channel = Endpoint::from_shared(url)
        .map_err(|err| err.to_string())?
        .connect()
        .await
        .map_err(|err| err.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    let members: GetMembersResponse = unary(
        &mut grpc,
        "/pdpb.PD/GetMembers",
        GetMembersRequest {
            header: Some(RequestHeader::default()),
        },
    )
    .await?;
    let cluster_id = checked(members.header)?;
    Ok((grpc, cluster_id))
}

/// The cluster id of a response header without an error.
fn checked(header: Option<ResponseHeader>) -> Result<u64, String> {
    let header = header.ok_or("PD answered without a header")?;
    match header.error {
        Some(err) => Err(format!("PD refused: {} ({})", err.message, err.kind)),
        None => Ok(header.cluster_id),
    }
}

async fn unary<Req, Resp>(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    request: Req,
) -> Result<Resp, String>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    grpc.ready().await.map_err(|err| err.to_string())?;
    grpc.unary(
        tonic::Request::new(request),
        PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
    .map_err(|status| format!("{}: {}", status.code(), status.message()))
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetRegionRequest {
    #[prost(message, optional, tag = "1")]
    header: Option<RequestHeader>,
    #[prost(bytes = "vec", tag = "2")]
    region_key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetRegionResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
    #[prost(message, optional, tag = "2")]
    region: Option<Region>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Region {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(bytes = "vec", tag = "2")]
    start_key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    end_key: Vec<u8>,
}

/// The keys inside `start..end` at which a region begins, asked of the PD at one of
/// `endpoints`, at most `limit` of them. Keys are as the transactional client writes them;
/// PD knows regions by their memcomparable encoding.
///
/// # Errors
/// Every endpoint's failure, joined, when none answered.
pub(super) async fn region_starts(
    endpoints: &[String],
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<Vec<Vec<u8>>, String> {
    first_answer(endpoints, |endpoint| starts_at(endpoint, start, end, limit)).await
}

async fn starts_at(
    endpoint: &str,
    start: &[u8],
    end: &[u8],
    limit: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let (mut grpc, cluster_id) = connect(endpoint).await?;
    let mut starts = Vec::new();
    let mut at = memcomparable(start);
    while starts.len() < limit {
        let answer: GetRegionResponse = unary(
            &mut grpc,
            "/pdpb.PD/GetRegion",
            GetRegionRequest {
                header: Some(RequestHeader {
                    cluster_id,
                    sender_id: 0,
                }),
                region_key: at.clone(),
            },
        )
        .await?;
        checked(answer.header)?;
        let region = answer.region.ok_or("PD knows no region for a key")?;
        // The last region ends at the empty key; a boundary that does not decode is not one
        // of this client's keys.
        if region.end_key.is_empty() || region.end_key <= at {
            break;
        }
        let Some(next) = from_memcomparable(&region.end_key) else {
            break;
        };
        if next.as_slice() >= end {
            break;
        }
        at = region.end_key;
        starts.push(next);
    }
    Ok(starts)
}

/// Bytes in TiKV's memcomparable form: groups of eight, the last padded with zeros, each
/// followed by `0xFF` less its padding.
fn memcomparable(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity((key.len() / 8 + 1) * 9);
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        out.extend_from_slice(chunk);
        out.push(0xFF);
    }
    let rest = chunks.remainder();
    let pad = 8 - rest.len();
    out.extend_from_slice(rest);
    out.extend(std::iter::repeat_n(0, pad));
    out.push(0xFF - u8::try_from(pad).unwrap_or(8));
    out
}

/// The bytes `encoded` is the memcomparable form of, if it is one.
fn from_memcomparable(encoded: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(encoded.len());
    for group in encoded.chunks(9) {
        let (&marker, bytes) = group.split_last()?;
        if bytes.len() != 8 {
            return None;
        }
        let pad = usize::from(0xFF - marker);
        if pad > 8 {
            return None;
        }
        out.extend_from_slice(bytes.get(..8 - pad)?);
        if pad > 0 {
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcomparable_round_trips_and_keeps_order() {
        let keys: [&[u8]; 6] = [b"", b"a", b"abcdefg", b"abcdefgh", b"abcdefgh\0", b"b"];
        for key in keys {
            assert_eq!(
                from_memcomparable(&memcomparable(key)).as_deref(),
                Some(key)
            );
        }
        for pair in keys.windows(2) {
            assert!(memcomparable(pair[0]) < memcomparable(pair[1]), "{pair:?}");
        }
        assert_eq!(memcomparable(b"abc").len(), 9);
        assert_eq!(memcomparable(b"abcdefgh").len(), 18);
        assert_eq!(from_memcomparable(b"abc"), None);
    }
}
