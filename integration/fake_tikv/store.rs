//! One fake TiKV store: the transactional RPCs the client sends, each checked against its
//! region (known, same epoch, led by this store, keys inside) before it touches the MVCC state.
//! Every other RPC answers Unimplemented (the generated default).

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use super::mvcc::TxnStatus;
use super::proto::errorpb;
use super::proto::kvrpcpb::{self, Context, KeyError};
use super::proto::tikvpb::tikv_server::{Tikv, TikvServer};
use super::{Region, Rpc, Server, Shared, State, spawn_server};

pub(super) fn serve(shared: Arc<Shared>, id: u64, listener: TcpListener) -> Server {
    let service = StoreService { shared, id };
    let router = tonic::transport::Server::builder()
        .add_service(TikvServer::new(service).max_decoding_message_size(64 << 20));
    spawn_server(listener, router).0
}

struct StoreService {
    shared: Arc<Shared>,
    id: u64,
}

/// A request passed its region checks, or the region error to answer with.
type Checked<T> = Result<T, errorpb::Error>;

impl StoreService {
    /// Fires armed faults, refuses while the store is down, checks the region, and runs `f`
    /// on the state with the request's region. `Err` is a gRPC status for the whole call.
    fn with_region<T>(
        &self,
        rpc: Rpc,
        name: &'static str,
        ctx: Option<&Context>,
        keys: &[&[u8]],
        f: impl FnOnce(&mut State, &Region) -> T,
    ) -> Result<Checked<T>, Status> {
        let lose = self.shared.fire(rpc, self.id);
        let mut state = self.shared.lock();
        *state.rpc_counts.entry(name).or_default() += 1;
        if state
            .store_down_until
            .get(&self.id)
            .is_some_and(|until| Instant::now() < *until)
        {
            return Err(Status::unavailable(format!("store {} is down", self.id)));
        }
        let region = match check_region(&state, self.id, ctx, keys) {
            Ok(region) => region,
            Err(err) => return Ok(Err(err)),
        };
        let out = f(&mut state, &region);
        if lose {
            return Err(Status::unavailable("the answer was lost on the way"));
        }
        Ok(Ok(out))
    }
}

fn check_region(
    state: &State,
    store: u64,
    ctx: Option<&Context>,
    keys: &[&[u8]],
) -> Result<Region, errorpb::Error> {
    let region_id = ctx.map_or(0, |c| c.region_id);
    let Some(region) = state.regions.get(&region_id) else {
        return Err(errorpb::Error {
            message: format!("region {region_id} not found"),
            region_not_found: Some(errorpb::RegionNotFound { region_id }),
            ..errorpb::Error::default()
        });
    };
    let epoch = ctx.and_then(|c| c.region_epoch).unwrap_or_default();
    if epoch != region.epoch() {
        return Err(errorpb::Error {
            message: format!("epoch of region {region_id} does not match"),
            epoch_not_match: Some(errorpb::EpochNotMatch {
                current_regions: state.regions.values().map(Region::to_proto).collect(),
            }),
            ..errorpb::Error::default()
        });
    }
    if region.leader_store != store {
        return Err(errorpb::Error {
            message: format!("store {store} does not lead region {region_id}"),
            not_leader: Some(errorpb::NotLeader {
                region_id,
                leader: if region.leader_hint {
                    region.peer_on(region.leader_store)
                } else {
                    None
                },
            }),
            ..errorpb::Error::default()
        });
    }
    if let Some(key) = keys.iter().find(|k| !region.contains(k)) {
        return Err(errorpb::Error {
            message: format!("key not in region {region_id}"),
            key_not_in_region: Some(errorpb::KeyNotInRegion {
                key: key.to_vec(),
                region_id,
                start_key: region.start.clone(),
                end_key: region.end.clone(),
            }),
            ..errorpb::Error::default()
        });
    }
    Ok(region.clone())
}

/// The part of `[start, end)` inside `region` (empty `end`: unbounded).
fn clip(region: &Region, start: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let start = start.max(region.start.as_slice()).to_vec();
    let end = match (end.is_empty(), region.end.is_empty()) {
        (true, _) => region.end.clone(),
        (false, true) => end.to_vec(),
        (false, false) => end.min(region.end.as_slice()).to_vec(),
    };
    (start, end)
}

fn locked(info: kvrpcpb::LockInfo) -> KeyError {
    KeyError {
        locked: Some(info),
        ..KeyError::default()
    }
}

