//! `lasthop-control keygen`: a permutation key, or with `--signing` a snapshot signing key.

use std::path::{Path, PathBuf};

use anyhow::Context;
use lasthop_core::PermutationKey;

/// Writes a snapshot signing key to `out` and its public key beside it (`OUT.pub`).
pub(crate) fn signing(out: &Path, force: bool) -> anyhow::Result<()> {
    let key = lasthop_control::signing::SigningKey::generate(out, force)?;
    let public = key.public_hex();
    let pub_path = PathBuf::from(format!("{}.pub", out.display()));
    std::fs::write(&pub_path, format!("{public}\n"))
        .with_context(|| format!("writing {}", pub_path.display()))?;
    println!(
        "wrote {} (public key in {}; give it to engines as --snapshot-verify-key)\npublic key: {public}",
        out.display(),
        pub_path.display()
    );
    Ok(())
}

/// Writes a new permutation key of `bits` to `out` (refusing to replace one without `force`).
pub(crate) fn permutation(out: &Path, bits: usize, force: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        force || !out.exists(),
        "{} exists; pass --force to replace it (codes minted under it become unreadable)",
        out.display()
    );
    anyhow::ensure!(
        matches!(bits, 128 | 192 | 256),
        "--bits must be 128, 192 or 256"
    );
    let key = PermutationKey::generate(bits / 8)?;
    lasthop_core::secret::write(out, key.to_file_text().as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {} (key id {:08x})", out.display(), key.id());
    Ok(())
}
