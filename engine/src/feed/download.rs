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

use lasthop_core::feed::{parse_frame, Frame, FrameError, SnapshotFrame, MAX_FRAME_LEN};
use lasthop_snapshot::{Snapshot, SnapshotError};
use sha2::{Digest, Sha256};

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
    /// The transfer broke off.
    #[error("downloading: {0}")]
    Transfer(std::io::Error),
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
    let agent = cfg
        .control
        .agent()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(Duration::from_secs(30))
        .build();
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

/// The body of [`fetch_snapshot`] for one control plane: download into `partial`, check, then
/// rename to `path`.
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
    let resp = cfg
        .get(agent, control, &s.url)
        .call()
        .map_err(|e| DownloadError::request(format!("GET {}", s.url), e))?;
    let mut body = resp.into_reader().take(s.size.saturating_add(1));
    let mut file = File::create(partial).map_err(DownloadError::local("creating", partial))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    loop {
        let n = body.read(&mut buf).map_err(DownloadError::Transfer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(DownloadError::local("writing", partial))?;
        got += n as u64;
    }
    if got != s.size {
        return Err(DownloadError::Size {
            got,
            announced: s.size,
        });
    }
    let sha = hex::encode(hasher.finalize());
    if sha != s.sha256 {
        return Err(DownloadError::Digest {
            got: sha,
            announced: s.sha256.clone(),
        });
    }
    file.sync_all()
        .map_err(DownloadError::local("fsync", partial))?;
    drop(file);
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
    tracing::info!(id = %s.id, bytes = got, ms = started.elapsed().as_millis() as u64,
        control = cfg.control.url(control), "snapshot downloaded");
    Ok(Arc::new(snapshot))
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
}
