//! The edge feed's frames and status reports: the wire types both ends share
//! (`core/FEED.md` is the contract, with examples).
//!
//! Frames travel as NDJSON, one object per line. Both ends parse them as untrusted bytes:
//! [`parse_frame`] bounds the line, rejects what does not deserialize, and validates every field
//! an engine will use as a key, a URL path or a file name, so a hostile or broken peer can end a
//! connection but never crash a process or write outside its directory.

use serde::{Deserialize, Serialize};

use crate::code::plausible_key;
pub use crate::link::DenyKind;
use crate::link::{LinkState, LinkStatus};

/// Longest frame line, without its newline.
pub const MAX_FRAME_LEN: usize = 64 * 1024;
/// Longest engine id, PoP name or snapshot id.
const MAX_NAME_LEN: usize = 64;
/// Prefix of every snapshot download path.
pub const SNAPSHOT_PATH: &str = "/edge/v1/snapshots/";
/// Where an engine fetches the branded domains' certificates.
pub const CERTIFICATES_PATH: &str = "/edge/v1/certificates";

/// One feed frame. Unknown `type`s parse as [`Frame::Unknown`] and are skipped by readers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    /// First frame of a subscription.
    Hello {
        last_seq: u64,
        time_ms: i64,
        /// The most codes a region mints per second (`--max-mint-rate`): while an engine's
        /// feed is lost it widens every region's window by this much per second, so a link
        /// minted meanwhile is never rejected by arithmetic. Absent: no bound is enforced.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mint_rate: Option<u64>,
        /// Regions this control plane's region has lost touch with (peer regions, `--peer`),
        /// each with the counters it may have minted since: the engine widens that region's
        /// window by as much, so its new links are asked of the origin, never 404'd.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        widen: Vec<Window>,
    },
    /// The full standing denylist as of change `seq`, in parts of at most [`DENYLIST_PART`]
    /// entries so every line stays under [`MAX_FRAME_LEN`]: part 0 replaces the reader's list,
    /// later parts add to it, and the list is complete at the part marked `last`.
    Denylist {
        seq: u64,
        entries: Vec<DenyEntry>,
        #[serde(default)]
        part: u32,
        #[serde(default = "yes")]
        last: bool,
    },
    LinkCreated(LinkFrame),
    StateChanged(LinkFrame),
    Snapshot(SnapshotFrame),
    /// The branded domains' certificates are at `generation`: after the snapshot frame on
    /// subscription, then whenever it moves. An engine holding another generation fetches
    /// `GET /edge/v1/certificates` ([`CERTIFICATES_PATH`]).
    Certificates {
        generation: u64,
    },
    /// At least every second when nothing else was sent.
    Heartbeat {
        last_seq: u64,
        time_ms: i64,
        /// As in `hello`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mint_rate: Option<u64>,
        /// As in `hello`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        widen: Vec<Window>,
    },
    #[serde(other)]
    Unknown,
}

/// Counters to add above region `region`'s mark (see `Frame::Hello`'s `widen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub region: u32,
    pub extra: u64,
}

fn yes() -> bool {
    true
}

/// Most entries in one `denylist` frame: 500 entries of the longest code (64 characters) make
/// a line of about 43 KiB, under [`MAX_FRAME_LEN`].
pub const DENYLIST_PART: usize = 500;

/// The standing denylist as of `seq`, as the frames that carry it (at least one, even empty).
pub fn denylist_frames(seq: u64, entries: Vec<DenyEntry>) -> Vec<Frame> {
    let parts = entries.len().div_ceil(DENYLIST_PART).max(1);
    let mut it = entries.into_iter();
    (0..parts)
        .map(|i| Frame::Denylist {
            seq,
            entries: it.by_ref().take(DENYLIST_PART).collect(),
            part: u32::try_from(i).unwrap_or(u32::MAX),
            last: i + 1 == parts,
        })
        .collect()
}

/// A standing denylist entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyEntry {
    pub code: String,
    pub deny: DenyKind,
}

/// A link's whole current state, as `link_created` and `state_changed` carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkFrame {
    pub seq: u64,
    pub code: String,
    /// Current destination; empty once deleted.
    pub long_url: String,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    /// When the link was created (`link_created`; optional on `state_changed`).
    #[serde(default)]
    pub created_at_ms: Option<i64>,
    #[serde(default)]
    pub deleted: bool,
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    pub takedown_reason: Option<String>,
    #[serde(default)]
    pub warn: bool,
    /// How the redirect is served (absent at the defaults).
    #[serde(default, skip_serializing_if = "crate::LinkOptions::is_default")]
    pub options: crate::LinkOptions,
}

