//! Health over the standard gRPC health service, on the Flight port.
//!
//! (The metrics endpoint is tested against a `moraine serve` process of its own in the
//! Python suite, `test_metrics.py`, since the process's metrics count every test here.)

use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::Backend;

async fn health(addr: std::net::SocketAddr) -> HealthClient<Channel> {
    HealthClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connect"),
    )
}

/// Waits on the health service's `Watch` stream until it reports `want` for `service`.
async fn until_status(client: &mut HealthClient<Channel>, service: &str, want: ServingStatus) {
    let mut watch = client
        .watch(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_mins(1);
    loop {
        let next = tokio::time::timeout_at(deadline, watch.message())
            .await
            .unwrap_or_else(|_| panic!("{service:?} never became {want:?}"))
            .expect("a health update")
            .expect("the watch goes on");
        if next.status == want as i32 {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_on_the_flight_port_without_credentials() {
    let store = Backend::Redb.open().await;
    let server = moraine::server::start(store.catalog(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("server starts");
    let mut client = health(server.addr()).await;
    until_status(&mut client, "", ServingStatus::Serving).await;
    until_status(
        &mut client,
        "arrow.flight.protocol.FlightService",
        ServingStatus::Serving,
    )
    .await;
    let unknown = client
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("an unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

/// With PD down no snapshot can be taken: the server reports `NOT_SERVING`, and `SERVING` again
/// once PD is back.
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_serving_while_the_store_is_unavailable() {
    let store = Backend::Tikv.open().await;
    let cluster = std::sync::Arc::clone(store.cluster().expect("a fake cluster"));
    let server = moraine::server::start(store.catalog(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("server starts");
    let mut client = health(server.addr()).await;
    until_status(&mut client, "", ServingStatus::Serving).await;
    cluster.stop_pd().await;
    until_status(&mut client, "", ServingStatus::NotServing).await;
    cluster.start_pd().await;
    until_status(&mut client, "", ServingStatus::Serving).await;
}
