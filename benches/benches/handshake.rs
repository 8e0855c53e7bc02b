//! The crypto floor of a TLS 1.3 handshake on the server, with ring (the provider the engine's
//! rustls uses; aws-lc-rs for the post-quantum hybrid's key exchange, as in the engine): what a
//! full handshake and a resumption cannot go below per server core, to put beside the
//! handshakes per server CPU-second that `perf/tls.sh` measures.
//!
//! - `ecdsa_p256_sign`: the CertificateVerify signature (P-256, SHA-256) over its 130-byte
//!   content (64 spaces, the context string, a 32-byte transcript hash).
//! - `x25519`: one ephemeral key pair and the agreement with the client's share.
//! - `key_schedule`: RFC 8446 §7.1 with HKDF-SHA256: the early, handshake and master secrets,
//!   both handshake and both application traffic secrets with their keys and IVs, the two
//!   Finished keys and MACs, the exporter and resumption secrets.
//! - `transcript`: SHA-256 over a typical handshake's messages (ClientHello, ServerHello,
//!   EncryptedExtensions, a one-certificate chain, CertificateVerify, Finished: about 2.5 KB).
//! - `full`: all of the above, one after another: the floor of a full handshake.
//! - `mlkem768_encapsulate`: the server's ML-KEM-768 half of X25519MLKEM768 (aws-lc-rs, as the
//!   engine has it): the client's 1,184-byte encapsulation key parsed, one encapsulation.
//! - `x25519mlkem768`: the server's whole hybrid key exchange through rustls' group (the
//!   encapsulation, an X25519 key pair and agreement, the shares joined).
//! - `full_x25519mlkem768`: `full` with `x25519mlkem768` in place of ring's X25519: the floor
//!   of a full handshake with the hybrid. Its X25519 half is aws-lc-rs', which costs about half
//!   of ring's on this machine's CPUs, so with the ML-KEM-768 encapsulation added it is still
//!   cheaper than `full`.
//! - `resumed_psk_dhe`: a TLS 1.3 resumption as rustls does it (psk_dhe_ke): the binder, the
//!   X25519 exchange and the key schedule, no signature.
//! - `rustls_server_full`: the server's side of a whole full TLS 1.3 handshake in rustls, in
//!   memory, configured as the engine's: its connection made, the ClientHello read, its flight
//!   written, the client's Finished read and two tickets written (the client's own work is not
//!   timed). What a rustls server pays beyond `full` before any I/O: the floor of the engine's
//!   handshakes with no TCP, no syscalls and no HTTP. With X25519 (the client offers it alone).
//! - `rustls_server_full_x25519mlkem768`: the same with a client offering only the hybrid.
//! - `rustls_server_full_sni_10000`: `rustls_server_full` through the engine's SNI resolver
//!   (`lasthop_engine::tls::sni`) holding 10,000 branded domains' certificates, each
//!   handshake's client naming another of them: what choosing among many certificates adds
//!   (issue 41's goal: within 5 % of one certificate's). Prints the bytes each certificate held
//!   costs.
//!
//! Run: `cargo bench -p lasthop-benches --bench handshake`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_lc_rs::kem::{EncapsulationKey, ML_KEM_768};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::digest::{self, SHA256};
use ring::hkdf::{KeyType, Prk, Salt, HKDF_SHA256};
use ring::hmac;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};

/// An output length for `Prk::expand`.
struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) into `out`.
fn expand_label(secret: &Prk, label: &[u8], context: &[u8], out: &mut [u8]) {
    let len = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let context_len = [context.len() as u8];
    let info = [
        &len[..],
        &label_len,
        b"tls13 ",
        label,
        &context_len,
        context,
    ];
    secret
        .expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("lengths within HKDF's bounds");
}

/// Derive-Secret: a 32-byte secret, as a PRK for the next expansions.
fn derive(secret: &Prk, label: &[u8], hash: &[u8]) -> (Prk, [u8; 32]) {
    let mut out = [0u8; 32];
    expand_label(secret, label, hash, &mut out);
    (Prk::new_less_safe(HKDF_SHA256, &out), out)
}

/// A traffic secret's key (AES-128-GCM) and IV.
fn traffic_keys(secret: &Prk) -> ([u8; 16], [u8; 12]) {
    let mut key = [0u8; 16];
    let mut iv = [0u8; 12];
    expand_label(secret, b"key", b"", &mut key);
    expand_label(secret, b"iv", b"", &mut iv);
    (key, iv)
}

