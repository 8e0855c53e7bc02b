//! The shared store over TLS, against a real PostgreSQL with `ssl = on` and a test CA
//! (testkit's `Postgres` makes one per server): libpq's `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` from the `--store` URL, the default for a host that is not loopback, client
//! certificates (`hostssl ... cert`), and `serve --check-config` reporting a certificate that
//! does not verify. The standby and failover test (`replication`) runs over TLS as well.

use std::path::Path;
use std::process::{Command, Output};

use lasthop_testkit::Postgres;

use crate::harness::{call, Site, BIN};

/// `lasthop-control migrate --store URL`: one connection as the store makes them.
fn migrate(url: &str) -> Output {
    Command::new(BIN)
        .args(["migrate", "--store", url])
        .output()
        .expect("lasthop-control runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts `url` connects (and migrates).
fn connects(url: &str) {
    let o = migrate(url);
    assert!(o.status.success(), "{url}: {}", text(&o));
}

/// Asserts `url` is refused; the message.
fn refused(url: &str) -> String {
    let o = migrate(url);
    assert!(!o.status.success(), "{url} connected: {}", text(&o));
    text(&o)
}

/// A CA the server's certificate does not chain to.
fn other_ca(dir: &Path) -> std::path::PathBuf {
    lasthop_testkit::test_ca(dir, "another CA", "other-ca")
}

#[test]
fn verify_full_connects_and_a_wrong_ca_or_name_is_refused_naming_the_store() {
    let Some(pg) = Postgres::start("pg_tls::verify_full") else {
        return;
    };
    pg.psql("CREATE DATABASE lasthop");
    let ca = pg.ca();
    let base = format!("postgres://postgres@127.0.0.1:{}/lasthop", pg.port);
    connects(&format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ));
    // The libpq key=value form, the certificate's DNS name (hostaddr for where it is).
    let words = format!(
        "host=lh.test hostaddr=127.0.0.1 port={} user=postgres dbname=lasthop sslmode=verify-full \
         sslrootcert='{}'",
        pg.port,
        ca.display()
    );
    connects(&words);

    // A CA that did not sign it.
    let dir = tempfile::tempdir().unwrap();
    let wrong = other_ca(dir.path());
    let e = refused(&format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        wrong.display()
    ));
    assert!(
        e.contains(&format!("PostgreSQL store 127.0.0.1:{}", pg.port))
            && e.contains("sslmode=verify-full")
            && e.contains("does not verify against sslrootcert=")
            && e.contains("UnknownIssuer"),
        "{e}"
    );
    // verify-ca checks the CA too.
    refused(&format!(
        "{base}?sslmode=verify-ca&sslrootcert={}",
        wrong.display()
    ));

    // A name the certificate does not carry: refused by verify-full, fine for verify-ca.
    let other_name = |mode: &str| {
        format!(
            "host=db.example hostaddr=127.0.0.1 port={} user=postgres dbname=lasthop \
             sslmode={mode} sslrootcert={}",
            pg.port,
            ca.display()
        )
    };
    let e = refused(&other_name("verify-full"));
    assert!(
        e.contains("PostgreSQL store db.example:")
            && e.contains("does not name the host")
            && e.contains("sslmode=verify-ca"),
        "{e}"
    );
    connects(&other_name("verify-ca"));

    // require encrypts without checking (as libpq); with sslrootcert it checks the CA.
    connects(&format!("{base}?sslmode=require"));
    refused(&format!(
        "{base}?sslmode=require&sslrootcert={}",
        wrong.display()
    ));
}

#[test]
fn a_host_that_is_not_loopback_gets_verify_full_by_default() {
    let Some(pg) = Postgres::start("pg_tls::default") else {
        return;
    };
    pg.psql("CREATE DATABASE lasthop");
    // A name (not resolved, so not known to be loopback) for a server on 127.0.0.1.
    let url = |extra: &str| {
        format!(
            "host=lh.test hostaddr=127.0.0.1 port={} user=postgres dbname=lasthop{extra}",
            pg.port
        )
    };
    // The system's CAs do not vouch for the test CA: verify-full, by default, refuses.
    let e = refused(&url(""));
    assert!(
        e.contains("sslmode=verify-full (the default for a host that is not loopback)")
            && e.contains("sslrootcert=FILE"),
        "{e}"
    );
    connects(&url(&format!(" sslrootcert={}", pg.ca().display())));

    // The server without TLS: the message says which sslmode to add.
    pg.psql("ALTER SYSTEM SET ssl = off");
    pg.psql("SELECT pg_reload_conf()");
    let e = refused(&url(&format!(" sslrootcert={}", pg.ca().display())));
    assert!(
        e.contains("does not offer TLS") && e.contains("add sslmode=disable"),
        "{e}"
    );
    connects(&url(" sslmode=disable"));
    // Loopback by address stays plain without a word.
    connects(&format!(
        "postgres://postgres@127.0.0.1:{}/lasthop",
        pg.port
    ));
}

