//! The redirect decision: a pure function of the parsed request, the tables and `now`
//! (docs/ARCHITECTURE.md, "Code"). Steps 1–7 of "The request path" there, minus the origin's I/O:
//!
//! 1. anything but GET/HEAD → 405;
//! 2. the path is `/<code>` or `/<code>+` (the preview); length routes the code: 7 base62
//!    characters → FF1-decrypt and check the high-water mark (404 by arithmetic, no lookup);
//!    8–64 characters of `[A-Za-z0-9_-]`, not all digits → an alias; anything else → 404;
//! 3. denylist: `Gone` → 410; `Warn` → the interstitial (a preview still shows the preview);
//!    `Changed` (the link's state moved after the snapshot was built) → skip the snapshot's stale
//!    entry and answer from the overlay;
//! 4. snapshot, 5. overlay: a hit is served by [`serve`]: expired → 410, a URL that is not
//!    `http(s)://` visible ASCII → 410 (nothing else may reach `Location`), preview → preview,
//!    flagged → interstitial, else 302;
//! 6. a miss → [`Answer::NeedOrigin`] when an origin is configured (only the origin may say 404
//!    for a code below the mark), else 404. Once the origin replies, [`answer_from_origin`]
//!    finishes with the same rules.
//!
//! In safe mode (the feed is lost, [`Tables::safe_mode`]) a link found locally is not served
//! straight away: [`decide`] returns [`Answer::NeedOrigin`] so the origin confirms its state
//! first, and [`decide_unconfirmed`] gives the local answer if the origin cannot.
//!
//! The [`Layer`] returned beside each answer is the table that settled it, for metrics.

use lasthop_core::{is_servable, CodeKind, LinkStatus, CODE_LEN};

use crate::denylist::Deny;
use crate::domains::{link_key, Domain};
use crate::http::{HttpError, Method, Request};
use crate::tables::Tables;

/// The table that settled an answer (metrics' "answers by layer"; never labelled by code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Settled before any table: bad method, a path that is no code at all, a malformed request.
    Invalid,
    /// A generated code above the high-water mark: 404 by arithmetic.
    HighWater,
    /// The denylist said 410. (A `warn` entry is counted where its URL was found.)
    Denylist,
    /// Found in the snapshot.
    Snapshot,
    /// Found in the overlay; also a miss everywhere when no origin is configured (the last
    /// table asked).
    Overlay,
    /// Handed to the origin, or answered from its reply.
    Origin,
}

impl Layer {
    /// Every layer, in request-path order.
    pub const ALL: [Layer; 6] = [
        Layer::Invalid,
        Layer::HighWater,
        Layer::Denylist,
        Layer::Snapshot,
        Layer::Overlay,
        Layer::Origin,
    ];

    /// The metric label values, indexed by layer.
    pub const NAMES: [&'static str; 6] = [
        "invalid",
        "high_water",
        "denylist",
        "snapshot",
        "overlay",
        "origin",
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// What to answer; [`crate::render::render`] turns it into bytes. Borrows the request's buffer
/// (the code) and the tables (the URL), so deciding copies nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// 302 to `url` (always servable: `http(s)://` and visible ASCII).
    Redirect { url: &'a [u8] },
    /// A redirect with the link's own options (issue 43): its status, its cache lifetime, the
    /// request's query forwarded into `url` (`crate::query`).
    RedirectWith {
        url: &'a [u8],
        options: lasthop_core::LinkOptions,
    },
    /// 302 to a branded domain's root or not-found destination (its settings): no link was
    /// followed, so no click.
    DomainRedirect { url: &'a [u8] },
    /// `/<code>+`: a page (or JSON) showing the destination, no redirect. `flagged` when the
    /// link is on the warning list. `domain`: the branded domain the code is on.
    Preview {
        code: &'a [u8],
        domain: Option<&'a [u8]>,
        url: &'a [u8],
        flagged: bool,
    },
    /// The warning interstitial for a flagged link.
    Warn {
        code: &'a [u8],
        domain: Option<&'a [u8]>,
        url: &'a [u8],
    },
    /// 404.
    NotFound,
    /// 410: deleted, disabled, taken down, expired, or a URL that may not be served.
    Gone,
    /// 405 with `Allow: GET, HEAD`; the connection stays open.
    MethodNotAllowed,
    /// A request that did not parse: its status, and the connection closes.
    BadRequest(HttpError),
    /// Not in any local table and an origin exists: look `code` up there, then call
    /// [`answer_from_origin`]. Rendering it directly gives 503. It carries what the decision
    /// learnt, so the request is finished later without deciding (or decrypting) again.
    NeedOrigin {
        code: &'a [u8],
        /// The branded domain the code is on (the origin is asked for its key `domain/code`).
        domain: Option<&'a [u8]>,
        preview: bool,
        /// The origin may remember a 404 for this code: an alias, or a generated code below its
        /// region's published mark (never in the reserve window above it, where a new link may
        /// appear at any moment).
        cache_negative: bool,
        /// Found locally and sent to be confirmed (safe mode): if the origin cannot answer,
        /// [`decide_unconfirmed`] serves the local answer.
        confirming: bool,
    },
    /// 503: the origin could not answer and nothing stale was at hand.
    Unavailable,
    /// 425 Too Early: a request other than GET/HEAD arrived in TLS 0-RTT early data (RFC 8470).
    TooEarly,
    /// 200 with an ACME HTTP-01 key authorization: `/.well-known/acme-challenge/TOKEN` on a
    /// branded domain whose certificate is being ordered (RFC 8555 §8.3).
    AcmeChallenge { key_authorization: &'a [u8] },
}

impl Answer<'_> {
    /// The response status.
    pub fn status(&self) -> u16 {
        match self {
            Answer::Redirect { .. } | Answer::DomainRedirect { .. } => 302,
            Answer::RedirectWith { options, .. } => options.redirect_status,
            Answer::Preview { .. } | Answer::Warn { .. } | Answer::AcmeChallenge { .. } => 200,
            Answer::NotFound => 404,
            Answer::Gone => 410,
            Answer::MethodNotAllowed => 405,
            Answer::BadRequest(e) => e.status(),
            Answer::NeedOrigin { .. } | Answer::Unavailable => 503,
            Answer::TooEarly => 425,
        }
    }

    /// Whether the connection must close after this answer whatever the client asked.
    pub fn closes(&self) -> bool {
        match self {
            Answer::BadRequest(e) => e.closes(),
            _ => false,
        }
    }
}

/// How much of the snapshot a request's arrival fetches: a connection's memory of what its
/// requests turned out to be. A paged snapshot keeps each entry in its bucket's page, so
/// fetching the whole page as a request arrives makes a cold hit wait for one memory access
/// instead of two; but that fetch is made before the decrypt knows whether the code was ever
/// issued, and a scanner's codes never were. So once a connection's last
/// [`Prefetcher::SCANS`] answers were all settled by the high-water mark, its requests fetch
/// the bucket line alone (what the decrypt's midway hint then builds on) until one asks for a
/// code that may exist (below the mark, or an alias: found or not, such a code may be hot):
/// a scanning flood costs memory bandwidth of one line a request, not a page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefetcher {
    scans: u8,
}

impl Prefetcher {
    /// Answers in a row settled by the high-water mark after which a connection counts as
    /// scanning.
    pub const SCANS: u8 = 2;

    /// Starts the memory fetch for the code a request's raw bytes seem to ask for (`GET /`
    /// or `HEAD /`, then seven code characters), before the request is parsed: the parse and
    /// the decrypt then run while the lines are on their way, and [`decide`] finds the bucket
    /// and (mostly) the entry in cache. A hint only: it reads nothing but `buf`, and garbage
    /// costs one wasted prefetch.
    #[inline]
    pub fn prefetch(&self, buf: &[u8], t: &Tables) {
        let Some(snapshot) = t.snapshot.as_deref() else {
            return;
        };
        let Some(rest) = buf
            .strip_prefix(b"GET /")
            .or_else(|| buf.strip_prefix(b"HEAD /"))
        else {
            return;
        };
        if let Some(code) = rest.get(..CODE_LEN) {
            if rest
                .get(CODE_LEN)
                .is_some_and(|&b| matches!(b, b' ' | b'+' | b'?'))
            {
                if self.scanning() {
                    snapshot.probe(code);
                } else {
                    snapshot.prefetch(code);
                }
            }
        }
    }

    /// [`Prefetcher::prefetch`] for a request whose path is already known (HTTP/2's
    /// `:path`, as soon as the header block is decoded): the rest of the request's handling
    /// runs while the lines are on their way.
    #[inline]
    pub fn prefetch_path(&self, path: &[u8], t: &Tables) {
        let Some(snapshot) = t.snapshot.as_deref() else {
            return;
        };
        let Some(code) = path.strip_prefix(b"/").and_then(|r| r.get(..CODE_LEN)) else {
            return;
        };
        if path.len() == CODE_LEN + 1 || matches!(path.get(CODE_LEN + 1), Some(b'+' | b'?')) {
            if self.scanning() {
                snapshot.probe(code);
            } else {
                snapshot.prefetch(code);
            }
        }
    }

    /// Records how a request was settled: a high-water answer counts towards scanning; an
    /// answer from any table, or one handed to the origin, ends it.
    #[inline]
    pub fn answered(&mut self, layer: Layer) {
        match layer {
            Layer::HighWater => self.scans = self.scans.saturating_add(1).min(Self::SCANS),
            Layer::Denylist | Layer::Snapshot | Layer::Overlay | Layer::Origin => self.scans = 0,
            // Not a code at all: says nothing either way.
            Layer::Invalid => {}
        }
    }

    /// Whether this connection's requests fetch the bucket line alone.
    pub fn scanning(&self) -> bool {
        self.scans >= Self::SCANS
    }
}

/// Decides the answer to `req` from the tables at `now_ms` (Unix milliseconds). Never
/// allocates, never blocks.
pub fn decide<'a>(req: &Request<'a>, t: &'a Tables, now_ms: i64) -> (Answer<'a>, Layer) {
    decide_in(req, t, now_ms, t.safe_mode && t.has_origin, false)
}

/// The local answer for a request that was parked to be confirmed in safe mode
/// ([`Answer::NeedOrigin`] with `confirming`) and whose confirmation failed: redirect
/// availability comes first (the caller counts it). Its code passed the high-water check when
/// it was parked and marks only rise, so it is not decrypted again.
pub fn decide_unconfirmed<'a>(
    req: &Request<'a>,
    t: &'a Tables,
    now_ms: i64,
) -> (Answer<'a>, Layer) {
    decide_in(req, t, now_ms, false, true)
}