/// The server's whole key schedule for one handshake from `psk` (zeros for a full handshake)
/// and the ECDHE `shared` secret, with `th` standing in for the transcript hashes.
fn key_schedule(psk: &[u8; 32], shared: &[u8], th: &[u8; 32]) -> [u8; 32] {
    let empty = digest::digest(&SHA256, b"");
    let early = Salt::new(HKDF_SHA256, &[0u8; 32]).extract(psk);
    let (_, derived) = derive(&early, b"derived", empty.as_ref());
    let handshake = Salt::new(HKDF_SHA256, &derived).extract(shared);
    let mut acc = [0u8; 32];
    for label in [&b"c hs traffic"[..], b"s hs traffic"] {
        let (secret, raw) = derive(&handshake, label, th);
        let (key, iv) = traffic_keys(&secret);
        // The Finished key and MAC over the transcript.
        let mut finished = [0u8; 32];
        expand_label(&secret, b"finished", b"", &mut finished);
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &finished), th);
        acc[0] ^= key[0] ^ iv[0] ^ raw[0] ^ tag.as_ref()[0];
    }
    let (_, derived) = derive(&handshake, b"derived", empty.as_ref());
    let master = Salt::new(HKDF_SHA256, &derived).extract(&[0u8; 32]);
    for label in [&b"c ap traffic"[..], b"s ap traffic"] {
        let (secret, raw) = derive(&master, label, th);
        let (key, iv) = traffic_keys(&secret);
        acc[1] ^= key[0] ^ iv[0] ^ raw[0];
    }
    for label in [&b"exp master"[..], b"res master"] {
        let (_, raw) = derive(&master, label, th);
        acc[2] ^= raw[0];
    }
    acc
}

/// About the bytes of a full handshake's messages, for the transcript hash.
fn transcript_bytes() -> Vec<u8> {
    (0..2_560u32).map(|i| (i * 31 % 251) as u8).collect()
}

/// The resumption binder: a PSK's binder key and the HMAC over the truncated ClientHello.
fn binder(psk: &[u8; 32], hello_hash: &[u8; 32]) -> hmac::Tag {
    let early = Salt::new(HKDF_SHA256, &[0u8; 32]).extract(psk);
    let empty = digest::digest(&SHA256, b"");
    let (binder_key, _) = derive(&early, b"res binder", empty.as_ref());
    let mut finished = [0u8; 32];
    expand_label(&binder_key, b"finished", b"", &mut finished);
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &finished), hello_hash)
}

/// Bytes of the DER certificate `perf/lib.sh`'s `tls_cert` makes (a P-256 leaf with a SAN): the
/// server copies its chain into the flight and never parses it, so a blob of the same length
/// stands in for it.
const CERT_LEN: usize = 560;

/// A server configured as the engine's by default (`engine/src/tls/config.rs`: TLS 1.3 and 1.2,
/// the server's suite order, ALPN http/1.1, a 16,384-session cache, two TLS 1.3 tickets) with a
/// P-256 key, and a TLS 1.3 client that never resumes.
fn rustls_pair(
    pkcs8: &[u8],
    group: &'static dyn rustls::crypto::SupportedKxGroup,
    branded: usize,
) -> (Arc<ServerConfig>, Arc<ClientConfig>) {
    use rustls::crypto::ring::cipher_suite as cs;
    let provider = Arc::new(CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ],
        kx_groups: ["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]
            .into_iter()
            .filter_map(lasthop_benches::kx_group)
            .collect(),
        ..rustls::crypto::ring::default_provider()
    });
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.to_vec()));
    let signer = provider
        .key_provider
        .load_private_key(key)
        .expect("the P-256 key");
    let chain = vec![CertificateDer::from(vec![0x30u8; CERT_LEN])];
    let single = Arc::new(CertifiedKey::new(chain.clone(), Arc::clone(&signer)));
    // The engine's resolver with `branded` domains' certificates, each its own chain and key
    // (the same bytes: the server never parses them), or the one certificate.
    let resolver: Arc<dyn ResolvesServerCert> = if branded == 0 {
        Arc::new(SingleCert(single))
    } else {
        let set = lasthop_engine::tls::sni::Branded::default();
        set.replace(branded_set(&provider, pkcs8, branded), Default::default());
        Arc::new(lasthop_engine::tls::sni::SniResolver::new(
            single,
            Arc::new(set),
        ))
    };
    let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    server.ignore_client_order = true;
    // The engine's default: stateful tickets in a bounded cache, 0-RTT allowed on them.
    server.session_storage = ServerSessionMemoryCache::new(16_384);
    server.max_early_data_size = 16_384;
    server.send_half_rtt_data = false;
    let client_provider = Arc::new(CryptoProvider {
        kx_groups: vec![group],
        ..(*provider).clone()
    });
    let mut client = lasthop_benches::NoCheck::tls13_client(client_provider, b"http/1.1");
    client.resumption = Resumption::disabled();
    (Arc::new(server), Arc::new(client))
}

