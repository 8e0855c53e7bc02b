//! A real PostgreSQL server per test (or shared by the tests running at once), in a temp dir.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::port::free_port;
use crate::process::running_as_root;
use crate::skip::skip;

/// A real PostgreSQL server from Debian's `postgresql` package: `initdb` into a temp dir and
/// `pg_ctl` on a loopback port (no system service), torn down when dropped. As root the server
/// runs as the `postgres` user (`runuser`), as PostgreSQL refuses to run as root.
#[derive(Debug)]
pub struct Postgres {
    pub dir: tempfile::TempDir,
    pub port: u16,
    bin: PathBuf,
    as_postgres: bool,
    pub data: PathBuf,
}

impl Postgres {
    /// The newest installed server's `bin` folder.
    pub fn bin_dir() -> Option<PathBuf> {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let v: u32 = e.file_name().to_str()?.parse().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").exists().then_some((v, bin))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, b)| b)
    }

    /// A server not yet made: a temp dir (owned by `postgres` when we run as root) and a port.
    fn in_temp_dir(bin: PathBuf, as_postgres: bool) -> Postgres {
        let dir = tempfile::tempdir().expect("tempdir");
        if as_postgres {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown")
                .success();
            assert!(ok, "chown the PostgreSQL dir");
        }
        Postgres {
            port: free_port(),
            data: dir.path().join("pg"),
            dir,
            bin,
            as_postgres,
        }
    }

    /// Starts a fresh server, or says SKIPPED (with the reason) and returns `None` where
    /// PostgreSQL is not installed (`scripts/test` installs it).
    pub fn start(test: &str) -> Option<Postgres> {
        let Some(bin) = Postgres::bin_dir() else {
            skip(
                test,
                "PostgreSQL is not installed (apt-get install postgresql)",
            );
            return None;
        };
        let pg = Postgres::in_temp_dir(bin, running_as_root());
        let out = pg
            .command("initdb")
            .args(["-D"])
            .arg(&pg.data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.make_pki();
        pg.configure(&[
            "listen_addresses = '127.0.0.1'",
            "max_connections = 200",
            "fsync = on",
            "synchronous_commit = on",
            "wal_level = replica",
            "max_wal_senders = 5",
            "shared_buffers = 64MB",
            // TLS on (clients choose: the store's sslmode); the files are in the data dir, so
            // a standby's base backup has them too.
            "ssl = on",
            "ssl_cert_file = 'server.pem'",
            "ssl_key_file = 'server.key'",
            "ssl_ca_file = 'ca.pem'",
        ]);
        pg.append_hba("host replication postgres 127.0.0.1/32 trust");
        pg.pg_ctl_start();
        Some(pg)
    }

    /// The test CA (`pki/ca.pem`) that signed the server's certificate (for `lh.test`,
    /// `localhost` and 127.0.0.1) and the client certificates of [`Postgres::client_cert`].
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("pki").join("ca.pem")
    }

    /// A test CA of its own and the server's certificate and key in the data dir (owned by the
    /// server's user, the key 0600 as PostgreSQL requires).
    fn make_pki(&self) {
        let pki = self.dir.path().join("pki");
        crate::pki::ca_and_server(
            &pki,
            "lasthop PostgreSQL test CA",
            "DNS:lh.test,DNS:localhost,IP:127.0.0.1",
            "lh.test",
            "server.key",
            "server.pem",
        );
        for f in ["server.pem", "server.key", "ca.pem"] {
            std::fs::copy(pki.join(f), self.data.join(f)).expect("copy into the data dir");
        }
        crate::engine::set_mode(&self.data.join("server.key"), 0o600);
        if self.as_postgres {
            let ok = Command::new("chown")
                .args(["postgres:postgres", "server.pem", "server.key", "ca.pem"])
                .current_dir(&self.data)
                .status()
                .expect("chown")
                .success();
            assert!(ok, "chown the server's TLS files");
        }
    }