#[tonic::async_trait]
impl Tikv for StoreService {
    async fn kv_get(
        &self,
        request: Request<kvrpcpb::GetRequest>,
    ) -> Result<Response<kvrpcpb::GetResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::GetResponse::default();
        match self.with_region(
            Rpc::Get,
            "KvGet",
            req.context.as_ref(),
            &[&req.key],
            |s, _| s.mvcc.read(&req.key, req.version),
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(Ok(Some(value))) => resp.value = value,
            Ok(Ok(None)) => resp.not_found = true,
            Ok(Err(lock)) => resp.error = Some(locked(lock)),
        }
        Ok(Response::new(resp))
    }

    async fn kv_batch_get(
        &self,
        request: Request<kvrpcpb::BatchGetRequest>,
    ) -> Result<Response<kvrpcpb::BatchGetResponse>, Status> {
        let req = request.into_inner();
        let keys: Vec<&[u8]> = req.keys.iter().map(Vec::as_slice).collect();
        let mut resp = kvrpcpb::BatchGetResponse::default();
        match self.with_region(
            Rpc::BatchGet,
            "KvBatchGet",
            req.context.as_ref(),
            &keys,
            |s, _| {
                req.keys
                    .iter()
                    .filter_map(|key| match s.mvcc.read(key, req.version) {
                        Ok(Some(value)) => Some(kvrpcpb::KvPair {
                            key: key.clone(),
                            value,
                            error: None,
                        }),
                        Ok(None) => None,
                        Err(lock) => Some(kvrpcpb::KvPair {
                            key: key.clone(),
                            value: Vec::new(),
                            error: Some(locked(lock)),
                        }),
                    })
                    .collect()
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(pairs) => resp.pairs = pairs,
        }
        Ok(Response::new(resp))
    }

    async fn kv_scan(
        &self,
        request: Request<kvrpcpb::ScanRequest>,
    ) -> Result<Response<kvrpcpb::ScanResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::ScanResponse::default();
        let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
        match self.with_region(
            Rpc::Scan,
            "KvScan",
            req.context.as_ref(),
            &[],
            |s, region| {
                // In a reverse scan the request's start key is the exclusive upper bound.
                let (lo, hi) = if req.reverse {
                    (&req.end_key, &req.start_key)
                } else {
                    (&req.start_key, &req.end_key)
                };
                let (lo, hi) = clip(region, lo, hi);
                s.mvcc.scan(&lo, &hi, req.version, limit, req.reverse)
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(found) => {
                let has_locks = found.iter().any(|(_, r)| r.is_err());
                resp.pairs = found
                    .into_iter()
                    .filter(|(_, r)| !has_locks || r.is_err())
                    .map(|(key, r)| match r {
                        Ok(value) => kvrpcpb::KvPair {
                            key,
                            value: if req.key_only { Vec::new() } else { value },
                            error: None,
                        },
                        Err(lock) => kvrpcpb::KvPair {
                            key,
                            value: Vec::new(),
                            error: Some(locked(lock)),
                        },
                    })
                    .collect();
            }
        }
        Ok(Response::new(resp))
    }

    async fn kv_prewrite(
        &self,
        request: Request<kvrpcpb::PrewriteRequest>,
    ) -> Result<Response<kvrpcpb::PrewriteResponse>, Status> {
        let req = request.into_inner();
        if req.try_one_pc || req.use_async_commit || req.for_update_ts != 0 {
            return Err(Status::unimplemented(
                "the fake serves optimistic two-phase commit only",
            ));
        }
        self.shared.held(Rpc::Prewrite).await;
        let keys: Vec<&[u8]> = req.mutations.iter().map(|m| m.key.as_slice()).collect();
        let mut resp = kvrpcpb::PrewriteResponse::default();
        match self.with_region(
            Rpc::Prewrite,
            "KvPrewrite",
            req.context.as_ref(),
            &keys,
            |s, _| {
                s.mvcc.prewrite(
                    &req.mutations,
                    &req.primary_lock,
                    req.start_version,
                    req.lock_ttl,
                    req.txn_size,
                )
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(errors) => resp.errors = errors,
        }
        Ok(Response::new(resp))
    }

    async fn kv_commit(
        &self,
        request: Request<kvrpcpb::CommitRequest>,
    ) -> Result<Response<kvrpcpb::CommitResponse>, Status> {
        let req = request.into_inner();
        let keys: Vec<&[u8]> = req.keys.iter().map(Vec::as_slice).collect();
        let mut resp = kvrpcpb::CommitResponse::default();
        match self.with_region(
            Rpc::Commit,
            "KvCommit",
            req.context.as_ref(),
            &keys,
            |s, _| {
                s.mvcc
                    .commit(&req.keys, req.start_version, req.commit_version)
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(Ok(())) => resp.commit_version = req.commit_version,
            Ok(Err(err)) => resp.error = Some(err),
        }
        Ok(Response::new(resp))
    }

    async fn kv_batch_rollback(
        &self,
        request: Request<kvrpcpb::BatchRollbackRequest>,
    ) -> Result<Response<kvrpcpb::BatchRollbackResponse>, Status> {
        let req = request.into_inner();
        let keys: Vec<&[u8]> = req.keys.iter().map(Vec::as_slice).collect();
        let mut resp = kvrpcpb::BatchRollbackResponse::default();
        match self.with_region(
            Rpc::BatchRollback,
            "KvBatchRollback",
            req.context.as_ref(),
            &keys,
            |s, _| s.mvcc.rollback(&req.keys, req.start_version),
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(Ok(())) => {}
            Ok(Err(err)) => resp.error = Some(err),
        }
        Ok(Response::new(resp))
    }

    async fn kv_check_txn_status(
        &self,
        request: Request<kvrpcpb::CheckTxnStatusRequest>,
    ) -> Result<Response<kvrpcpb::CheckTxnStatusResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::CheckTxnStatusResponse::default();
        match self.with_region(
            Rpc::CheckTxnStatus,
            "KvCheckTxnStatus",
            req.context.as_ref(),
            &[&req.primary_key],
            |s, _| {
                s.mvcc.check_txn_status(
                    &req.primary_key,
                    req.lock_ts,
                    req.current_ts,
                    req.rollback_if_not_exist,
                )
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(Err(err)) => resp.error = Some(err),
            Ok(Ok(TxnStatus::Locked { ttl, lock })) => {
                resp.lock_ttl = ttl;
                resp.lock_info = Some(lock);
            }
            Ok(Ok(TxnStatus::Committed(commit_ts))) => resp.commit_version = commit_ts,
            Ok(Ok(TxnStatus::RolledBack(action))) => resp.action = action as i32,
        }
        Ok(Response::new(resp))
    }

    async fn kv_resolve_lock(
        &self,
        request: Request<kvrpcpb::ResolveLockRequest>,
    ) -> Result<Response<kvrpcpb::ResolveLockResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::ResolveLockResponse::default();
        if let Err(region_error) = self.with_region(
            Rpc::ResolveLock,
            "KvResolveLock",
            req.context.as_ref(),
            &[],
            |s, region| {
                let mut txns: Vec<(u64, u64)> =
                    req.txn_infos.iter().map(|t| (t.txn, t.status)).collect();
                if req.start_version != 0 {
                    txns.push((req.start_version, req.commit_version));
                }
                for (start_ts, commit_ts) in txns {
                    s.mvcc
                        .resolve(start_ts, commit_ts, &region.start, &region.end);
                }
            },
        )? {
            resp.region_error = Some(region_error);
        }
        Ok(Response::new(resp))
    }

    async fn kv_txn_heart_beat(
        &self,
        request: Request<kvrpcpb::TxnHeartBeatRequest>,
    ) -> Result<Response<kvrpcpb::TxnHeartBeatResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::TxnHeartBeatResponse::default();
        match self.with_region(
            Rpc::CheckTxnStatus,
            "KvTxnHeartBeat",
            req.context.as_ref(),
            &[&req.primary_lock],
            |s, _| {
                s.mvcc
                    .heartbeat(&req.primary_lock, req.start_version, req.advise_lock_ttl)
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(Ok(ttl)) => resp.lock_ttl = ttl,
            Ok(Err(err)) => resp.error = Some(err),
        }
        Ok(Response::new(resp))
    }

    async fn kv_scan_lock(
        &self,
        request: Request<kvrpcpb::ScanLockRequest>,
    ) -> Result<Response<kvrpcpb::ScanLockResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::ScanLockResponse::default();
        let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
        match self.with_region(
            Rpc::Scan,
            "KvScanLock",
            req.context.as_ref(),
            &[],
            |s, region| {
                let (lo, hi) = clip(region, &req.start_key, &req.end_key);
                s.mvcc.scan_locks(req.max_version, &lo, &hi, limit)
            },
        )? {
            Err(region_error) => resp.region_error = Some(region_error),
            Ok(locks) => resp.locks = locks,
        }
        Ok(Response::new(resp))
    }
}
