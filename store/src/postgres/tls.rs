//! TLS to PostgreSQL: libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey`, read from the
//! `--store` URL or connection string, through rustls (ring, as everywhere in lasthop) and
//! `tokio-postgres-rustls`.
//!
//! | `sslmode`     | TLS                              | the server's certificate            |
//! |---------------|----------------------------------|-------------------------------------|
//! | `disable`     | never                            | -                                   |
//! | `prefer`      | if the server offers it          | not checked (as libpq)              |
//! | `require`     | always                           | not checked; with `sslrootcert`, as `verify-ca` (as libpq) |
//! | `verify-ca`   | always                           | signed by a trusted CA              |
//! | `verify-full` | always                           | signed by a trusted CA, for the host named |
//!
//! Trusted CAs: `sslrootcert=FILE` (PEM), or the system's store (`/etc/ssl/certs`, through
//! `rustls-native-certs`) without it or with `sslrootcert=system`. `sslcert` and `sslkey` (PEM,
//! both or neither) are the client certificate the server may ask for (`hostssl ... cert` in
//! `pg_hba.conf`); the key file is a secret and refused when others can read it.
//!
//! Without `sslmode`, a store whose hosts are all loopback (a Unix socket, `localhost`,
//! 127.0.0.0/8, ::1) stays plain, and any other gets `verify-full`: a host name is taken as
//! not loopback (it is not resolved here), so `host=db.example hostaddr=127.0.0.1` is verified
//! as `db.example`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct};
use tokio_postgres::config::{Host, SslMode as PgSslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StoreError;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The TLS settings of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SslParams {
    pub mode: Option<SslMode>,
    /// `sslrootcert`: a PEM file, or `system`.
    pub root_cert: Option<String>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A store's connection settings: tokio-postgres's configuration, the TLS connector every
/// connection to it uses, and what to say when connecting fails.
#[derive(Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustlsConnect,
    /// The `sslmode` in force.
    pub mode: SslMode,
    /// True when `mode` is the default for a host that is not loopback (not written).
    pub defaulted: bool,
    /// The hosts, for messages (`db1:5432,db2:5432`).
    pub hosts: String,
    /// Where the trusted CAs came from, for messages.
    roots: String,
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTarget")
            .field("hosts", &self.hosts)
            .field("mode", &self.mode)
            .field("defaulted", &self.defaulted)
            .finish_non_exhaustive()
    }
}

fn refused(url_hosts: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::Connect(format!("PostgreSQL store {url_hosts}: {what}"))
}

/// Splits the TLS settings out of a `postgres://` URL or a libpq `key=value` string: the rest
/// (what tokio-postgres parses) and the settings.
pub fn split_ssl(url: &str) -> Result<(String, SslParams), String> {
    let mut params = SslParams::default();
    let mut take = |key: &str, value: String| -> Result<bool, String> {
        match key {
            "sslmode" => {
                params.mode = Some(SslMode::parse(&value).ok_or_else(|| {
                    format!(
                        "sslmode={value}: expected disable, prefer, require, verify-ca or \
                         verify-full"
                    )
                })?);
            }
            "sslrootcert" => params.root_cert = Some(value),
            "sslcert" => params.cert = Some(PathBuf::from(value)),
            "sslkey" => params.key = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    let k = percent_decode(k)?;
                    if !take(&k, percent_decode(v)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for (key, value, raw) in key_values(url)? {
            if !take(&key, value)? {
                kept.push(raw);
            }
        }
        kept.join(" ")
    };
    Ok((rest, params))
}

/// `%XX` escapes in a URL's query part (and `+` kept as is, as libpq does).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape in the store URL near {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the store URL's {s:?} is not UTF-8"))
}

/// The `key=value` pairs of a libpq connection string (values quoted with `'` or bare,
/// backslash escapes), each with its text as written.
fn key_values(s: &str) -> Result<Vec<(String, String, &str)>, String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[start..i];
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() || b[i] != b'=' {
            return Err(format!("the store's connection string: {key:?} has no '='"));
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => {
                        return Err(format!(
                            "the store's connection string: {key}'s quoted value never ends"
                        ))
                    }
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        value.push(b[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
        }
        let value = String::from_utf8(value)
            .map_err(|_| format!("the store's connection string: {key}'s value is not UTF-8"))?;
        out.push((key.to_string(), value, &s[start..i]));
    }
}

/// True for a host that never leaves the machine: a Unix socket, `localhost`, 127.0.0.0/8,
/// ::1. A host name is not resolved: any other name is taken as remote.
fn loopback(host: &Host) -> bool {
    match host {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            let name = name.trim_start_matches('[').trim_end_matches(']');
            name.eq_ignore_ascii_case("localhost")
                || name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
}

/// The hosts of `config` as `host:port,...`, for messages.
fn describe_hosts(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| {
        ports
            .get(i)
            .or_else(|| ports.first())
            .copied()
            .unwrap_or(5432)
    };
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{a}:{}", port(i)))
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                Host::Tcp(name) => format!("{name}:{}", port(i)),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect()
    };
    hosts.join(",")
}

/// Parses a `--store` URL or connection string and builds its TLS connector (reading the CA,
/// certificate and key files it names).
pub fn target(url: &str) -> Result<PgTarget, StoreError> {
    let (rest, ssl) = split_ssl(url).map_err(StoreError::Connect)?;
    let mut config = rest
        .parse::<tokio_postgres::Config>()
        .map_err(|e| StoreError::Postgres {
            what: "store URL",
            cause: Box::new(e),
        })?;
    let hosts = describe_hosts(&config);
    let all_loopback = config.get_hosts().iter().all(loopback)
        && config.get_hostaddrs().iter().all(|a| a.is_loopback());
    let (mode, defaulted) = match ssl.mode {
        Some(m) => (m, false),
        None if all_loopback => (SslMode::Disable, false),
        None => (SslMode::VerifyFull, true),
    };
    config.ssl_mode(match mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        _ => PgSslMode::Require,
    });
    let (tls, roots) = client_config(&ssl, mode).map_err(|e| refused(&hosts, e))?;
    Ok(PgTarget {
        config,
        tls: MakeRustlsConnect::new(tls),
        mode,
        defaulted,
        hosts,
        roots,
    })
}

