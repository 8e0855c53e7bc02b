//! The archive's object storage: `--clicks-archive-url s3://BUCKET/PREFIX` (any S3-compatible
//! store, `--clicks-archive-endpoint`) or `file:///path`, through the `object_store` crate.
//!
//! Layout under the prefix (Hive-style, so engines that read Parquet on S3 prune by day and hour):
//! `day=YYYY-MM-DD/hour=HH/<source>-<partition>-<first>-<last>.parquet` ([`ObjectKey`]). Days
//! written before the Parquet archive keep their NDJSON parts, `YYYY-MM-DD/<part>.ndjson.zst`
//! (`archive.rs`); readers take both.
//!
//! An object is written whole or not at all: one PUT, or above `part_bytes` a multipart upload
//! whose id is journalled (`archive-uploads.json` beside the positions) before its first part,
//! so that a sink killed mid-upload aborts exactly its own unfinished uploads at its next start
//! and no one else's (S3 cannot list "mine"; a bucket lifecycle rule on incomplete uploads is
//! the backstop should the journal's disk be lost). On `file://` a put is a temp file renamed
//! into place, fsynced with its directory.
//!
//! `object_store` is async; the archive runs on plain threads, so this module owns a small
//! runtime and waits on it (from any thread but that runtime's own).

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use serde::{Deserialize, Serialize};

use super::Day;

/// Why the object store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectsError {
    /// The archive URL or its settings are wrong.
    #[error("--clicks-archive-url: {0}")]
    Config(String),
    /// The store answered with an error (or could not be reached).
    #[error("{url}: {source}")]
    Store {
        /// The archive URL (never its credentials).
        url: String,
        /// The error.
        source: object_store::Error,
    },
    /// The upload journal.
    #[error("{path}: {source}")]
    Journal {
        /// Its path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The archive's runtime is gone.
    #[error("the object store's runtime stopped")]
    Stopped,
}

/// Where the archive lives, as the flags say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveLocation {
    /// `s3://BUCKET/PREFIX` or `file:///path`.
    pub url: String,
    /// An S3-compatible endpoint (`http://127.0.0.1:8333`); without it, AWS (or `AWS_ENDPOINT`).
    pub endpoint: Option<String>,
    /// The S3 region (or `AWS_REGION`; `us-east-1` when neither says).
    pub region: Option<String>,
    /// An AWS-style credentials file (`[default]` or `AWS_PROFILE`'s section with
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`); without it, the
    /// standard environment variables.
    pub credentials_file: Option<PathBuf>,
}

impl ArchiveLocation {
    /// `file://DIR`.
    pub fn local(dir: &FsPath) -> ArchiveLocation {
        ArchiveLocation {
            url: format!("file://{}", dir.display()),
            endpoint: None,
            region: None,
            credentials_file: None,
        }
    }

    /// The local directory of a `file://` URL.
    pub fn local_dir(&self) -> Option<PathBuf> {
        self.url.strip_prefix("file://").map(PathBuf::from)
    }
}

/// The keys of an AWS credentials file's profile.
fn credentials(path: &FsPath) -> Result<(String, String, Option<String>), ObjectsError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ObjectsError::Config(format!(
            "--clicks-archive-credentials-file {}: {e}",
            path.display()
        ))
    })?;
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let (mut key, mut secret, mut token) = (None, None, None);
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().trim_start_matches("profile ").to_owned();
            continue;
        }
        if section != profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_owned();
            match k.trim() {
                "aws_access_key_id" => key = Some(v),
                "aws_secret_access_key" => secret = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
    }
    match (key, secret) {
        (Some(k), Some(s)) => Ok((k, s, token)),
        _ => Err(ObjectsError::Config(format!(
            "--clicks-archive-credentials-file {}: profile [{profile}] needs aws_access_key_id and aws_secret_access_key",
            path.display()
        ))),
    }
}

/// A store, its multipart interface (S3's; none on `file://`) and the prefix under it.
type Built = (Arc<dyn ObjectStore>, Option<Arc<dyn MultipartStore>>, Path);

