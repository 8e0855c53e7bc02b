//! Snapshot downloads: what the feed announces is fetched beside the serving file, checked
//! against the announced size and SHA-256, verified, and only then given its final name; at
//! start-up without a local snapshot, the newest one is asked for and fetched the same way.
//! With several control planes, each is tried in turn (they share one store, so snapshot ids
//! mean the same on each).

use std::fs::File;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lasthop_core::feed::SnapshotDigest;
use lasthop_core::feed::{parse_frame, Frame, FrameError, SnapshotFrame, MAX_FRAME_LEN};
use lasthop_snapshot::{Snapshot, SnapshotError};

use super::{FeedConfig, LoadFn};

/// Why a snapshot could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DownloadError {
    /// A request got no answer, or an error status.
    #[error("{what}: {source}")]
    Request {
        what: String,
        source: Box<ureq::Error>,
    },
    /// The transfer broke off (after the resumes allowed).
    #[error("downloading: {0}")]
    Transfer(std::io::Error),
    /// The control plane answered 404 for the file (garbage-collected since it was announced).
    #[error("GET {url}: 404, the snapshot is no longer kept")]
    Gone { url: String },
    /// This host could not write or rename the file.
    #[error("{op} {}: {source}", path.display())]
    Local {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("got {got} bytes, announced {announced}")]
    Size { got: u64, announced: u64 },
    #[error("sha256 {got}, announced {announced}")]
    Digest { got: String, announced: String },
    /// The file does not open or verify.
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("file says sequence {got}, announced {announced}")]
    Sequence { got: u64, announced: u64 },
    /// `/edge/v1/snapshots/latest` answered something that is not a snapshot's description.
    #[error("snapshot description: {0}")]
    Description(String),
    /// The announcement is not signed by a pinned key (`--snapshot-verify-key`): the file is
    /// not even fetched.
    #[error("snapshot {id} refused: {source}")]
    Signature { id: String, source: SignatureError },
    /// Every control plane failed; each one's reason, by its URL.
    #[error("{}", .0.iter().map(|(url, e)| format!("{url}: {e}")).collect::<Vec<_>>().join("; "))]
    Everywhere(Vec<(String, DownloadError)>),
}

impl DownloadError {
    /// The control plane is at fault (unreachable, a 5xx, the transfer broke), rather than the
    /// file it sent or this host: fail over to the next one.
    pub fn fail_over(&self) -> bool {
        match self {
            DownloadError::Request { source, .. } => match &**source {
                ureq::Error::Status(status, _) => *status >= 500,
                ureq::Error::Transport(_) => true,
            },
            DownloadError::Transfer(_) => true,
            _ => false,
        }
    }

    fn request(what: impl Into<String>, e: ureq::Error) -> DownloadError {
        DownloadError::Request {
            what: what.into(),
            source: Box::new(e),
        }
    }

