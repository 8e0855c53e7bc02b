//! The workspace's programs, for tests in a crate other than theirs (`env!("CARGO_BIN_EXE_..")`
//! names only the tested crate's own binaries).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The `lasthop-engine` binary (`$LASTHOP_ENGINE_BIN` overrides it).
pub fn engine_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| locate("lasthop-engine", "LASTHOP_ENGINE_BIN"))
        .clone()
}

/// The `lasthop-control` binary (`$LASTHOP_CONTROL_BIN` overrides it).
pub fn control_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| locate("lasthop-control", "LASTHOP_CONTROL_BIN"))
        .clone()
}

/// The binary `name` of the workspace package of the same name: `$override_var` if set; the
/// path cargo gives its own package's tests at run time (cargo 1.94 and later); else the one in
/// the target directory this test runs from, built first when it is missing or older than a
/// source file its dep-info names.
fn locate(name: &str, override_var: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(override_var) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os(format!("CARGO_BIN_EXE_{name}")) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test>-<hash>
    let mut dir = exe.parent().expect("the test's directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("the target directory");
    }
    let bin = dir.join(name);
    if !bin.exists() || stale(&bin) {
        // A workspace test run builds it; `cargo test -p <another crate>` alone may not have.
        // (Building it unconditionally would resolve `-p <its crate>`'s own feature set and
        // rebuild much of the dependency tree on every run.)
        let profile = match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev",
            Some(p) => p,
        };
        eprintln!("building {name} for the tests (missing, or older than its sources)");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let ok = Command::new(cargo)
            .args([
                "build",
                "-q",
                "--profile",
                profile,
                "-p",
                name,
                "--bin",
                name,
            ])
            .current_dir(workspace_root())
            .status()
            .expect("cargo build")
            .success();
        assert!(ok, "building {name}");
    }
    bin
}

/// Whether a source file named in `bin`'s dep-info (`<bin>.d`, which cargo writes beside it
/// with every workspace source the binary was built from) changed after it was built, or is
/// gone. Without a dep-info file it is taken as fresh.
fn stale(bin: &Path) -> bool {
    let Ok(built) = bin.metadata().and_then(|m| m.modified()) else {
        return true;
    };
    let Ok(info) = std::fs::read_to_string(bin.with_extension("d")) else {
        return false;
    };
    let Some((_, sources)) = info.lines().next().and_then(|l| l.split_once(": ")) else {
        return false;
    };
    // Make-style: spaces inside a path are escaped as `\ `.
    let sources = sources.replace("\\ ", "\0");
    sources
        .split_whitespace()
        .map(|s| PathBuf::from(s.replace('\0', " ")))
        .any(|src| {
            src.metadata()
                .and_then(|m| m.modified())
                .map_or(true, |t: SystemTime| t > built)
        })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::time::{Duration, SystemTime};

    use super::*;

    fn file_at(path: &Path, body: &str, at: SystemTime) {
        std::fs::write(path, body).unwrap();
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }

    #[test]
    fn a_binary_is_stale_once_a_source_in_its_dep_info_is_newer_or_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, src) = (dir.path().join("prog"), dir.path().join("main.rs"));
        let built = SystemTime::now() - Duration::from_secs(60);
        file_at(&bin, "", built);
        file_at(&src, "", built - Duration::from_secs(1));
        assert!(!stale(&bin), "without dep-info it is taken as fresh");
        let info = format!("{}: {}\n", bin.display(), src.display());
        std::fs::write(bin.with_extension("d"), info).unwrap();
        assert!(!stale(&bin));
        file_at(&src, "", built + Duration::from_secs(1));
        assert!(stale(&bin), "a source changed after the build");
        std::fs::remove_file(&src).unwrap();
        assert!(stale(&bin), "a source gone");
    }
}