/// The rustls client for `mode` and the files in `ssl`; and where its trusted CAs came from.
fn client_config(ssl: &SslParams, mode: SslMode) -> Result<(ClientConfig, String), String> {
    let provider = Arc::new(lasthop_tls::provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(lasthop_tls::VERSIONS)
        .map_err(|e| e.to_string())?;
    // libpq: `require` with a root certificate file verifies as `verify-ca`.
    let check = match mode {
        SslMode::Require if ssl.root_cert.as_deref().is_some_and(|r| r != "system") => {
            SslMode::VerifyCa
        }
        m => m,
    };
    let (verifier, roots): (Arc<dyn ServerCertVerifier>, String) = match check {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let (store, from) = match ssl.root_cert.as_deref() {
                Some(file) if file != "system" => (
                    lasthop_tls::root_store(Path::new(file)).map_err(|e| e.to_string())?,
                    format!("sslrootcert={file}"),
                ),
                _ => (
                    lasthop_tls::system_roots().map_err(|_| {
                        "no sslrootcert given and the system has no trusted CAs (install \
                         ca-certificates, or give sslrootcert=FILE, the CA that signed the \
                         server's certificate)"
                            .to_string()
                    })?,
                    "the system's trusted CAs".to_string(),
                ),
            };
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
                .build()
                .map_err(|e| e.to_string())?;
            let v: Arc<dyn ServerCertVerifier> = if check == SslMode::VerifyCa {
                Arc::new(AnyName(webpki))
            } else {
                webpki
            };
            (v, from)
        }
        _ => (
            Arc::new(Unchecked(provider)),
            "nothing (sslmode does not verify)".to_string(),
        ),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&ssl.cert, &ssl.key) {
        (Some(cert), Some(key)) => {
            lasthop_core::secret::check(key).map_err(|e| format!("sslkey: {e}"))?;
            let chain = lasthop_tls::certs(cert).map_err(|e| e.to_string())?;
            let key_der = lasthop_tls::private_key(key).map_err(|e| e.to_string())?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                format!(
                    "sslcert {} and sslkey {} do not make a client identity: {e}",
                    cert.display(),
                    key.display()
                )
            })?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err("sslcert needs its sslkey".into()),
        (None, Some(_)) => return Err("sslkey needs its sslcert".into()),
    };
    Ok((config, roots))
}