    fn local<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> DownloadError + 'a {
        move |source| DownloadError::Local {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why a snapshot's announcement failed its signature check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    #[error("it is not signed, and this engine pins snapshot keys")]
    Missing,
    #[error("its signature is not 128 hex digits")]
    Malformed,
    #[error("its signature verifies with none of the {keys} pinned key(s)")]
    NoKeyVerifies { keys: usize },
}

/// Why a `--snapshot-verify-key` file was refused.
#[derive(Debug, thiserror::Error)]
#[error("snapshot verify key {}: {reason}", path.display())]
pub struct VerifyKeyError {
    pub path: PathBuf,
    pub reason: String,
}

/// The public keys a snapshot's announcement must be signed by (`--snapshot-verify-key`,
/// Ed25519 over `SnapshotFrame::signed_message`; `lasthop-control keygen --signing` makes the
/// pair). No keys: nothing is checked (the default, and plain development set-ups).
#[derive(Debug, Clone, Default)]
pub struct SnapshotKeys(Arc<[[u8; 32]]>);

impl SnapshotKeys {
    /// Reads each file: 64 hex digits (surrounding whitespace ignored).
    pub fn load(paths: &[PathBuf]) -> Result<SnapshotKeys, VerifyKeyError> {
        let keys = paths
            .iter()
            .map(|path| {
                let err = |reason: String| VerifyKeyError {
                    path: path.clone(),
                    reason,
                };
                let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
                let bytes = hex::decode(text.trim())
                    .map_err(|_| err("not hex (want the 64 hex digits keygen printed)".into()))?;
                <[u8; 32]>::try_from(bytes.as_slice())
                    .map_err(|_| err(format!("{} bytes, an Ed25519 key has 32", bytes.len())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SnapshotKeys(keys.into()))
    }

    /// Keys pinned.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when nothing is pinned (every announcement passes).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Passes `frame` when nothing is pinned or one pinned key verifies its signature.
    pub fn check(&self, frame: &SnapshotFrame) -> Result<(), SignatureError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let sig = frame.signature.as_deref().ok_or(SignatureError::Missing)?;
        let sig = hex::decode(sig)
            .ok()
            .filter(|s| s.len() == 64)
            .ok_or(SignatureError::Malformed)?;
        let message = frame.signed_message();
        let verifies = self.0.iter().any(|key| {
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
                .verify(&message, &sig)
                .is_ok()
        });
        if verifies {
            Ok(())
        } else {
            Err(SignatureError::NoKeyVerifies { keys: self.0.len() })
        }
    }
}

/// A snapshot file that does not open or verify.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct OpenError {
    pub path: PathBuf,
    pub source: SnapshotError,
}

/// Downloads, checks and opens the snapshot `s` announces, into `data_dir/snapshots/<id>.snap`:
/// from control plane `from` (the one whose feed announced it), else from the others in turn.
pub(super) fn fetch_snapshot(
    cfg: &FeedConfig,
    s: &SnapshotFrame,
    from: usize,
) -> Result<Arc<Snapshot>, DownloadError> {
    cfg.verify_keys
        .check(s)
        .map_err(|source| DownloadError::Signature {
            id: s.id.clone(),
            source,
        })?;
    let dir = cfg.snapshot_dir();
    std::fs::create_dir_all(&dir).map_err(DownloadError::local("creating", &dir))?;
    let path = dir.join(format!("{}.snap", s.id));
    let partial = dir.join(format!(".{}.partial", s.id));
    let agent = cfg.transfer_agent();
    let mut failures = Vec::new();
    for control in cfg.control.order(from) {
        match download_to(cfg, s, &agent, control, &partial, &dir, &path) {
            Ok(snapshot) => return Ok(snapshot),
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                if e.fail_over() {
                    cfg.control.failed(control, &e.to_string());
                }
                failures.push((cfg.control.url(control).to_string(), e));
            }
        }
    }
    Err(DownloadError::Everywhere(failures))
}

/// How many times one download resumes after a broken transfer before it gives up.
const RESUMES: u32 = 5;

/// The body of [`fetch_snapshot`] for one control plane: download the zstd copy (`<url>.zst`,
/// resuming a broken transfer with `Range`) and decompress it into `partial`, or the file
/// itself from a control plane without copies; check, then rename to `path`.
fn download_to(
    cfg: &FeedConfig,
    s: &SnapshotFrame,
    agent: &ureq::Agent,
    control: usize,
    partial: &Path,
    dir: &Path,
    path: &Path,
) -> Result<Arc<Snapshot>, DownloadError> {
    let started = Instant::now();
    let zpartial = dir.join(format!(".{}.zst.partial", s.id));
    // zstd never grows data by more than a small fraction; a longer copy is not this file's.
    let zmax = s.size.saturating_add(s.size / 64).saturating_add(64 * 1024);
    let compressed = fetch_resumable(
        cfg,
        agent,
        control,
        &format!("{}.zst", s.url),
        &zpartial,
        zmax,
    );
    let (got, sha, wire) = match compressed {
        Ok(wire) => {
            let unpacked = decompress(&zpartial, partial, s.size);
            let _ = std::fs::remove_file(&zpartial);
            let (got, sha) = unpacked?;
            (got, sha, wire)
        }
        // A control plane that serves no zstd copies: the file itself.
        Err(Fetched::NotFound) => {
            let _ = std::fs::remove_file(&zpartial);
            let wire = match fetch_resumable(cfg, agent, control, &s.url, partial, s.size) {
                Ok(wire) => wire,
                Err(Fetched::NotFound) => return Err(DownloadError::Gone { url: s.url.clone() }),
                Err(Fetched::Failed(e)) => return Err(e),
            };
            let (got, sha) = hash_file(partial)?;
            (got, sha, wire)
        }
        Err(Fetched::Failed(e)) => {
            let _ = std::fs::remove_file(&zpartial);
            return Err(e);
        }
    };
    if got != s.size {
        return Err(DownloadError::Size {
            got,
            announced: s.size,
        });
    }
    if sha != s.sha256 {
        return Err(DownloadError::Digest {
            got: sha,
            announced: s.sha256.clone(),
        });
    }
    File::open(partial)
        .and_then(|f| f.sync_all())
        .map_err(DownloadError::local("fsync", partial))?;
    // Checked before it takes its final name, so a start-up never finds a bad `<id>.snap`.
    let snapshot = open_verified(cfg.load, partial)?;
    if snapshot.sequence() != s.seq {
        return Err(DownloadError::Sequence {
            got: snapshot.sequence(),
            announced: s.seq,
        });
    }
    std::fs::rename(partial, path).map_err(DownloadError::local("renaming", partial))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    tracing::info!(id = %s.id, bytes = got, transferred = wire, ms = started.elapsed().as_millis() as u64,
        control = cfg.control.url(control), "snapshot downloaded");
    Ok(Arc::new(snapshot))
}

/// Why [`fetch_resumable`] got nothing.
enum Fetched {
    /// The control plane has no such file (404).
    NotFound,
    Failed(DownloadError),
}

impl From<DownloadError> for Fetched {
    fn from(e: DownloadError) -> Fetched {
        Fetched::Failed(e)
    }
}

/// Downloads `url` (a path on control plane `control`) into `dest`, resuming from the bytes
/// it holds with `Range: bytes=N-` after a broken transfer, up to [`RESUMES`] times; a server
/// that answers 200 to a range starts the file over. A file longer than `max_len` is refused
/// (a wrong or hostile answer must not fill the disk). Returns the bytes transferred.
fn fetch_resumable(
    cfg: &FeedConfig,
    agent: &ureq::Agent,
    control: usize,
    url: &str,
    dest: &Path,
    max_len: u64,
) -> Result<u64, Fetched> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dest)
        .map_err(DownloadError::local("creating", dest))?;
    let mut have = file
        .metadata()
        .map_err(DownloadError::local("reading", dest))?
        .len();
    let mut transferred = 0u64;
    let mut resumes = 0u32;
    loop {
        let mut req = cfg.get(agent, control, url);
        if have > 0 {
            req = req.set("Range", &format!("bytes={have}-"));
        }
        let resp = match req.call() {
            Ok(resp) => resp,
            Err(ureq::Error::Status(404, _)) => return Err(Fetched::NotFound),
            // What we hold is not a prefix of the file (it cannot be, ids are immutable, but
            // a stray partial could be): start over, once.
            Err(ureq::Error::Status(416, _)) if have > 0 && resumes < RESUMES => {
                file.set_len(0)
                    .map_err(DownloadError::local("truncating", dest))?;
                have = 0;
                resumes += 1;
                continue;
            }
            Err(e) => return Err(DownloadError::request(format!("GET {url}"), e).into()),
        };
        let expected = resp
            .header("Content-Length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        match resp.status() {
            206 => {
                let from = resp
                    .header("Content-Range")
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if from != Some(have) {
                    return Err(DownloadError::Description(format!(
                        "GET {url}: asked from byte {have}, got {:?}",
                        resp.header("Content-Range")
                    ))
                    .into());
                }
            }
            _ if have > 0 => {
                // The whole file again: start over.
                file.set_len(0)
                    .map_err(DownloadError::local("truncating", dest))?;
                have = 0;
            }
            _ => {}
        }
        let mut body = resp
            .into_reader()
            .take(max_len.saturating_add(1).saturating_sub(have));
        let copied = std::io::copy(&mut body, &mut file);
        let now_have = file
            .metadata()
            .map_err(DownloadError::local("reading", dest))?
            .len();
        if now_have > max_len {
            return Err(DownloadError::Size {
                got: now_have,
                announced: max_len,
            }
            .into());
        }
        transferred += now_have - have;
        let short = expected.is_some_and(|n| now_have - have < n);
        have = now_have;
        match copied {
            Ok(_) if !short => return Ok(transferred),
            outcome => {
                let e = match outcome {
                    Err(e) => e,
                    Ok(_) => std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "short body"),
                };
                if resumes >= RESUMES {
                    return Err(DownloadError::Transfer(e).into());
                }
                resumes += 1;
                tracing::info!(url, have, resumes, error = %e, "snapshot transfer broke; resuming");
            }
        }
    }
}