impl LinkFrame {
    /// The frame for `code` at change `seq`, from the stored link's URL and state.
    pub fn new(seq: u64, code: &str, long_url: &str, state: &LinkState) -> LinkFrame {
        LinkFrame {
            seq,
            code: code.to_owned(),
            long_url: if state.deleted {
                String::new()
            } else {
                long_url.to_owned()
            },
            expires_at_ms: state.expires_at_ms,
            created_at_ms: None,
            deleted: state.deleted,
            disabled: state.disabled,
            takedown_reason: state.takedown_reason.clone(),
            // Held links are served through the interstitial too; engines need not know why.
            warn: state.interstitial(),
            options: state.options,
        }
    }

    /// The state this frame carries.
    pub fn state(&self) -> LinkState {
        LinkState {
            deleted: self.deleted,
            disabled: self.disabled,
            expires_at_ms: self.expires_at_ms,
            takedown_reason: self.takedown_reason.clone(),
            warn: self.warn,
            ..LinkState::default()
        }
    }

    /// Deleted, disabled or taken down: answered 410 whatever the clock says.
    pub fn gone(&self) -> bool {
        self.deleted || self.disabled || self.takedown_reason.is_some()
    }

    /// The standing denylist's entry for the state this frame carries
    /// ([`LinkState::deny_kind`]).
    pub fn deny_kind(&self) -> Option<DenyKind> {
        DenyKind::of(
            self.deleted,
            self.disabled || self.takedown_reason.is_some(),
            self.warn,
        )
    }
}

/// The answer of the edge listener's `GET /edge/v1/links/{code}` (the origin read-through):
/// everything an engine needs to answer for the code. The control plane writes it, engines read
/// it; unknown fields are ignored so the control plane can add some.
///
/// `status` is evaluated at the control plane's clock when answering; `expires_at_ms` travels
/// too, so the engine can expire a cached answer on its own clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeLink {
    pub code: String,
    /// The destination; empty for a deleted link.
    pub long_url: String,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    pub status: LinkStatus,
    /// Served through the warning interstitial: flagged, or held until verified.
    #[serde(default)]
    pub warn: bool,
    /// How the redirect is served (absent at the defaults).
    #[serde(default, skip_serializing_if = "crate::LinkOptions::is_default")]
    pub options: crate::LinkOptions,
}

impl EdgeLink {
    /// The edge's view of link `code` to `long_url` in `state` at `now_ms`.
    pub fn new(code: &str, long_url: &str, state: &LinkState, now_ms: i64) -> EdgeLink {
        let status = state.status(now_ms);
        EdgeLink {
            code: code.to_owned(),
            long_url: if status == LinkStatus::Deleted {
                String::new()
            } else {
                long_url.to_owned()
            },
            expires_at_ms: state.expires_at_ms,
            status,
            warn: state.interstitial(),
            options: state.options,
        }
    }
}

/// A published snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFrame {
    /// `<seq as 16 hex digits>-<8 hex digits>`; also the file's name.
    pub id: String,
    /// Complete up to this change.
    pub seq: u64,
    /// File length in bytes.
    pub size: u64,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// Download path on the edge listener: `/edge/v1/snapshots/<id>`.
    pub url: String,
    /// Ed25519 signature of [`SnapshotFrame::signed_message`] by the control plane's snapshot
    /// signing key, lowercase hex (128 digits); absent when the control plane signs nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// A snapshot file's digest as [`SnapshotFrame`] carries it: the SHA-256 of every byte,
/// lowercase hex, and the byte count. The control plane computes it when it publishes; an
/// engine, as it downloads, to check what it got against what was announced.
#[derive(Debug, Clone, Default)]
pub struct SnapshotDigest {
    hasher: sha2::Sha256,
    size: u64,
}