    /// A client certificate for PostgreSQL user `user` (its CN) signed by the test CA, and its
    /// key (0600): `sslcert` and `sslkey` for `hostssl ... cert`.
    pub fn client_cert(&self, user: &str) -> (PathBuf, PathBuf) {
        let pki = self.dir.path().join("pki");
        let (cert, key) = (format!("{user}.pem"), format!("{user}.key"));
        std::fs::write(
            pki.join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .expect("client.ext");
        crate::pki::signed_cert(&pki, crate::pki::P256, user, &key, &cert, "client.ext");
        crate::engine::set_mode(&pki.join(&key), 0o600);
        (pki.join(cert), pki.join(key))
    }

    /// Puts `line` first in `pg_hba.conf` (the first matching line decides) and reloads.
    pub fn prepend_hba(&self, line: &str) {
        let path = self.data.join("pg_hba.conf");
        let old = std::fs::read_to_string(&path).expect("pg_hba.conf");
        std::fs::write(&path, format!("{line}\n{old}")).expect("write pg_hba.conf");
        self.psql("SELECT pg_reload_conf()");
    }

    /// One server for every test running at the same time (each makes its own database):
    /// started by the first, stopped when the last one lets go.
    pub fn shared(test: &str) -> Option<Arc<Postgres>> {
        static SHARED: Mutex<std::sync::Weak<Postgres>> = Mutex::new(std::sync::Weak::new());
        let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pg) = slot.upgrade() {
            return Some(pg);
        }
        let pg = Arc::new(Postgres::start(test)?);
        *slot = Arc::downgrade(&pg);
        Some(pg)
    }

    /// A fresh database of a random name on the [`Postgres::shared`] server: the server (keep
    /// it while the database is used) and the database's URL.
    pub fn fresh_database(test: &str) -> Option<(Arc<Postgres>, String)> {
        let pg = Postgres::shared(test)?;
        let mut b = [0u8; 6];
        use std::io::Read as _;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .expect("/dev/urandom");
        let name: String = b.iter().map(|x| format!("{x:02x}")).collect();
        let url = pg.database(&format!("p{name}"));
        Some((pg, url))
    }

    /// A `Command` for one of the server's programs, as the `postgres` user when we are root.
    pub fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// Appends lines to `postgresql.conf`.
    pub fn configure(&self, lines: &[&str]) {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .expect("postgresql.conf");
        writeln!(f, "port = {}", self.port).expect("write conf");
        writeln!(f, "unix_socket_directories = '{}'", self.data.display()).expect("write conf");
        for l in lines {
            writeln!(f, "{l}").expect("write conf");
        }
    }

    fn append_hba(&self, line: &str) {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("pg_hba.conf"))
            .expect("pg_hba.conf");
        writeln!(f, "{line}").expect("write hba");
    }

    pub fn pg_ctl_start(&self) {
        let log = self.dir.path().join(format!("pg-{}.log", self.port));
        let out = self
            .command("pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-l"])
            .arg(&log)
            .args(["-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl start: {} {}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started, on a port of its own.
    pub fn standby_of(primary: &Postgres) -> Postgres {
        let standby = Postgres::in_temp_dir(primary.bin.clone(), primary.as_postgres);
        let out = standby
            .command("pg_basebackup")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-X", "stream", "-R", "-c", "fast", "-D"])
            .arg(&standby.data)
            .output()
            .expect("pg_basebackup runs");
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        standby.configure(&["hot_standby = on"]);
        standby.pg_ctl_start();
        standby
    }

    /// `pg_ctl promote`: the standby becomes a primary.
    pub fn promote(&self) {
        let out = self
            .command("pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-w", "promote"])
            .output()
            .expect("pg_ctl promote runs");
        assert!(
            out.status.success(),
            "promote: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A new empty database on this server; its URL.
    pub fn database(&self, name: &str) -> String {
        self.psql(&format!("CREATE DATABASE {name}"));
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Runs SQL through `psql` (as the superuser, on the `postgres` database); its output.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_on("postgres", sql)
    }

    pub fn psql_on(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// SIGKILLs the server (the postmaster: every backend goes with it).
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.data.join("postmaster.pid")) {
            if let Some(pid) = pid.lines().next() {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }

    pub fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
