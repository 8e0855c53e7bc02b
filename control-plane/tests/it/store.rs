//! The store's contract, one suite run against every backend (docs/ARCHITECTURE.md, "Code"): the
//! embedded redb store and the PostgreSQL store on a real server (`harness::Postgres`; SKIPPED
//! where PostgreSQL is not installed). Each test gets a fresh store; `Backend::open` opens it again
//! over the same data, for what must survive a restart.

use std::sync::Arc;

use lasthop_control::store::embedded::{EmbeddedStore, EmbeddedStoreConfig};
use lasthop_control::store::postgres::{PgStore, PgStoreConfig};
use lasthop_control::store::{
    Actor, Batch, BatchUpdate, CreateOutcome, CreateRequest, DeleteOutcome, DomainRecord,
    DomainSettings, DomainSuspension, Hsts, Imported, OwnerRecord, Report, ReportFilter,
    ReportKind, Resolution, StateUpdate, Store, Verdict,
};
use lasthop_core::feed::DenyKind;
use lasthop_core::{Change, CodeScheme, LinkState, PermutationKey};
use lasthop_testkit::Postgres;
use lasthop_trust::{CanonicalHost, Destination};

/// A fresh store of one backend.
pub enum Backend {
    Embedded {
        dir: tempfile::TempDir,
        key: PermutationKey,
    },
    Postgres {
        _server: Arc<Postgres>,
        url: String,
        key: PermutationKey,
    },
}

impl Backend {
    pub fn embedded() -> Backend {
        Backend::Embedded {
            dir: tempfile::tempdir().unwrap(),
            key: PermutationKey::generate(16).unwrap(),
        }
    }

    /// A new database on the shared test server, or `None` (SKIPPED) without PostgreSQL.
    pub fn postgres(test: &str) -> Option<Backend> {
        let server = Postgres::shared(test)?;
        let url = server.database(&format!("t{}", rand_suffix()));
        Some(Backend::Postgres {
            _server: server,
            url,
            key: PermutationKey::generate(16).unwrap(),
        })
    }

    pub fn key(&self) -> &PermutationKey {
        match self {
            Backend::Embedded { key, .. } | Backend::Postgres { key, .. } => key,
        }
    }

    pub fn open(&self) -> Arc<dyn Store> {
        self.open_in(0, 1)
    }

    /// The store of region `region` of `regions`.
    pub fn open_in(&self, region: u32, regions: u32) -> Arc<dyn Store> {
        self.open_with(region, regions, None)
    }

    /// [`Backend::open_in`], leasing `block_size` counters at a time (`None`: the default).
    pub fn open_with(&self, region: u32, regions: u32, block_size: Option<u64>) -> Arc<dyn Store> {
        let scheme = CodeScheme::new(self.key()).unwrap();
        match self {
            Backend::Embedded { dir, .. } => {
                let mut config = EmbeddedStoreConfig::new(dir.path().join("links.redb"), scheme);
                (config.region, config.regions) = (region, regions);
                config.block_size = block_size.unwrap_or(config.block_size);
                Arc::new(EmbeddedStore::open(config, None).unwrap())
            }
            Backend::Postgres { url, .. } => {
                let mut config = PgStoreConfig::new(url.clone(), scheme);
                (config.region, config.regions) = (region, regions);
                config.block_size = block_size.unwrap_or(config.block_size);
                Arc::new(PgStore::open(config).unwrap())
            }
        }
    }
}

fn rand_suffix() -> String {
    let mut b = [0u8; 6];
    getrandom_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn getrandom_bytes(buf: &mut [u8]) {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .unwrap();
}

/// Every test of the suite, once per backend.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test] fn $name() { super::$name(&super::Backend::embedded()); })*
        }
        mod postgres {
            $(#[test] fn $name() {
                if let Some(b) = super::Backend::postgres(concat!("store::postgres::", stringify!($name))) {
                    super::$name(&b);
                }
            })*
        }
    };
}

suite!(
    state_updates_write_the_change_log_and_the_denylist,
    the_destination_index_finds_a_host_and_its_subdomains_only,
    audit_records_append_in_order_and_survive_a_reopen,
    batches_mark_and_unmark_code_sets_and_move_the_scan_cursor,
    suspensions_leave_other_takedowns_and_flags_alone,
    reports_and_owners,
    creates_lease_counters_claim_aliases_and_replay_idempotent_answers,
    owners_pages_and_consistent_reads,
    api_keys_are_seen_by_every_reader_and_revocations_at_once,
    replicated_pages_apply_once_and_never_loop,
    domains_are_claimed_once_and_written_by_revision,
    aliases_are_unique_per_domain_and_codes_on_all,
    edits_move_the_index_and_leave_no_url_behind,
    imports_keep_old_codes_and_claims_are_never_issued,
);

impl Backend {
    /// The API keys as a control plane on this backend sees them: the keys file beside the
    /// embedded store, the shared store's table with PostgreSQL.
    fn keys(&self, store: &Arc<dyn Store>) -> lasthop_control::ApiKeys {
        match self {
            Backend::Embedded { dir, .. } => lasthop_control::ApiKeys::open(dir.path()),
            Backend::Postgres { .. } => {
                lasthop_control::ApiKeys::from_store(Arc::clone(store)).unwrap()
            }
        }
    }
}

/// Two control planes' views of the keys: a key made through one authenticates on the other
/// at once; one revoked through the other stops authenticating on the first (the shared
/// store's notification takes milliseconds; the revoking side sees it immediately).
fn api_keys_are_seen_by_every_reader_and_revocations_at_once(b: &Backend) {
    use lasthop_control::auth::AuthError;
    let store_a = b.open();
    // The embedded store has one writer process; its keys file is what several CLIs share.
    let store_b = match b {
        Backend::Embedded { .. } => Arc::clone(&store_a),
        Backend::Postgres { .. } => b.open(),
    };
    let (a, c) = (b.keys(&store_a), b.keys(&store_b));
    assert_eq!(a.authenticate("lh_nope"), Err(AuthError::Unknown));
    let made = a.create("team-a", false).unwrap();
    let admin = c.create("ops", true).unwrap();
    assert_eq!(c.authenticate(&made.key).unwrap().owner, "team-a");
    assert_eq!(c.authenticate(&made.key).unwrap().key_id, made.id);
    assert!(a.authenticate(&admin.key).unwrap().admin);
    assert!(c.revoke(&made.id).unwrap());
    assert_eq!(c.authenticate(&made.key), Err(AuthError::Revoked));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while a.authenticate(&made.key).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the revocation never reached the other reader"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(a.authenticate(&made.key), Err(AuthError::Revoked));
    assert!(!a.revoke(&made.id).unwrap(), "already revoked");
    assert!(!a.revoke("lhk_0000000000000000").unwrap(), "unknown");
    let listed = a.list(None);
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().any(|k| k.id == made.id && k.revoked));
    assert!(listed
        .iter()
        .any(|k| k.id == admin.id && !k.revoked && k.admin));
    assert_eq!(a.list(Some("ops")).len(), 1);
    assert!(
        !serde_json::to_string(&listed).unwrap().contains("lh_"),
        "never a secret"
    );
    store_a.shutdown().unwrap();
    if let Backend::Postgres { .. } = b {
        store_b.shutdown().unwrap();
    }
}

