//! `lasthop-snapshot`: build, synthesise, inspect, verify and query snapshot files.
//! Progress goes to stderr; results to stdout.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use lasthop_core::region::DEFAULT_RESERVE;
use lasthop_core::{
    classify_key, region_range, split_key, CodeKind, CodeScheme, HighWater, PermutationKey,
};
use lasthop_snapshot::{
    parse_line, Layout, SealedInfo, Snapshot, SnapshotMeta, SnapshotWriter, Synth,
};

#[derive(Parser)]
#[command(name = "lasthop-snapshot", version, about = "lasthop snapshot files")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a snapshot from a TSV of `key<TAB>url[<TAB>expires_at[<TAB>options]]` (key: a code
    /// or alias, `domain/code` on a branded domain; expires_at: Unix seconds or RFC 3339, or
    /// empty; options: `redirect_status=301,cache_seconds=86400,forward_query=true,
    /// query_precedence=request`, any of them). High-water marks are derived from the generated
    /// codes, on every domain.
    Build {
        #[arg(long = "in")]
        input: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        key_file: PathBuf,
        /// Feed sequence the snapshot is complete up to.
        #[arg(long, default_value_t = 0)]
        sequence: u64,
        /// Region count of the deployment.
        #[arg(long, default_value_t = 1)]
        regions: u32,
        /// Reserve above each high-water mark.
        #[arg(long, default_value_t = DEFAULT_RESERVE)]
        reserve: u64,
        #[command(flatten)]
        shape: Shape,
    },
    /// Synthesise a snapshot of N real codes (region 0 counters 0..N) plus N/100 aliases, and
    /// write every key to --codes-out, one per line, for load generators.
    Synth {
        #[arg(long)]
        key_file: PathBuf,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        codes_out: PathBuf,
        /// Also write `code<TAB>url` for every link (to give a peer server the same links).
        #[arg(long)]
        tsv_out: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        sequence: u64,
        /// Seed of the synthetic data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        shape: Shape,
    },
    /// Print the header, counts, sizes and bytes per link.
    Inspect { file: PathBuf },
    /// Check the header, bounds, checksums and every entry.
    Verify { file: PathBuf },
    /// Look one link key up: a code or alias, `domain/code` on a branded domain.
    Get { file: PathBuf, key: String },
}

/// How the file is laid out (any reader reads either layout).
#[derive(Args)]
struct Shape {
    /// Fixed index hash seed (reproducible output); random by default.
    #[arg(long)]
    hash_seed: Option<u64>,
    /// Memory against a cold hit's memory accesses (`snapshot-builder/FORMAT.md`).
    #[arg(long, value_enum, default_value_t = Layout::Compact)]
    layout: Layout,
}

impl Shape {
    fn apply(&self, meta: SnapshotMeta) -> SnapshotMeta {
        let mut meta = meta.with_layout(self.layout);
        meta.hash_seed = self.hash_seed;
        meta
    }
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Build {
            input,
            out,
            key_file,
            sequence,
            regions,
            reserve,
            shape,
        } => build(&input, &out, &key_file, sequence, regions, reserve, &shape),
        Cmd::Synth {
            key_file,
            count,
            out,
            codes_out,
            tsv_out,
            sequence,
            seed,
            shape,
        } => synth(
            &key_file,
            count,
            &out,
            &codes_out,
            tsv_out.as_deref(),
            sequence,
            seed,
            &shape,
        ),
        Cmd::Inspect { file } => inspect(&file),
        Cmd::Verify { file } => verify(&file),
        Cmd::Get { file, key } => get(&file, &key),
    }
}

fn load_scheme(key_file: &Path) -> Result<(PermutationKey, CodeScheme)> {
    let key = PermutationKey::load(key_file)
        .with_context(|| format!("loading key {}", key_file.display()))?;
    let scheme = CodeScheme::new(&key).context("key does not make a code scheme")?;
    Ok((key, scheme))
}

/// Prints a progress line every million links.
struct Progress {
    started: Instant,
    total: Option<u64>,
}

impl Progress {
    fn new(total: Option<u64>) -> Self {
        Progress {
            started: Instant::now(),
            total,
        }
    }

    fn tick(&self, done: u64) {
        if done % 1_000_000 != 0 || done == 0 {
            return;
        }
        let rate = done as f64 / self.started.elapsed().as_secs_f64();
        match self.total {
            Some(t) => eprintln!("  {done}/{t} links ({rate:.0}/s)"),
            None => eprintln!("  {done} links ({rate:.0}/s)"),
        }
    }
}