/// The name of branded domain `i` in the benches' sets.
fn branded_name(i: usize) -> String {
    format!("go{i}.brand{}.test", i % 97)
}

/// This process's resident bytes (`/proc/self/statm`), 0 where it cannot be read.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// `n` branded certificates as the engine holds them (each a chain and its signing key, by
/// name).
fn branded_set(
    provider: &CryptoProvider,
    pkcs8: &[u8],
    n: usize,
) -> std::collections::HashMap<String, Arc<CertifiedKey>> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.to_vec()));
    (0..n)
        .map(|i| {
            let signer = provider
                .key_provider
                .load_private_key(key.clone_key())
                .expect("the P-256 key");
            let chain = vec![CertificateDer::from(vec![0x30u8; CERT_LEN])];
            (branded_name(i), Arc::new(CertifiedKey::new(chain, signer)))
        })
        .collect()
}

/// What one branded certificate costs the engine in memory: the resident growth of a fresh
/// process (nothing freed yet to reuse) holding 10,000 of them, per certificate.
fn branded_footprint(pkcs8: &[u8]) -> u64 {
    let provider = rustls::crypto::ring::default_provider();
    let n = 10_000;
    let before = rss_bytes();
    let set = branded_set(&provider, pkcs8, n);
    let held = rss_bytes().saturating_sub(before) / n as u64;
    drop(black_box(set));
    held
}

/// The one certificate, whatever the client asks.
#[derive(Debug)]
struct SingleCert(Arc<CertifiedKey>);

impl ResolvesServerCert for SingleCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0))
    }
}

/// One full TLS 1.3 handshake in memory, to the server's last ticket; returns the time spent
/// in the server's calls alone (its connection's creation included).
fn server_side(
    server: &Arc<ServerConfig>,
    client: &Arc<ClientConfig>,
    buf: &mut Vec<u8>,
    name: &str,
) -> Duration {
    let name = ServerName::try_from(name.to_string()).expect("a name");
    let mut c = ClientConnection::new(Arc::clone(client), name).expect("a client");
    let t = Instant::now();
    let mut s = ServerConnection::new(Arc::clone(server)).expect("a server");
    let mut spent = t.elapsed();
    loop {
        buf.clear();
        while c.wants_write() {
            c.write_tls(buf).expect("to memory");
        }
        let t = Instant::now();
        let mut input = &buf[..];
        while !input.is_empty() {
            s.read_tls(&mut input).expect("from memory");
            s.process_new_packets().expect("a good handshake");
        }
        let mut output = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut output).expect("to memory");
        }
        spent += t.elapsed();
        if output.is_empty() && !c.is_handshaking() && !s.is_handshaking() {
            return spent;
        }
        let mut input = &output[..];
        while !input.is_empty() {
            c.read_tls(&mut input).expect("from memory");
            c.process_new_packets().expect("a good handshake");
        }
    }
}