fn req(owner: &str, url: &str, alias: Option<&str>) -> CreateRequest {
    CreateRequest {
        owner: owner.into(),
        long_url: url.into(),
        domain: None,
        alias: alias.map(str::to_string),
        expires_at_ms: None,
        idempotency: None,
        now_ms: lasthop_control::clock::now_ms(),
        hold: None,
        options: Default::default(),
        tags: Vec::new(),
        actor: Actor::System,
        destination: None,
        imported: None,
    }
}

fn created(store: &dyn Store, r: CreateRequest) -> lasthop_control::StoredLink {
    match store.create(r).unwrap() {
        CreateOutcome::Created(s) => s,
        other => panic!("{other:?}"),
    }
}

fn creates_lease_counters_claim_aliases_and_replay_idempotent_answers(backend: &Backend) {
    let store = backend.open();
    let scheme = CodeScheme::new(backend.key()).unwrap();
    let mut counters = std::collections::HashSet::new();
    for i in 0..30 {
        let s = created(
            store.as_ref(),
            req("alice", &format!("https://example.com/{i}"), None),
        );
        assert_eq!(s.link.code.len(), 7);
        assert!(counters.insert(scheme.decode(s.link.code.as_bytes()).unwrap()));
    }
    let first = created(
        store.as_ref(),
        req("alice", "https://example.com/a", Some("spring-sale")),
    );
    assert_eq!(first.link.code, "spring-sale");
    assert_eq!(
        store
            .create(req("bob", "https://example.com/b", Some("spring-sale")))
            .unwrap(),
        CreateOutcome::AliasTaken
    );
    // Idempotency: the same key and body replay the first answer; another body is refused.
    let claim = |body: u8| lasthop_control::store::IdempotencyClaim {
        key: "k-1".into(),
        body_hash: [body; 32],
    };
    let mut r = req("alice", "https://example.com/idem", None);
    r.idempotency = Some(claim(1));
    let made = created(store.as_ref(), r.clone());
    assert_eq!(
        store.create(r.clone()).unwrap(),
        CreateOutcome::Replayed(made.clone())
    );
    let mut other = r.clone();
    other.idempotency = Some(claim(2));
    assert_eq!(
        store.create(other).unwrap(),
        CreateOutcome::IdempotencyMismatch
    );
    let mut bobs = r.clone();
    bobs.owner = "bob".into();
    assert!(
        matches!(store.create(bobs).unwrap(), CreateOutcome::Created(_)),
        "keys are per owner"
    );
    // Marks: every leased counter is below its region's mark.
    let marks = store.high_water_marks().unwrap();
    let max = *counters.iter().max().unwrap();
    assert!(
        marks
            .iter()
            .any(|&(region, mark)| region == 0 && mark > max),
        "{marks:?}"
    );
    // A graceful shutdown returns the unused block; the next open takes it first.
    store.shutdown().unwrap();
    drop(store);
    let store = backend.open();
    let next = created(
        store.as_ref(),
        req("alice", "https://example.com/after", None),
    );
    let n = scheme.decode(next.link.code.as_bytes()).unwrap();
    assert!(!counters.contains(&n));
    assert!(n < max + 100, "the returned block is reused ({n} vs {max})");
    assert_eq!(
        store.get("spring-sale").unwrap().unwrap().link.long_url,
        "https://example.com/a"
    );
    store.shutdown().unwrap();
}

