//! Opening connections: TCP, and TLS over it for `https`.

use std::sync::Arc;

use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;

use super::address::Address;

/// A stream a connection runs over: TCP, or TLS over TCP.
pub(super) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// Opens connections: one TLS configuration for every endpoint.
#[derive(Clone)]
pub(in crate::webhooks) struct Connector {
    tls: Result<TlsConnector, String>,
}

impl Connector {
    pub(in crate::webhooks) fn new() -> Self {
        let tls = tls_config().map(|config| TlsConnector::from(Arc::new(config)));
        if let Err(err) = &tls {
            tracing::error!(error = %err, "webhook deliveries to https will fail until this is fixed");
        }
        Self { tls }
    }

    pub(super) async fn open(self, address: Arc<Address>) -> Result<Box<dyn Stream>, String> {
        let tcp = TcpStream::connect(address.connect_to.as_str())
            .await
            .map_err(|err| format!("cannot connect: {err}"))?;
        // Requests are written whole; waiting to fill a segment only delays them.
        tcp.set_nodelay(true)
            .map_err(|err| format!("cannot connect: {err}"))?;
        Ok(match &address.server_name {
            None => Box::new(tcp),
            Some(name) => {
                let tls = self.tls.as_ref().map_err(Clone::clone)?;
                Box::new(
                    tls.connect(name.clone(), tcp)
                        .await
                        .map_err(|err| format!("TLS: {err}"))?,
                )
            }
        })
    }
}

/// The platform's trusted roots, as `reqwest` would use them; HTTP/1.1 only.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(Arc::clone(&provider))
        .map_err(|err| format!("cannot load the trusted certificates: {err}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS: {err}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
