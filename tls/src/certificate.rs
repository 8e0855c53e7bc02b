//! A domain's certificate as an owner hands it over (PEM chain, leaf first, and its private
//! key), checked before anything stores or serves it: the key is the leaf's, the leaf names the
//! domain, it is valid now, it is an end entity's (not a CA's) and, where it says what it is
//! for, for TLS servers, and the chain given links up certificate by certificate (each signed
//! by the next; the last is taken as the anchor, since a chain need not carry its root), as
//! webpki, rustls' own verifier, judges it.
//!
//! What is not checked: whether a public CA issued it. The chain's own last certificate is its
//! anchor, so a private CA's certificate (or a self-signed leaf) is stored like any other, and
//! browsers judge it. Control of the name is what the next issue's ACME issuance proves.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use x509_cert::der::Decode;

/// Most certificates a chain may hold: a leaf and a few intermediates.
pub const MAX_CHAIN: usize = 8;

/// A certificate that passed every check, ready to serve (its chain with the signing key
/// loaded once, here), with what the API shows of it.
#[derive(Debug)]
pub struct CheckedCertificate {
    pub certified: CertifiedKey,
    /// The leaf's validity, in Unix milliseconds.
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    /// The leaf's issuer, as RFC 4514 text (`CN=R11,O=Let's Encrypt,C=US`).
    pub issuer: String,
}

impl CheckedCertificate {
    /// The chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.certified.cert
    }
}

/// Why a certificate was refused; [`CertificateError::code`] is the API's `reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateError {
    #[error("the certificate is not PEM with at least one CERTIFICATE section")]
    NoCertificate,
    #[error("the chain holds more than {MAX_CHAIN} certificates")]
    ChainTooLong,
    #[error("the key is not a PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey,
    #[error("the key is of a kind this server cannot sign with")]
    UnsupportedKey,
    #[error("the private key is not the certificate's")]
    KeyMismatch,
    #[error("a certificate of the chain does not parse: {0}")]
    Malformed(String),
    #[error("the certificate does not name {0}")]
    WrongName(String),
    #[error("the certificate is not valid now (expired, or not yet valid)")]
    NotValidNow,
    #[error("the chain does not link up (each certificate must be signed by the next): {0}")]
    BadChain(String),
    #[error("the first certificate is a CA's, not a server's (the leaf goes first)")]
    NotALeaf,
    #[error("the certificate's extended key usage does not allow TLS servers")]
    NotForServers,
}

impl CertificateError {
    /// A short machine word for the API's `reason`.
    pub fn code(&self) -> &'static str {
        match self {
            CertificateError::NoCertificate => "no_certificate",
            CertificateError::ChainTooLong => "chain_too_long",
            CertificateError::NoKey => "no_key",
            CertificateError::UnsupportedKey => "unsupported_key",
            CertificateError::KeyMismatch => "key_mismatch",
            CertificateError::Malformed(_) => "malformed",
            CertificateError::WrongName(_) => "wrong_name",
            CertificateError::NotValidNow => "not_valid_now",
            CertificateError::BadChain(_) => "bad_chain",
            CertificateError::NotALeaf => "not_a_leaf",
            CertificateError::NotForServers => "not_for_servers",
        }
    }
}

/// Refuses a CA certificate in the leaf's place, and a leaf whose extended key usage leaves
/// TLS servers out (webpki checks the usage too, but only on a chain of two or more).
fn leaf_use(leaf: &x509_cert::Certificate) -> Result<(), CertificateError> {
    use x509_cert::der::oid::AssociatedOid;
    use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage};
    const SERVER_AUTH: &str = "1.3.6.1.5.5.7.3.1";
    const ANY_USAGE: &str = "2.5.29.37.0";
    for ext in leaf.tbs_certificate.extensions.iter().flatten() {
        let value = ext.extn_value.as_bytes();
        if ext.extn_id == BasicConstraints::OID {
            let bc = BasicConstraints::from_der(value)
                .map_err(|e| CertificateError::Malformed(e.to_string()))?;
            if bc.ca {
                return Err(CertificateError::NotALeaf);
            }
        } else if ext.extn_id == ExtendedKeyUsage::OID {
            let eku = ExtendedKeyUsage::from_der(value)
                .map_err(|e| CertificateError::Malformed(e.to_string()))?;
            let serves = eku.0.iter().any(|oid| {
                let oid = oid.to_string();
                oid == SERVER_AUTH || oid == ANY_USAGE
            });
            if !serves {
                return Err(CertificateError::NotForServers);
            }
        }
    }
    Ok(())
}

/// The chain (leaf first, at most `max` certificates) and the signing key of `key_pem`.
fn load(
    chain_pem: &str,
    key_pem: &str,
    max: usize,
) -> Result<
    (
        Vec<CertificateDer<'static>>,
        std::sync::Arc<dyn rustls::sign::SigningKey>,
    ),
    CertificateError,
> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CertificateError::NoCertificate)?;
    if chain.is_empty() {
        return Err(CertificateError::NoCertificate);
    }
    if chain.len() > max {
        return Err(CertificateError::ChainTooLong);
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|_| CertificateError::NoKey)?;
    let signer = crate::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|_| CertificateError::UnsupportedKey)?;
    Ok((chain, signer))
}

/// Checks `chain_pem` (leaf first) and `key_pem` for `name` at `now_ms`.
pub fn check(
    chain_pem: &str,
    key_pem: &str,
    name: &str,
    now_ms: i64,
) -> Result<CheckedCertificate, CertificateError> {
    let (chain, signer) = load(chain_pem, key_pem, MAX_CHAIN)?;
    let provider = crate::provider();
    let certified = CertifiedKey::new(chain, signer);
    certified
        .keys_match()
        .map_err(|_| CertificateError::KeyMismatch)?;
    let chain = &certified.cert;

    let leaf = x509_cert::Certificate::from_der(&chain[0])
        .map_err(|e| CertificateError::Malformed(e.to_string()))?;
    let validity = &leaf.tbs_certificate.validity;
    let ms = |t: x509_cert::time::Time| -> i64 {
        i64::try_from(t.to_unix_duration().as_millis()).unwrap_or(i64::MAX)
    };
    let (not_before_ms, not_after_ms) = (ms(validity.not_before), ms(validity.not_after));
    let issuer = leaf.tbs_certificate.issuer.to_string();
    leaf_use(&leaf)?;

    let end_entity = webpki::EndEntityCert::try_from(&chain[0])
        .map_err(|e| CertificateError::Malformed(format!("{e:?}")))?;
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|_| CertificateError::WrongName(name.to_string()))?;
    end_entity
        .verify_is_valid_for_subject_name(&server_name)
        .map_err(|_| CertificateError::WrongName(name.to_string()))?;
    if now_ms < not_before_ms || now_ms > not_after_ms {
        return Err(CertificateError::NotValidNow);
    }
    if chain.len() >= 2 {
        let last = &chain[chain.len() - 1];
        let anchor = webpki::anchor_from_trusted_cert(last)
            .map_err(|e| CertificateError::Malformed(format!("{e:?}")))?;
        let now = UnixTime::since_unix_epoch(std::time::Duration::from_millis(
            u64::try_from(now_ms).unwrap_or(0),
        ));
        end_entity
            .verify_for_usage(
                provider.signature_verification_algorithms.all,
                &[anchor],
                &chain[1..chain.len() - 1],
                now,
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .map_err(|e| match e {
                webpki::Error::CertExpired { .. } | webpki::Error::CertNotValidYet { .. } => {
                    CertificateError::NotValidNow
                }
                other => CertificateError::BadChain(format!("{other:?}")),
            })?;
    }
    Ok(CheckedCertificate {
        certified,
        not_before_ms,
        not_after_ms,
        issuer,
    })
}

/// A TLS-ALPN-01 challenge certificate (RFC 8737) ready to serve: self-signed, for one name,
/// carrying the critical `acmeIdentifier` extension that webpki (rightly) refuses in a
/// certificate for browsers, so only its PEM and its key's match are checked.
pub fn challenge_key(cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, CertificateError> {
    let (chain, signer) = load(cert_pem, key_pem, 1)?;
    // `CertifiedKey::keys_match` reads the certificate through webpki, which refuses the
    // critical extension: the public keys are compared here.
    use x509_cert::der::Encode;
    let leaf = x509_cert::Certificate::from_der(&chain[0])
        .map_err(|e| CertificateError::Malformed(e.to_string()))?;
    let spki = leaf
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| CertificateError::Malformed(e.to_string()))?;
    if signer.public_key().as_deref() != Some(&spki[..]) {
        return Err(CertificateError::KeyMismatch);
    }
    Ok(CertifiedKey::new(chain, signer))
}

/// What identifies a certificate to its CA's renewal information (RFC 9773 §4.1): the leaf's
/// authority key identifier and its serial number's DER content, both as DER bytes.
pub fn ari_identifier(chain_pem: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    use x509_cert::der::oid::AssociatedOid;
    use x509_cert::ext::pkix::AuthorityKeyIdentifier;
    let leaf = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()?
        .ok()?;
    let cert = x509_cert::Certificate::from_der(&leaf).ok()?;
    let aki = cert
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .find(|e| e.extn_id == AuthorityKeyIdentifier::OID)
        .and_then(|e| AuthorityKeyIdentifier::from_der(e.extn_value.as_bytes()).ok())?
        .key_identifier?;
    let serial = cert.tbs_certificate.serial_number.as_bytes().to_vec();
    Some((aki.as_bytes().to_vec(), serial))
}
