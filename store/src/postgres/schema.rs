//! The PostgreSQL schema, as versioned migrations (`lasthop-control migrate`, and at every
//! start): each runs once, in order, in its own transaction, recorded in
//! `lasthop_migrations`. Text that is compared by range (codes, index keys, code sets) is
//! `COLLATE "C"`, so ranges follow byte order whatever the database's locale.

use tokio_postgres::Client;

use crate::StoreError;

/// Every migration, in order: (version, what it does, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "links, state, change log, leases, idempotency, denylist, trust and safety, keys, secrets",
        r#"
CREATE TABLE meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
-- One row whose lock every write transaction that appends to the change log holds until it
-- commits: sequences are then handed out in commit order, and a reader tailing `seq > last`
-- can never skip a change that commits late.
CREATE TABLE change_seq (
    id   int PRIMARY KEY CHECK (id = 1),
    next bigint NOT NULL
);
INSERT INTO change_seq (id, next) VALUES (1, 1);
CREATE TABLE links (
    code          text COLLATE "C" PRIMARY KEY,
    long_url      text NOT NULL,
    owner         text COLLATE "C" NOT NULL,
    created_at_ms bigint NOT NULL,
    created_seq   bigint NOT NULL,
    state         text NOT NULL
);
CREATE INDEX links_by_owner ON links (owner, created_seq DESC);
CREATE TABLE changes (
    seq    bigint PRIMARY KEY,
    change text NOT NULL
);
CREATE TABLE counters (
    region int PRIMARY KEY,
    next   bigint NOT NULL
);
CREATE TABLE free_counter_ranges (
    start_n bigint PRIMARY KEY,
    end_n   bigint NOT NULL,
    region  int NOT NULL
);
CREATE TABLE idempotency (
    owner         text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    body_hash     text NOT NULL,
    created_at_ms bigint NOT NULL,
    code          text NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE INDEX idempotency_by_age ON idempotency (created_at_ms);
CREATE TABLE denied (
    code text COLLATE "C" PRIMARY KEY,
    kind smallint NOT NULL
);
CREATE TABLE dest_hosts (
    index_key text COLLATE "C" NOT NULL,
    code      text COLLATE "C" NOT NULL,
    url_hash  bigint NOT NULL,
    PRIMARY KEY (index_key, code)
);
CREATE TABLE audit (
    id     bigserial PRIMARY KEY,
    code   text COLLATE "C" NOT NULL,
    record text NOT NULL
);
CREATE INDEX audit_by_code ON audit (code, id);
CREATE TABLE code_sets (
    set_name text COLLATE "C" NOT NULL,
    code     text COLLATE "C" NOT NULL,
    PRIMARY KEY (set_name, code)
);
CREATE TABLE reports (
    id     bigserial PRIMARY KEY,
    open   boolean NOT NULL,
    report text NOT NULL
);
CREATE INDEX reports_open ON reports (id) WHERE open;
CREATE TABLE owners (
    owner  text COLLATE "C" PRIMARY KEY,
    record text NOT NULL
);
CREATE TABLE positions (
    name  text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE api_keys (
    hash       bytea PRIMARY KEY,
    id         text UNIQUE NOT NULL,
    owner      text NOT NULL,
    admin      boolean NOT NULL,
    created_at text NOT NULL,
    revoked_at text
);
CREATE TABLE secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
"#,
    ),
    (
        2,
        "shared control-plane state: engine reports, published snapshots",
        r#"
CREATE TABLE edge_reports (
    engine      text PRIMARY KEY,
    entry       text NOT NULL,
    received_ms bigint NOT NULL
);
CREATE TABLE snapshots (
    id           text COLLATE "C" PRIMARY KEY,
    seq          bigint NOT NULL,
    sha256       text NOT NULL,
    size         bigint NOT NULL,
    published_ms bigint NOT NULL
);
-- A snapshot's bytes, in chunks of a MiB; already compact, so stored without compression.
CREATE TABLE snapshot_chunks (
    id   text COLLATE "C" NOT NULL REFERENCES snapshots (id) ON DELETE CASCADE,
    n    int NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (id, n)
);
ALTER TABLE snapshot_chunks ALTER COLUMN data SET STORAGE EXTERNAL;
"#,
    ),
    (
        3,
        "replication between regions: the change-log entries another region originated",
        r#"
-- Change-log entries written by replicating another region (`--peer`): never served back to
-- a peer, so nothing loops. The last applied position of each peer is `positions.peer/<r>`;
-- its high-water mark is its `counters` row.
CREATE TABLE change_origins (
    seq    bigint PRIMARY KEY,
    region int NOT NULL
);
"#,
    ),
    (
        4,
        "branded domains",
        r#"
-- A branded domain's record (owner, settings, suspension) as JSON; `revision` is the record's
-- own, compared by every write (`Store::write_domain`).
CREATE TABLE domains (
    domain   text COLLATE "C" PRIMARY KEY,
    revision bigint NOT NULL,
    record   text NOT NULL
);
"#,
    ),
    (
        5,
        "api keys limited to domains",
        r#"
-- The domains a key may act on, comma-separated (`apikey create --domain D`); empty: all.
ALTER TABLE api_keys ADD COLUMN domains text NOT NULL DEFAULT '';
"#,
    ),
];

/// Applies every migration the database has not had yet; returns how many ran.
pub async fn migrate(client: &mut Client) -> Result<usize, StoreError> {
    let err = |e: tokio_postgres::Error| StoreError::Postgres {
        what: "migrations",
        cause: Box::new(e),
    };
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS lasthop_migrations (
                version    int PRIMARY KEY,
                what       text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await
        .map_err(err)?;
    let mut ran = 0;
    for (version, what, sql) in MIGRATIONS {
        let txn = client.transaction().await.map_err(err)?;
        // One control plane at a time migrates; the others wait here, then see it done.
        txn.execute("LOCK TABLE lasthop_migrations IN EXCLUSIVE MODE", &[])
            .await
            .map_err(err)?;
        let done = txn
            .query_opt(
                "SELECT 1 FROM lasthop_migrations WHERE version = $1",
                &[version],
            )
            .await
            .map_err(err)?
            .is_some();
        if !done {
            txn.batch_execute(sql).await.map_err(err)?;
            txn.execute(
                "INSERT INTO lasthop_migrations (version, what) VALUES ($1, $2)",
                &[version, what],
            )
            .await
            .map_err(err)?;
            ran += 1;
            tracing::info!(version, what, "applied a migration");
        }
        txn.commit().await.map_err(err)?;
    }
    Ok(ran)
}
