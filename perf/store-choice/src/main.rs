//! store-choice: lasthop control-plane store benchmark (redb vs fjall).
//!
//! One "create" = one durable link creation, written atomically as:
//!   links[key]                             = JSON {url, owner, created_at}
//!   link_state[key]                        = ~40 B JSON
//!   owner_idx[owner(8) 0x00 !seq(u64 BE)]  = code
//!   changes[seq(u64 BE)]                   = ~200 B JSON change record
//!   meta["links_created"]                  = seq   (every 10,000 creates)
//!
//! Group commit: one writer thread drains up to B pending creates from a channel
//! fed by C client threads (each waits for its ack), writes them in ONE
//! transaction/batch, commits with fsync, then acks them all.
//!
//! Record key layouts (`--layout`):
//!   random:  key = the 7-char random base62 code (every create hits a random leaf)
//!   counter: key = 0x00 ‖ n (u64 BE), n a sequential counter handed out by the
//!            writer, code = base62(n) — the control plane's `record_key` for
//!            generated codes (store/src/embedded/mod.rs), so the
//!            creates of one group commit land on the same few leaves.

use std::error::Error;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const META_EVERY: u64 = 10_000;
const OWNERS: usize = 1_000;

/// How `links` / `link_state` are keyed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    /// key = 7-char random base62 code (the client's code).
    Random,
    /// key = 0x00 ‖ counter (u64 BE); the writer assigns counter = seq, so
    /// consecutive creates get consecutive keys (as with the control plane's
    /// leased counter blocks; one writer, one region).
    Counter,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Random => "random",
            Layout::Counter => "counter",
        }
    }
}

/// A record key of at most 9 bytes (7-byte code or 0x00 ‖ u64 BE), kept inline.
#[derive(Clone, Copy)]
struct RecKey {
    buf: [u8; 9],
    len: u8,
}

impl RecKey {
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

/// 7-char base62 rendering of a counter (same length as a random code).
fn counter_code(mut n: u64) -> [u8; 7] {
    let mut out = [b'0'; 7];
    for b in out.iter_mut().rev() {
        *b = BASE62[(n % 62) as usize];
        n /= 62;
    }
    out
}

// ---------------------------------------------------------------- rng / data

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    // splitmix64
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn b62<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in out.iter_mut() {
            *b = BASE62[self.below(62) as usize];
        }
        out
    }
}

#[derive(Clone)]
struct Create {
    code: [u8; 7],
    owner: [u8; 8],
    url: String,
    created_at: u64,
}

fn owner_pool() -> Vec<[u8; 8]> {
    let mut r = Rng::new(42);
    (0..OWNERS).map(|_| r.b62::<8>()).collect()
}

fn gen_create(r: &mut Rng, owners: &[[u8; 8]]) -> Create {
    let code = r.b62::<7>();
    let owner = owners[r.below(owners.len() as u64) as usize];
    let len = 40 + r.below(161) as usize; // URL 40..=200 chars
    let mut url = String::with_capacity(len);
    url.push_str("https://example.com/");
    while url.len() < len {
        url.push(BASE62[r.below(62) as usize] as char);
    }
    let created_at = 1_760_000_000_000 + r.below(1_000_000_000);
    Create { code, owner, url, created_at }
}

/// The rows one create writes (seq assigned by the single writer).
struct Rows {
    /// record key of `links` / `link_state` (depends on the layout)
    key: RecKey,
    /// the link's code (owner_idx value, change record)
    code: [u8; 7],
    link: Vec<u8>,
    state: Vec<u8>,
    owner_key: [u8; 17],
    seq_key: [u8; 8],
    change: Vec<u8>,
}

