//! The one PD call the TiKV backend needs that tikv-client 0.4 does not make: registering a
//! service GC safe point (`pdpb.PD/UpdateServiceGCSafePoint`).
//!
//! Every deployment sharing a cluster registers the oldest timestamp it may still read under
//! a service id of its own, and PD answers with the minimum over every live registration.
//! A deployment then collects garbage only below that minimum, so none collects what another
//! still reads. A registration lapses after its time-to-live, so a deployment that stopped
//! holds nothing back for long.
//!
//! Only the fields these two calls use are declared here; protobuf decoding skips the rest.

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
    let mut failures = Vec::new();
    for endpoint in endpoints {
        match tokio::time::timeout(CALL_TIMEOUT, update_at(endpoint, service, ttl, safe_point))
            .await
        {
            Ok(Ok(min)) => return Ok(min),
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
    // PD checks the cluster id of every request; GetMembers tells it.
    let members: GetMembersResponse = unary(
        &mut grpc,
        "/pdpb.PD/GetMembers",
        GetMembersRequest {
            header: Some(RequestHeader::default()),
        },
    )
    .await?;
    let cluster_id = checked(members.header)?;
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