/// The store and the prefix a location names.
fn build(loc: &ArchiveLocation) -> Result<Built, ObjectsError> {
    if let Some(dir) = loc.local_dir() {
        if !dir.is_absolute() {
            return Err(ObjectsError::Config(format!(
                "{}: a file:// URL needs an absolute path (file:///var/lib/...)",
                loc.url
            )));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| ObjectsError::Config(format!("{}: {e}", dir.display())))?;
        let fs = LocalFileSystem::new_with_prefix(&dir)
            .map_err(|e| ObjectsError::Config(format!("{}: {e}", dir.display())))?
            .with_fsync(true)
            .with_automatic_cleanup(true);
        return Ok((Arc::new(fs), None, Path::default()));
    }
    let rest = loc.url.strip_prefix("s3://").ok_or_else(|| {
        ObjectsError::Config(format!(
            "{}: expected s3://BUCKET/PREFIX or file:///path",
            loc.url
        ))
    })?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(ObjectsError::Config(format!("{}: no bucket", loc.url)));
    }
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        // The sink retries forever itself, counting each; a request gives up soon.
        .with_retry(RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(20),
            ..RetryConfig::default()
        })
        .with_client_options(
            ClientOptions::new()
                .with_connect_timeout(Duration::from_secs(5))
                .with_timeout(Duration::from_secs(120)),
        );
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        b = b.with_region("us-east-1");
    }
    if let Some(r) = &loc.region {
        b = b.with_region(r);
    }
    if let Some(e) = &loc.endpoint {
        b = b
            .with_endpoint(e)
            .with_allow_http(e.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    if let Some(path) = &loc.credentials_file {
        let (key, secret, token) = credentials(path)?;
        b = b.with_access_key_id(key).with_secret_access_key(secret);
        if let Some(t) = token {
            b = b.with_token(t);
        }
    }
    let s3 = Arc::new(
        b.build()
            .map_err(|e| ObjectsError::Config(format!("{}: {e}", loc.url)))?,
    );
    let prefix = Path::parse(prefix.trim_matches('/'))
        .map_err(|e| ObjectsError::Config(format!("{}: {e}", loc.url)))?;
    Ok((s3.clone(), Some(s3), prefix))
}

/// An object's name: where its events came from and the day and hour they happened in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The events' UTC day.
    pub day: Day,
    /// Their UTC hour.
    pub hour: u8,
    /// `spool` (the spool), or the Kafka topic.
    pub source: String,
    /// The spool segment (`<writer>.<number>`), or the Kafka partition.
    pub partition: String,
    /// The first position: a spool byte offset, or the first Kafka offset.
    pub first: u64,
    /// The last: the spool offset after the range, or the last Kafka offset.
    pub last: u64,
}

impl ObjectKey {
    /// Its path under `prefix`.
    pub fn path(&self, prefix: &Path) -> Path {
        let name = format!(
            "day={}/hour={:02}/{}-{}-{}-{}.parquet",
            self.day, self.hour, self.source, self.partition, self.first, self.last
        );
        join(prefix, &name)
    }
}

fn join(prefix: &Path, rest: &str) -> Path {
    let mut p = prefix.clone();
    for part in rest.split('/') {
        p = p.join(part);
    }
    p
}

/// One multipart upload in flight, as journalled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Upload {
    path: String,
    id: String,
}

/// The objects of one day.
#[derive(Debug, Default)]
pub struct DayObjects {
    /// Parquet objects (`day=D/hour=HH/*.parquet`), by hour.
    pub parquet: Vec<(u8, Path)>,
    /// NDJSON parts of the archive before Parquet (`D/*.ndjson.zst`).
    pub ndjson: Vec<Path>,
}