#[inline]
fn decide_in<'a>(
    req: &Request<'a>,
    t: &'a Tables,
    now_ms: i64,
    confirm: bool,
    mark_checked: bool,
) -> (Answer<'a>, Layer) {
    if req.method == Method::Other {
        return (Answer::MethodNotAllowed, Layer::Invalid);
    }
    let Some((code, preview)) = code_of(req.path) else {
        return (Answer::NotFound, Layer::Invalid);
    };
    // A branded domain's requests are its namespace's (one length check when there is none).
    let domain = t.domains.find(req.host);
    if let Some(settled) = domain.and_then(|d| domain_first(d, code, preview)) {
        return settled;
    }
    let mut slot = None;
    let key = link_key(&mut slot, domain, code);
    // One inlined copy for every domain: a second (a branded path of its own) left FF1 and the
    // lookup out of line and cost the default domain's hit ~75 instructions (callgrind).
    let decided = decide_key(t, now_ms, confirm, mark_checked, code, key, domain, preview);
    match (
        decided,
        domain.and_then(|d| d.not_found_redirect.as_deref()),
    ) {
        ((Answer::NotFound, layer), Some(url)) => (Answer::DomainRedirect { url }, layer),
        (decided, _) => decided,
    }
}

/// What a branded domain settles before any table: its suspension (410) and `GET /` (its root
/// redirect).
#[inline(never)]
fn domain_first<'a>(domain: &'a Domain, code: &[u8], preview: bool) -> Option<(Answer<'a>, Layer)> {
    if domain.suspended {
        return Some((Answer::Gone, Layer::Denylist));
    }
    if code.is_empty() && !preview {
        if let Some(url) = domain.root_redirect.as_deref() {
            return Some((Answer::DomainRedirect { url }, Layer::Invalid));
        }
    }
    None
}

/// Whether an imported link may have `key` (a legacy code, or a claimed 7-character code above
/// its region's mark): the snapshot's legacy set, or the overlay (links since the snapshot).
/// Off the hot path: only legacy-shaped codes and codes above the mark get here.
#[cold]
#[inline(never)]
fn legacy_may_exist(t: &Tables, key: &[u8]) -> bool {
    t.snapshot
        .as_deref()
        .is_some_and(|s| s.legacy_may_contain(key))
        || t.overlay.get(key).is_some()
}

/// Whether a code that is neither a generated code nor an alias is looked up: a legacy code
/// ([`lasthop_core::legacy_shape`]) that may exist ([`legacy_may_exist`]) or that its domain's
/// old shortener may have (issue 44's lazy fallback).
#[cold]
#[inline(never)]
fn legacy_lookup(t: &Tables, code: &[u8], key: &[u8], domain: Option<&Domain>) -> bool {
    // The fallback: the origin is asked, and asks the domain's old shortener.
    lasthop_core::legacy_shape(code)
        && (legacy_may_exist(t, key) || (t.has_origin && t.domains.legacy_fallback(domain)))
}

/// The path of ACME HTTP-01 answers, less its leading `/` (RFC 8555 §8.3).
pub const ACME_CHALLENGE_PREFIX: &[u8] = b".well-known/acme-challenge/";

