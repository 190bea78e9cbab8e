//! Which session a request comes from, and which transaction it runs in: the id it names
//! (if the session may use it), else its session's open one. What a session creates is its
//! own: another session naming it is told it does not exist.

use tonic::{Request, Status};

use super::prepared::Prepared;
use super::service::MoraineSqlService;
use super::status::to_status;
use crate::auth::Session;
use crate::catalog::CatalogSnapshot;
use crate::error::{Error, Result};
use crate::txn::TxnId;

/// The caller of a request, as the authentication gate found it.
///
/// # Errors
/// UNAUTHENTICATED for a request that did not pass the gate (a wiring fault: every server
/// puts the gate in front of this service).
pub(crate) fn caller<T>(request: &Request<T>) -> Result<Session, Status> {
    request
        .extensions()
        .get::<Session>()
        .cloned()
        .ok_or_else(|| {
            to_status(&Error::Unauthenticated {
                reason: "the call did not pass the server's authentication",
            })
        })
}

/// A transaction id as sent, if one was.
fn explicit_txn(id: Option<&bytes::Bytes>) -> Option<TxnId> {
    id.filter(|id| !id.is_empty())
        .map(|id| TxnId::from_bytes(id))
}

impl MoraineSqlService {
    /// The transaction a request runs in: the id it names, else its session's open one.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an id of another session's transaction.
    pub(super) fn txn_of(
        &self,
        explicit: Option<&bytes::Bytes>,
        session: &Session,
    ) -> Result<Option<TxnId>> {
        match explicit_txn(explicit) {
            Some(id) => {
                self.txns.check_access(&id, session.owner())?;
                Ok(Some(id))
            }
            None => Ok(session.id().and_then(|s| self.txns.of_session(s))),
        }
    }

    /// The transaction a prepared statement runs in. A handle prepared in a transaction that
    /// has since ended follows its session to the session's current one: ADBC keeps using a
    /// handle across `commit()`.
    pub(super) fn txn_of_prepared(&self, prepared: &Prepared, session: &Session) -> Option<TxnId> {
        let current = || session.id().and_then(|s| self.txns.of_session(s));
        match &prepared.txn {
            Some(id) if self.txns.is_open(id) => Some(id.clone()),
            Some(id) => current().or_else(|| Some(id.clone())),
            None => current(),
        }
    }

    /// What a request in `txn` reads.
    pub(super) async fn view(&self, txn: Option<&TxnId>) -> Result<CatalogSnapshot> {
        match txn {
            Some(id) => self.txns.view(id).await,
            None => self.engine.catalog().snapshot().await,
        }
    }
}