fn seal_reporting<S: lasthop_snapshot::Sink<Output = SealedInfo>>(
    writer: SnapshotWriter<S>,
    started: Instant,
) -> Result<SealedInfo> {
    let links = writer.len();
    eprintln!("  sealing {links} links (sort, pages, overflow, fsync, rename)");
    let sealing = Instant::now();
    let info = writer.seal().context("sealing the snapshot")?;
    let total = started.elapsed().as_secs_f64();
    eprintln!(
        "sealed {} links ({} with options) in {total:.2}s ({:.0} links/s; seal {:.2}s): {} bytes, {:.2} bytes/link beyond URLs, {:.1}% in their page ({}-byte pages)",
        info.links,
        info.with_options,
        info.links as f64 / total,
        sealing.elapsed().as_secs_f64(),
        info.file_len,
        info.overhead_per_link(),
        100.0 * info.inline as f64 / info.links.max(1) as f64,
        info.page_len,
    );
    Ok(info)
}

fn build(
    input: &Path,
    out: &Path,
    key_file: &Path,
    sequence: u64,
    regions: u32,
    reserve: u64,
    shape: &Shape,
) -> Result<()> {
    let started = Instant::now();
    let (key, scheme) = load_scheme(key_file)?;
    let high_water = HighWater::new(regions, reserve).context("bad --regions")?;
    let starts: Vec<u64> = (0..regions)
        .map(|r| region_range(r, regions).map(|range| range.start))
        .collect::<Result<_, _>>()?;
    let meta = shape.apply(SnapshotMeta::new(sequence, key.id(), high_water));
    let mut writer = SnapshotWriter::create(out, meta)?;
    let reader =
        BufReader::new(File::open(input).with_context(|| format!("opening {}", input.display()))?);
    let progress = Progress::new(None);
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.with_context(|| format!("{}:{lineno}", input.display()))?;
        let Some(link) =
            parse_line(&line).with_context(|| format!("{}:{lineno}", input.display()))?
        else {
            continue;
        };
        let key_bytes = link.key.as_bytes();
        if classify_key(key_bytes) == CodeKind::Generated {
            // Every 7-character base62 string decodes (FF1 is a permutation of the space); a
            // branded domain's codes come from the same counters as the default domain's.
            let (_, code) = split_key(key_bytes);
            let Some(n) = scheme.decode(code) else {
                bail!("{}:{lineno}: {:?} is not a code", input.display(), link.key);
            };
            let region = starts.partition_point(|&s| s <= n).saturating_sub(1) as u32;
            writer.raise_high_water(region, n + 1)?;
        }
        writer
            .add_with_options(
                key_bytes,
                link.url.as_bytes(),
                link.expires_at_ms,
                link.options,
            )
            .with_context(|| format!("{}:{lineno}", input.display()))?;
        progress.tick(writer.len());
    }
    seal_reporting(writer, started)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one per CLI flag
