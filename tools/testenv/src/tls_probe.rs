//! What a TLS server presents: a client handshake that accepts any server certificate
//! and keeps the end-entity one, for tests and benchmarks that ask a proxy (HAProxy,
//! the real router) which certificate it serves for a name.
//!
//! Each call builds its own client configuration, so no session is resumed: every
//! handshake is a full one and the server presents its certificate every time.

use std::sync::{Arc, Mutex};

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio_rustls::client::TlsStream;

/// An established TLS session and the certificate the server presented in it.
#[derive(Debug)]
pub struct Session {
    /// The connection, ready for a request.
    pub stream: TlsStream<TcpStream>,
    /// The server's end-entity certificate (DER).
    pub certificate: Option<Vec<u8>>,
}

impl Session {
    /// The ALPN protocol the server chose, if any.
    pub fn alpn(&self) -> Option<String> {
        self.stream
            .get_ref()
            .1
            .alpn_protocol()
            .map(|protocol| String::from_utf8_lossy(protocol).into_owned())
    }
}

/// Connects to `addr` and completes a handshake with SNI `sni`, offering the ALPN
/// protocols `alpn` (none when empty). `None` when the connection or the handshake
/// fails.
pub async fn connect(addr: impl ToSocketAddrs, sni: &str, alpn: &[&[u8]]) -> Option<Session> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let recorder = Arc::new(Recorder {
        provider: Arc::clone(&provider),
        seen: Mutex::new(None),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.ok()?;
    let name = ServerName::try_from(sni.to_owned()).ok()?;
    let stream = connector.connect(name, tcp).await.ok()?;
    let certificate = kube_common::sync::lock(&recorder.seen).clone();
    Some(Session {
        stream,
        certificate,
    })
}

/// The end-entity certificate (DER) the server at `addr` presents for `sni`, if a
/// handshake succeeds.
pub async fn presented(addr: impl ToSocketAddrs, sni: &str) -> Option<Vec<u8>> {
    connect(addr, sni, &[]).await?.certificate
}

/// Accepts any server certificate and remembers the end-entity one.
#[derive(Debug)]
struct Recorder {
    provider: Arc<CryptoProvider>,
    /// Guards the end-entity certificate of the handshake, once the server sent it.
    seen: Mutex<Option<Vec<u8>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *kube_common::sync::lock(&self.seen) = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