#[test]
fn hostssl_cert_admits_only_a_client_certificate() {
    let Some(pg) = Postgres::start("pg_tls::client_cert") else {
        return;
    };
    pg.psql("CREATE DATABASE lasthop");
    pg.psql("CREATE ROLE edge LOGIN");
    pg.psql("GRANT ALL ON DATABASE lasthop TO edge");
    pg.psql_on("lasthop", "GRANT ALL ON SCHEMA public TO edge");
    // `edge` logs in with a certificate over TLS, and in no other way.
    pg.prepend_hba("host all edge 127.0.0.1/32 reject");
    pg.prepend_hba("hostssl all edge 127.0.0.1/32 cert");
    let (cert, key) = pg.client_cert("edge");
    let base = format!(
        "postgres://edge@127.0.0.1:{}/lasthop?sslmode=verify-full&sslrootcert={}",
        pg.port,
        pg.ca().display()
    );
    connects(&format!(
        "{base}&sslcert={}&sslkey={}",
        cert.display(),
        key.display()
    ));
    let e = refused(&base);
    assert!(e.contains("PostgreSQL store 127.0.0.1:"), "{e}");
    refused(&format!("postgres://edge@127.0.0.1:{}/lasthop", pg.port));
    // Its key is a secret file: refused when others can read it.
    lasthop_testkit::set_mode(&key, 0o644);
    let e = refused(&format!(
        "{base}&sslcert={}&sslkey={}",
        cert.display(),
        key.display()
    ));
    assert!(
        e.contains("sslkey") && e.contains(&format!("chmod o-rwx {}", key.display())),
        "{e}"
    );
}

#[test]
fn serve_over_tls_keeps_every_connection_encrypted_and_check_config_reports_a_bad_ca() {
    let Some(pg) = Postgres::start("pg_tls::serve") else {
        return;
    };
    pg.psql("CREATE DATABASE lasthop");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/lasthop?sslmode=verify-full&sslrootcert={}",
        pg.port,
        pg.ca().display()
    );
    let site = Site::shared(&url);
    let server = site.start(&["--scanner", "off"]);
    let (status, body) = call(
        "POST",
        &server.url("/v1/links"),
        Some(&site.api_key),
        Some(r#"{"long_url":"https://example.com/over-tls"}"#),
    )
    .expect("the API answers");
    assert_eq!(status, 201, "{body}");
    // The writer, the pool, the listener: every connection to the database is TLS.
    let rows = pg.psql(
        "SELECT s.ssl, count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.datname = 'lasthop' AND a.backend_type = 'client backend' GROUP BY s.ssl",
    );
    assert_eq!(rows.trim().lines().collect::<Vec<_>>().len(), 1, "{rows}");
    assert!(rows.trim().starts_with("t|"), "plain connections: {rows}");
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    let wrong = format!(
        "postgres://postgres@127.0.0.1:{}/lasthop?sslmode=verify-full&sslrootcert={}",
        pg.port,
        other_ca(dir.path()).display()
    );
    let check = |store: &str| {
        Command::new(BIN)
            .args(["serve", "--check-config", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--key-file")
            .arg(site.key_file())
            .args(["--store", store])
            .output()
            .expect("lasthop-control runs")
    };
    let good = check(&url);
    assert!(good.status.success(), "{}", text(&good));
    let bad = check(&wrong);
    assert!(!bad.status.success(), "{}", text(&bad));
    let e = text(&bad);
    assert!(
        e.contains("does not verify against sslrootcert=") && e.contains("PostgreSQL store"),
        "{e}"
    );
}