fn encode(c: &Create, seq: u64, layout: Layout) -> Rows {
    let (key, code_bytes) = match layout {
        Layout::Random => {
            let mut buf = [0u8; 9];
            buf[..7].copy_from_slice(&c.code);
            (RecKey { buf, len: 7 }, c.code)
        }
        Layout::Counter => {
            // the writer hands out counters in order: counter n = seq
            let mut buf = [0u8; 9];
            buf[1..].copy_from_slice(&seq.to_be_bytes());
            (RecKey { buf, len: 9 }, counter_code(seq))
        }
    };
    let code = std::str::from_utf8(&code_bytes).unwrap();
    let owner = std::str::from_utf8(&c.owner).unwrap();
    let link = format!(
        r#"{{"url":"{}","owner":"{}","created_at":{}}}"#,
        c.url, owner, c.created_at
    )
    .into_bytes();
    let state = br#"{"status":"active","version":1,"exp":0}"#.to_vec();
    let mut owner_key = [0u8; 17];
    owner_key[..8].copy_from_slice(&c.owner);
    owner_key[8] = 0;
    owner_key[9..].copy_from_slice(&(u64::MAX - seq).to_be_bytes());
    let change = format!(
        r#"{{"seq":{},"op":"create","code":"{}","owner":"{}","created_at":{},"url":"{}"}}"#,
        seq, code, owner, c.created_at, c.url
    )
    .into_bytes();
    Rows { key, code: code_bytes, link, state, owner_key, seq_key: seq.to_be_bytes(), change }
}

/// Encode a group with consecutive seqs starting at `*seq + 1`; returns the
/// meta counter value if the group crossed a multiple of META_EVERY.
fn encode_group(creates: &[&Create], seq: &mut u64, layout: Layout) -> (Vec<Rows>, Option<u64>) {
    let mut meta = None;
    let rows = creates
        .iter()
        .map(|c| {
            *seq += 1;
            if *seq % META_EVERY == 0 {
                meta = Some(*seq);
            }
            encode(c, *seq, layout)
        })
        .collect();
    (rows, meta)
}

// ---------------------------------------------------------------- stores

trait Store: Send + Sync {
    /// Write all rows (+ optional meta counter) in ONE atomic transaction and
    /// make it durable (fsync) before returning. With `check_unique`, a row
    /// whose code already exists is skipped (read-then-write inside the
    /// serialized write transaction). Returns the number of skipped rows.
    fn commit(&self, rows: &[Rows], meta: Option<u64>, check_unique: bool) -> Res<usize>;
    /// Point read of links[key]; returns value length if present.
    fn get_link(&self, key: &[u8]) -> Res<Option<usize>>;
}

#[cfg(feature = "redb")]
mod redb_store {
    use super::{Res, Rows, Store};
    use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
    use std::path::Path;

    const LINKS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("links");
    const STATE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("link_state");
    const OWNER: TableDefinition<&[u8], &[u8]> = TableDefinition::new("owner_idx");
    const CHANGES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("changes");
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

    pub struct RedbStore {
        db: Database,
    }

    impl RedbStore {
        pub fn open(dir: &Path) -> Res<Self> {
            std::fs::create_dir_all(dir)?;
            let db = Database::create(dir.join("lasthop.redb"))?;
            // create tables up front
            let tx = db.begin_write()?;
            {
                tx.open_table(LINKS)?;
                tx.open_table(STATE)?;
                tx.open_table(OWNER)?;
                tx.open_table(CHANGES)?;
                tx.open_table(META)?;
            }
            tx.commit()?;
            Ok(RedbStore { db })
        }
    }

