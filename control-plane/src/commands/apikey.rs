//! `lasthop-control apikey create|list|revoke`: API keys, in the data directory's file or the
//! shared store.

use anyhow::Context;
use lasthop_control::ApiKeys;

use super::is_postgres;
use crate::cli::{ApikeyCommand, KeysAt};

impl KeysAt {
    pub(crate) fn open(&self) -> anyhow::Result<ApiKeys> {
        match self.store.as_deref() {
            #[cfg(feature = "postgres")]
            Some(url) if is_postgres(url) => {
                let keys = lasthop_control::store::postgres::keys::PgKeys::connect(url)
                    .context("connecting to the store")?;
                Ok(ApiKeys::from_key_store(std::sync::Arc::new(keys))?)
            }
            #[cfg(not(feature = "postgres"))]
            Some(url) if is_postgres(url) => {
                Err(lasthop_control::StoreError::NotBuilt("--store").into())
            }
            Some("embedded") | None => {
                let dir = self
                    .data_dir
                    .as_deref()
                    .context("--data-dir is needed with the embedded store")?;
                Ok(ApiKeys::open(dir))
            }
            Some(other) => anyhow::bail!(
                "--store must be `embedded` or a PostgreSQL connection string, not {other:?}"
            ),
        }
    }
}

pub(crate) fn run(command: ApikeyCommand) -> anyhow::Result<()> {
    match command {
        ApikeyCommand::Create {
            at,
            owner,
            admin,
            domains,
            json,
        } => {
            let domains: Vec<String> = domains
                .iter()
                .map(|d| lasthop_control::api::domain_name(d))
                .collect();
            let key = at.open()?.create_for(&owner, admin, &domains)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"key": key.key, "id": key.id, "owner": owner, "admin": admin, "domains": domains})
                );
            } else {
                // The secret alone on stdout (scripts capture it), the id beside it on stderr.
                println!("{}", key.key);
                eprintln!(
                    "key id {} (owner {owner}{})",
                    key.id,
                    if admin { ", admin" } else { "" }
                );
            }
            Ok(())
        }
        ApikeyCommand::List { at, owner, json } => {
            let keys = at.open()?.list(owner.as_deref());
            for k in keys {
                if json {
                    println!("{}", serde_json::to_string(&k)?);
                } else {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        k.id,
                        k.owner,
                        if k.admin { "admin" } else { "user" },
                        k.created_at,
                        match &k.revoked_at {
                            Some(at) => format!("revoked {at}"),
                            None => "active".to_string(),
                        }
                    );
                }
            }
            Ok(())
        }
        ApikeyCommand::Revoke { at, id } => {
            let keys = at.open()?;
            let known = keys.list(None).into_iter().find(|k| k.id == id);
            match known {
                None => anyhow::bail!("no key has the id {id}"),
                Some(k) if k.revoked => {
                    println!("{id} was already revoked");
                    Ok(())
                }
                Some(_) => {
                    keys.revoke(&id)?;
                    println!("revoked {id}");
                    Ok(())
                }
            }
        }
    }
}
