//! `lasthop-control links import`: another shortener's export moved in with every old code
//! kept (issue 44), in batches of 1000, each checked as creates are and written whole or not
//! at all: through a serving control plane's `POST /v1/imports/links` (`--api`, any store,
//! while it serves), or straight into a stopped embedded store (`--data-dir`) through the same
//! code the endpoint runs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use lasthop_control::api::imports::{import_batch, ImportBatch, ImportLink, ImportReport};
use lasthop_control::import::{self, Row};
use lasthop_control::safety::{ListSet, Safety, SafetyConfig};
use lasthop_control::{ApiConfig, ApiKeys, ApiParts, AppState, Principal};
use lasthop_core::{CodeScheme, PermutationKey};

use crate::cli::LinksCommand;

/// Rows a batch carries (the endpoint's most).
const BATCH: usize = lasthop_control::api::imports::IMPORT_BATCH_MAX;

/// Where the batches go.
enum Target {
    Api {
        agent: ureq::Agent,
        endpoint: String,
        key: String,
    },
    Local {
        runtime: tokio::runtime::Runtime,
        state: AppState,
        store: Arc<dyn lasthop_control::store::Store>,
    },
}

impl Target {
    fn send(&self, batch: ImportBatch) -> anyhow::Result<ImportReport> {
        match self {
            Target::Api {
                agent,
                endpoint,
                key,
            } => match agent
                .post(endpoint)
                .set("Authorization", &format!("Bearer {key}"))
                .send_json(&batch)
            {
                Ok(r) => Ok(r.into_json()?),
                Err(ureq::Error::Status(status, r)) => {
                    let text = r.into_string().unwrap_or_default();
                    bail!("the control plane refused the batch ({status}): {text}");
                }
                Err(e) => bail!("calling {endpoint}: {e}"),
            },
            Target::Local { runtime, state, .. } => {
                let who = Principal {
                    owner: "lasthop-control".into(),
                    admin: true,
                    key_id: "cli".into(),
                    domains: Vec::new(),
                };
                runtime
                    .block_on(import_batch(
                        state,
                        &who,
                        lasthop_control::Actor::System,
                        batch,
                    ))
                    .map_err(|e| anyhow::anyhow!("{e}"))
            }
        }
    }

    fn finish(self) -> anyhow::Result<()> {
        if let Target::Local { store, .. } = self {
            store.shutdown()?;
        }
        Ok(())
    }
}

/// The embedded store in `data_dir`, with the checks `serve` makes on defaults and `lists`.
fn local(data_dir: &Path, key_file: &Path, lists: &[PathBuf]) -> anyhow::Result<Target> {
    let key = PermutationKey::load(key_file)?;
    let store = super::open_store(
        "embedded",
        data_dir,
        CodeScheme::new(&key)?,
        0,
        1,
        10_000,
        None,
    )
    .with_context(|| {
        format!(
            "opening the store in {} (is serve stopped?)",
            data_dir.display()
        )
    })?;
    let metrics = lasthop_control::metrics::Metrics::new()?;
    let lists = ListSet::load(lists, metrics.clone())?;
    let safety = Safety::new(
        Arc::clone(&store),
        lists,
        SafetyConfig::default(),
        metrics.clone(),
    )?;
    let mut parts = ApiParts::new(
        Arc::clone(&store),
        ApiKeys::open(data_dir),
        ApiConfig::default(),
        metrics,
    );
    parts.safety = Arc::new(safety);
    Ok(Target::Local {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        state: AppState::from_parts(parts),
        store,
    })
}

pub(crate) fn run(command: LinksCommand) -> anyhow::Result<()> {
    let LinksCommand::Import {
        from,
        file,
        owner,
        domain,
        with_clicks,
        dry_run,
        api,
        api_key,
        data_dir,
        key_file,
        reputation_lists,
    } = command;
    let target = match (api, api_key, data_dir) {
        (Some(_), _, Some(_)) => bail!("--api and --data-dir: say one"),
        (Some(api), Some(key), None) => Target::Api {
            agent: ureq::AgentBuilder::new()
                .timeout(std::time::Duration::from_secs(120))
                .build(),
            endpoint: format!("{}/v1/imports/links", api.trim_end_matches('/')),
            key,
        },
        (Some(_), None, None) => {
            bail!("--api needs --api-key (an admin key), or LASTHOP_API_KEY")
        }
        (None, _, Some(dir)) => {
            let key_file = key_file.context("--data-dir needs --key-file")?;
            local(&dir, &key_file, &reputation_lists)?
        }
        (None, _, None) => {
            bail!("say where to import: --api URL --api-key KEY, or --data-dir DIR --key-file K")
        }
    };
    let input: Box<dyn Read> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(&file).with_context(|| format!("opening {}", file.display()))?)
    };
    let mut totals = Totals::default();
    let mut rows: Vec<ImportLink> = Vec::with_capacity(BATCH);
    let send = |rows: &mut Vec<ImportLink>, totals: &mut Totals| -> anyhow::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let report = target.send(ImportBatch {
            owner: owner.clone(),
            domain: domain.clone(),
            dry_run,
            with_clicks,
            links: std::mem::take(rows),
        })?;
        totals.imported += report.imported;
        totals.existing += report.existing;
        for r in report.refused {
            totals.refused += 1;
            let detail = r.detail.map(|d| format!(" ({d})")).unwrap_or_default();
            eprintln!(
                "refused: record {} ({}): {}{detail}: {}",
                r.line, r.code, r.reason, r.message
            );
        }
        Ok(())
    };
    let counts = import::read(from, input, |row| {
        match row {
            Ok(row) => rows.push(link_of(row)),
            Err(refused) => {
                totals.refused += 1;
                eprintln!("refused: {refused}");
            }
        }
        if rows.len() >= BATCH {
            send(&mut rows, &mut totals)?;
        }
        Ok(())
    })?;
    send(&mut rows, &mut totals)?;
    let verb = if dry_run { "would import" } else { "imported" };
    println!(
        "{} {verb}, {} already there, {} refused ({} records read)",
        totals.imported, totals.existing, totals.refused, counts.records
    );
    target.finish()
}

#[derive(Debug, Default)]
struct Totals {
    imported: u64,
    existing: u64,
    refused: u64,
}

fn link_of(row: Row) -> ImportLink {
    ImportLink {
        line: row.line,
        code: row.code,
        long_url: row.long_url,
        created_at_ms: row.created_at_ms,
        expires_at_ms: row.expires_at_ms,
        tags: row.tags,
        clicks: row.clicks,
    }
}