    impl Store for RedbStore {
        fn commit(&self, rows: &[Rows], meta: Option<u64>, check_unique: bool) -> Res<usize> {
            let mut tx = self.db.begin_write()?;
            tx.set_durability(Durability::Immediate)?;
            let mut dups = 0;
            {
                let mut links = tx.open_table(LINKS)?;
                let mut state = tx.open_table(STATE)?;
                let mut owner = tx.open_table(OWNER)?;
                let mut changes = tx.open_table(CHANGES)?;
                for r in rows {
                    if check_unique && links.get(r.key.as_slice())?.is_some() {
                        dups += 1;
                        continue;
                    }
                    links.insert(r.key.as_slice(), r.link.as_slice())?;
                    state.insert(r.key.as_slice(), r.state.as_slice())?;
                    owner.insert(&r.owner_key[..], &r.code[..])?;
                    changes.insert(&r.seq_key[..], r.change.as_slice())?;
                }
                if let Some(n) = meta {
                    let mut m = tx.open_table(META)?;
                    m.insert("links_created", n)?;
                }
            }
            tx.commit()?;
            Ok(dups)
        }

        fn get_link(&self, key: &[u8]) -> Res<Option<usize>> {
            // one read transaction per request, as an API handler would do
            let rtx = self.db.begin_read()?;
            let t = rtx.open_table(LINKS)?;
            Ok(t.get(key)?.map(|v| v.value().len()))
        }
    }
}

#[cfg(feature = "fjall")]
mod fjall_store {
    use super::{Res, Rows, Store};
    use fjall::{
        Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable, SingleWriterTxDatabase,
        SingleWriterTxKeyspace,
    };
    use std::path::Path;

    /// Plain `Database` + atomic cross-keyspace `WriteBatch` with SyncAll.
    pub struct FjallStore {
        db: Database,
        links: Keyspace,
        state: Keyspace,
        owner: Keyspace,
        changes: Keyspace,
        meta: Keyspace,
    }

    impl FjallStore {
        pub fn open(dir: &Path) -> Res<Self> {
            let db = Database::builder(dir).open()?;
            let ks = |n: &str| db.keyspace(n, KeyspaceCreateOptions::default);
            Ok(FjallStore {
                links: ks("links")?,
                state: ks("link_state")?,
                owner: ks("owner_idx")?,
                changes: ks("changes")?,
                meta: ks("meta")?,
                db,
            })
        }
    }

    impl Store for FjallStore {
        fn commit(&self, rows: &[Rows], meta: Option<u64>, check_unique: bool) -> Res<usize> {
            let mut b = self.db.batch().durability(Some(PersistMode::SyncAll));
            let mut dups = 0;
            for r in rows {
                // NB: not isolated from other writers; fine only because we have one writer
                if check_unique && self.links.contains_key(r.key.as_slice())? {
                    dups += 1;
                    continue;
                }
                b.insert(&self.links, r.key.as_slice(), r.link.as_slice());
                b.insert(&self.state, r.key.as_slice(), r.state.as_slice());
                b.insert(&self.owner, &r.owner_key[..], &r.code[..]);
                b.insert(&self.changes, &r.seq_key[..], r.change.as_slice());
            }
            if let Some(n) = meta {
                b.insert(&self.meta, "links_created", &n.to_be_bytes()[..]);
            }
            b.commit()?;
            Ok(dups)
        }

        fn get_link(&self, key: &[u8]) -> Res<Option<usize>> {
            Ok(self.links.get(key)?.map(|v| v.len()))
        }
    }

    /// `SingleWriterTxDatabase`: serialized write transactions with reads
    /// (what an alias uniqueness check needs), committed with SyncAll.
    pub struct FjallTxStore {
        db: SingleWriterTxDatabase,
        links: SingleWriterTxKeyspace,
        state: SingleWriterTxKeyspace,
        owner: SingleWriterTxKeyspace,
        changes: SingleWriterTxKeyspace,
        meta: SingleWriterTxKeyspace,
    }

    impl FjallTxStore {
        pub fn open(dir: &Path) -> Res<Self> {
            let db = SingleWriterTxDatabase::builder(dir).open()?;
            let ks = |n: &str| db.keyspace(n, KeyspaceCreateOptions::default);
            Ok(FjallTxStore {
                links: ks("links")?,
                state: ks("link_state")?,
                owner: ks("owner_idx")?,
                changes: ks("changes")?,
                meta: ks("meta")?,
                db,
            })
        }
    }