/// Decompresses the zstd file `from` into `to` (at most `limit` + 1 bytes: more is a wrong
/// file, not a reason to fill the disk); returns the bytes written and their SHA-256.
fn decompress(from: &Path, to: &Path, limit: u64) -> Result<(u64, String), DownloadError> {
    let input = File::open(from).map_err(DownloadError::local("opening", from))?;
    let decoder = zstd::stream::read::Decoder::new(input).map_err(DownloadError::Transfer)?;
    let mut out = File::create(to).map_err(DownloadError::local("creating", to))?;
    // A corrupt stream is the transfer's fault (the copy's SHA-256 is not announced; the
    // decompressed bytes' is, and is checked by the caller).
    hash_copy(
        decoder.take(limit.saturating_add(1)),
        Some((&mut out, to)),
        DownloadError::Transfer,
    )
}

/// The length and SHA-256 of a downloaded file.
fn hash_file(path: &Path) -> Result<(u64, String), DownloadError> {
    let file = File::open(path).map_err(DownloadError::local("opening", path))?;
    hash_copy(file, None, |e| DownloadError::local("reading", path)(e))
}

/// Reads `input` to its end, hashing it and writing it to `out` when given; returns the length
/// and the SHA-256 (lowercase hex). `read_error` says whose fault a failed read is.
fn hash_copy(
    mut input: impl Read,
    mut out: Option<(&mut File, &Path)>,
    read_error: impl Fn(std::io::Error) -> DownloadError,
) -> Result<(u64, String), DownloadError> {
    let mut digest = SnapshotDigest::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = input.read(&mut buf).map_err(&read_error)?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
        if let Some((file, path)) = out.as_mut() {
            file.write_all(&buf[..n])
                .map_err(DownloadError::local("writing", path))?;
        }
    }
    let (sha256, got) = digest.finish();
    Ok((got, sha256))
}

