//! Reputation list files (`--reputation-list FILE`, repeatable): loaded at start, re-read when
//! a file changes (polled) or on SIGHUP, and checked at every create.
//!
//! Each file is one list, named after its file name without the extension (`urlhaus.csv` →
//! `urlhaus`), which is the `reason` of everything it blocks (`list:urlhaus`). Its format is
//! detected from its content ([`lasthop_trust::lists`]); a malformed line is skipped, counted
//! and logged with the file and line. A list that cannot be read, or that suddenly parses to
//! no entries at all (a truncated download), keeps its previous version loaded: the log says
//! so and `lasthop_reputation_list_stale{list}` is 1 until a good version arrives. At start a
//! list that cannot be read is an error: there is no previous version to keep.
//!
//! Every reload hands the entries it added to the caller, which takes down the existing links
//! they match (the time-bomb defence, [`super::enforce`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use lasthop_trust::{parse_list, Added, Destination, ReputationIndex};

use crate::error_chain::ErrorChain;
use crate::metrics::Metrics;

/// Largest list file read (the public feeds are a few hundred MB at most).
const MAX_LIST_BYTES: u64 = 2 << 30;
/// Malformed lines logged one by one per load; the rest are only counted.
const LOGGED_MALFORMED: usize = 20;

/// Why a list could not be loaded or reloaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListError {
    /// The list file could not be read.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The list file is larger than the most that is read (2 GiB).
    #[error("{} is larger than {MAX_LIST_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf, len: u64 },
    /// Two list files have the same name ([`list_name`]).
    #[error("two reputation lists are named {name:?} (from their file names); rename one")]
    DuplicateName { name: String },
    /// A reload found the file gone or unreadable (the log line names the file).
    #[error(transparent)]
    Stat(std::io::Error),
    /// A reload parsed to no entries a list that had some.
    #[error("it has no entries now (it had {had}): a truncated or failed download?")]
    Emptied { had: usize },
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> ListError + '_ {
    move |source| ListError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// One loaded list.
#[derive(Debug)]
pub struct LoadedList {
    pub name: String,
    pub path: PathBuf,
    pub format: &'static str,
    pub index: Arc<ReputationIndex>,
    pub malformed_lines: usize,
    pub loaded_at_ms: i64,
}

/// What a list match found: the list's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListHit {
    pub list: String,
}

/// File identity and version: inode, size, mtime.
type Stamp = (u64, u64, SystemTime);

struct Watched {
    path: PathBuf,
    name: String,
    stamp: Option<Stamp>,
    /// The file could not even be stat'ed at the last poll (already logged).
    missing: bool,
}

/// Every configured list.
pub struct ListSet {
    watched: Mutex<Vec<Watched>>,
    loaded: RwLock<Arc<Vec<Arc<LoadedList>>>>,
    metrics: Metrics,
}

impl std::fmt::Debug for ListSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListSet").finish_non_exhaustive()
    }
}

/// The list's name: the file name without its extension, lowercased, anything outside
/// `[a-z0-9._-]` as `-`.
pub fn list_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = stem
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "list".to_string()
    } else {
        name
    }
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::metadata(path)?;
    Ok((m.ino(), m.len(), m.modified()?))
}

/// Reads and parses one list file.
fn read_list(name: &str, path: &Path) -> Result<LoadedList, ListError> {
    let len = std::fs::metadata(path).map_err(read_error(path))?.len();
    if len > MAX_LIST_BYTES {
        return Err(ListError::TooLarge {
            path: path.to_path_buf(),
            len,
        });
    }
    let bytes = std::fs::read(path).map_err(read_error(path))?;
    let parsed = parse_list(&bytes);
    for m in parsed.malformed.iter().take(LOGGED_MALFORMED) {
        tracing::warn!(list = name, file = %path.display(), line = m.line, reason = m.reason, "skipping a malformed list line");
    }
    if parsed.malformed_lines > LOGGED_MALFORMED {
        tracing::warn!(
            list = name,
            file = %path.display(),
            more = parsed.malformed_lines - LOGGED_MALFORMED,
            "more malformed list lines skipped"
        );
    }
    let index = ReputationIndex::build([(name, parsed.entries.as_slice())]);
    Ok(LoadedList {
        name: name.to_string(),
        path: path.to_path_buf(),
        format: parsed.format.as_str(),
        index: Arc::new(index),
        malformed_lines: parsed.malformed_lines,
        loaded_at_ms: crate::clock::now_ms(),
    })
}