    impl Store for FjallTxStore {
        fn commit(&self, rows: &[Rows], meta: Option<u64>, check_unique: bool) -> Res<usize> {
            let mut tx = self.db.write_tx().durability(Some(PersistMode::SyncAll));
            let mut dups = 0;
            for r in rows {
                if check_unique && tx.get(&self.links, r.key.as_slice())?.is_some() {
                    dups += 1;
                    continue;
                }
                tx.insert(&self.links, r.key.as_slice(), r.link.as_slice());
                tx.insert(&self.state, r.key.as_slice(), r.state.as_slice());
                tx.insert(&self.owner, &r.owner_key[..], &r.code[..]);
                tx.insert(&self.changes, &r.seq_key[..], r.change.as_slice());
            }
            if let Some(n) = meta {
                tx.insert(&self.meta, "links_created", &n.to_be_bytes()[..]);
            }
            tx.commit()?;
            Ok(dups)
        }

        fn get_link(&self, key: &[u8]) -> Res<Option<usize>> {
            Ok(self.links.get(key)?.map(|v| v.len()))
        }
    }
}

fn open_store(name: &str, dir: &Path) -> Res<Box<dyn Store>> {
    match name {
        #[cfg(feature = "redb")]
        "redb" => Ok(Box::new(redb_store::RedbStore::open(dir)?)),
        #[cfg(feature = "fjall")]
        "fjall" => Ok(Box::new(fjall_store::FjallStore::open(dir)?)),
        #[cfg(feature = "fjall")]
        "fjall-tx" => Ok(Box::new(fjall_store::FjallTxStore::open(dir)?)),
        other => Err(format!("unknown or not compiled-in store: {other}").into()),
    }
}

// ---------------------------------------------------------------- phases

struct Req {
    create: Create,
    ack: mpsc::Sender<()>,
}

struct PhaseResult {
    clients: usize,
    creates: u64,
    secs: f64,
    commits: u64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    /// bytes the process caused to be written to storage during the phase
    /// (/proc/self/io write_bytes; includes background flush/compaction)
    disk_bytes: u64,
}

fn proc_write_bytes() -> u64 {
    fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("write_bytes:").map(|v| v.trim().parse().ok()))
                .flatten()
        })
        .unwrap_or(0)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn group_commit_phase(
    store: Arc<dyn Store>,
    clients: usize,
    max_batch: usize,
    secs: f64,
    seq: &mut u64,
    check_unique: bool,
    layout: Layout,
    owners: &Arc<Vec<[u8; 8]>>,
) -> Res<PhaseResult> {
    let (tx, rx) = mpsc::channel::<Req>();
    let start_seq = *seq;
    let writer = {
        let store = store.clone();
        thread::spawn(move || -> Res<(u64, u64)> {
            let mut seq = start_seq;
            let mut commits = 0u64;
            let mut pending: Vec<Req> = Vec::with_capacity(max_batch);
            while let Ok(first) = rx.recv() {
                pending.push(first);
                while pending.len() < max_batch {
                    match rx.try_recv() {
                        Ok(r) => pending.push(r),
                        Err(_) => break,
                    }
                }
                let creates: Vec<&Create> = pending.iter().map(|r| &r.create).collect();
                let (rows, meta) = encode_group(&creates, &mut seq, layout);
                store.commit(&rows, meta, check_unique)?;
                commits += 1;
                for r in pending.drain(..) {
                    let _ = r.ack.send(());
                }
            }
            Ok((seq, commits))
        })
    };

    let wb0 = proc_write_bytes();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for c in 0..clients {
        let tx = tx.clone();
        let owners = owners.clone();
        handles.push(thread::spawn(move || {
            let mut rng = Rng::new(0xC0FFEE_u64.wrapping_add(*seq_seed() ^ c as u64));
            let (ack_tx, ack_rx) = mpsc::channel::<()>();
            let mut lat = Vec::with_capacity(1 << 14);
            while Instant::now() < deadline {
                let create = gen_create(&mut rng, &owners);
                let t0 = Instant::now();
                if tx.send(Req { create, ack: ack_tx.clone() }).is_err() {
                    break;
                }
                if ack_rx.recv().is_err() {
                    break;
                }
                lat.push(t0.elapsed().as_micros() as u64);
            }
            lat
        }));
    }
    drop(tx);
    let mut lat: Vec<u64> = Vec::new();
    for h in handles {
        lat.extend(h.join().expect("client panicked"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (end_seq, commits) = writer.join().expect("writer panicked")?;
    let disk_bytes = proc_write_bytes().saturating_sub(wb0);
    *seq = end_seq;
    lat.sort_unstable();
    Ok(PhaseResult {
        clients,
        creates: lat.len() as u64,
        secs: elapsed,
        commits,
        p50_us: pct(&lat, 0.50),
        p99_us: pct(&lat, 0.99),
        max_us: lat.last().copied().unwrap_or(0),
        disk_bytes,
    })
}

/// Different client seeds per process run (so codes differ across phases).
fn seq_seed() -> &'static u64 {
    use std::sync::OnceLock;
    static S: OnceLock<u64> = OnceLock::new();
    S.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7)
    })
}