fn synth(
    key_file: &Path,
    count: u64,
    out: &Path,
    codes_out: &Path,
    tsv_out: Option<&Path>,
    sequence: u64,
    seed: u64,
    shape: &Shape,
) -> Result<()> {
    let started = Instant::now();
    let (key, scheme) = load_scheme(key_file)?;
    let mut high_water = HighWater::new(1, DEFAULT_RESERVE)?;
    high_water.raise(0, count)?;
    let meta = shape.apply(SnapshotMeta::new(sequence, key.id(), high_water));
    let mut synth = Synth::new(scheme, count, seed);
    let total = synth.total();
    let mut writer = SnapshotWriter::create(out, meta)?;
    writer.reserve(usize::try_from(total).unwrap_or(0));
    let mut codes = BufWriter::with_capacity(
        1 << 20,
        File::create(codes_out).with_context(|| format!("creating {}", codes_out.display()))?,
    );
    let mut tsv = match tsv_out {
        Some(p) => Some(BufWriter::with_capacity(
            1 << 20,
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let progress = Progress::new(Some(total));
    while let Some(link) = synth.next_link() {
        codes.write_all(link.key)?;
        codes.write_all(b"\n")?;
        if let Some(t) = tsv.as_mut() {
            t.write_all(link.key)?;
            t.write_all(b"\t")?;
            t.write_all(link.url)?;
            t.write_all(b"\n")?;
        }
        writer.add(link.key, link.url, link.expires_at_ms)?;
        progress.tick(writer.len());
    }
    codes.flush()?;
    codes.get_ref().sync_all()?;
    if let Some(mut t) = tsv {
        t.flush()?;
    }
    seal_reporting(writer, started)?;
    Ok(())
}

fn inspect(file: &Path) -> Result<()> {
    let s = Snapshot::open(file).with_context(|| format!("opening {}", file.display()))?;
    let links = s.links().max(1) as f64;
    let (home, total, max_probe) = s.buckets();
    let hw = s.high_water();
    println!("file             {}", file.display());
    println!("format version   {}", s.format_version());
    println!("sequence         {}", s.sequence());
    println!("key id           {:#010x}", s.key_id());
    println!("hash seed        {:#018x}", s.hash_seed());
    println!(
        "regions          {} (reserve {})",
        hw.regions(),
        hw.reserve()
    );
    for (r, mark) in hw.marks().iter().enumerate() {
        let start = region_range(r as u32, hw.regions())?.start;
        println!("  region {r:<4}    mark {mark} ({} issued)", mark - start);
    }
    println!(
        "links            {} ({} codes, {} aliases, {} expiring; {} on branded domains)",
        s.links(),
        s.links() - s.aliases(),
        s.aliases(),
        s.expiring(),
        s.branded(),
    );
    if s.format_version() >= 5 {
        println!(
            "legacy set       {} keys (imported codes of other shorteners' shapes)",
            s.legacy_keys()
        );
    }
    println!(
        "url bytes        {} (mean {:.1})",
        s.url_bytes(),
        s.url_bytes() as f64 / links
    );
    let load = s.links() as f64 / (total as f64 * 8.0);
    if s.format_version() == 1 {
        println!(
            "arena            {} bytes ({:.2} per link beyond URLs)",
            s.arena_len(),
            s.arena_len().saturating_sub(s.url_bytes()) as f64 / links
        );
        println!(
            "index            {} bytes ({:.2} per link): {home} home + {} spill buckets, load {load:.3}, max probe {max_probe}",
            s.index_len(),
            s.index_len() as f64 / links,
            total - home,
        );
    } else {
        println!(
            "pages            {} bytes ({:.2} per link): {total} of {} bytes ({home} home + {} spill), slot load {load:.3}, max probe {max_probe}",
            s.index_len(),
            s.index_len() as f64 / links,
            s.page_len(),
            total - home,
        );
        println!(
            "overflow         {} bytes (entries that did not fit their page)",
            s.arena_len()
        );
    }
    println!(
        "file             {} bytes ({:.2} per link)",
        s.file_len(),
        s.file_len() as f64 / links
    );
    println!(
        "overhead         {:.2} bytes per link beyond URL bytes",
        (s.file_len() - s.url_bytes()) as f64 / links
    );
    Ok(())
}

fn verify(file: &Path) -> Result<()> {
    let started = Instant::now();
    let s = Snapshot::open(file).with_context(|| format!("opening {}", file.display()))?;
    let opened = started.elapsed();
    s.verify()
        .with_context(|| format!("verifying {}", file.display()))?;
    let verified = started.elapsed();
    s.audit()
        .with_context(|| format!("auditing {}", file.display()))?;
    println!(
        "ok: {} links, sequence {}; open {:.1?}, checksums {:.1?}, audit {:.1?}",
        s.links(),
        s.sequence(),
        opened,
        verified - opened,
        started.elapsed() - verified,
    );
    Ok(())
}

fn get(file: &Path, key: &str) -> Result<()> {
    let s = Snapshot::open(file).with_context(|| format!("opening {}", file.display()))?;
    if classify_key(key.as_bytes()) == CodeKind::Invalid {
        bail!("{key:?} is not a link key (a code or alias, or domain/code)");
    }
    let Some(entry) = s.lookup(key.as_bytes()) else {
        eprintln!("{key}: not found");
        std::process::exit(1);
    };
    println!("{}", String::from_utf8_lossy(entry.url()));
    if let Some(ms) = entry.expires_at_ms() {
        let when = chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| "out of range".into());
        println!("expires_at_ms {ms} ({when})");
    }
    let options = entry.options();
    if !options.is_default() {
        println!(
            "options redirect_status={},cache_seconds={},forward_query={},query_precedence={}",
            options.redirect_status,
            options.cache_seconds,
            options.forward_query,
            if options.request_precedence {
                "request"
            } else {
                "destination"
            }
        );
    }
    Ok(())
}
