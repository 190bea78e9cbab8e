//! The fake PD: members (itself, the leader), the TSO stream, region and store lookup, and the
//! GC safe point (which also compacts the MVCC state). Every other RPC answers Unimplemented.

use std::sync::Arc;

use futures::StreamExt as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status, Streaming};

use super::proto::{metapb, pdpb};
use super::{CLUSTER_ID, Region, Server, Shared, decode_key, spawn_server};

pub(super) fn serve(shared: Arc<Shared>, listener: TcpListener) -> Server {
    let addr = listener.local_addr().expect("pd addr");
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = PdService {
        shared,
        url: format!("http://{addr}"),
        stopped: stop_rx,
    };
    let router =
        tonic::transport::Server::builder().add_service(pdpb::pd_server::PdServer::new(service));
    let (mut server, stopped) = spawn_server(listener, router);
    // TSO streams live as long as the client: end them when the server stops, or its graceful
    // shutdown would wait for them forever.
    let mut stopped = stopped;
    tokio::spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
        let _ = stop_tx.send(true);
    });
    server.addr = addr;
    server
}

struct PdService {
    shared: Arc<Shared>,
    url: String,
    stopped: watch::Receiver<bool>,
}

#[expect(
    clippy::unnecessary_wraps,
    reason = "responses hold their header as an option"
)]
fn header() -> Option<pdpb::ResponseHeader> {
    Some(pdpb::ResponseHeader {
        cluster_id: CLUSTER_ID,
        error: None,
    })
}

fn region_response(region: Option<&Region>) -> pdpb::GetRegionResponse {
    pdpb::GetRegionResponse {
        header: header(),
        region: region.map(Region::to_proto),
        leader: region.and_then(|r| r.peer_on(r.leader_store)),
        ..pdpb::GetRegionResponse::default()
    }
}

fn store_proto(id: u64, addr: std::net::SocketAddr) -> metapb::Store {
    metapb::Store {
        id,
        address: addr.to_string(),
        state: metapb::StoreState::Up as i32,
        version: "8.5.0".to_owned(),
        ..metapb::Store::default()
    }
}

#[tonic::async_trait]
impl pdpb::pd_server::Pd for PdService {
    async fn get_members(
        &self,
        _request: Request<pdpb::GetMembersRequest>,
    ) -> Result<Response<pdpb::GetMembersResponse>, Status> {
        let me = pdpb::Member {
            name: "fake-pd".to_owned(),
            member_id: 1,
            peer_urls: vec![self.url.clone()],
            client_urls: vec![self.url.clone()],
            ..pdpb::Member::default()
        };
        Ok(Response::new(pdpb::GetMembersResponse {
            header: header(),
            members: vec![me.clone()],
            leader: Some(me.clone()),
            etcd_leader: Some(me),
            ..pdpb::GetMembersResponse::default()
        }))
    }

    async fn tso(
        &self,
        request: Request<Streaming<pdpb::TsoRequest>>,
    ) -> Result<Response<BoxStream<pdpb::TsoResponse>>, Status> {
        let inbound = request.into_inner();
        let shared = Arc::clone(&self.shared);
        let stopped = self.stopped.clone();
        let out = futures::stream::unfold(
            (inbound, shared, stopped),
            |(mut inbound, shared, mut stopped)| async move {
                let next = tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return None,
                    next = inbound.message() => next,
                };
                let item = match next {
                    Ok(Some(req)) => {
                        let count = req.count.max(1);
                        let ts = shared.lock().next_ts(u64::from(count));
                        Ok(pdpb::TsoResponse {
                            header: header(),
                            count,
                            timestamp: Some(pdpb::Timestamp {
                                physical: i64::try_from(ts >> 18).unwrap_or(i64::MAX),
                                logical: i64::try_from(ts & ((1 << 18) - 1)).unwrap_or(0),
                                suffix_bits: 0,
                            }),
                        })
                    }
                    Ok(None) => return None,
                    Err(status) => Err(status),
                };
                Some((item, (inbound, shared, stopped)))
            },
        );
        Ok(Response::new(out.boxed()))
    }

    async fn get_region(
        &self,
        request: Request<pdpb::GetRegionRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        let req = request.into_inner();
        let key = decode_key(&req.region_key)
            .ok_or_else(|| Status::invalid_argument("region key is not memcomparable-encoded"))?;
        let state = self.shared.lock();
        Ok(Response::new(region_response(state.region_for_key(&key))))
    }

    async fn get_region_by_id(
        &self,
        request: Request<pdpb::GetRegionByIdRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        let req = request.into_inner();
        let state = self.shared.lock();
        Ok(Response::new(region_response(
            state.regions.get(&req.region_id),
        )))
    }

    async fn get_store(
        &self,
        request: Request<pdpb::GetStoreRequest>,
    ) -> Result<Response<pdpb::GetStoreResponse>, Status> {
        let req = request.into_inner();
        let state = self.shared.lock();
        let addr = state
            .store_addrs
            .get(&req.store_id)
            .ok_or_else(|| Status::not_found(format!("no store {}", req.store_id)))?;
        Ok(Response::new(pdpb::GetStoreResponse {
            header: header(),
            store: Some(store_proto(req.store_id, *addr)),
            stats: None,
        }))
    }

    async fn get_all_stores(
        &self,
        _request: Request<pdpb::GetAllStoresRequest>,
    ) -> Result<Response<pdpb::GetAllStoresResponse>, Status> {
        let state = self.shared.lock();
        Ok(Response::new(pdpb::GetAllStoresResponse {
            header: header(),
            stores: state
                .store_addrs
                .iter()
                .map(|(id, addr)| store_proto(*id, *addr))
                .collect(),
        }))
    }

    async fn update_service_gc_safe_point(
        &self,
        request: Request<pdpb::UpdateServiceGcSafePointRequest>,
    ) -> Result<Response<pdpb::UpdateServiceGcSafePointResponse>, Status> {
        let req = request.into_inner();
        let mut state = self.shared.lock();
        let now = std::time::Instant::now();
        state
            .service_safe_points
            .retain(|_, (_, until)| *until > now);
        let ttl = std::time::Duration::from_secs(u64::try_from(req.ttl).unwrap_or(0));
        // As PD: a registration below the cluster's GC safe point is raised to it.
        let safe_point = req.safe_point.max(state.safe_point);
        state
            .service_safe_points
            .insert(req.service_id.clone(), (safe_point, now + ttl));
        let min_safe_point = state
            .service_safe_points
            .values()
            .map(|(point, _)| *point)
            .min()
            .unwrap_or(safe_point);
        Ok(Response::new(pdpb::UpdateServiceGcSafePointResponse {
            header: header(),
            service_id: req.service_id,
            ttl: req.ttl,
            min_safe_point,
        }))
    }

    async fn update_gc_safe_point(
        &self,
        request: Request<pdpb::UpdateGcSafePointRequest>,
    ) -> Result<Response<pdpb::UpdateGcSafePointResponse>, Status> {
        let req = request.into_inner();
        let mut state = self.shared.lock();
        if req.safe_point > state.safe_point {
            state.safe_point = req.safe_point;
            let safe_point = state.safe_point;
            state.mvcc.gc(safe_point);
            self.shared.gc_moved.notify_waiters();
        }
        Ok(Response::new(pdpb::UpdateGcSafePointResponse {
            header: header(),
            new_safe_point: state.safe_point,
        }))
    }
}