fn dir_size(p: &Path) -> (u64, u64, usize) {
    use std::os::unix::fs::MetadataExt;
    let (mut apparent, mut alloc, mut files) = (0u64, 0u64, 0usize);
    if let Ok(rd) = fs::read_dir(p) {
        for e in rd.flatten() {
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                let (a, b, f) = dir_size(&e.path());
                apparent += a;
                alloc += b;
                files += f;
            } else {
                apparent += md.len();
                alloc += md.blocks() * 512;
                files += 1;
            }
        }
    }
    (apparent, alloc, files)
}

fn fsync_baseline(dir: &Path, n: usize) -> Res<(u64, u64)> {
    let path = dir.join("fsync-probe");
    let mut f = fs::OpenOptions::new().create(true).write(true).truncate(true).open(&path)?;
    let buf = vec![0xABu8; 4096];
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        f.write_all(&buf)?;
        f.sync_all()?;
        lat.push(t0.elapsed().as_micros() as u64);
    }
    drop(f);
    fs::remove_file(&path)?;
    lat.sort_unstable();
    Ok((pct(&lat, 0.5), pct(&lat, 0.99)))
}

struct StoreReport {
    name: String,
    preload_n: u64,
    preload_secs: f64,
    phases: Vec<PhaseResult>,
    get_p50_us: f64,
    get_p99_us: f64,
    gets_per_s: f64,
    size_apparent: u64,
    size_alloc: u64,
    files: usize,
    total_creates: u64,
}

struct Opts {
    seconds: f64,
    preload: u64,
    preload_batch: usize,
    clients: Vec<usize>,
    max_batch: usize,
    stores: Vec<String>,
    layouts: Vec<Layout>,
    dir: PathBuf,
    keep: bool,
    check_unique: bool,
    get_secs: f64,
}

