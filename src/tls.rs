//! TLS, and mutual TLS, for the Flight endpoint: rustls (the ring provider) with our own
//! acceptor in front of tonic, so that certificates reload on SIGHUP without a restart. A
//! connection takes the configuration in force when it was accepted.
//!
//! The server offers ALPN `h2` (gRPC). A client that speaks plaintext to a TLS port fails its
//! handshake and is closed; it never reaches the service.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

use crate::error::{Error, Result};

/// How long a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections accepted but not yet taken by the server.
const ACCEPT_BACKLOG: usize = 64;

/// Where the server's certificate, key and (for mutual TLS) client CA are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to; none for server-only TLS.
    pub client_ca: Option<PathBuf>,
}

/// The TLS configuration in force, reloadable.
pub struct Tls {
    files: TlsFiles,
    config: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    /// Loads the files.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file that cannot be read or used.
    pub fn load(files: TlsFiles) -> Result<Self> {
        let config = build(&files)?;
        Ok(Self {
            files,
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// Rereads the files; connections accepted from now on use them. On an error the
    /// configuration in force stays.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn reload(&self) -> Result<()> {
        let config = build(&self.files)?;
        *self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        Ok(())
    }

    /// Whether clients must present a certificate.
    #[must_use]
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(
            &self
                .config
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }
}

fn build(files: &TlsFiles) -> Result<ServerConfig> {
    let bad = |setting: &'static str, path: &PathBuf, what: String| Error::Config {
        setting,
        reason: format!("{}: {what}", path.display()),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect)
        .map_err(|err| bad("tls-cert", &files.cert, err.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            "tls-cert",
            &files.cert,
            "no PEM certificate in it".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|err| bad("tls-key", &files.key, err.to_string()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|err| bad("tls-cert", &files.cert, err.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|err| bad("tls-client-ca", path, err.to_string()))?
            {
                let cert = cert.map_err(|err| bad("tls-client-ca", path, err.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|err| bad("tls-client-ca", path, err.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|err| bad("tls-client-ca", path, err.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|err| bad("tls-key", &files.key, err.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The TLS connections accepted on `listener`, each handshaken on a task of its own (a slow
/// or failing client holds up nobody). Dropping the stream stops accepting.
pub struct TlsIncoming {
    accepted: mpsc::Receiver<io::Result<TlsStream<TcpStream>>>,
    task: JoinHandle<()>,
}

impl TlsIncoming {
    /// Accepts on `listener` with `tls`.
    #[must_use]
    pub fn new(listener: TcpListener, tls: Arc<Tls>) -> Self {
        let (sender, accepted) = mpsc::channel(ACCEPT_BACKLOG);
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of descriptors and the like: passing; the listener stays.
                        tracing::warn!("accepting a connection failed: {err}");
                        tokio::task::yield_now().await;
                        continue;
                    }
                };
                // Without TCP_NODELAY every small reply waits out delayed ACKs.
                let _ = stream.set_nodelay(true);
                let acceptor = tls.acceptor();
                let handed = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = handed.send(Ok(stream)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, "TLS handshake failed: {err}");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
                if sender.is_closed() {
                    return;
                }
            }
        });
        Self { accepted, task }
    }
}

impl Stream for TlsIncoming {
    type Item = io::Result<TlsStream<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.accepted.poll_recv(cx)
    }
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}