fn handshake(c: &mut Criterion) {
    let rng = SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("a P-256 key");
    // First, before anything is freed that the set could reuse.
    println!(
        "branded certificates held: {} bytes each (a {CERT_LEN}-byte chain, its P-256 signing \
         key, the name and the map's entry; resident growth over 10,000)",
        branded_footprint(pkcs8.as_ref())
    );
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .expect("the key just made");
    let mut to_sign = vec![b' '; 64];
    to_sign.extend_from_slice(b"TLS 1.3, server CertificateVerify\0");
    to_sign.extend_from_slice(&[7u8; 32]);
    let client = EphemeralPrivateKey::generate(&X25519, &rng).expect("an X25519 key");
    let client_share = client.compute_public_key().expect("its public key");
    let transcript = transcript_bytes();
    let th = [9u8; 32];
    let psk = [5u8; 32];

    let x25519 = || {
        let mine = EphemeralPrivateKey::generate(&X25519, &rng).expect("an X25519 key");
        let _share = mine.compute_public_key().expect("its public key");
        let peer = UnparsedPublicKey::new(&X25519, client_share.as_ref());
        agreement::agree_ephemeral(mine, &peer, |shared| {
            let mut out = [0u8; 32];
            out.copy_from_slice(shared);
            out
        })
        .expect("a valid share")
    };

    let mut group = c.benchmark_group("handshake");
    group.throughput(Throughput::Elements(1));
    group.bench_function("ecdsa_p256_sign", |b| {
        b.iter(|| key.sign(&rng, black_box(&to_sign)).expect("signs"))
    });
    group.bench_function("x25519", |b| b.iter(|| black_box(x25519())));
    group.bench_function("key_schedule", |b| {
        b.iter(|| key_schedule(&[0; 32], black_box(&[3u8; 32]), &th))
    });
    group.bench_function("transcript", |b| {
        b.iter(|| digest::digest(&SHA256, black_box(&transcript)))
    });
    group.bench_function("full", |b| {
        b.iter(|| {
            let shared = x25519();
            let hash = digest::digest(&SHA256, &transcript);
            let mut th = [0u8; 32];
            th.copy_from_slice(hash.as_ref());
            let schedule = key_schedule(&[0; 32], &shared, &th);
            let signature = key.sign(&rng, &to_sign).expect("signs");
            black_box((schedule, signature))
        })
    });
    let mut buf = Vec::new();
    for (name, kx, branded) in [
        (
            "rustls_server_full",
            rustls::crypto::ring::kx_group::X25519,
            0,
        ),
        (
            "rustls_server_full_x25519mlkem768",
            rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768,
            0,
        ),
        (
            "rustls_server_full_sni_10000",
            rustls::crypto::ring::kx_group::X25519,
            10_000,
        ),
    ] {
        let (server, client) = rustls_pair(pkcs8.as_ref(), kx, branded);
        let names: Vec<String> = if branded == 0 {
            vec!["lh.test".into()]
        } else {
            // Clients of every domain in turn, in a scattered order.
            (0..branded)
                .map(|i| branded_name(i * 7919 % branded))
                .collect()
        };
        let mut next = 0;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        next = (next + 1) % names.len();
                        server_side(&server, &client, &mut buf, &names[next])
                    })
                    .sum()
            })
        });
    }
    // The hybrid: the client's shares as a client makes them.
    let hybrid = rustls::crypto::aws_lc_rs::kx_group::X25519MLKEM768;
    let hybrid_client = hybrid.start().expect("a hybrid key pair");
    let hybrid_share = hybrid_client.pub_key().to_vec();
    // X25519MLKEM768's client share: the ML-KEM-768 encapsulation key first, then X25519's.
    let mlkem_key = hybrid_share[..1184].to_vec();
    let encapsulate = || {
        let key = EncapsulationKey::new(&ML_KEM_768, black_box(&mlkem_key)).expect("a key");
        key.encapsulate().expect("encapsulates")
    };
    group.bench_function("mlkem768_encapsulate", |b| b.iter(encapsulate));
    group.bench_function("x25519mlkem768", |b| {
        b.iter(|| {
            hybrid
                .start_and_complete(black_box(&hybrid_share))
                .expect("a valid share")
        })
    });
    group.bench_function("full_x25519mlkem768", |b| {
        b.iter(|| {
            let kx = hybrid
                .start_and_complete(&hybrid_share)
                .expect("a valid share");
            let shared = kx.secret.secret_bytes();
            let hash = digest::digest(&SHA256, &transcript);
            let mut th = [0u8; 32];
            th.copy_from_slice(hash.as_ref());
            let schedule = key_schedule(&[0; 32], shared, &th);
            let signature = key.sign(&rng, &to_sign).expect("signs");
            black_box((kx.pub_key.len(), schedule, signature))
        })
    });
    group.bench_function("resumed_psk_dhe", |b| {
        b.iter(|| {
            let tag = binder(&psk, &th);
            let shared = x25519();
            let hash = digest::digest(&SHA256, &transcript[..600]);
            let mut th = [0u8; 32];
            th.copy_from_slice(hash.as_ref());
            black_box((tag, key_schedule(&psk, &shared, &th)))
        })
    });
    group.finish();
}

criterion_group!(benches, handshake);
criterion_main!(benches);