/// Loads the snapshot at `path` with `load` and checks every byte of it (`verify`).
pub fn open_verified(load: LoadFn, path: &Path) -> Result<Snapshot, OpenError> {
    let err = |source| OpenError {
        path: path.to_path_buf(),
        source,
    };
    let snapshot = load(path).map_err(err)?;
    snapshot.verify().map_err(err)?;
    Ok(snapshot)
}

/// Deletes downloaded snapshots other than `keep` and the newest one before it.
pub(super) fn prune_snapshots(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".snap"))
        .collect();
    names.sort();
    let keep_name = format!("{keep}.snap");
    let Some(pos) = names.iter().position(|n| *n == keep_name) else {
        return;
    };
    for (i, name) in names.iter().enumerate() {
        // Ids start with the sequence in fixed-width hex, so names sort by age.
        if i + 1 < pos {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
}

/// The newest snapshot in `data_dir/snapshots/` that opens and verifies, with its id.
pub fn newest_local(data_dir: &Path, load: LoadFn) -> Option<(Arc<Snapshot>, String)> {
    let dir = data_dir.join("snapshots");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".snap") && !n.starts_with('.'))
        .collect();
    names.sort();
    for name in names.iter().rev() {
        match open_verified(load, &dir.join(name)) {
            Ok(s) => {
                let id = name.trim_end_matches(".snap").to_string();
                return Some((Arc::new(s), id));
            }
            Err(e) => tracing::warn!(error = %e, "skipping a local snapshot"),
        }
    }
    None
}