fn run_store(
    store_name: &str,
    layout: Layout,
    o: &Opts,
    owners: &Arc<Vec<[u8; 8]>>,
) -> Res<StoreReport> {
    let name = &format!("{store_name}/{}", layout.name());
    let dir = o.dir.join(format!("{store_name}-{}", layout.name()));
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let store: Arc<dyn Store> = Arc::from(open_store(store_name, &dir)?);
    let mut seq = 0u64;

    // ---- bulk preload (durable commits of preload_batch creates each)
    eprintln!("[{name}] preloading {} links ...", o.preload);
    let mut rng = Rng::new(1);
    let mut keys: Vec<RecKey> = Vec::with_capacity(o.preload as usize);
    let t0 = Instant::now();
    let mut left = o.preload;
    while left > 0 {
        let n = left.min(o.preload_batch as u64);
        let creates: Vec<Create> = (0..n).map(|_| gen_create(&mut rng, owners)).collect();
        let refs: Vec<&Create> = creates.iter().collect();
        let (rows, meta) = encode_group(&refs, &mut seq, layout);
        keys.extend(rows.iter().map(|r| r.key));
        store.commit(&rows, meta, o.check_unique)?;
        left -= n;
    }
    let preload_secs = t0.elapsed().as_secs_f64();

    // ---- group-commit phases
    let mut phases = Vec::new();
    for &c in &o.clients {
        eprintln!("[{name}] group commit, C={c}, B={} for {}s ...", o.max_batch, o.seconds);
        let r = group_commit_phase(
            store.clone(),
            c,
            o.max_batch,
            o.seconds,
            &mut seq,
            o.check_unique,
            layout,
            owners,
        )?;
        phases.push(r);
    }

    // ---- idle point gets of random existing (preloaded) keys, 1 reader
    eprintln!("[{name}] point gets ...");
    let (mut get_p50_us, mut get_p99_us, mut gets_per_s) = (0.0, 0.0, 0.0);
    if !keys.is_empty() {
        let mut r = Rng::new(99);
        let mut lat_ns: Vec<u64> = Vec::with_capacity(1 << 20);
        let gstart = Instant::now();
        let gdeadline = gstart + Duration::from_secs_f64(o.get_secs);
        while Instant::now() < gdeadline && lat_ns.len() < 2_000_000 {
            let key = &keys[r.below(keys.len() as u64) as usize];
            let t = Instant::now();
            let v = store.get_link(key.as_slice())?;
            lat_ns.push(t.elapsed().as_nanos() as u64);
            if v.is_none() {
                return Err(format!("{name}: preloaded code missing").into());
            }
        }
        gets_per_s = lat_ns.len() as f64 / gstart.elapsed().as_secs_f64();
        lat_ns.sort_unstable();
        get_p50_us = pct(&lat_ns, 0.5) as f64 / 1000.0;
        get_p99_us = pct(&lat_ns, 0.99) as f64 / 1000.0;
    }

    drop(store); // close the database (fjall persists its journal on drop)
    thread::sleep(Duration::from_millis(200));
    let (size_apparent, size_alloc, files) = dir_size(&dir);
    if !o.keep {
        fs::remove_dir_all(&dir)?;
    }
    Ok(StoreReport {
        name: name.to_string(),
        preload_n: o.preload,
        preload_secs,
        phases,
        get_p50_us,
        get_p99_us,
        gets_per_s,
        size_apparent,
        size_alloc,
        files,
        total_creates: seq,
    })
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

fn usage() -> ! {
    eprintln!(
        "usage: store-choice [--seconds N] [--preload N] [--stores redb,fjall,fjall-tx]\n\
         \x20                   [--layout random,counter]\n\
         \x20                   [--clients 1,16,64] [--batch 512] [--preload-batch 5000]\n\
         \x20                   [--get-seconds N] [--dir PATH] [--keep] [--check-unique]"
    );
    std::process::exit(2)
}

fn parse_args() -> Opts {
    let mut o = Opts {
        seconds: 5.0,
        preload: 200_000,
        preload_batch: 5_000,
        clients: vec![1, 16, 64],
        max_batch: 512,
        stores: vec!["redb".into(), "fjall".into(), "fjall-tx".into()],
        layouts: vec![Layout::Random, Layout::Counter],
        dir: PathBuf::from("/work/tmp-storechoice"),
        keep: false,
        check_unique: false,
        get_secs: 2.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--seconds" => o.seconds = val().parse().unwrap_or_else(|_| usage()),
            "--preload" => o.preload = val().parse().unwrap_or_else(|_| usage()),
            "--preload-batch" => o.preload_batch = val().parse().unwrap_or_else(|_| usage()),
            "--batch" => o.max_batch = val().parse().unwrap_or_else(|_| usage()),
            "--get-seconds" => o.get_secs = val().parse().unwrap_or_else(|_| usage()),
            "--clients" => {
                o.clients = val()
                    .split(',')
                    .map(|s| s.trim().parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--stores" => o.stores = val().split(',').map(|s| s.trim().to_string()).collect(),
            "--layout" | "--layouts" => {
                o.layouts = val()
                    .split(',')
                    .map(|s| match s.trim() {
                        "random" => Layout::Random,
                        "counter" => Layout::Counter,
                        _ => usage(),
                    })
                    .collect()
            }
            "--dir" => o.dir = PathBuf::from(val()),
            "--keep" => o.keep = true,
            "--check-unique" => o.check_unique = true,
            _ => usage(),
        }
    }
    if o.max_batch == 0 || o.preload_batch == 0 || o.layouts.is_empty() {
        usage();
    }
    o
}

fn main() -> Res<()> {
    let o = parse_args();
    fs::create_dir_all(&o.dir)?;
    let owners = Arc::new(owner_pool());

    // average encoded sizes, for the record
    let mut r = Rng::new(5);
    let (mut l, mut s, mut ch) = (0usize, 0usize, 0usize);
    for i in 0..10_000u64 {
        let e = encode(&gen_create(&mut r, &owners), 1_000_000 + i, Layout::Random);
        l += e.link.len();
        s += e.state.len();
        ch += e.change.len();
    }
    let (fs50, fs99) = fsync_baseline(&o.dir, 200)?;

    let mut reports = Vec::new();
    for name in &o.stores {
        for &layout in &o.layouts {
            reports.push(run_store(name, layout, &o, &owners)?);
        }
    }
    if !o.keep {
        let _ = fs::remove_dir(&o.dir);
    }

    println!();
    println!(
        "store-choice: preload={} seconds/phase={} B={} check_unique={} layouts={} dir={}",
        o.preload,
        o.seconds,
        o.max_batch,
        o.check_unique,
        o.layouts.iter().map(|l| l.name()).collect::<Vec<_>>().join(","),
        o.dir.display()
    );
    println!(
        "row sizes (mean): links/link_state key 7 B (random) or 9 B (counter), links value {} B, link_state {} B, owner_idx key 17 B -> 7 B, changes value {} B",
        l / 10_000,
        s / 10_000,
        ch / 10_000
    );
    println!("disk baseline: 4 KiB append + fsync p50 {} ms, p99 {} ms", ms(fs50), ms(fs99));
    println!();
    println!("| store | clients | creates/s | ack p50 ms | ack p99 ms | ack max ms | commits/s | creates/commit | disk KiB written/create |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rep in &reports {
        for p in &rep.phases {
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {:.0} | {:.1} | {:.1} |",
                rep.name,
                p.clients,
                p.creates as f64 / p.secs,
                ms(p.p50_us),
                ms(p.p99_us),
                ms(p.max_us),
                p.commits as f64 / p.secs,
                p.creates as f64 / p.commits.max(1) as f64,
                p.disk_bytes as f64 / 1024.0 / p.creates.max(1) as f64,
            );
        }
    }
    println!();
    println!("| store | bulk load creates/s | point get p50 us | point get p99 us | gets/s (1 thread) | total creates | on-disk MiB (apparent / allocated) | files |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for rep in &reports {
        println!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.0} | {} | {} / {} | {} |",
            rep.name,
            rep.preload_n as f64 / rep.preload_secs.max(1e-9),
            rep.get_p50_us,
            rep.get_p99_us,
            rep.gets_per_s,
            rep.total_creates,
            mib(rep.size_apparent),
            mib(rep.size_alloc),
            rep.files,
        );
    }
    Ok(())
}