/// `verify-ca`: the chain must lead to a trusted CA; the name in it is not compared with the
/// host's.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` (without `sslrootcert`): encrypted, the certificate not checked, as
/// libpq does; the handshake's signature is still verified against the certificate's key.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A failed connection to `target` as an error that names the store, the `sslmode` in force
/// and, for the usual TLS failures, what to change.
pub fn connect_error(target: &PgTarget, e: tokio_postgres::Error) -> StoreError {
    let mode = if target.defaulted {
        format!(
            "sslmode={} (the default for a host that is not loopback)",
            target.mode.as_str()
        )
    } else {
        format!("sslmode={}", target.mode.as_str())
    };
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(&e);
    let mut tls = None;
    while let Some(s) = source {
        let text = s.to_string();
        if !cause.contains(&text) {
            cause = format!("{cause}: {text}");
        }
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            tls = Some(r.clone());
        } else if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                tls = Some(r.clone());
            }
        }
        source = s.source();
    }
    let hint = match tls {
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        )) => ": the server's certificate does not name the host connected to (connect by a \
                 name it carries, or use sslmode=verify-ca to check the CA alone)"
            .to_string(),
        Some(rustls::Error::InvalidCertificate(c)) => format!(
            ": the server's certificate does not verify against {} ({c:?}): give \
             sslrootcert=FILE, the CA that signed it",
            target.roots
        ),
        Some(_) => String::new(),
        None if cause.contains("does not support TLS") && target.defaulted => {
            ": the server does not offer TLS: turn on `ssl` in its postgresql.conf, or add \
             sslmode=disable to the --store URL to connect in clear"
                .to_string()
        }
        None if cause.contains("does not support TLS") => {
            ": the server does not offer TLS: turn on `ssl` in its postgresql.conf".to_string()
        }
        None => String::new(),
    };
    refused(&target.hosts, format!("{mode}: {cause}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ssl_settings_leave_a_url_and_the_rest_stays() {
        let (rest, p) = split_ssl(
            "postgres://u@db:5432,db2:5432/lh?sslmode=verify-full&target_session_attrs=read-write\
             &sslrootcert=%2Fetc%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u@db:5432,db2:5432/lh?target_session_attrs=read-write"
        );
        assert_eq!(p.mode, Some(SslMode::VerifyFull));
        assert_eq!(p.root_cert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(p.cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(p.key, Some(PathBuf::from("/k.pem")));
        let (rest, p) = split_ssl("postgres://u@db/lh?sslmode=require").unwrap();
        assert_eq!(rest, "postgres://u@db/lh");
        assert_eq!(p.mode, Some(SslMode::Require));
    }

    #[test]
    fn the_ssl_settings_leave_a_key_value_string() {
        let (rest, p) = split_ssl(
            "host=db port=5432 sslmode = 'verify-ca' sslrootcert='/a b/ca.pem' \
             user=lh password='it\\'s'",
        )
        .unwrap();
        assert_eq!(rest, "host=db port=5432 user=lh password='it\\'s'");
        assert_eq!(p.mode, Some(SslMode::VerifyCa));
        assert_eq!(p.root_cert.as_deref(), Some("/a b/ca.pem"));
        // What stays parses as it did.
        let c: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(c.get_password(), Some(&b"it's"[..]));
    }

    #[test]
    fn bad_settings_are_refused_clearly() {
        let e = split_ssl("postgres://db/lh?sslmode=allow").unwrap_err();
        assert!(
            e.contains("sslmode=allow") && e.contains("verify-full"),
            "{e}"
        );
        assert!(split_ssl("host=db sslmode").is_err());
        assert!(split_ssl("host='db").is_err());
        assert!(split_ssl("postgres://db/lh?sslrootcert=%zz").is_err());
    }

    #[test]
    fn loopback_stays_plain_and_any_other_host_defaults_to_verify_full() {
        for url in [
            "postgres://u@127.0.0.1:5/lh",
            "postgres://u@localhost/lh",
            "postgres://u@[::1]:5/lh",
            "host=/run/postgresql user=u",
            "host=127.0.0.2,localhost user=u",
        ] {
            let t = target(url).unwrap();
            assert_eq!((t.mode, t.defaulted), (SslMode::Disable, false), "{url}");
        }
        for url in [
            "postgres://u@db.example/lh",
            "postgres://u@127.0.0.1,10.0.0.2/lh",
            "host=lh.test hostaddr=127.0.0.1 user=u",
            "postgres://u@198.18.0.1/lh",
        ] {
            let Ok(t) = target(url) else {
                // A machine without a system trust store says so (with the fix) instead.
                let e = target(url).unwrap_err().to_string();
                assert!(e.contains("sslrootcert=FILE"), "{e}");
                continue;
            };
            assert_eq!((t.mode, t.defaulted), (SslMode::VerifyFull, true), "{url}");
        }
        // Written, it is what it says, even for loopback.
        let t = target("postgres://u@127.0.0.1/lh?sslmode=require").unwrap();
        assert_eq!((t.mode, t.defaulted), (SslMode::Require, false));
        let t = target("postgres://u@db.example/lh?sslmode=disable").unwrap();
        assert_eq!((t.mode, t.defaulted), (SslMode::Disable, false));
    }

    #[test]
    fn a_missing_ca_file_or_half_an_identity_names_itself() {
        let e = target("postgres://u@db/lh?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PostgreSQL store db:5432") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let e = target("postgres://u@db/lh?sslmode=require&sslcert=/c.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslcert needs its sslkey"), "{e}");
    }
}