/// Asks the control planes for the newest snapshot and downloads it (start-up without one):
/// the one in use first, then the others in turn.
pub fn fetch_latest(cfg: &FeedConfig) -> Result<(Arc<Snapshot>, String), DownloadError> {
    let agent = cfg.control.agent().timeout(Duration::from_secs(5)).build();
    let controls = &*cfg.control;
    let mut failures = Vec::new();
    for control in controls.order(controls.current()) {
        match newest_snapshot(cfg, &agent, control) {
            Ok(frame) => {
                let snapshot = fetch_snapshot(cfg, &frame, control)?;
                return Ok((snapshot, frame.id));
            }
            Err(e) => {
                if e.fail_over() {
                    controls.failed(control, &e.to_string());
                }
                failures.push((controls.url(control).to_string(), e));
            }
        }
    }
    Err(DownloadError::Everywhere(failures))
}

/// Control plane `control`'s description of its newest snapshot.
fn newest_snapshot(
    cfg: &FeedConfig,
    agent: &ureq::Agent,
    control: usize,
) -> Result<SnapshotFrame, DownloadError> {
    let resp = cfg
        .get(agent, control, "/edge/v1/snapshots/latest")
        .call()
        .map_err(|e| DownloadError::request("asking for the newest snapshot", e))?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_FRAME_LEN as u64)
        .read_to_end(&mut body)
        .map_err(DownloadError::Transfer)?;
    let bad = |e: &dyn std::fmt::Display| DownloadError::Description(e.to_string());
    // The answer is a snapshot frame without its `type`.
    let mut value: serde_json::Value = serde_json::from_slice(&body).map_err(|e| bad(&e))?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("type".into(), serde_json::Value::from("snapshot"));
    }
    let line = serde_json::to_vec(&value).map_err(|e| bad(&e))?;
    match parse_frame(&line).map_err(|e: FrameError| bad(&e))? {
        Frame::Snapshot(frame) => Ok(frame),
        _ => Err(DownloadError::Description("not a snapshot frame".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_current_and_previous() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [1u64, 2, 3, 4] {
            std::fs::write(dir.path().join(format!("{seq:016x}-aa.snap")), b"x").unwrap();
        }
        prune_snapshots(dir.path(), &format!("{:016x}-aa", 3));
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [2u64, 3, 4].map(|s| format!("{s:016x}-aa.snap")).to_vec()
        );
    }

    /// A one-file HTTP server on a real socket: the first GET gets the headers of the whole
    /// file and half its bytes, then the connection drops; later GETs honour `Range`. Returns
    /// its base URL and the Range headers it saw.
    fn breaking_server(body: Vec<u8>) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                let mut conn = conn.unwrap();
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut range = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        range = v.trim().trim_end_matches('-').parse::<usize>().ok();
                    }
                }
                log.lock().unwrap().push(format!("{range:?}"));
                let len = body.len();
                let head = match range {
                    Some(from) => format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {from}-{}/{len}\r\nConnection: close\r\n\r\n",
                        len - from,
                        len - 1
                    ),
                    None => format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                    ),
                };
                conn.write_all(head.as_bytes()).unwrap();
                let from = range.unwrap_or(0);
                let to = if n == 0 { len / 2 } else { len };
                conn.write_all(&body[from..to]).unwrap();
            }
        });
        (base, seen)
    }

    #[test]
    fn a_broken_transfer_resumes_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let body: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let (base, seen) = breaking_server(body.clone());
        let cfg = FeedConfig {
            control: Arc::new(crate::control::ControlPlanes::new([base]).unwrap()),
            token: None,
            engine_id: "e".into(),
            pop: "p".into(),
            data_dir: dir.path().to_path_buf(),
            timeout: Duration::from_secs(5),
            safe_mode: false,
            load: |p| Snapshot::open(p),
            verify_keys: SnapshotKeys::default(),
            certificates: None,
            origin: None,
        };
        let agent = cfg.control.agent().build();
        let dest = dir.path().join("x.partial");
        let got = match fetch_resumable(&cfg, &agent, 0, "/x.zst", &dest, 1 << 20) {
            Ok(n) => n,
            Err(_) => panic!("the download resumes"),
        };
        assert_eq!(std::fs::read(&dest).unwrap(), body);
        assert_eq!(got, body.len() as u64, "every byte once");
        assert_eq!(
            *seen.lock().unwrap(),
            ["None".to_string(), format!("Some({})", body.len() / 2)]
        );
    }
}