fn owners_pages_and_consistent_reads(backend: &Backend) {
    let store = backend.open();
    let mut codes = Vec::new();
    for i in 0..7 {
        codes.push(
            created(
                store.as_ref(),
                req("carol", &format!("https://example.com/c{i}"), None),
            )
            .link
            .code,
        );
    }
    created(store.as_ref(), req("dave", "https://example.com/d", None));
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list("carol", cursor.as_deref(), 3).unwrap();
        assert!(page.links.len() <= 3);
        seen.extend(page.links.iter().map(|s| s.link.code.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    codes.reverse();
    assert_eq!(seen, codes, "newest first, every one once");
    assert!(store.list("nobody", None, 10).unwrap().links.is_empty());
    // The walk over every link and the key-order scan see the same links.
    let mut all = Vec::new();
    let seq = store
        .for_each_link(&mut |s| {
            all.push(s.link.code.clone());
            Ok(())
        })
        .unwrap();
    assert_eq!(all.len(), 8);
    assert_eq!(seq, store.last_seq().unwrap());
    let mut scanned = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let (page, next) = store.scan_links(after.as_deref(), 3).unwrap();
        scanned.extend(page.into_iter().map(|s| s.link.code));
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    all.sort();
    scanned.sort();
    assert_eq!(all, scanned);
    assert_eq!(store.count_links().unwrap(), 8);
    assert_eq!(
        store
            .get_many(&[codes[0].clone(), "nope-nope".into()])
            .unwrap()[1],
        None
    );
    store.shutdown().unwrap();
}

fn create(store: &dyn Store, alias: &str) -> String {
    let req = CreateRequest {
        owner: "alice".into(),
        long_url: format!("https://example.com/{alias}"),
        domain: None,
        alias: Some(alias.into()),
        expires_at_ms: None,
        idempotency: None,
        now_ms: 1,
        hold: None,
        options: Default::default(),
        tags: Vec::new(),
        actor: Actor::System,
        destination: None,
        imported: None,
    };
    match store.create(req).unwrap() {
        CreateOutcome::Created(s) => s.link.code,
        other => panic!("{other:?}"),
    }
}

fn state_changes(store: &dyn Store) -> Vec<(u64, String, LinkState)> {
    store
        .changes_since(0, 100)
        .unwrap()
        .into_iter()
        .filter_map(|(seq, c)| match c {
            Change::StateChanged { code, state } => Some((seq, code, state)),
            Change::LinkCreated { .. } => None,
        })
        .collect()
}

fn state_updates_write_the_change_log_and_the_denylist(backend: &Backend) {
    let store = backend.open();
    let commits = store.commits();
    let (a, b, c) = (
        create(store.as_ref(), "link-aaaa"),
        create(store.as_ref(), "link-bbbb"),
        create(store.as_ref(), "link-cccc"),
    );
    assert_eq!(*commits.borrow(), 3, "each commit is announced");
    assert_eq!(
        store
            .update_state("never-was", StateUpdate::Restore, &Actor::System)
            .unwrap(),
        None
    );

    let taken = StateUpdate::Takedown {
        reason: "phishing".into(),
        warn: false,
    };
    let s = store
        .update_state(&a, taken.clone(), &Actor::System)
        .unwrap()
        .unwrap();
    assert_eq!(s.state.takedown_reason.as_deref(), Some("phishing"));
    assert_eq!(s.link.long_url, "https://example.com/link-aaaa");
    // The same update again changes nothing and writes nothing.
    store.update_state(&a, taken, &Actor::System).unwrap();
    assert_eq!(store.last_seq().unwrap(), 4);
    store
        .update_state(
            &b,
            StateUpdate::Takedown {
                reason: "odd".into(),
                warn: true,
            },
            &Actor::System,
        )
        .unwrap();
    store
        .update_state(
            &c,
            StateUpdate::Settings {
                disabled: Some(true),
                expires_at_ms: Some(Some(99)),
                options: None,
                tags: None,
            },
            &Actor::System,
        )
        .unwrap();
    let (seq, mut denied) = store.denied().unwrap();
    denied.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(seq, 6);
    assert_eq!(*commits.borrow(), 6);
    assert_eq!(
        denied,
        [
            (a.clone(), DenyKind::Gone),
            (b.clone(), DenyKind::Warn),
            (c.clone(), DenyKind::Gone)
        ]
    );

    // Restore clears the flags but not the expiry; delete drops a code from the list.
    let s = store
        .update_state(&c, StateUpdate::Restore, &Actor::System)
        .unwrap()
        .unwrap();
    assert_eq!((s.state.disabled, s.state.expires_at_ms), (false, Some(99)));
    assert_eq!(
        store.delete(&a, &Actor::System).unwrap(),
        DeleteOutcome::Deleted
    );
    let (seq, denied) = store.denied().unwrap();
    assert_eq!((seq, denied), (8, vec![(b.clone(), DenyKind::Warn)]));
    // A deleted link's state is final.
    let s = store
        .update_state(&a, StateUpdate::Restore, &Actor::System)
        .unwrap()
        .unwrap();
    assert!(s.state.deleted && s.state.takedown_reason.is_some());
    assert_eq!(store.last_seq().unwrap(), 8);

    let changes = state_changes(store.as_ref());
    assert_eq!(
        changes
            .iter()
            .map(|(seq, code, _)| (*seq, code.as_str()))
            .collect::<Vec<_>>(),
        [
            (4, a.as_str()),
            (5, b.as_str()),
            (6, c.as_str()),
            (7, c.as_str()),
            (8, a.as_str())
        ]
    );
    assert!(changes[4].2.deleted, "delete is a state change");
    store.shutdown().unwrap();
    drop(store);

    // The denylist and the commit watch's starting point survive a reopen.
    let store = backend.open();
    assert_eq!(*store.commits().borrow(), 8);
    assert_eq!(store.denied().unwrap(), (8, vec![(b, DenyKind::Warn)]));
    store.shutdown().unwrap();
}

fn create_url(store: &dyn Store, owner: &str, url: &str) -> String {
    let req = CreateRequest {
        owner: owner.into(),
        long_url: url.into(),
        domain: None,
        alias: None,
        expires_at_ms: None,
        idempotency: None,
        now_ms: 1,
        hold: None,
        options: Default::default(),
        tags: Vec::new(),
        actor: Actor::Key("lhk_0123456789abcdef".into()),
        destination: None,
        imported: None,
    };
    match store.create(req).unwrap() {
        CreateOutcome::Created(s) => s.link.code,
        other => panic!("{other:?}"),
    }
}

fn host(s: &str) -> CanonicalHost {
    CanonicalHost::parse(s).unwrap()
}

fn all_by_host(store: &dyn Store, h: &str, page: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let p = store
            .codes_by_host(&host(h), true, after.as_deref(), page)
            .unwrap();
        assert!(p.entries.len() <= page);
        out.extend(p.entries.into_iter().map(|e| e.code));
        match p.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    out.sort();
    out
}

fn the_destination_index_finds_a_host_and_its_subdomains_only(backend: &Backend) {
    let store = backend.open();
    let mut on = vec![
        create_url(store.as_ref(), "a", "https://evil.example/1"),
        create_url(store.as_ref(), "a", "https://www.evil.example/2"),
        create_url(store.as_ref(), "b", "https://a.b.evil.example/3"),
        create_url(store.as_ref(), "b", "https://EVIL.example./4"),
    ];
    on.sort();
    let off = [
        create_url(store.as_ref(), "a", "https://evil-x.example/"),
        create_url(store.as_ref(), "a", "https://xevil.example/"),
        create_url(store.as_ref(), "a", "https://example/"),
        create_url(store.as_ref(), "a", "https://evil.example.other.test/"),
        create_url(store.as_ref(), "a", "http://192.0.2.1/"),
    ];
    for page in [1, 2, 3, 100] {
        assert_eq!(
            all_by_host(store.as_ref(), "evil.example", page),
            on,
            "page {page}"
        );
    }
    let mut www = vec![on_code(store.as_ref(), "https://www.evil.example/2")];
    www.sort();
    assert_eq!(all_by_host(store.as_ref(), "www.evil.example", 10), www);
    assert_eq!(
        all_by_host(store.as_ref(), "192.0.2.1", 10),
        vec![off[4].clone()]
    );
    assert_eq!(
        all_by_host(store.as_ref(), "3221225985", 10),
        vec![off[4].clone()]
    );
    assert!(all_by_host(store.as_ref(), "nothing.example", 10).is_empty());
    // Without subdomains, the host's own links only; each entry carries its URL's hash.
    let own = store
        .codes_by_host(&host("evil.example"), false, None, 100)
        .unwrap()
        .entries;
    assert_eq!(own.len(), 2);
    let dest = Destination::parse("https://evil.example/1").unwrap();
    let gone = on_code(store.as_ref(), "https://evil.example/1");
    assert!(own.contains(&lasthop_control::store::HostEntry {
        code: gone.clone(),
        url_hash: dest.url_hash()
    }));
    // A delete erases the entry with the URL.
    store.delete(&gone, &Actor::System).unwrap();
    assert!(!all_by_host(store.as_ref(), "evil.example", 10).contains(&gone));
    assert_eq!(
        store
            .codes_by_host(&host("evil.example"), false, None, 100)
            .unwrap()
            .entries
            .len(),
        1
    );
    store.shutdown().unwrap();
}

/// The code of the (only) link to `url`, through the index.
fn on_code(store: &dyn Store, url: &str) -> String {
    let dest = Destination::parse(url).unwrap();
    let codes: Vec<_> = store
        .codes_by_host(&dest.host, false, None, 1000)
        .unwrap()
        .entries
        .into_iter()
        .filter(|e| e.url_hash == dest.url_hash())
        .collect();
    assert_eq!(codes.len(), 1, "{url}");
    codes[0].code.clone()
}

fn audit_records_append_in_order_and_survive_a_reopen(backend: &Backend) {
    let store = backend.open();
    let code = create_url(store.as_ref(), "a", "https://audited.example/");
    let other = create_url(store.as_ref(), "a", "https://other.example/");
    let admin = Actor::Key("lhk_aaaaaaaaaaaaaaaa".into());
    let takedown = StateUpdate::Takedown {
        reason: "phishing".into(),
        warn: false,
    };
    store.update_state(&code, takedown.clone(), &admin).unwrap();
    // No change, no record.
    store.update_state(&code, takedown, &admin).unwrap();
    store.shutdown().unwrap();
    drop(store);
    let store = backend.open();
    store
        .update_state(&code, StateUpdate::Restore, &admin)
        .unwrap();
    let h = store.history(&code).unwrap();
    let actions: Vec<_> = h
        .iter()
        .map(|r| (r.actor.as_str(), r.action.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("lhk_aaaaaaaaaaaaaaaa", "takedown"),
            ("lhk_aaaaaaaaaaaaaaaa", "restore"),
        ]
    );
    assert_eq!(h[1].undid.as_deref(), Some("takedown: phishing"));
    assert!(
        store.history(&other).unwrap().is_empty(),
        "codes keep their own trails"
    );
    // A pinned link ignores automatic verdicts, not an admin.
    let block = StateUpdate::Verdict {
        verdict: Verdict::Block,
        reason: "list:x".into(),
    };
    let s = store
        .update_state(&code, block.clone(), &Actor::List("x".into()))
        .unwrap()
        .unwrap();
    assert!(s.state.pinned && s.state.takedown_reason.is_none());
    store
        .update_state(&code, StateUpdate::Unpin, &admin)
        .unwrap();
    let s = store
        .update_state(&code, block, &Actor::List("x".into()))
        .unwrap()
        .unwrap();
    assert_eq!(s.state.takedown_reason.as_deref(), Some("list:x"));
    assert_eq!(
        store.history(&code).unwrap().last().unwrap().actor,
        "list:x"
    );
    store.shutdown().unwrap();
}

fn batches_mark_and_unmark_code_sets_and_move_the_scan_cursor(backend: &Backend) {
    let store = backend.open();
    let codes: Vec<_> = (0..5)
        .map(|i| create_url(store.as_ref(), "a", &format!("https://s{i}.example/")))
        .collect();
    let takedown = |code: &String| BatchUpdate {
        code: code.clone(),
        update: StateUpdate::Takedown {
            reason: "suspended".into(),
            warn: false,
        },
    };
    store
        .update_state(
            &codes[0],
            StateUpdate::Takedown {
                reason: "before".into(),
                warn: false,
            },
            &Actor::System,
        )
        .unwrap();
    let batch = Batch {
        updates: [&codes[0], &codes[1], &codes[2], &"nosuchlink".to_string()]
            .into_iter()
            .map(takedown)
            .collect(),
        actor: Actor::System,
        now_ms: 2,
        mark_changed: Some("s/a".into()),
        unmark: None,
        positions: Vec::new(),
    };
    let results = store.apply_batch(batch).unwrap();
    assert_eq!(
        results.iter().map(|r| r.changed).collect::<Vec<_>>(),
        [true, true, true, false]
    );
    assert!(results[3].link.is_none());
    let mut marked = store.code_set("s/a", None, 10).unwrap().codes;
    marked.sort();
    let mut want = codes[..3].to_vec();
    want.sort();
    assert_eq!(marked, want, "the changed ones, once each");
    let first = store.code_set("s/a", None, 2).unwrap();
    let rest = store.code_set("s/a", first.next.as_deref(), 2).unwrap();
    assert_eq!(
        (first.codes.len(), rest.codes.len(), rest.next),
        (2, 1, None)
    );
    assert!(store.code_set("s/b", None, 10).unwrap().codes.is_empty());
    // Unmarking takes every code of the batch out, changed or not.
    let lift = Batch {
        updates: codes[..2]
            .iter()
            .map(|c| BatchUpdate {
                code: c.clone(),
                update: StateUpdate::Lift {
                    reason: "suspended".into(),
                },
            })
            .collect(),
        actor: Actor::System,
        now_ms: 3,
        mark_changed: None,
        unmark: Some("s/a".into()),
        positions: Vec::new(),
    };
    store.apply_batch(lift).unwrap();
    assert_eq!(
        store.code_set("s/a", None, 10).unwrap().codes,
        vec![codes[2].clone()]
    );

    // Positions move with a batch, even one without updates, and persist.
    assert_eq!(store.position("scan").unwrap(), None);
    let cursor = Batch {
        updates: Vec::new(),
        actor: Actor::Scanner,
        now_ms: 4,
        mark_changed: None,
        unmark: None,
        positions: vec![
            ("scan".into(), "5".into()),
            ("rescan".into(), "1 ab".into()),
        ],
    };
    assert!(store.apply_batch(cursor).unwrap().is_empty());
    store.shutdown().unwrap();
    drop(store);
    let store = backend.open();
    assert_eq!(store.position("scan").unwrap().as_deref(), Some("5"));
    assert_eq!(store.position("rescan").unwrap().as_deref(), Some("1 ab"));
    store.shutdown().unwrap();
}

fn suspensions_leave_other_takedowns_and_flags_alone(backend: &Backend) {
    let store = backend.open();
    let admin = Actor::Key("lhk_aaaaaaaaaaaaaaaa".into());
    let (live, flagged, down) = (
        create_url(store.as_ref(), "a", "https://live.example/"),
        create_url(store.as_ref(), "a", "https://flagged.example/"),
        create_url(store.as_ref(), "a", "https://down.example/"),
    );
    let warn = StateUpdate::Takedown {
        reason: "odd".into(),
        warn: true,
    };
    store.update_state(&flagged, warn, &admin).unwrap();
    let list = StateUpdate::Verdict {
        verdict: Verdict::Block,
        reason: "list:x".into(),
    };
    store
        .update_state(&down, list, &Actor::List("x".into()))
        .unwrap();
    let suspend = StateUpdate::Suspend {
        reason: "account suspended: spam".into(),
    };
    let lift = StateUpdate::Lift {
        reason: "account suspended: spam".into(),
    };
    for code in [&live, &flagged, &down] {
        store.update_state(code, suspend.clone(), &admin).unwrap();
    }
    let get = |c: &str| store.get(c).unwrap().unwrap().state;
    assert_eq!(
        get(&down).takedown_reason.as_deref(),
        Some("list:x"),
        "not replaced"
    );
    assert!(get(&flagged).warn && get(&flagged).takedown_reason.is_some());
    for code in [&live, &flagged, &down] {
        store.update_state(code, lift.clone(), &admin).unwrap();
    }
    assert_eq!(get(&live), LinkState::default());
    assert!(
        get(&flagged).warn && get(&flagged).takedown_reason.is_none(),
        "the flag is back"
    );
    assert_eq!(get(&down).takedown_reason.as_deref(), Some("list:x"));
    // A warn that lifts a takedown says so in the trail.
    let takedown = StateUpdate::Takedown {
        reason: "phishing".into(),
        warn: false,
    };
    store.update_state(&live, takedown, &admin).unwrap();
    let warn = StateUpdate::Takedown {
        reason: "downgraded".into(),
        warn: true,
    };
    store.update_state(&live, warn, &admin).unwrap();
    let h = store.history(&live).unwrap();
    let last = h.last().unwrap();
    assert_eq!(
        (last.action.as_str(), last.undid.as_deref()),
        ("warn", Some("takedown: phishing"))
    );
    store.shutdown().unwrap();
}

fn reports_and_owners(backend: &Backend) {
    let store = backend.open();
    let code = create_url(store.as_ref(), "a", "https://reported.example/");
    let report = |kind| Report {
        id: 0,
        kind,
        code: code.clone(),
        reason: "phishing".into(),
        details: None,
        created_at_ms: 5,
        by: None,
        resolution: None,
    };
    let ids: Vec<u64> = (0..3)
        .map(|_| store.add_report(report(ReportKind::Report)).unwrap().id)
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    let resolution = Resolution {
        action: "dismiss".into(),
        by: "lhk_x".into(),
        at_ms: 6,
    };
    assert!(matches!(
        store.resolve_report(2, resolution.clone()).unwrap(),
        Some(Ok(_))
    ));
    assert!(matches!(
        store.resolve_report(2, resolution.clone()).unwrap(),
        Some(Err(_))
    ));
    assert!(store.resolve_report(9, resolution).unwrap().is_none());
    let open_ids: Vec<u64> = store
        .reports(ReportFilter::Open, None, 10)
        .unwrap()
        .reports
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(open_ids, [1, 3]);
    let page = store.reports(ReportFilter::All, None, 2).unwrap();
    assert_eq!(page.reports.len(), 2);
    let next = store
        .reports(ReportFilter::All, page.next_cursor.as_deref(), 2)
        .unwrap();
    assert_eq!(next.reports.iter().map(|r| r.id).collect::<Vec<_>>(), [3]);
    assert_eq!(
        store.history(&code).unwrap().len(),
        3,
        "a record for each report"
    );

    let flagged = OwnerRecord {
        owner: "a".into(),
        flagged: Some(lasthop_control::store::OwnerFlag {
            at_ms: 1,
            reason: "velocity".into(),
            domains_last_hour: 9,
            limit: 5,
        }),
        suspended: None,
        unsuspended_at_ms: None,
    };
    store.put_owner(flagged.clone()).unwrap();
    assert_eq!(store.owner("a").unwrap(), Some(flagged));
    assert_eq!(store.owners().unwrap().len(), 1);
    store
        .put_owner(OwnerRecord {
            owner: "a".into(),
            ..OwnerRecord::default()
        })
        .unwrap();
    assert_eq!(
        store.owner("a").unwrap(),
        None,
        "an empty record is removed"
    );
    // A lifted suspension is kept: peer regions order suspensions by it.
    let lifted = OwnerRecord {
        owner: "a".into(),
        unsuspended_at_ms: Some(7),
        ..OwnerRecord::default()
    };
    store.put_owner(lifted.clone()).unwrap();
    assert_eq!(store.owner("a").unwrap(), Some(lifted));
    store.shutdown().unwrap();
}

/// Another region's page: written once however often it comes, marked as that region's
/// (never served back), its position and high-water mark kept; the home's state replaces
/// ours, another region's only restricts; its audit records join the history once.
fn replicated_pages_apply_once_and_never_loop(backend: &Backend) {
    use lasthop_control::store::{
        peer_position, AuditRecord, Origin, OwnChange, Replicated, ReplicatedChange,
    };
    use lasthop_core::{region_range, Link};
    let scheme = CodeScheme::new(backend.key()).unwrap();
    let store = backend.open_in(0, 2);
    let store = &*store;
    let mine = create_url(store, "alice", "https://example.com/mine");
    let theirs = scheme
        .encode_string(region_range(1, 2).unwrap().start + 5)
        .unwrap();
    let link = Link {
        code: theirs.clone(),
        long_url: "https://example.org/theirs".into(),
        owner: "bob".into(),
        created_at_ms: 7,
    };
    let taken = LinkState {
        takedown_reason: Some("phishing".into()),
        ..LinkState::default()
    };
    // The changes of a page end at its position: sequences position-n+1..=position.
    let page = |changes: Vec<(Change, bool)>, position: u64| Replicated {
        region: 1,
        changes: {
            let n = changes.len() as u64;
            changes
                .into_iter()
                .enumerate()
                .map(|(i, (change, authoritative))| {
                    let seq = position + 1 + i as u64 - n;
                    ReplicatedChange {
                        seq,
                        audit: match &change {
                            Change::StateChanged { .. } => vec![AuditRecord {
                                at_ms: 9,
                                actor: "lhk_there".into(),
                                action: "takedown".into(),
                                reason: None,
                                undid: None,
                                origin: Some(Origin { region: 1, seq }),
                            }],
                            Change::LinkCreated { .. } => Vec::new(),
                        },
                        change,
                        authoritative,
                    }
                })
                .collect()
        },
        high_water: region_range(1, 2).unwrap().start + 10_000,
        position,
    };
    let created = Change::LinkCreated {
        link: link.clone(),
        state: LinkState::default(),
    };
    let took_down = Change::StateChanged {
        code: theirs.clone(),
        state: taken.clone(),
    };
    let first = page(vec![(created.clone(), true), (took_down.clone(), true)], 2);
    assert_eq!(store.replicate(first.clone()).unwrap().applied, 2);
    assert_eq!(
        store.replicate(first).unwrap().applied,
        0,
        "a page applied twice"
    );
    assert_eq!(store.get(&theirs).unwrap().unwrap().state, taken);
    assert_eq!(
        store.position(&peer_position(1)).unwrap().as_deref(),
        Some("2")
    );
    assert!(store
        .high_water_marks()
        .unwrap()
        .contains(&(1, region_range(1, 2).unwrap().start + 10_000)));
    // Only our own changes are served to peers; the replicated ones are skipped past.
    let (own, upto) = store.own_changes_since(0, 100).unwrap();
    assert_eq!(upto, store.last_seq().unwrap());
    assert_eq!(own.len(), 1);
    assert!(matches!(&own[0].change, Change::LinkCreated { link, .. } if link.code == mine));
    // From a region that is not the link's home, a restore lifts nothing; a flag adds.
    let restored = Change::StateChanged {
        code: theirs.clone(),
        state: LinkState::default(),
    };
    store
        .replicate(page(vec![(restored.clone(), false)], 3))
        .unwrap();
    assert_eq!(store.get(&theirs).unwrap().unwrap().state, taken);
    let flagged = Change::StateChanged {
        code: mine.clone(),
        state: LinkState {
            warn: true,
            ..LinkState::default()
        },
    };
    store.replicate(page(vec![(flagged, false)], 4)).unwrap();
    assert!(store.get(&mine).unwrap().unwrap().state.warn);
    // From its home, the restore applies.
    store.replicate(page(vec![(restored, true)], 5)).unwrap();
    assert_eq!(
        store.get(&theirs).unwrap().unwrap().state,
        LinkState::default()
    );
    let history = store.history(&theirs).unwrap();
    let seqs: Vec<u64> = history
        .iter()
        .filter_map(|r| r.origin.filter(|o| o.region == 1).map(|o| o.seq))
        .collect();
    assert_eq!(seqs, [2, 3, 5], "{history:?}");
    // Our own change goes out with the record written with it, tagged with its sequence.
    let before = store.last_seq().unwrap();
    store
        .update_state(
            &mine,
            StateUpdate::Takedown {
                reason: "spam".into(),
                warn: false,
            },
            &Actor::System,
        )
        .unwrap();
    let (own, _) = store.own_changes_since(before, 10).unwrap();
    assert_eq!(own.len(), 1);
    assert_eq!(
        own[0].audit.iter().map(|r| r.origin).collect::<Vec<_>>(),
        [Some(Origin {
            region: 0,
            seq: own[0].seq
        })]
    );
    assert_eq!(own[0].audit[0].action, "takedown");
    // A long run of replicated entries is read in bounded steps, each saying how far it got.
    let many: Vec<(Change, bool)> = (0..1_500u64)
        .map(|i| {
            let code = scheme
                .encode_string(region_range(1, 2).unwrap().start + 100 + i)
                .unwrap();
            let link = Link {
                code,
                ..link.clone()
            };
            (
                Change::LinkCreated {
                    link,
                    state: LinkState::default(),
                },
                true,
            )
        })
        .collect();
    let before = store.last_seq().unwrap();
    store.replicate(page(many, 1_505)).unwrap();
    let last = create_url(store, "alice", "https://example.com/after-the-run");
    let (own, upto) = store.own_changes_since(before, 10).unwrap();
    assert!(own.is_empty() && upto > before && upto < store.last_seq().unwrap());
    let (own, _) = store.own_changes_since(upto, 10).unwrap();
    assert!(
        matches!(&own[..], [OwnChange { change: Change::LinkCreated { link, .. }, .. }] if link.code == last)
    );
    store.shutdown().unwrap();
}

fn domain(name: &str, owner: &str) -> DomainRecord {
    DomainRecord {
        domain: name.into(),
        owner: owner.into(),
        created_at_ms: 1_700_000_000_000,
        revision: 0,
        settings: DomainSettings::default(),
        suspended: None,
        certificate: None,
        acme: None,
    }
}

fn domains_are_claimed_once_and_written_by_revision(backend: &Backend) {
    let store = backend.open();
    assert_eq!(store.domain("go.example.com").unwrap(), None);
    assert!(store.domains().unwrap().is_empty());
    let generation = store.domains_generation().unwrap();
    // A claim succeeds once; a second claim (another owner's or the same) finds it taken.
    assert!(store
        .write_domain(domain("go.example.com", "alice"), None, false)
        .unwrap());
    assert!(!store
        .write_domain(domain("go.example.com", "bob"), None, false)
        .unwrap());
    assert!(store
        .write_domain(domain("b.example", "bob"), None, false)
        .unwrap());
    let stored = store.domain("go.example.com").unwrap().unwrap();
    assert_eq!((stored.owner.as_str(), stored.revision), ("alice", 1));
    // Two writes went in, one was refused: the generation moved (by one, or to the time).
    let after_claims = store.domains_generation().unwrap();
    assert!(
        after_claims >= generation + 2,
        "{generation} -> {after_claims}"
    );
    // A write at the stored revision goes in and moves it on; one at a stale revision does not.
    let mut changed = stored.clone();
    changed.settings.hsts = Some(Hsts {
        max_age: 300,
        include_subdomains: false,
        preload: false,
    });
    changed.suspended = Some(DomainSuspension {
        at_ms: 5,
        by: "lhk_ops".into(),
        reason: "phishing".into(),
    });
    assert!(store.write_domain(changed.clone(), Some(1), false).unwrap());
    let mut stale = stored.clone();
    stale.settings.root_redirect = Some("https://example.com/".into());
    assert!(!store.write_domain(stale, Some(1), false).unwrap());
    let now = store.domain("go.example.com").unwrap().unwrap();
    assert_eq!(now.revision, 2);
    assert_eq!(now.settings, changed.settings);
    assert_eq!(now.suspended, changed.suspended);
    // A write to a record that is not there is refused; so is a removal at a stale revision.
    assert!(!store
        .write_domain(domain("none.example", "alice"), Some(1), false)
        .unwrap());
    assert!(!store.write_domain(now.clone(), Some(1), true).unwrap());
    // Listed by name, and kept across a reopen.
    store.shutdown().unwrap();
    drop(store);
    let store = backend.open();
    let names: Vec<String> = store
        .domains()
        .unwrap()
        .into_iter()
        .map(|d| d.domain)
        .collect();
    assert_eq!(names, ["b.example", "go.example.com"]);
    let before_removal = store.domains_generation().unwrap();
    assert!(
        before_removal > after_claims,
        "kept across the reopen, and moved by the write"
    );
    // Refused writes (a missing record's removal, a stale revision) leave it where it is.
    assert!(!store
        .write_domain(domain("none.example", "alice"), None, true)
        .unwrap());
    assert_eq!(store.domains_generation().unwrap(), before_removal);
    assert!(store.write_domain(now, Some(2), true).unwrap());
    assert_eq!(store.domain("go.example.com").unwrap(), None);
    assert!(store.domains_generation().unwrap() > before_removal);
    // Removed, the name can be claimed again.
    assert!(store
        .write_domain(domain("go.example.com", "bob"), None, false)
        .unwrap());
}

/// A link belongs to one domain: the same alias on two domains is two links (keys `alias` and
/// `domain/alias`), a generated code on a branded domain is keyed `domain/code` and its counter
/// is never handed out again on any domain, state changes and history follow the key, and a
/// domain's live links are counted (deleted ones not).
fn aliases_are_unique_per_domain_and_codes_on_all(backend: &Backend) {
    let store = backend.open();
    let on = |domain: Option<&str>, url: &str, alias: Option<&str>| CreateRequest {
        domain: domain.map(str::to_string),
        ..req("alice", url, alias)
    };
    let default = created(
        store.as_ref(),
        on(None, "https://a.example/", Some("spring-sale")),
    );
    let branded = created(
        store.as_ref(),
        on(
            Some("go.example.com"),
            "https://b.example/",
            Some("spring-sale"),
        ),
    );
    assert_eq!(default.link.code, "spring-sale");
    assert_eq!(branded.link.code, "go.example.com/spring-sale");
    assert!(matches!(
        store
            .create(on(
                Some("go.example.com"),
                "https://c.example/",
                Some("spring-sale")
            ))
            .unwrap(),
        CreateOutcome::AliasTaken
    ));
    let got = store.get("go.example.com/spring-sale").unwrap().unwrap();
    assert_eq!(got.link.long_url, "https://b.example/");
    assert_eq!(
        store.get("spring-sale").unwrap().unwrap().link.long_url,
        "https://a.example/"
    );
    // Generated codes: one counter for every domain.
    let g1 = created(
        store.as_ref(),
        on(Some("go.example.com"), "https://d.example/", None),
    );
    let g2 = created(store.as_ref(), on(None, "https://e.example/", None));
    let (d1, c1) = lasthop_core::split_key_str(&g1.link.code);
    assert_eq!(d1, Some("go.example.com"));
    assert_eq!(c1.len(), 7);
    assert_ne!(c1, g2.link.code);
    assert!(
        store.get(c1).unwrap().is_none(),
        "not on the default domain"
    );
    assert!(store
        .get(&format!("other.example/{}", g2.link.code))
        .unwrap()
        .is_none());
    // State and history follow the key.
    let taken = store
        .update_state(
            "go.example.com/spring-sale",
            StateUpdate::Takedown {
                reason: "phishing".into(),
                warn: false,
            },
            &Actor::System,
        )
        .unwrap()
        .unwrap();
    assert!(taken.state.takedown_reason.is_some());
    assert!(store
        .get("spring-sale")
        .unwrap()
        .unwrap()
        .state
        .takedown_reason
        .is_none());
    let (_, denied) = store.denied().unwrap();
    assert!(denied
        .iter()
        .any(|(k, _)| k == "go.example.com/spring-sale"));
    assert!(!denied.iter().any(|(k, _)| k == "spring-sale"));
    assert!(!store
        .history("go.example.com/spring-sale")
        .unwrap()
        .is_empty());
    // Live links per domain (a deleted one is not).
    assert_eq!(store.domain_links("go.example.com", 100).unwrap(), 2);
    assert_eq!(store.domain_links("go.example.com", 1).unwrap(), 1);
    assert_eq!(store.domain_links("example.com", 100).unwrap(), 0);
    assert_eq!(store.domain_links("go.example.co", 100).unwrap(), 0);
    store.delete(&g1.link.code, &Actor::System).unwrap();
    store
        .delete("go.example.com/spring-sale", &Actor::System)
        .unwrap();
    assert_eq!(store.domain_links("go.example.com", 100).unwrap(), 0);
}

/// A destination edit (issue 43): the link serves the new URL, the destination index moves to
/// the new host, the change log marks the edit without its URL and the history keeps hashes
/// only; a pending edit (`--hold-unverified`) waits for its verdict (a block refuses it); a
/// deletion leaves neither URL anywhere in the log, the history or the index.
fn edits_move_the_index_and_leave_no_url_behind(backend: &Backend) {
    use lasthop_control::store::destination_hash;
    let store = backend.open();
    let s = created(
        store.as_ref(),
        req("alice", "https://before.example/a", None),
    );
    let code = s.link.code.clone();
    // An admin's restore pins the link; an edit ends the pin (it vouched for the old URL).
    let pinned = store
        .update_state(&code, StateUpdate::Restore, &Actor::System)
        .unwrap()
        .unwrap();
    assert!(pinned.state.pinned);
    let edit = |url: &str, hold| StateUpdate::Edit {
        long_url: url.into(),
        hold,
        from: destination_hash("https://before.example/a"),
        to: destination_hash(url),
    };
    let after = store
        .update_state(&code, edit("https://after.example/b", None), &Actor::System)
        .unwrap()
        .unwrap();
    assert_eq!(after.state.url(&after.link), "https://after.example/b");
    assert!(after.state.destination_unscanned);
    assert!(!after.state.pinned, "the edit ends the pin");
    assert_eq!(
        all_by_host(store.as_ref(), "after.example", 10),
        vec![code.clone()]
    );
    assert!(all_by_host(store.as_ref(), "before.example", 10).is_empty());
    let got = store.get(&code).unwrap().unwrap();
    assert_eq!(got.state.url(&got.link), "https://after.example/b");

    // Held: the current destination stays until the verdict; a block refuses the edit.
    store
        .update_state(
            &code,
            edit(
                "https://held.example/c",
                Some(lasthop_core::Hold::Unverified),
            ),
            &Actor::System,
        )
        .unwrap();
    let held = store.get(&code).unwrap().unwrap();
    assert_eq!(held.state.url(&held.link), "https://after.example/b");
    assert_eq!(
        held.state.pending_destination.as_deref(),
        Some("https://held.example/c")
    );
    let verdict = |v, url: &str| StateUpdate::EditVerdict {
        verdict: v,
        reason: "scan".into(),
        to: destination_hash(url),
    };
    // A verdict on another destination changes nothing.
    let same = store
        .update_state(
            &code,
            verdict(Verdict::Clean, "https://other.example/"),
            &Actor::Scanner,
        )
        .unwrap()
        .unwrap();
    assert_eq!(same.state, held.state);
    let refused = store
        .update_state(
            &code,
            verdict(Verdict::Block, "https://held.example/c"),
            &Actor::Scanner,
        )
        .unwrap()
        .unwrap();
    assert_eq!(refused.state.url(&refused.link), "https://after.example/b");
    assert!(refused.state.pending_destination.is_none());
    assert!(
        refused.state.takedown_reason.is_none(),
        "the link itself stays up"
    );
    // The served edit's own verdict: clean clears the mark.
    let judged = store
        .update_state(
            &code,
            verdict(Verdict::Clean, "https://after.example/b"),
            &Actor::Scanner,
        )
        .unwrap()
        .unwrap();
    assert!(!judged.state.destination_unscanned);

    let urls = ["after.example", "held.example"];
    let log_has_url = |store: &dyn Store| {
        let text: String = store
            .changes_since(0, 1000)
            .unwrap()
            .iter()
            .map(|(_, c)| serde_json::to_string(c).unwrap())
            .collect();
        urls.iter().any(|u| text.contains(u))
    };
    assert!(
        !log_has_url(store.as_ref()),
        "the log marks edits without their URLs"
    );
    let history = serde_json::to_string(&store.history(&code).unwrap()).unwrap();
    assert!(
        history.contains(&destination_hash("https://after.example/b")),
        "{history}"
    );
    assert!(!urls.iter().any(|u| history.contains(u)), "{history}");
    let marked = store
        .changes_since(0, 1000)
        .unwrap()
        .into_iter()
        .any(|(_, c)| matches!(c, Change::StateChanged { state, .. } if state.destination.as_deref() == Some("")));
    assert!(marked, "the log says there is an edit");

    assert_eq!(
        store.delete(&code, &Actor::System).unwrap(),
        DeleteOutcome::Deleted
    );
    let gone = store.get(&code).unwrap().unwrap();
    assert!(gone.state.destination.is_none() && gone.state.pending_destination.is_none());
    assert!(all_by_host(store.as_ref(), "after.example", 10).is_empty());
    assert!(!log_has_url(store.as_ref()));
}

/// Issue 44: an imported link keeps its old code, whatever its shape; a 7-character base62 one
/// above the mark claims its counter, which no lease hands out (the counters around it are
/// issued), and one at or below the mark is a collision; the legacy codes and claims are in
/// their code sets; an import keeps the old creation time; a second import of a code is
/// "taken", so a re-run can tell its rows are there. Claims survive a reopen.
fn imports_keep_old_codes_and_claims_are_never_issued(backend: &Backend) {
    let scheme = CodeScheme::new(backend.key()).unwrap();
    let store = backend.open_with(0, 1, Some(4));
    let first = created(store.as_ref(), req("alice", "https://a.example/", None));
    let n0 = scheme.decode(first.link.code.as_bytes()).unwrap();
    let import = |code: &str, url: &str| CreateRequest {
        imported: Some(Imported {
            created_at_ms: Some(1_551_675_967_000),
            clicks: Some(42),
        }),
        ..req("mover", url, Some(code))
    };
    // The block of 4 around n0 is leased: its mark is at most n0 + 4. Claim two counters past
    // it, close enough that the creates below lease the blocks that hold them.
    let claimed = [n0 + 6, n0 + 9].map(|n| scheme.encode_string(n).unwrap());
    for code in &claimed {
        let s = created(store.as_ref(), import(code, "https://old.example/seven"));
        assert_eq!(s.link.created_at_ms, 1_551_675_967_000);
        assert_eq!(s.state.imported_clicks, Some(42));
        assert_eq!(&s.link.code, code);
    }
    let below = scheme.encode_string(n0).unwrap();
    assert!(matches!(
        store
            .create(import(&below, "https://old.example/x"))
            .unwrap(),
        CreateOutcome::AliasTaken
    ));
    let unissued_below = scheme.encode_string(n0 + 1).unwrap();
    assert!(
        matches!(
            store
                .create(import(&unissued_below, "https://old.example/x"))
                .unwrap(),
            CreateOutcome::Collision(_)
        ),
        "a counter at or below the mark may have been issued"
    );
    for code in ["a", "Q9", "abc-_", "12345678", "old-alias-1"] {
        let s = created(store.as_ref(), import(code, "https://old.example/legacy"));
        assert_eq!(s.link.code, code);
    }
    let branded = created(
        store.as_ref(),
        CreateRequest {
            domain: Some("go.example.com".into()),
            ..import("b2", "https://old.example/branded")
        },
    );
    assert_eq!(branded.link.code, "go.example.com/b2");
    assert!(matches!(
        store
            .create(import("a", "https://old.example/again"))
            .unwrap(),
        CreateOutcome::AliasTaken
    ));
    // A batch is all or nothing: one create that fails writes none of the others.
    let failed = store.create_many(vec![
        import("kept-out", "https://old.example/batch"),
        req("mover", "https://old.example/batch", Some("ab")),
    ]);
    assert!(failed.is_err(), "{failed:?}");
    assert!(store.get("kept-out").unwrap().is_none(), "rolled back");
    let both = store
        .create_many(vec![
            import("in-1", "https://old.example/batch"),
            import("a", "https://old.example/batch"),
        ])
        .unwrap();
    assert!(matches!(
        both.as_slice(),
        [CreateOutcome::Created(_), CreateOutcome::AliasTaken]
    ));
    let set = |name: &str| {
        let mut codes = store.code_set(name, None, 100).unwrap().codes;
        codes.sort();
        codes
    };
    let mut legacy = vec![
        "12345678".to_string(),
        "Q9".into(),
        "a".into(),
        "abc-_".into(),
        "go.example.com/b2".into(),
        "in-1".into(),
    ];
    legacy.extend(claimed.iter().cloned());
    legacy.sort();
    assert_eq!(
        set(lasthop_control::store::LEGACY_SET),
        legacy,
        "no alias-shaped code"
    );
    let mut counters = vec![
        lasthop_control::store::claimed_entry(n0 + 6),
        lasthop_control::store::claimed_entry(n0 + 9),
    ];
    counters.sort();
    assert_eq!(set(lasthop_control::store::CLAIMED_SET), counters);

    // Creates lease the blocks holding the claims and skip them, also after a reopen.
    let mut issued = std::collections::HashSet::new();
    for i in 0..8 {
        let s = created(
            store.as_ref(),
            req("alice", &format!("https://n.example/{i}"), None),
        );
        assert!(
            !claimed.contains(&s.link.code),
            "{} was claimed",
            s.link.code
        );
        assert!(issued.insert(s.link.code.clone()));
    }
    store.shutdown().unwrap();
    drop(store);
    finish_claims(
        backend.open_with(0, 1, Some(4)),
        &scheme,
        &claimed,
        n0,
        issued,
    );
}

/// The second half of [`imports_keep_old_codes_and_claims_are_never_issued`], after a reopen.
fn finish_claims(
    store: Arc<dyn Store>,
    scheme: &CodeScheme,
    claimed: &[String; 2],
    n0: u64,
    mut issued: std::collections::HashSet<String>,
) {
    for i in 0..12 {
        let s = created(
            store.as_ref(),
            req("alice", &format!("https://n.example/r/{i}"), None),
        );
        assert!(
            !claimed.contains(&s.link.code),
            "{} was claimed",
            s.link.code
        );
        assert!(issued.insert(s.link.code.clone()));
    }
    // The generator went past both claims: the counters on either side of them are issued.
    let counters: std::collections::HashSet<u64> = issued
        .iter()
        .map(|c| scheme.decode(c.as_bytes()).unwrap())
        .collect();
    for n in [n0 + 5, n0 + 7, n0 + 8, n0 + 10] {
        assert!(counters.contains(&n), "counter {n} issued");
    }
    assert_eq!(
        store.get(&claimed[0]).unwrap().unwrap().link.long_url,
        "https://old.example/seven"
    );
    store.shutdown().unwrap();
}