/// The archive's object store.
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    multipart: Option<Arc<dyn MultipartStore>>,
    prefix: Path,
    url: String,
    runtime: Option<tokio::runtime::Runtime>,
    /// The multipart journal (`None`: nothing to journal, or a reader).
    journal: Option<PathBuf>,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Objects {
    /// The store at `loc`. A writer passes its `journal` file for multipart upload ids.
    pub fn open(loc: &ArchiveLocation, journal: Option<PathBuf>) -> Result<Objects, ObjectsError> {
        let (store, multipart, prefix) = build(loc)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("clicks-objects")
            .enable_all()
            .build()
            .map_err(|e| ObjectsError::Config(format!("starting its runtime: {e}")))?;
        Ok(Objects {
            store,
            multipart,
            prefix,
            url: loc.url.clone(),
            runtime: Some(runtime),
            journal,
        })
    }

    /// The archive URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The prefix objects are named under.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    fn wait<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, object_store::Error>> + Send + 'static,
    ) -> Result<T, ObjectsError> {
        let rt = self.runtime.as_ref().ok_or(ObjectsError::Stopped)?;
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv()
            .map_err(|_| ObjectsError::Stopped)?
            .map_err(|source| ObjectsError::Store {
                url: self.url.clone(),
                source,
            })
    }

    fn read_journal(&self) -> Result<Vec<Upload>, ObjectsError> {
        let Some(path) = &self.journal else {
            return Ok(Vec::new());
        };
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ObjectsError::Journal {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(source) => Err(ObjectsError::Journal {
                path: path.clone(),
                source,
            }),
        }
    }

    fn write_journal(&self, uploads: &[Upload]) -> Result<(), ObjectsError> {
        let Some(path) = &self.journal else {
            return Ok(());
        };
        let err = |source| ObjectsError::Journal {
            path: path.clone(),
            source,
        };
        crate::archiver::write_durably(
            path,
            &serde_json::to_vec(uploads).map_err(|e| err(std::io::Error::other(e)))?,
        )
        .map_err(err)
    }

    /// Aborts the multipart uploads a killed run of this sink left (its journal); returns how
    /// many. An upload the store no longer knows (completed, or aborted before) is forgotten.
    pub fn abort_unfinished(&self) -> Result<usize, ObjectsError> {
        let uploads = self.read_journal()?;
        let Some(mp) = &self.multipart else {
            return Ok(0);
        };
        let mut aborted = 0;
        for u in &uploads {
            let (mp, path, id) = (Arc::clone(mp), Path::from(u.path.as_str()), u.id.clone());
            match self.wait(async move { mp.abort_multipart(&path, &id).await }) {
                Ok(()) => {
                    tracing::info!(object = %u.path, upload = %u.id, "aborted an unfinished multipart upload of a killed run");
                    aborted += 1;
                }
                Err(ObjectsError::Store {
                    source: object_store::Error::NotFound { .. },
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        self.write_journal(&[])?;
        Ok(aborted)
    }

    /// Stores `bytes` at `key`: one PUT up to `part_bytes`, else a journalled multipart upload
    /// in parts of `part_bytes` (at least 5 MiB, as S3 wants). Visible whole once this returns.
    pub fn put(
        &self,
        key: &ObjectKey,
        bytes: Bytes,
        part_bytes: usize,
    ) -> Result<(), ObjectsError> {
        let path = key.path(&self.prefix);
        let Some(mp) = self.multipart.as_ref().filter(|_| bytes.len() > part_bytes) else {
            let store = Arc::clone(&self.store);
            return self
                .wait(async move { store.put(&path, PutPayload::from(bytes)).await })
                .map(drop);
        };
        let mp2 = Arc::clone(mp);
        let p = path.clone();
        let id = self.wait(async move { mp2.create_multipart(&p).await })?;
        let upload = Upload {
            path: path.to_string(),
            id: id.clone(),
        };
        let journaled = self.read_journal().and_then(|mut journal| {
            journal.push(upload.clone());
            self.write_journal(&journal)
        });
        if let Err(e) = journaled {
            // Unjournalled, a kill would leave it for no one to abort: abort it now.
            let (mp, p, id) = (Arc::clone(mp), path.clone(), id.clone());
            let _ = self.wait(async move { mp.abort_multipart(&p, &id).await });
            return Err(e);
        }
        tracing::info!(object = %path, upload = %id, bytes = bytes.len(), "multipart upload started");
        let result =
            (|| {
                let mut parts: Vec<PartId> = Vec::new();
                for (i, chunk) in bytes.chunks(part_bytes.max(5 << 20)).enumerate() {
                    let data = bytes.slice_ref(chunk);
                    let (mp, p, id) = (Arc::clone(mp), path.clone(), id.clone());
                    parts.push(self.wait(async move {
                        mp.put_part(&p, &id, i, PutPayload::from(data)).await
                    })?);
                }
                let (mp, p, id) = (Arc::clone(mp), path.clone(), id.clone());
                self.wait(async move { mp.complete_multipart(&p, &id, parts).await })
            })();
        if result.is_err() {
            let (mp, p, id) = (Arc::clone(mp), path.clone(), id.clone());
            // Best effort: a failed abort stays journalled for the next start.
            if self
                .wait(async move { mp.abort_multipart(&p, &id).await })
                .is_err()
            {
                return result.map(drop);
            }
        }
        let mut journal = self.read_journal()?;
        journal.retain(|u| *u != upload);
        self.write_journal(&journal)?;
        result.map(drop)
    }

    /// The days the archive holds, oldest first: Parquet days (`day=D`) and NDJSON days (`D`).
    pub fn days(&self) -> Result<Vec<Day>, ObjectsError> {
        let store = Arc::clone(&self.store);
        let prefix = self.prefix.clone();
        let listed = self.wait(async move {
            store
                .list_with_delimiter(Some(&prefix).filter(|p| !p.as_ref().is_empty()))
                .await
        })?;
        let days: BTreeSet<Day> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename())
            .filter_map(|name| Day::parse(name.strip_prefix("day=").unwrap_or(name)))
            .collect();
        Ok(days.into_iter().collect())
    }

    fn list(&self, under: Path) -> Result<Vec<object_store::ObjectMeta>, ObjectsError> {
        let store = Arc::clone(&self.store);
        self.wait(async move { store.list(Some(&under)).try_collect::<Vec<_>>().await })
    }

    /// A day's objects, by name.
    pub fn day_objects(&self, day: Day) -> Result<DayObjects, ObjectsError> {
        let mut out = DayObjects::default();
        for meta in self.list(join(&self.prefix, &format!("day={day}")))? {
            let hour = meta
                .location
                .parts()
                .map(|p| p.as_ref().to_owned())
                .find_map(|p| p.strip_prefix("hour=")?.parse::<u8>().ok());
            match hour {
                Some(h) if meta.location.as_ref().ends_with(".parquet") => {
                    out.parquet.push((h, meta.location))
                }
                _ => {}
            }
        }
        for meta in self.list(join(&self.prefix, &day.to_string()))? {
            if meta.location.as_ref().ends_with(".ndjson.zst") {
                out.ndjson.push(meta.location);
            }
        }
        out.parquet.sort();
        out.ndjson.sort();
        Ok(out)
    }

    /// An object's bytes.
    pub fn get(&self, path: &Path) -> Result<Bytes, ObjectsError> {
        let (store, path) = (Arc::clone(&self.store), path.clone());
        self.wait(async move { store.get(&path).await?.bytes().await })
    }

    /// Deletes every object of `day` (both layouts); returns how many.
    pub fn delete_day(&self, day: Day) -> Result<usize, ObjectsError> {
        let mut n = 0;
        for under in [format!("day={day}"), day.to_string()] {
            let store = Arc::clone(&self.store);
            let under = join(&self.prefix, &under);
            n += self
                .wait(async move {
                    let locations = store.list(Some(&under)).map_ok(|m| m.location).boxed();
                    store.delete_stream(locations).try_collect::<Vec<_>>().await
                })?
                .len();
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hive_style() {
        let key = ObjectKey {
            day: Day::parse("2026-12-07").unwrap(),
            hour: 5,
            source: "lasthop.clicks".into(),
            partition: "3".into(),
            first: 100,
            last: 199,
        };
        assert_eq!(
            key.path(&Path::from("archive/eu")).as_ref(),
            "archive/eu/day=2026-12-07/hour=05/lasthop.clicks-3-100-199.parquet"
        );
        assert_eq!(
            key.path(&Path::default()).as_ref(),
            "day=2026-12-07/hour=05/lasthop.clicks-3-100-199.parquet"
        );
    }

    #[test]
    fn urls_are_checked() {
        let bad = |url: &str| {
            let loc = ArchiveLocation {
                url: url.into(),
                endpoint: None,
                region: None,
                credentials_file: None,
            };
            build(&loc).err().map(|e| e.to_string())
        };
        assert!(bad("http://x/y").unwrap().contains("s3://BUCKET/PREFIX"));
        assert!(bad("s3:///p").unwrap().contains("no bucket"));
        assert!(bad("file://relative/dir").unwrap().contains("absolute"));
        assert!(bad("s3://bucket/some/prefix").is_none());
    }

    #[test]
    fn credentials_files_are_read_by_profile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(
            &path,
            "[other]\naws_access_key_id = NO\naws_secret_access_key = NO\n\n[default]\n# a comment\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = s3cr3t\n",
        )
        .unwrap();
        let (k, s, t) = credentials(&path).unwrap();
        assert_eq!((k.as_str(), s.as_str(), t), ("AKIDEXAMPLE", "s3cr3t", None));
        std::fs::write(&path, "[default]\naws_access_key_id = A\n").unwrap();
        let err = credentials(&path).unwrap_err().to_string();
        assert!(
            err.contains("aws_secret_access_key") && !err.contains("= A"),
            "{err}"
        );
    }

    #[test]
    fn a_local_archive_round_trips_and_drops_days() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::open(&ArchiveLocation::local(dir.path()), None).unwrap();
        let day = Day::parse("2026-12-07").unwrap();
        let key = |hour, first| ObjectKey {
            day,
            hour,
            source: "spool".into(),
            partition: "edge-a.0000000001".into(),
            first,
            last: first + 10,
        };
        objects
            .put(&key(3, 0), Bytes::from_static(b"one"), 8 << 20)
            .unwrap();
        objects
            .put(&key(4, 10), Bytes::from_static(b"two"), 8 << 20)
            .unwrap();
        std::fs::create_dir_all(dir.path().join("2026-12-06")).unwrap();
        std::fs::write(dir.path().join("2026-12-06/000000.ndjson.zst"), b"x").unwrap();
        assert_eq!(
            objects.days().unwrap(),
            vec![day.minus(1), day],
            "both layouts"
        );
        let listed = objects.day_objects(day).unwrap();
        assert_eq!(
            listed.parquet.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(objects.get(&listed.parquet[1].1).unwrap(), "two");
        assert_eq!(objects.day_objects(day.minus(1)).unwrap().ndjson.len(), 1);
        assert_eq!(objects.delete_day(day).unwrap(), 2);
        assert_eq!(objects.delete_day(day.minus(1)).unwrap(), 1);
        assert!(objects.days().unwrap().is_empty());
    }
}
