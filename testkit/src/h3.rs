//! HTTP/3 requests with the engine's aioquic test client (`engine/tests/h3/client.py`), in the
//! Python that `scripts/test` installs aioquic into (`$LASTHOP_AIOQUIC_PYTHON`, else `python3`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{skip, Engine, Pki};

/// The Python that has aioquic.
pub fn aioquic_python() -> String {
    std::env::var("LASTHOP_AIOQUIC_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether aioquic can be imported; says `what` is skipped (fails under CI) when not.
pub fn aioquic(what: &str) -> bool {
    let ok = Command::new(aioquic_python())
        .args(["-c", "import aioquic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            what,
            "no aioquic (scripts/test installs it in a venv: LASTHOP_AIOQUIC_PYTHON)",
        );
    }
    ok
}

/// The client script (its flags are in its docstring).
pub fn h3_client() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../engine/tests/h3/client.py"
    ))
}

/// Runs the aioquic script `script` with `args` against `e` and reads the JSON it prints;
/// fails with its stderr and the engine's log when it does not succeed.
pub fn aioquic_json(e: &Engine, script: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(aioquic_python())
        .arg(script)
        .args(args)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{} {args:?}: {}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr),
        e.log()
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// One request to `e`'s QUIC listener with the client, trusting `pki`'s CA; its JSON answer
/// (`status`, `headers` as `[name, value]` pairs, `body`, and what `extra` asked for).
pub fn h3(e: &Engine, pki: &Pki, path: &str, extra: &[&str]) -> serde_json::Value {
    let quic = e.quic.as_deref().expect("the engine serves QUIC");
    let (host, port) = quic.rsplit_once(':').unwrap();
    let mut args = vec![host, port, path, "--ca", pki.ca.to_str().unwrap()];
    args.extend_from_slice(extra);
    aioquic_json(e, &h3_client(), &args)
}