impl SnapshotDigest {
    /// Adds the file's next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        sha2::Digest::update(&mut self.hasher, bytes);
        self.size += bytes.len() as u64;
    }

    /// The SHA-256 (lowercase hex) and the size of everything added.
    pub fn finish(self) -> (String, u64) {
        (hex::encode(sha2::Digest::finalize(self.hasher)), self.size)
    }

    /// The digest of everything `input` yields, read in 1 MiB blocks.
    pub fn of(mut input: impl std::io::Read) -> std::io::Result<(String, u64)> {
        let mut digest = SnapshotDigest::default();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match input.read(&mut buf) {
                Ok(0) => return Ok(digest.finish()),
                Ok(n) => digest.update(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl SnapshotFrame {
    /// The bytes a snapshot signature covers: a domain-separation label, then `id`, `seq`,
    /// `size` and `sha256` in that order, each ended by a newline. The SHA-256 binds the file's
    /// bytes, the rest what the engine checks them against; `url` is not covered (it only says
    /// where to fetch them).
    pub fn signed_message(&self) -> Vec<u8> {
        format!(
            "lasthop snapshot signature v1\n{}\n{}\n{}\n{}\n",
            self.id, self.seq, self.size, self.sha256
        )
        .into_bytes()
    }
}

/// What an engine posts to `POST /edge/v1/status` about every second.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    pub engine: String,
    pub pop: String,
    pub applied_seq: u64,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    #[serde(default)]
    pub snapshot_seq: u64,
    pub feed_connected: bool,
    pub safe_mode: bool,
    /// The domains generation whose certificates, settings and ACME challenge answers the
    /// engine serves (0: none yet, or an engine from before it was reported).
    #[serde(default)]
    pub certificates_generation: u64,
    pub time_ms: i64,
}

impl StatusReport {
    /// Checks the fields the control plane keys and prints.
    pub fn validate(&self) -> Result<(), FrameError> {
        if !valid_name(&self.engine) {
            return Err(FrameError::Field("engine"));
        }
        if !valid_name(&self.pop) {
            return Err(FrameError::Field("pop"));
        }
        if let Some(id) = &self.snapshot_id {
            if !valid_snapshot_id(id) {
                return Err(FrameError::Field("snapshot_id"));
            }
        }
        Ok(())
    }
}

/// Why a frame line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame of {len} bytes is over the {MAX_FRAME_LEN}-byte limit")]
    TooLong { len: usize },
    #[error("frame is not valid: {0}")]
    Json(String),
    #[error("frame field `{0}` is invalid")]
    Field(&'static str),
}

/// An engine id, PoP name: 1–64 characters of `[A-Za-z0-9._:-]`.
pub fn valid_name(s: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A snapshot id: 1–64 characters of `[0-9a-f-]` (safe as a file name and a path segment).
pub fn valid_snapshot_id(s: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&s.len())
        && s.bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
}

fn check_link(l: &LinkFrame) -> Result<(), FrameError> {
    if !plausible_key(l.code.as_bytes()) {
        return Err(FrameError::Field("code"));
    }
    // The engine re-checks servability at serve time; here only the bound matters.
    if l.long_url.len() > MAX_FRAME_LEN {
        return Err(FrameError::Field("long_url"));
    }
    Ok(())
}

fn check_snapshot(s: &SnapshotFrame) -> Result<(), FrameError> {
    if !valid_snapshot_id(&s.id) {
        return Err(FrameError::Field("id"));
    }
    if s.sha256.len() != 64
        || !s
            .sha256
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(FrameError::Field("sha256"));
    }
    if s.url.strip_prefix(SNAPSHOT_PATH) != Some(s.id.as_str()) {
        return Err(FrameError::Field("url"));
    }
    Ok(())
}

/// Parses and validates one frame line (without its newline; a trailing `\r` or `\n` is
/// tolerated). Never panics, whatever the bytes.
pub fn parse_frame(line: &[u8]) -> Result<Frame, FrameError> {
    if line.len() > MAX_FRAME_LEN + 2 {
        return Err(FrameError::TooLong { len: line.len() });
    }
    let frame: Frame = serde_json::from_slice(line.trim_ascii_end())
        .map_err(|e| FrameError::Json(e.to_string()))?;
    match &frame {
        Frame::Denylist { entries, .. } => {
            if entries.iter().any(|e| !plausible_key(e.code.as_bytes())) {
                return Err(FrameError::Field("entries.code"));
            }
        }
        Frame::LinkCreated(l) | Frame::StateChanged(l) => check_link(l)?,
        Frame::Snapshot(s) => check_snapshot(s)?,
        Frame::Hello { .. }
        | Frame::Heartbeat { .. }
        | Frame::Certificates { .. }
        | Frame::Unknown => {}
    }
    Ok(frame)
}

/// One frame as its NDJSON line, newline included.
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    // Serializing these plain structs cannot fail (no maps with non-string keys, no I/O).
    let mut line = serde_json::to_vec(frame).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The snapshot id for a file complete up to `seq` whose SHA-256 starts with `sha256_prefix`.
pub fn snapshot_id(seq: u64, sha256_hex: &str) -> String {
    let short: String = sha256_hex.chars().take(8).collect();
    format!("{seq:016x}-{short}")
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_snapshot_digest_is_sha256_in_hex_and_the_size_whatever_the_reads() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let whole = SnapshotDigest::of(&bytes[..]).unwrap();
        let mut parts = SnapshotDigest::default();
        for chunk in bytes.chunks(77_777) {
            parts.update(chunk);
        }
        assert_eq!(parts.finish(), whole);
        assert_eq!(whole.1, 3_000_000);
        let (empty, size) = SnapshotDigest::of(&b""[..]).unwrap();
        assert_eq!(size, 0);
        assert_eq!(
            empty,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn link(seq: u64) -> LinkFrame {
        LinkFrame {
            seq,
            code: "aB3xY9q".into(),
            long_url: "https://example.com/".into(),
            expires_at_ms: None,
            created_at_ms: Some(1),
            deleted: false,
            disabled: false,
            takedown_reason: None,
            warn: false,
            options: Default::default(),
        }
    }

    #[test]
    fn frames_round_trip_and_match_feed_md() {
        let sha = "ab".repeat(32);
        let id = snapshot_id(0x1236, &sha);
        assert_eq!(id, "0000000000001236-abababab");
        let frames = [
            Frame::Hello {
                last_seq: 1,
                time_ms: 2,
                mint_rate: Some(10_000),
                widen: vec![Window {
                    region: 1,
                    extra: 20_000,
                }],
            },
            Frame::Denylist {
                seq: 1,
                entries: vec![DenyEntry {
                    code: "my-campaign".into(),
                    deny: DenyKind::Warn,
                }],
                part: 0,
                last: true,
            },
            Frame::LinkCreated(link(2)),
            Frame::StateChanged(LinkFrame {
                takedown_reason: Some("phishing".into()),
                ..link(3)
            }),
            Frame::Snapshot(SnapshotFrame {
                signature: Some("ab".repeat(64)),
                url: format!("{SNAPSHOT_PATH}{id}"),
                id,
                seq: 3,
                size: 10,
                sha256: sha,
            }),
            Frame::Heartbeat {
                last_seq: 3,
                time_ms: 4,
                mint_rate: None,
                widen: Vec::new(),
            },
        ];
        for f in &frames {
            let line = encode_frame(f);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(&parse_frame(&line).unwrap(), f);
        }
        let j = String::from_utf8(encode_frame(&frames[3])).unwrap();
        assert!(
            j.starts_with("{\"type\":\"state_changed\",\"seq\":3,"),
            "{j}"
        );
        assert!(
            parse_frame(br#"{"type":"state_changed","seq":3,"code":"xY3dE9q","long_url":""}"#)
                .unwrap()
                .eq(&Frame::StateChanged(LinkFrame {
                    seq: 3,
                    code: "xY3dE9q".into(),
                    long_url: String::new(),
                    expires_at_ms: None,
                    created_at_ms: None,
                    deleted: false,
                    disabled: false,
                    takedown_reason: None,
                    warn: false,
                    options: Default::default(),
                }))
        );
    }

    /// Issue 44: frames carry legacy codes (alone or after a domain) in link frames and
    /// denylist entries; a code no namespace can hold is still refused.
    #[test]
    fn frames_carry_legacy_codes() {
        for code in ["ab-1", "q", "12345678", "go.example.com/x_y"] {
            let line = format!(
                r#"{{"type":"link_created","seq":4,"code":"{code}","long_url":"https://old.example/"}}"#
            );
            match parse_frame(line.as_bytes()) {
                Ok(Frame::LinkCreated(l)) => assert_eq!(l.code, code),
                other => panic!("{code}: {other:?}"),
            }
            let deny = format!(
                r#"{{"type":"denylist","seq":1,"entries":[{{"code":"{code}","deny":"gone"}}]}}"#
            );
            assert!(parse_frame(deny.as_bytes()).is_ok(), "{deny}");
        }
        for bad in ["a b", "a.b", "", "go.example.com/"] {
            let line = format!(
                r#"{{"type":"link_created","seq":4,"code":"{bad}","long_url":"https://old.example/"}}"#
            );
            assert_eq!(
                parse_frame(line.as_bytes()).unwrap_err(),
                FrameError::Field("code"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn big_denylists_split_under_the_line_limit() {
        let entries: Vec<DenyEntry> = (0..1_234)
            .map(|i| DenyEntry {
                code: format!("a{i:0>63}"),
                deny: DenyKind::Gone,
            })
            .collect();
        let frames = denylist_frames(9, entries.clone());
        assert_eq!(frames.len(), 3);
        let mut back = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let line = encode_frame(f);
            assert!(line.len() <= MAX_FRAME_LEN, "{} bytes", line.len());
            let Frame::Denylist {
                entries,
                part,
                last,
                seq,
            } = parse_frame(&line).unwrap()
            else {
                panic!()
            };
            assert_eq!((seq, part as usize, last), (9, i, i == 2));
            back.extend(entries);
        }
        assert_eq!(back, entries);
        assert!(matches!(
            &denylist_frames(1, Vec::new())[..],
            [Frame::Denylist {
                part: 0,
                last: true,
                ..
            }]
        ));
        // A single frame from an older writer (no part fields) is a whole list.
        assert!(matches!(
            parse_frame(br#"{"type":"denylist","seq":1,"entries":[]}"#).unwrap(),
            Frame::Denylist {
                part: 0,
                last: true,
                ..
            }
        ));
    }

    #[test]
    fn unknown_types_and_fields_are_tolerated() {
        assert_eq!(
            parse_frame(br#"{"type":"future_thing","x":1}"#).unwrap(),
            Frame::Unknown
        );
        let f = parse_frame(br#"{"type":"heartbeat","last_seq":5,"time_ms":1,"extra":true}"#);
        assert_eq!(
            f.unwrap(),
            Frame::Heartbeat {
                last_seq: 5,
                time_ms: 1,
                mint_rate: None,
                widen: Vec::new(),
            }
        );
    }

    #[test]
    fn hostile_fields_are_refused() {
        let bad = [
            &br#"{"type":"link_created","seq":1,"code":"../etc","long_url":"x"}"#[..],
            br#"{"type":"link_created","seq":1,"code":"","long_url":"x"}"#,
            br#"{"type":"denylist","seq":1,"entries":[{"code":"a b","deny":"gone"}]}"#,
            br#"{"type":"snapshot","id":"../x","seq":1,"size":1,"sha256":"00","url":"/edge/v1/snapshots/../x"}"#,
            br#"{"type":"heartbeat","last_seq":-1,"time_ms":1}"#,
            br#"{"type":"heartbeat"}"#,
            b"not json",
            b"",
        ];
        for line in bad {
            assert!(
                parse_frame(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let sha = "0".repeat(64);
        let other = format!(
            r#"{{"type":"snapshot","id":"00-aa","seq":1,"size":1,"sha256":"{sha}","url":"http://evil/x"}}"#
        );
        assert_eq!(parse_frame(other.as_bytes()), Err(FrameError::Field("url")));
        let long = vec![b' '; MAX_FRAME_LEN + 3];
        assert!(matches!(
            parse_frame(&long),
            Err(FrameError::TooLong { .. })
        ));
    }

    #[test]
    fn status_reports_validate() {
        let mut r = StatusReport {
            engine: "host-1:8080".into(),
            pop: "ams".into(),
            applied_seq: 1,
            snapshot_id: Some("0000000000000001-abcdef01".into()),
            snapshot_seq: 1,
            feed_connected: true,
            safe_mode: false,
            certificates_generation: 0,
            time_ms: 1,
        };
        assert_eq!(r.validate(), Ok(()));
        r.pop = "a b".into();
        assert_eq!(r.validate(), Err(FrameError::Field("pop")));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_frame(&bytes);
        }

        #[test]
        fn mangled_frames_never_panic(cut in 0usize..200, flip in 0usize..200, byte in any::<u8>()) {
            let mut line = encode_frame(&Frame::StateChanged(link(7)));
            let flip = flip % line.len();
            line[flip] = byte;
            line.truncate(cut.min(line.len()));
            let _ = parse_frame(&line);
        }
    }
}