/// A path that is no code: a branded domain's published ACME HTTP-01 answer, else 404.
#[cold]
fn acme_or_not_found<'a>(domain: Option<&'a Domain>, path: &[u8], preview: bool) -> Answer<'a> {
    let answer = domain
        .filter(|_| !preview)
        .zip(path.strip_prefix(ACME_CHALLENGE_PREFIX))
        .and_then(|(d, token)| d.acme_answer(token));
    match answer {
        Some(key_authorization) => Answer::AcmeChallenge { key_authorization },
        None => Answer::NotFound,
    }
}

/// Whether `path` asks for an ACME HTTP-01 answer (the plain listener's HTTPS redirect lets
/// it through: a CA validates over plain HTTP).
pub fn is_acme_challenge(path: &[u8]) -> bool {
    path.strip_prefix(b"/")
        .is_some_and(|p| p.starts_with(ACME_CHALLENGE_PREFIX))
}

/// The decision for `code` (its [link key](lasthop_core::split_key) `key`, on `domain`).
#[allow(clippy::too_many_arguments)]
#[inline]
fn decide_key<'a>(
    t: &'a Tables,
    now_ms: i64,
    confirm: bool,
    mark_checked: bool,
    code: &'a [u8],
    key: &[u8],
    domain: Option<&'a Domain>,
    preview: bool,
) -> (Answer<'a>, Layer) {
    let domain_name = domain.map(|d| &*d.name);
    let snapshot = t.snapshot.as_deref();
    // `counter`: the decrypted counter of a generated code, when it was decrypted here.
    // The hot path's question as before imports; a legacy code is told apart below, cold.
    let kind = lasthop_core::classify_native(code);
    let (probe, counter) = match kind {
        CodeKind::Generated => {
            // The key's hash, and a hint for its bucket line (the page's lines were asked for
            // by [`Prefetcher::prefetch`] as the request arrived; a caller that skipped it
            // still gets the bucket fetched under the decrypt). The high-water check below
            // decides whether the lookup happens.
            let probe = snapshot.map(|s| s.probe(key));
            // Halfway through the decrypt the bucket has arrived: fetch the entry's lines.
            let midway = || {
                if let (Some(s), Some(probe)) = (snapshot, probe) {
                    s.prefetch_entry(probe);
                }
            };
            if mark_checked {
                midway();
                (probe, None)
            } else {
                match t.scheme.decode_with(code, midway) {
                    Some(n) if t.high_water.may_be_issued(n) => (probe, Some(n)),
                    // Above the mark: never issued here, unless an import claimed it.
                    _ if legacy_may_exist(t, key) => (probe, None),
                    _ => return (Answer::NotFound, Layer::HighWater),
                }
            }
        }
        CodeKind::Alias => (None, None),
        // Another shortener's code, moved in: looked up only when the legacy set says it may
        // exist, so a scanner's junk of this shape still costs no lookup.
        CodeKind::Legacy | CodeKind::Invalid if legacy_lookup(t, code, key, domain) => (None, None),
        CodeKind::Legacy | CodeKind::Invalid => {
            return (acme_or_not_found(domain, code, preview), Layer::Invalid)
        }
    };
    // Whether a 404 from the origin may be cached: an alias's always; a generated code's only
    // below its region's mark (not in the reserve, which a fresh lease may fill), worked out
    // only when the origin is asked (a hit never needs it).
    let need_origin = |confirming| Answer::NeedOrigin {
        code,
        domain: domain_name,
        preview,
        cache_negative: match counter {
            Some(n) => t.high_water.below_mark(n),
            None => kind != CodeKind::Generated,
        },
        confirming,
    };
    let (warn, snapshot) = match t.denylist.check(key) {
        Some(Deny::Gone) => return (Answer::Gone, Layer::Denylist),
        Some(Deny::Warn) => (true, snapshot),
        // Changed after the snapshot: its entry there is stale; the overlay has the link.
        Some(Deny::Changed) => (false, None),
        None => (false, snapshot),
    };
    let entry = snapshot.and_then(|s| match probe {
        Some(probe) => s.lookup_probe(key, probe),
        None => s.lookup(key),
    });
    if let Some(entry) = entry {
        if confirm {
            return (need_origin(true), Layer::Origin);
        }
        let found = Found {
            url: entry.url(),
            expires_at_ms: entry.expires_at_ms(),
            warn,
            // Version 4 carries a link's own options; every other entry has the defaults.
            options: entry.own_options(),
        };
        return (
            serve(code, domain_name, preview, found, now_ms),
            Layer::Snapshot,
        );
    }
    if let Some(link) = t.overlay.get(key) {
        if confirm {
            return (need_origin(true), Layer::Origin);
        }
        let found = Found {
            url: &link.url,
            expires_at_ms: link.expires_at_ms,
            warn: warn || link.warn,
            options: own(link.options),
        };
        return (
            serve(code, domain_name, preview, found, now_ms),
            Layer::Overlay,
        );
    }
    if t.has_origin {
        (need_origin(false), Layer::Origin)
    } else {
        (Answer::NotFound, Layer::Overlay)
    }
}

/// A link as the origin reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginLink<'a> {
    pub url: &'a [u8],
    pub expires_at_ms: Option<i64>,
    /// The status at the origin's clock when it answered.
    pub status: LinkStatus,
    /// Flagged or held: the interstitial.
    pub warn: bool,
    /// How the redirect is served.
    pub options: lasthop_core::LinkOptions,
}

/// Finishes an [`Answer::NeedOrigin`] once the origin replied: `link` is what it returned,
/// `None` when it says the code does not exist. The denylist is consulted again (it may have
/// changed while the origin was asked, and either source flagging a link is enough); deleted,
/// disabled, taken down and expired (at the origin's clock or at ours) answer 410.
pub fn answer_from_origin<'a>(
    code: &'a [u8],
    preview: bool,
    t: &'a Tables,
    host: &[u8],
    link: Option<OriginLink<'a>>,
    now_ms: i64,
) -> (Answer<'a>, Layer) {
    let domain = t.domains.find(host);
    let mut slot = None;
    let key = link_key(&mut slot, domain, code);
    let domain = domain.map(|d| &*d.name);
    let warn = match t.denylist.check(key) {
        Some(Deny::Gone) => return (Answer::Gone, Layer::Denylist),
        Some(Deny::Warn) => true,
        // The origin's answer is the link's current form anyway.
        Some(Deny::Changed) | None => false,
    };
    let Some(link) = link else {
        return (Answer::NotFound, Layer::Origin);
    };
    let answer = match link.status {
        LinkStatus::Active => {
            let found = Found {
                url: link.url,
                expires_at_ms: link.expires_at_ms,
                warn: warn || link.warn,
                options: own(link.options),
            };
            serve(code, domain, preview, found, now_ms)
        }
        LinkStatus::Expired
        | LinkStatus::Deleted
        | LinkStatus::Disabled
        | LinkStatus::TakenDown => Answer::Gone,
    };
    (answer, Layer::Origin)
}

/// A link some table found.
#[derive(Debug, Clone, Copy)]
struct Found<'a> {
    url: &'a [u8],
    expires_at_ms: Option<i64>,
    warn: bool,
    /// The link's own options; `None` at the defaults (a plain snapshot entry says so without
    /// any options to compare).
    options: Option<lasthop_core::LinkOptions>,
}