impl ListSet {
    /// Loads every list; any that cannot be read is an error.
    pub fn load(paths: &[PathBuf], metrics: Metrics) -> Result<ListSet, ListError> {
        let mut watched = Vec::new();
        let mut loaded = Vec::new();
        for path in paths {
            let name = list_name(path);
            if watched.iter().any(|w: &Watched| w.name == name) {
                return Err(ListError::DuplicateName { name });
            }
            let st = stamp(path).map_err(read_error(path))?;
            let list = read_list(&name, path)?;
            tracing::info!(list = %name, file = %path.display(), format = list.format, entries = list.index.len(), malformed = list.malformed_lines, "loaded a reputation list");
            watched.push(Watched {
                path: path.clone(),
                name,
                stamp: Some(st),
                missing: false,
            });
            loaded.push(Arc::new(list));
        }
        let set = ListSet {
            watched: Mutex::new(watched),
            loaded: RwLock::new(Arc::new(loaded)),
            metrics,
        };
        for list in set.lists().iter() {
            set.export(list, false);
        }
        Ok(set)
    }

    /// No lists at all.
    pub fn empty(metrics: Metrics) -> ListSet {
        ListSet {
            watched: Mutex::new(Vec::new()),
            loaded: RwLock::new(Arc::new(Vec::new())),
            metrics,
        }
    }

    /// The lists as loaded now.
    pub fn lists(&self) -> Arc<Vec<Arc<LoadedList>>> {
        match self.loaded.read() {
            Ok(l) => Arc::clone(&l),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// The first list (in the order given) with an entry matching `dest`.
    pub fn check(&self, dest: &Destination) -> Option<ListHit> {
        let lists = self.lists();
        lists.iter().find_map(|l| {
            l.index.check(dest).map(|hit| ListHit {
                list: hit.list.to_string(),
            })
        })
    }

    fn export(&self, list: &LoadedList, stale: bool) {
        let m = &self.metrics;
        let name = list.name.as_str();
        m.reputation_list_entries
            .with_label_values(&[name])
            .set(i64::try_from(list.index.len()).unwrap_or(i64::MAX));
        m.reputation_list_malformed_lines
            .with_label_values(&[name])
            .set(i64::try_from(list.malformed_lines).unwrap_or(i64::MAX));
        m.reputation_list_loaded_seconds
            .with_label_values(&[name])
            .set(list.loaded_at_ms as f64 / 1000.0);
        m.reputation_list_stale
            .with_label_values(&[name])
            .set(i64::from(stale));
    }

    /// Re-reads the lists whose file changed (every list with `force`, as on SIGHUP) and
    /// returns the entries each reload added, by list.
    pub fn reload(&self, force: bool) -> Vec<Vec<Added>> {
        let Ok(mut watched) = self.watched.lock() else {
            return Vec::new();
        };
        let current = self.lists();
        let mut next: Vec<Arc<LoadedList>> = current.iter().cloned().collect();
        let mut added = Vec::new();
        let mut changed = false;
        for (i, w) in watched.iter_mut().enumerate() {
            let st = stamp(&w.path);
            match &st {
                Ok(s) if !force && w.stamp.as_ref() == Some(s) => continue,
                Err(_) if !force && w.missing => continue,
                _ => {}
            }
            w.missing = st.is_err();
            let Some(old) = next.get(i).cloned() else {
                continue;
            };
            let seen = st.as_ref().ok().cloned();
            let fresh = st
                .map_err(ListError::Stat)
                .and_then(|s| read_list(&w.name, &w.path).map(|l| (s, l)))
                .and_then(|(s, l)| {
                    if l.index.is_empty() && !old.index.is_empty() {
                        return Err(ListError::Emptied {
                            had: old.index.len(),
                        });
                    }
                    Ok((s, l))
                });
            match fresh {
                Ok((s, list)) => {
                    w.stamp = Some(s);
                    let new_entries = list.index.added(&old.index);
                    tracing::info!(list = %w.name, file = %w.path.display(), format = list.format, entries = list.index.len(), added = new_entries.len(), malformed = list.malformed_lines, "reloaded a reputation list");
                    self.export(&list, false);
                    if !new_entries.is_empty() {
                        added.push(new_entries);
                    }
                    next[i] = Arc::new(list);
                    changed = true;
                }
                Err(e) => {
                    // Keep the previous version; try again at the next poll only if the file
                    // changes again (or on SIGHUP). The version remembered is the one read: a
                    // writer that finished meanwhile changed the file again.
                    if seen.is_some() {
                        w.stamp = seen;
                    }
                    tracing::error!(list = %w.name, file = %w.path.display(), error = %ErrorChain(&e), entries = old.index.len(), "cannot reload a reputation list; keeping its previous version");
                    self.metrics
                        .reputation_list_load_failures
                        .with_label_values(&[w.name.as_str()])
                        .inc();
                    self.export(&old, true);
                }
            }
        }
        if changed {
            if let Ok(mut l) = self.loaded.write() {
                *l = Arc::new(next);
            }
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_file_names() {
        assert_eq!(list_name(Path::new("/etc/lists/URLhaus.csv")), "urlhaus");
        assert_eq!(list_name(Path::new("open phish.txt")), "open-phish");
        assert_eq!(list_name(Path::new("hosts")), "hosts");
        assert_eq!(list_name(Path::new("")), "list");
    }
}