/// `options` as [`Found`] keeps them.
#[inline]
fn own(options: lasthop_core::LinkOptions) -> Option<lasthop_core::LinkOptions> {
    (!options.is_default()).then_some(options)
}

/// Step 7 for a found link: expiry, the serve-time URL check, then preview, interstitial or 302.
#[inline]
fn serve<'a>(
    code: &'a [u8],
    domain: Option<&'a [u8]>,
    preview: bool,
    found: Found<'a>,
    now_ms: i64,
) -> Answer<'a> {
    if found.expires_at_ms.is_some_and(|at| now_ms >= at) || !is_servable(found.url) {
        // An empty URL (a deletion tombstone) fails is_servable too.
        return Answer::Gone;
    }
    if preview {
        Answer::Preview {
            code,
            domain,
            url: found.url,
            flagged: found.warn,
        }
    } else if found.warn {
        Answer::Warn {
            code,
            domain,
            url: found.url,
        }
    } else {
        match found.options {
            None => Answer::Redirect { url: found.url },
            Some(options) => Answer::RedirectWith {
                url: found.url,
                options,
            },
        }
    }
}

/// `/<code>` or `/<code>+` → (code, preview).
#[inline]
pub(crate) fn code_of(path: &[u8]) -> Option<(&[u8], bool)> {
    let rest = path.strip_prefix(b"/")?;
    Some(match rest.strip_suffix(b"+") {
        Some(code) => (code, true),
        None => (rest, false),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use lasthop_core::{CodeScheme, HighWater, PermutationKey};
    use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter};

    use super::*;
    use crate::denylist::Denylist;
    use crate::http::{parse, Limits, Parse};
    use crate::overlay::{Overlay, OverlayLink};

    pub(crate) const NOW: i64 = 1_700_000_000_000;
    pub(crate) const ISSUED: u64 = 1_000;
    pub(crate) const RESERVE: u64 = 100;

    pub(crate) struct Fixture {
        pub tables: Tables,
        pub scheme: CodeScheme,
    }

    impl Fixture {
        pub fn code(&self, n: u64) -> String {
            self.scheme.encode_string(n).unwrap()
        }
    }

    /// Counters 0..ISSUED are issued; 0..10 are in the snapshot with various states, 10 and
    /// "overlay-alias" in the overlay.
    pub(crate) fn fixture(has_origin: bool) -> Fixture {
        let key = PermutationKey::from_bytes(&[7u8; 16]).unwrap();
        let scheme = CodeScheme::new(&key).unwrap();
        let mut hw = HighWater::new(1, RESERVE).unwrap();
        hw.raise(0, ISSUED).unwrap();
        let mut w = SnapshotWriter::in_memory(SnapshotMeta::new(9, key.id(), hw)).unwrap();
        let c = |n| scheme.encode(n).unwrap();
        w.add(&c(0), b"https://example.com/zero", None).unwrap();
        w.add(&c(1), b"https://example.com/expired", Some(NOW - 1))
            .unwrap();
        w.add(&c(2), b"https://example.com/later", Some(NOW + 1))
            .unwrap();
        w.add(&c(3), b"https://example.com/denied", None).unwrap();
        w.add(&c(4), b"https://example.com/<warn>&\"q\"", None)
            .unwrap();
        w.add(&c(5), b"javascript:alert(1)", None).unwrap();
        w.add(&c(6), b"https://example.com/a\r\nSet-Cookie: x=1", None)
            .unwrap();
        w.add(&c(7), b"", None).unwrap(); // a deletion tombstone
        w.add(b"spring-sale", b"https://shop.example/spring", None)
            .unwrap();
        w.add(b"12345678a", b"https://shop.example/digits", None)
            .unwrap();
        let (_, bytes) = w.seal().unwrap();
        let snapshot = Arc::new(Snapshot::from_vec(bytes).unwrap());
        let tables = Tables::from_snapshot(scheme.clone(), snapshot, has_origin).unwrap();
        let denylist = Denylist::new([
            (c(3).to_vec(), Deny::Gone),
            (c(4).to_vec(), Deny::Warn),
            (b"gone-alias".to_vec(), Deny::Gone),
        ]);
        let link =
            |url: &str, expires_at_ms, warn| OverlayLink::new(url.as_bytes(), expires_at_ms, warn);
        let overlay = Overlay::empty().with_all([
            (c(10).to_vec(), link("https://example.com/ten", None, false)),
            (
                b"overlay-alias".to_vec(),
                link("http://o.example/", None, false),
            ),
            (
                c(11).to_vec(),
                link("https://example.com/flagged", None, true),
            ),
            (
                c(12).to_vec(),
                link("https://example.com/old", Some(NOW), false),
            ),
        ]);
        let tables = tables
            .with_denylist(Arc::new(denylist))
            .with_overlay(Arc::new(overlay));
        Fixture { tables, scheme }
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: lh.example\r\n\r\n").into_bytes()
    }

    fn decide_buf<'a>(buf: &'a [u8], t: &'a Tables) -> (Answer<'a>, Layer) {
        match parse(buf, &Limits::default()) {
            Parse::Complete { req, .. } => decide(&req, t, NOW),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn generated_hit_redirects() {
        let f = fixture(false);
        let buf = get(&format!("/{}", f.code(0)));
        let (a, layer) = decide_buf(&buf, &f.tables);
        assert_eq!(
            a,
            Answer::Redirect {
                url: b"https://example.com/zero"
            }
        );
        assert_eq!(layer, Layer::Snapshot);
        // The query string is dropped, not an error.
        let buf = get(&format!("/{}?utm=1", f.code(0)));
        assert_eq!(decide_buf(&buf, &f.tables).0.status(), 302);
    }

    #[test]
    fn changed_codes_skip_the_stale_snapshot_entry() {
        let f = fixture(false);
        // Code 7 is a tombstone in the snapshot (410); restored after it was built, the feed
        // put its current form in the overlay and marked it Changed.
        let c7 = f.code(7);
        let buf = get(&format!("/{c7}"));
        assert_eq!(decide_buf(&buf, &f.tables).0, Answer::Gone);
        let t = f
            .tables
            .with_denylist(Arc::new(Denylist::new([(c7.as_bytes(), Deny::Changed)])))
            .with_overlay(Arc::new(f.tables.overlay.with_inserted(
                c7.as_bytes(),
                OverlayLink::new(b"https://example.com/restored", None, false),
            )));
        assert_eq!(
            decide_buf(&buf, &t),
            (
                Answer::Redirect {
                    url: b"https://example.com/restored"
                },
                Layer::Overlay
            )
        );
    }

    #[test]
    fn safe_mode_confirms_local_hits_at_the_origin() {
        let f = fixture(true);
        let mut t = f.tables.clone();
        t.safe_mode = true;
        let c0 = f.code(0);
        let buf = get(&format!("/{c0}"));
        assert_eq!(
            decide_buf(&buf, &t),
            (
                Answer::NeedOrigin {
                    domain: None,
                    code: c0.as_bytes(),
                    preview: false,
                    cache_negative: true,
                    confirming: true,
                },
                Layer::Origin
            )
        );
        // The local answer stays available for when the origin cannot confirm.
        let Parse::Complete { req, .. } = parse(&buf, &Limits::default()) else {
            panic!()
        };
        assert_eq!(decide_unconfirmed(&req, &t, NOW).0.status(), 302);
        // Denylisted codes and scanners are settled locally even in safe mode.
        let buf = get(&format!("/{}", f.code(3)));
        assert_eq!(decide_buf(&buf, &t), (Answer::Gone, Layer::Denylist));
        let buf = get(&format!("/{}", f.code(ISSUED + RESERVE)));
        assert_eq!(decide_buf(&buf, &t).1, Layer::HighWater);
        // Without an origin there is nothing to confirm with.
        let mut alone = fixture(false).tables;
        alone.safe_mode = true;
        let buf = get(&format!("/{c0}"));
        assert_eq!(decide_buf(&buf, &alone).0.status(), 302);
    }

    #[test]
    fn never_issued_is_404_by_arithmetic() {
        let f = fixture(true);
        // Above mark + reserve: 404 even with an origin, from the high-water layer.
        let buf = get(&format!("/{}", f.code(ISSUED + RESERVE)));
        assert_eq!(
            decide_buf(&buf, &f.tables),
            (Answer::NotFound, Layer::HighWater)
        );
        // Inside the reserve: not provably unissued, so it goes to the origin.
        let code = f.code(ISSUED + RESERVE - 1);
        let buf = get(&format!("/{code}"));
        assert_eq!(
            decide_buf(&buf, &f.tables),
            (
                Answer::NeedOrigin {
                    domain: None,
                    code: code.as_bytes(),
                    preview: false,
                    cache_negative: false,
                    confirming: false,
                },
                Layer::Origin
            )
        );
    }

    /// Tables with two branded domains: `go.example.com` (with its own `spring-sale`, a
    /// generated code, a flagged alias and a denied one) and `lh.test` (suspended), plus
    /// `redirecting.example` with root and not-found redirects.
    fn branded(f: &Fixture) -> Tables {
        use crate::domains::{Domain, Domains};
        let c = |n| f.scheme.encode(n).unwrap();
        let key = |d: &str, code: &[u8]| [d.as_bytes(), b"/", code].concat();
        let link = |url: &str, warn| OverlayLink::new(url.as_bytes(), None, warn);
        let overlay = Overlay::empty().with_all([
            (
                key("go.example.com", b"spring-sale"),
                link("https://go.example/spring", false),
            ),
            (
                key("go.example.com", &c(20)),
                link("https://go.example/twenty", false),
            ),
            (
                key("go.example.com", b"flagged-alias"),
                link("https://go.example/flagged", true),
            ),
            (
                key("go.example.com", b"denied-alias"),
                link("https://go.example/denied", false),
            ),
            (
                key("lh.test", b"spring-sale"),
                link("https://lh.example/spring", false),
            ),
        ]);
        let denylist = Denylist::new([(key("go.example.com", b"denied-alias"), Deny::Gone)]);
        let mut suspended = Domain::new("lh.test");
        suspended.suspended = true;
        let mut redirecting = Domain::new("redirecting.example");
        redirecting.root_redirect = Some(b"https://brand.example/"[..].into());
        redirecting.not_found_redirect = Some(b"https://brand.example/missing"[..].into());
        f.tables
            .with_overlay(Arc::new(overlay))
            .with_denylist(Arc::new(denylist))
            .with_domains(Arc::new(Domains::new([
                Domain::new("go.example.com"),
                suspended,
                redirecting,
            ])))
    }

    fn on(host: &str, path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
    }

    #[test]
    fn a_branded_host_is_looked_up_in_its_own_namespace() {
        let f = fixture(false);
        let t = branded(&f);
        // The same alias on two domains: two destinations.
        assert_eq!(
            decide_buf(&on("go.example.com", "/spring-sale"), &t),
            (
                Answer::Redirect {
                    url: b"https://go.example/spring"
                },
                Layer::Overlay
            )
        );
        assert_eq!(
            decide_buf(&on("lh.example", "/spring-sale"), &t).0,
            Answer::Redirect {
                url: b"https://shop.example/spring"
            },
            "any other Host is the default domain's"
        );
        // Host in another case, with a port and a trailing dot.
        assert_eq!(
            decide_buf(&on("GO.example.com.:8443", "/spring-sale"), &t).0,
            Answer::Redirect {
                url: b"https://go.example/spring"
            }
        );
        // A generated code is found on its own domain only.
        let twenty = f.code(20);
        assert_eq!(
            decide_buf(&on("go.example.com", &format!("/{twenty}")), &t).0,
            Answer::Redirect {
                url: b"https://go.example/twenty"
            }
        );
        assert_eq!(
            decide_buf(&on("lh.example", &format!("/{twenty}")), &t).0,
            Answer::NotFound
        );
        // A default-domain code asked on a branded domain: 404, not the default's link.
        let zero = f.code(0);
        assert_eq!(
            decide_buf(&on("lh.example", &format!("/{zero}")), &t)
                .0
                .status(),
            302
        );
        assert_eq!(
            decide_buf(&on("go.example.com", &format!("/{zero}")), &t).0,
            Answer::NotFound
        );
        assert_eq!(
            decide_buf(&on("go.example.com", "/12345678a"), &t).0,
            Answer::NotFound
        );
        // Never issued: still 404 by arithmetic, before any lookup.
        assert_eq!(
            decide_buf(
                &on("go.example.com", &format!("/{}", f.code(ISSUED + RESERVE))),
                &t
            ),
            (Answer::NotFound, Layer::HighWater)
        );
        // Its denylist and its flags are the domain's own.
        assert_eq!(
            decide_buf(&on("go.example.com", "/denied-alias"), &t),
            (Answer::Gone, Layer::Denylist)
        );
        assert_eq!(
            decide_buf(&on("go.example.com", "/flagged-alias"), &t).0,
            Answer::Warn {
                code: b"flagged-alias",
                domain: Some(b"go.example.com"),
                url: b"https://go.example/flagged",
            }
        );
        assert_eq!(
            decide_buf(&on("go.example.com", "/spring-sale+"), &t).0,
            Answer::Preview {
                code: b"spring-sale",
                domain: Some(b"go.example.com"),
                url: b"https://go.example/spring",
                flagged: false,
            }
        );
    }

    #[test]
    fn a_published_acme_answer_is_served_on_its_domain_only() {
        use crate::domains::{Domain, Domains};
        let f = fixture(false);
        let mut go = Domain::new("go.example.com");
        go.acme_http = vec![(b"tok-EN_1"[..].into(), b"tok-EN_1.thumb"[..].into())].into();
        let mut redirecting = Domain::new("redirecting.example");
        redirecting.not_found_redirect = Some(b"https://brand.example/missing"[..].into());
        redirecting.acme_http = vec![(b"r"[..].into(), b"r.thumb"[..].into())].into();
        let t = f
            .tables
            .with_domains(Arc::new(Domains::new([go, redirecting])));
        let path = "/.well-known/acme-challenge/tok-EN_1";
        assert_eq!(
            decide_buf(&on("go.example.com", path), &t),
            (
                Answer::AcmeChallenge {
                    key_authorization: b"tok-EN_1.thumb"
                },
                Layer::Invalid
            )
        );
        assert_eq!(
            decide_buf(&on("go.example.com:80", path), &t).0.status(),
            200
        );
        // Another token, another domain's token, the default domain, a preview: 404.
        for (host, path) in [
            ("go.example.com", "/.well-known/acme-challenge/other"),
            ("go.example.com", "/.well-known/acme-challenge/r"),
            ("go.example.com", "/.well-known/acme-challenge/tok-EN_1+"),
            ("go.example.com", "/.well-known/acme-challenge/"),
            ("lh.example", path),
        ] {
            assert_eq!(
                decide_buf(&on(host, path), &t).0,
                Answer::NotFound,
                "{host}{path}"
            );
        }
        // A domain's not-found redirect does not swallow its answer.
        assert_eq!(
            decide_buf(
                &on("redirecting.example", "/.well-known/acme-challenge/r"),
                &t
            )
            .0,
            Answer::AcmeChallenge {
                key_authorization: b"r.thumb"
            }
        );
        assert!(is_acme_challenge(b"/.well-known/acme-challenge/x"));
        assert!(!is_acme_challenge(b"/.well-known/other"));
        assert!(!is_acme_challenge(b"/abcdefg"));
    }

    #[test]
    fn a_branded_key_is_found_in_the_snapshot() {
        use crate::domains::{Domain, Domains};
        let f = fixture(false);
        let mut hw = HighWater::new(1, RESERVE).unwrap();
        hw.raise(0, ISSUED).unwrap();
        let mut w =
            SnapshotWriter::in_memory(SnapshotMeta::new(10, f.scheme.key_id(), hw)).unwrap();
        w.add(b"spring-sale", b"https://shop.example/spring", None)
            .unwrap();
        w.add(
            b"go.example.com/spring-sale",
            b"https://go.example/snapshot",
            None,
        )
        .unwrap();
        let key = [&b"go.example.com/"[..], &f.scheme.encode(40).unwrap()].concat();
        w.add(&key, b"https://go.example/forty", None).unwrap();
        let (_, bytes) = w.seal().unwrap();
        let snapshot = Arc::new(Snapshot::from_vec(bytes).unwrap());
        let t = f
            .tables
            .with_snapshot(snapshot)
            .unwrap()
            .with_overlay(Arc::new(Overlay::empty()))
            .with_domains(Arc::new(Domains::new([Domain::new("go.example.com")])));
        assert_eq!(
            decide_buf(&on("go.example.com", "/spring-sale"), &t),
            (
                Answer::Redirect {
                    url: b"https://go.example/snapshot"
                },
                Layer::Snapshot
            )
        );
        assert_eq!(
            decide_buf(&on("lh.example", "/spring-sale"), &t).0,
            Answer::Redirect {
                url: b"https://shop.example/spring"
            }
        );
        let forty = f.code(40);
        assert_eq!(
            decide_buf(&on("go.example.com", &format!("/{forty}")), &t),
            (
                Answer::Redirect {
                    url: b"https://go.example/forty"
                },
                Layer::Snapshot
            )
        );
        assert_eq!(
            decide_buf(&on("lh.example", &format!("/{forty}")), &t).0,
            Answer::NotFound
        );
    }

    /// Version 4: a snapshot entry with options of its own answers with its status, its
    /// cache lifetime and its query forwarding, as an overlay link with them does; a plain
    /// entry beside it still answers the default 302.
    #[test]
    fn a_snapshot_entry_with_options_answers_with_them() {
        use lasthop_core::LinkOptions;
        let f = fixture(false);
        let mut hw = HighWater::new(1, RESERVE).unwrap();
        hw.raise(0, ISSUED).unwrap();
        let mut w =
            SnapshotWriter::in_memory(SnapshotMeta::new(10, f.scheme.key_id(), hw)).unwrap();
        let permanent = LinkOptions {
            redirect_status: 301,
            cache_seconds: 86_400,
            ..LinkOptions::default()
        };
        let uncached = LinkOptions {
            redirect_status: 307,
            cache_seconds: 0,
            ..LinkOptions::default()
        };
        let request_first = LinkOptions {
            redirect_status: 308,
            forward_query: true,
            request_precedence: true,
            ..LinkOptions::default()
        };
        let c = |n| f.scheme.encode(n).unwrap();
        w.add_with_options(&c(0), b"https://example.com/p", None, permanent)
            .unwrap();
        w.add(&c(1), b"https://example.com/plain", None).unwrap();
        w.add_with_options(
            b"uncached-link",
            b"https://example.com/u",
            Some(NOW + 1),
            uncached,
        )
        .unwrap();
        w.add_with_options(
            b"go.example.com/request-first",
            b"https://go.example/r?a=1",
            None,
            request_first,
        )
        .unwrap();
        let (_, bytes) = w.seal().unwrap();
        let snapshot = Arc::new(Snapshot::from_vec(bytes).unwrap());
        let t = f
            .tables
            .with_snapshot(snapshot)
            .unwrap()
            .with_overlay(Arc::new(Overlay::empty()))
            .with_domains(Arc::new(crate::domains::Domains::new([
                crate::domains::Domain::new("go.example.com"),
            ])));
        let rendered = |buf: &[u8]| {
            let Parse::Complete { req, .. } = parse(buf, &Limits::default()) else {
                panic!()
            };
            let mut out = Vec::new();
            crate::render::render_for(&decide(&req, &t, NOW).0, &req, &mut out);
            String::from_utf8(out).unwrap()
        };

        let buf = get(&format!("/{}?x=1", f.code(0)));
        assert_eq!(
            decide_buf(&buf, &t),
            (
                Answer::RedirectWith {
                    url: b"https://example.com/p",
                    options: permanent
                },
                Layer::Snapshot
            )
        );
        let out = rendered(&buf);
        assert!(
            out.starts_with("HTTP/1.1 301 Moved Permanently\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Location: https://example.com/p\r\n"),
            "the query dropped: {out}"
        );
        assert!(
            out.contains("Cache-Control: private, max-age=86400\r\n"),
            "{out}"
        );

        let buf = get(&format!("/{}", f.code(1)));
        assert_eq!(
            decide_buf(&buf, &t),
            (
                Answer::Redirect {
                    url: b"https://example.com/plain"
                },
                Layer::Snapshot
            )
        );

        let buf = get("/uncached-link");
        assert_eq!(decide_buf(&buf, &t).0.status(), 307);
        let out = rendered(&buf);
        assert!(
            out.starts_with("HTTP/1.1 307 Temporary Redirect\r\n"),
            "{out}"
        );
        assert!(out.contains("Cache-Control: no-store\r\n"), "{out}");

        let buf = on("go.example.com", "/request-first?a=9&b=2");
        assert_eq!(
            decide_buf(&buf, &t),
            (
                Answer::RedirectWith {
                    url: b"https://go.example/r?a=1",
                    options: request_first
                },
                Layer::Snapshot
            )
        );
        let out = rendered(&buf);
        assert!(
            out.starts_with("HTTP/1.1 308 Permanent Redirect\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Location: https://go.example/r?a=9&b=2\r\n"),
            "{out}"
        );
        // A preview shows the destination as it is, whatever the options.
        assert_eq!(
            decide_buf(&get(&format!("/{}+", f.code(0))), &t).0,
            Answer::Preview {
                code: f.code(0).as_bytes(),
                domain: None,
                url: b"https://example.com/p",
                flagged: false,
            }
        );
    }

    #[test]
    fn a_branded_miss_goes_to_the_origin_under_its_domain() {
        let f = fixture(true);
        let t = branded(&f);
        assert_eq!(
            decide_buf(&on("go.example.com", "/not-here-alias"), &t).0,
            Answer::NeedOrigin {
                code: b"not-here-alias",
                domain: Some(b"go.example.com"),
                preview: false,
                cache_negative: true,
                confirming: false,
            }
        );
        let found = OriginLink {
            url: b"https://go.example/from-origin",
            expires_at_ms: None,
            status: LinkStatus::Active,
            warn: false,
            options: Default::default(),
        };
        assert_eq!(
            answer_from_origin(
                b"denied-alias",
                false,
                &t,
                b"go.example.com",
                Some(found),
                NOW
            )
            .0,
            Answer::Gone,
            "the domain's denylist entry wins over the origin's answer"
        );
        assert_eq!(
            answer_from_origin(b"denied-alias", false, &t, b"lh.example", Some(found), NOW).0,
            Answer::Redirect {
                url: b"https://go.example/from-origin"
            },
            "the default domain's code of that name is another link"
        );
    }

    #[test]
    fn domain_settings_and_suspension() {
        let f = fixture(false);
        let t = branded(&f);
        assert_eq!(
            decide_buf(&on("lh.test", "/spring-sale"), &t),
            (Answer::Gone, Layer::Denylist),
            "a suspended domain's links answer 410"
        );
        assert_eq!(decide_buf(&on("lh.test", "/"), &t).0, Answer::Gone);
        assert_eq!(
            decide_buf(&on("redirecting.example", "/"), &t).0,
            Answer::DomainRedirect {
                url: b"https://brand.example/"
            }
        );
        assert_eq!(
            decide_buf(&on("redirecting.example", "/no-such-alias"), &t).0,
            Answer::DomainRedirect {
                url: b"https://brand.example/missing"
            }
        );
        assert_eq!(
            decide_buf(&on("redirecting.example", "/bad.path"), &t).0,
            Answer::DomainRedirect {
                url: b"https://brand.example/missing"
            }
        );
        assert_eq!(
            decide_buf(&on("go.example.com", "/"), &t).0,
            Answer::NotFound,
            "no root redirect set"
        );
        assert_eq!(
            decide_buf(&on("lh.example", "/"), &t).0,
            Answer::NotFound,
            "the default domain is unchanged"
        );
    }

    #[test]
    fn aliases() {
        let f = fixture(false);
        let (a, layer) = decide_buf(b"GET /spring-sale HTTP/1.1\r\nHost: a\r\n\r\n", &f.tables);
        assert_eq!(
            a,
            Answer::Redirect {
                url: b"https://shop.example/spring"
            }
        );
        assert_eq!(layer, Layer::Snapshot);
        let (a, _) = decide_buf(b"GET /12345678a HTTP/1.1\r\nHost: a\r\n\r\n", &f.tables);
        assert_eq!(a.status(), 302);
        for bad in [
            "/all-bad.char",
            "/123456789",
            "/",
            "/abc",
            "/abcdef",
            "/spring-sale/x",
            "*",
        ] {
            let buf = get(bad);
            assert_eq!(
                decide_buf(&buf, &f.tables),
                (Answer::NotFound, Layer::Invalid),
                "{bad}"
            );
        }
        let long = get(&format!("/{}", "a".repeat(65)));
        assert_eq!(
            decide_buf(&long, &f.tables),
            (Answer::NotFound, Layer::Invalid)
        );
        let miss = get("/no-such-alias");
        assert_eq!(
            decide_buf(&miss, &f.tables),
            (Answer::NotFound, Layer::Overlay)
        );
    }

    #[test]
    fn expiry_is_410_at_and_after() {
        let f = fixture(false);
        let buf = get(&format!("/{}", f.code(1)));
        assert_eq!(decide_buf(&buf, &f.tables), (Answer::Gone, Layer::Snapshot));
        let buf = get(&format!("/{}", f.code(2)));
        assert_eq!(decide_buf(&buf, &f.tables).0.status(), 302);
        let buf = get(&format!("/{}", f.code(12)));
        assert_eq!(decide_buf(&buf, &f.tables), (Answer::Gone, Layer::Overlay));
    }

    #[test]
    fn denylist() {
        let f = fixture(true);
        let buf = get(&format!("/{}", f.code(3)));
        assert_eq!(decide_buf(&buf, &f.tables), (Answer::Gone, Layer::Denylist));
        let buf = get(&format!("/{}+", f.code(3)));
        assert_eq!(
            decide_buf(&buf, &f.tables),
            (Answer::Gone, Layer::Denylist),
            "preview too"
        );
        // Denylisted aliases are gone before the origin is asked.
        let buf = get("/gone-alias");
        assert_eq!(decide_buf(&buf, &f.tables), (Answer::Gone, Layer::Denylist));
    }

    #[test]
    fn warn_gives_interstitial_unless_preview() {
        let f = fixture(false);
        let code = f.code(4);
        let buf = get(&format!("/{code}"));
        let (a, layer) = decide_buf(&buf, &f.tables);
        assert_eq!(
            a,
            Answer::Warn {
                domain: None,
                code: code.as_bytes(),
                url: b"https://example.com/<warn>&\"q\""
            }
        );
        assert_eq!(layer, Layer::Snapshot);
        let buf = get(&format!("/{code}+"));
        assert!(matches!(
            decide_buf(&buf, &f.tables).0,
            Answer::Preview { flagged: true, .. }
        ));
        let buf = get(&format!("/{}", f.code(11)));
        assert!(matches!(
            decide_buf(&buf, &f.tables),
            (Answer::Warn { .. }, Layer::Overlay)
        ));
    }

    #[test]
    fn preview() {
        let f = fixture(false);
        let code = f.code(0);
        let buf = get(&format!("/{code}+"));
        assert_eq!(
            decide_buf(&buf, &f.tables).0,
            Answer::Preview {
                domain: None,
                code: code.as_bytes(),
                url: b"https://example.com/zero",
                flagged: false
            }
        );
        let buf = get("/spring-sale+");
        assert!(matches!(
            decide_buf(&buf, &f.tables).0,
            Answer::Preview {
                code: b"spring-sale",
                ..
            }
        ));
        let buf = get(&format!("/{code}++"));
        assert_eq!(decide_buf(&buf, &f.tables).0, Answer::NotFound);
    }

    #[test]
    fn unservable_urls_are_gone() {
        let f = fixture(false);
        for n in [5, 6, 7] {
            let buf = get(&format!("/{}", f.code(n)));
            assert_eq!(decide_buf(&buf, &f.tables), (Answer::Gone, Layer::Snapshot));
            let buf = get(&format!("/{}+", f.code(n)));
            assert_eq!(decide_buf(&buf, &f.tables).0, Answer::Gone);
        }
    }

    #[test]
    fn methods() {
        let f = fixture(false);
        let code = f.code(0);
        let head = format!("HEAD /{code} HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(decide_buf(head.as_bytes(), &f.tables).0.status(), 302);
        for m in ["POST", "PUT", "DELETE", "OPTIONS", "get"] {
            let buf = format!("{m} /{code} HTTP/1.1\r\nHost: a\r\n\r\n");
            assert_eq!(
                decide_buf(buf.as_bytes(), &f.tables),
                (Answer::MethodNotAllowed, Layer::Invalid),
                "{m}"
            );
        }
    }

    #[test]
    fn overlay_hit() {
        let f = fixture(true);
        let buf = get(&format!("/{}", f.code(10)));
        assert_eq!(
            decide_buf(&buf, &f.tables),
            (
                Answer::Redirect {
                    url: b"https://example.com/ten"
                },
                Layer::Overlay
            )
        );
        let buf = get("/overlay-alias");
        assert_eq!(
            decide_buf(&buf, &f.tables),
            (
                Answer::Redirect {
                    url: b"http://o.example/"
                },
                Layer::Overlay
            )
        );
    }

    #[test]
    fn origin_needed_or_not() {
        let with = fixture(true);
        let without = fixture(false);
        let code = with.code(20);
        let buf = get(&format!("/{code}+"));
        assert_eq!(
            decide_buf(&buf, &with.tables),
            (
                Answer::NeedOrigin {
                    domain: None,
                    code: code.as_bytes(),
                    preview: true,
                    cache_negative: true,
                    confirming: false,
                },
                Layer::Origin
            )
        );
        assert_eq!(
            decide_buf(&buf, &without.tables),
            (Answer::NotFound, Layer::Overlay)
        );
    }

    #[test]
    fn from_origin() {
        let f = fixture(true);
        let t = &f.tables;
        let url = b"https://example.com/from-origin";
        let link = |status, warn, expires_at_ms| {
            Some(OriginLink {
                url,
                expires_at_ms,
                status,
                warn,
                options: Default::default(),
            })
        };
        let active = link(LinkStatus::Active, false, None);
        let code = b"abcDEF1";
        assert_eq!(
            answer_from_origin(code, false, t, b"", active, NOW),
            (Answer::Redirect { url }, Layer::Origin)
        );
        assert!(matches!(
            answer_from_origin(code, true, t, b"", active, NOW).0,
            Answer::Preview { flagged: false, .. }
        ));
        assert_eq!(
            answer_from_origin(code, false, t, b"", None, NOW),
            (Answer::NotFound, Layer::Origin)
        );
        assert!(matches!(
            answer_from_origin(
                code,
                false,
                t,
                b"",
                link(LinkStatus::Active, true, None),
                NOW
            )
            .0,
            Answer::Warn { .. }
        ));
        for gone in [
            link(LinkStatus::Deleted, false, None),
            link(LinkStatus::Disabled, false, None),
            link(LinkStatus::TakenDown, false, None),
            // Expired at the origin's clock, or at ours.
            link(LinkStatus::Expired, false, Some(NOW + 1)),
            link(LinkStatus::Active, false, Some(NOW)),
        ] {
            assert_eq!(
                answer_from_origin(code, false, t, b"", gone, NOW).0,
                Answer::Gone
            );
        }
        let ftp = Some(OriginLink {
            url: b"ftp://x/",
            expires_at_ms: None,
            status: LinkStatus::Active,
            warn: false,
            options: Default::default(),
        });
        assert_eq!(
            answer_from_origin(code, false, t, b"", ftp, NOW).0,
            Answer::Gone
        );
        // The denylist still wins over an origin that has not heard of the takedown yet.
        assert_eq!(
            answer_from_origin(b"gone-alias", false, t, b"", active, NOW),
            (Answer::Gone, Layer::Denylist)
        );
        let c4 = f.code(4);
        assert!(matches!(
            answer_from_origin(c4.as_bytes(), false, t, b"", active, NOW).0,
            Answer::Warn { .. }
        ));
    }

    #[test]
    fn layers() {
        assert_eq!(Layer::ALL.len(), 6);
        let names: Vec<_> = Layer::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(
            names,
            [
                "invalid",
                "high_water",
                "denylist",
                "snapshot",
                "overlay",
                "origin"
            ]
        );
    }

    #[test]
    fn a_connection_scanning_fetches_the_bucket_line_alone() {
        let mut pf = Prefetcher::default();
        assert!(!pf.scanning(), "a new connection fetches whole pages");
        pf.answered(Layer::HighWater);
        assert!(!pf.scanning(), "one miss is not a scan");
        pf.answered(Layer::Invalid);
        assert!(!pf.scanning(), "a path that is no code says nothing");
        pf.answered(Layer::HighWater);
        assert!(pf.scanning(), "two high-water answers in a row are");
        for _ in 0..10 {
            pf.answered(Layer::HighWater);
        }
        assert!(pf.scanning());
        pf.answered(Layer::Snapshot);
        assert!(!pf.scanning(), "a found code ends it at once");
        pf.answered(Layer::HighWater);
        pf.answered(Layer::HighWater);
        pf.answered(Layer::Origin);
        assert!(!pf.scanning());
    }

    proptest::proptest! {
        /// Whatever the path, decide never panics, and a redirect's URL is always servable.
        #[test]
        fn decide_total(path in "/[A-Za-z0-9_+.-]{0,70}") {
            let f = fixture(true);
            let buf = get(&path);
            // The pre-parse hint reads the raw bytes and never changes an answer, whole page
            // or bucket line.
            let mut pf = Prefetcher::default();
            for _ in 0..2 {
                pf.prefetch(&buf, &f.tables);
                pf.prefetch(&buf[..buf.len() / 2], &f.tables);
                pf.answered(Layer::HighWater);
            }
            proptest::prop_assert!(pf.scanning());
            pf.prefetch(&buf, &f.tables);
            if let Parse::Complete { req, .. } = parse(&buf, &Limits::default()) {
                let (a, _) = decide(&req, &f.tables, NOW);
                if let Answer::Redirect { url } | Answer::Warn { url, .. } | Answer::Preview { url, .. } = a {
                    proptest::prop_assert!(is_servable(url));
                }
            }
        }
    }
}
