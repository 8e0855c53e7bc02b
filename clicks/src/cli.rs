//! The command line of the click pipeline: `lasthop-clicks process|archive|recompute|synth`
//! (the same commands and flags as `lasthop-control clicks ...`, which calls [`run`]), and the
//! processor settings `lasthop-control serve` flattens into its own ([`ClicksTuning`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use crate::archiver::Archiver;
use crate::kafka::KafkaConfig;
use crate::metrics::ClickMetrics;
use crate::objects::ArchiveLocation;
use crate::synth::SynthConfig;
use crate::{Day, Processor, ProcessorConfig, SourceConfig};

/// `lasthop-clicks`' commands (and `lasthop-control clicks`').
#[derive(Debug, Subcommand)]
pub enum ClicksCommand {
    /// Fill a spool directory or a Kafka topic with a realistic synthetic click stream.
    Synth(SynthArgs),
    /// Run the processor standalone (the same code `serve` runs) on a spool or a topic, with
    /// the archive consumer beside it unless --clicks-archive off.
    Process(ProcessArgs),
    /// Run the archive consumer alone: the raw archive from its own position on the spool or
    /// its own Kafka group (GROUP.archive), for an analytics tier whose processors run with
    /// --clicks-archive off.
    Archive(ProcessArgs),
    /// Rebuild one day's rollups from the archive with the current rules (server stopped; while
    /// it runs, use `POST /v1/admin/clicks/recompute`).
    Recompute {
        #[arg(long, env = "LASTHOP_DATA_DIR")]
        data_dir: PathBuf,
        /// The day, YYYY-MM-DD (UTC).
        #[arg(long)]
        day: String,
        #[command(flatten)]
        rules: RuleArgs,
        #[command(flatten)]
        archive: ArchiveArgs,
    },
    /// Rewrite a day of the local NDJSON archive (DATA_DIR/clicks/archive/YYYY-MM-DD, written
    /// before the Parquet archive) as Parquet objects in the archive (--clicks-archive-url),
    /// then delete the NDJSON parts.
    ArchiveConvert {
        #[arg(long, env = "LASTHOP_DATA_DIR")]
        data_dir: PathBuf,
        /// The day, YYYY-MM-DD (UTC).
        #[arg(long)]
        day: String,
        #[command(flatten)]
        archive: ArchiveArgs,
        /// Parts of multipart uploads, bytes (at least 5 MiB).
        #[arg(long, default_value_t = crate::archiver::DEFAULT_PART_BYTES, value_parser = part_bytes)]
        part_bytes: usize,
    },
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Write sealed segments into this spool directory.
    #[arg(long, conflicts_with = "kafka", required_unless_present = "kafka")]
    pub spool: Option<PathBuf>,
    /// Produce to this Kafka cluster instead.
    #[arg(long)]
    pub kafka: Option<String>,
    #[arg(long, default_value = "lasthop.clicks")]
    pub topic: String,
    /// Producer compression (none, gzip, snappy, lz4, zstd).
    #[arg(long, default_value = "lz4")]
    pub compression: String,
    /// Spool writer name.
    #[arg(long, default_value = "synth")]
    pub writer: String,
    /// Events, about 1% of them duplicate deliveries.
    #[arg(long)]
    pub events: u64,
    #[arg(long, default_value_t = 1000)]
    pub codes: u32,
    /// Events for these links (repeatable; a code, or `domain/code` on a branded domain)
    /// instead of `--codes` generated ones: real links, whose stats and console pages can then
    /// be read.
    #[arg(long = "code")]
    pub fixed_codes: Vec<String>,
    #[arg(long, default_value_t = 100_000)]
    pub visitors: u64,
    #[arg(long, default_value_t = 0.1)]
    pub bot_share: f64,
    /// Days the events span, ending now.
    #[arg(long, default_value_t = 1)]
    pub days: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct ProcessArgs {
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Spool directory (default DATA_DIR/clicks/spool).
    #[arg(long, conflicts_with = "kafka")]
    pub spool: Option<PathBuf>,
    /// Consume this Kafka cluster instead of a spool.
    #[arg(long)]
    pub kafka: Option<String>,
    #[arg(long, default_value = "lasthop.clicks")]
    pub topic: String,
    #[arg(long, default_value = "lasthop-clicks")]
    pub group: String,
    /// Stop once the source is drained and print a JSON summary line.
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Serve the processor's (or the archive consumer's) Prometheus metrics at
    /// http://ADDR/metrics (lag, spool pending bytes, events by outcome, archive objects).
    #[arg(long, env = "LASTHOP_CLICKS_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub tuning: ClicksTuning,
}

/// Bot rules files.
#[derive(Debug, Args, Clone)]
pub struct RuleArgs {
    /// User-agent patterns file (default: the shipped list).
    #[arg(long, env = "LASTHOP_BOT_AGENTS")]
    pub bot_agents: Option<PathBuf>,
    /// Published crawler ranges file (default: the shipped list).
    #[arg(long, env = "LASTHOP_CRAWLER_RANGES")]
    pub crawler_ranges: Option<PathBuf>,
    /// One user agent on one public network (/24 or /48) fetching this many distinct codes
    /// within one `--clicks-burst-secs` window counts as a bot (mail scanners, link unfurlers)
    /// from that fetch on; 0 turns the rule off.
    #[arg(long, env = "LASTHOP_CLICKS_BURST_CODES", default_value_t = lasthop_analytics::rules::DEFAULT_BURST_CODES,
          value_parser = burst_codes)]
    pub clicks_burst_codes: u32,
    /// The burst rule's window, in seconds (1-3600).
    #[arg(long, env = "LASTHOP_CLICKS_BURST_SECS", default_value_t = lasthop_analytics::rules::DEFAULT_BURST_SECS,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub clicks_burst_secs: u32,
}

/// Where the raw archive is (`serve`, `clicks process|archive|recompute|archive-convert`).
#[derive(Debug, Args, Clone)]
pub struct ArchiveArgs {
    /// Where the raw archive is: `s3://BUCKET/PREFIX` (S3 or an S3-compatible store, with
    /// --clicks-archive-endpoint) or `file:///path`; default file://DATA_DIR/clicks/archive.
    /// S3 credentials come from the standard AWS environment variables or
    /// --clicks-archive-credentials-file.
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_URL", value_name = "URL")]
    pub clicks_archive_url: Option<String>,
    /// An S3-compatible endpoint for --clicks-archive-url s3://… (`http://127.0.0.1:8333`,
    /// `https://s3.example.net`).
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_ENDPOINT", value_name = "URL")]
    pub clicks_archive_endpoint: Option<String>,
    /// The S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_REGION")]
    pub clicks_archive_region: Option<String>,
    /// An AWS-style credentials file (`[default]`, or AWS_PROFILE's section, with
    /// aws_access_key_id and aws_secret_access_key); never logged.
    #[arg(
        long,
        env = "LASTHOP_CLICKS_ARCHIVE_CREDENTIALS_FILE",
        value_name = "FILE"
    )]
    pub clicks_archive_credentials_file: Option<PathBuf>,
}

impl ArchiveArgs {
    /// The location these flags name, default `file://DATA_DIR/clicks/archive`.
    pub fn location(&self, data_dir: &std::path::Path) -> anyhow::Result<ArchiveLocation> {
        let url = match &self.clicks_archive_url {
            Some(u) => u.clone(),
            None => {
                let dir = std::path::absolute(data_dir.join("clicks").join("archive"))
                    .context("the data directory's absolute path")?;
                ArchiveLocation::local(&dir).url
            }
        };
        Ok(ArchiveLocation {
            url,
            endpoint: self.clicks_archive_endpoint.clone(),
            region: self.clicks_archive_region.clone(),
            credentials_file: self.clicks_archive_credentials_file.clone(),
        })
    }
}

/// `--clicks-archive-part-bytes`: S3 refuses parts under 5 MiB (but the last).
fn part_bytes(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 5 << 20 => Ok(n),
        Ok(_) => Err("at least 5242880 (5 MiB, S3's smallest part)".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// `--clicks-burst-codes`: 0 (off) or at least 2 (one code is a click, not a burst).
fn burst_codes(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(1) => Err("1 would count every click as a bot: use 0 (off) or at least 2".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

impl RuleArgs {
    /// The bot rules these files and settings make.
    pub fn load(&self) -> anyhow::Result<Arc<lasthop_analytics::Rules>> {
        let mut rules = lasthop_analytics::Rules::load(
            self.bot_agents.as_deref(),
            self.crawler_ranges.as_deref(),
        )
        .context("loading the bot rules")?;
        rules.burst_codes = self.clicks_burst_codes;
        rules.burst_secs = self.clicks_burst_secs;
        Ok(Arc::new(rules))
    }
}

/// Processor settings shared by `serve` and `clicks process`.
#[derive(Debug, Args, Clone)]
pub struct ClicksTuning {
    /// Where rollups are kept: `embedded` (DATA_DIR/clicks/rollups.redb, one processor) or
    /// `clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB` (several processors may share it and one
    /// Kafka consumer group), `clickhouses://…` over HTTPS (ClickHouse's https_port, 8443).
    #[arg(long, env = "LASTHOP_CLICKS_STORE", default_value = "embedded")]
    pub clicks_store: crate::StoreLocation,
    /// The CA file (PEM) a `clickhouses://` store's certificate must chain to; without it,
    /// the system's trusted CAs.
    #[arg(long, env = "LASTHOP_CLICKS_STORE_CA", value_name = "FILE")]
    pub clicks_store_ca: Option<std::path::PathBuf>,
    /// How long the Kafka group waits for a silent processor (killed, hung) before handing its
    /// partitions to the others, milliseconds (librdkafka's session.timeout.ms).
    #[arg(long, env = "LASTHOP_CLICKS_KAFKA_SESSION_MS", default_value_t = crate::kafka::DEFAULT_SESSION_TIMEOUT_MS)]
    pub clicks_kafka_session_ms: u32,
    /// A librdkafka consumer property, `key=value`, for the processor's and the archive
    /// consumer's Kafka clients (repeatable): TLS (`security.protocol=SSL`,
    /// `ssl.ca.location=FILE`, `ssl.certificate.location`, `ssl.key.location`) and SASL
    /// (`security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`, `sasl.username`,
    /// `sasl.password`). Applied after lasthop's own settings, so it may change them.
    #[arg(long = "clicks-kafka-option", value_name = "KEY=VALUE", value_parser = crate::kafka::parse_option)]
    pub clicks_kafka_options: Vec<(String, String)>,
    /// Run the archive consumer beside the processor: it writes the raw archive
    /// (DATA_DIR/clicks/archive) from its own position on the spool, or its own Kafka group
    /// (GROUP.archive). With several processors, run it on one host (`clicks archive`) and
    /// `off` on the others.
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE", value_enum, default_value_t = Toggle::On)]
    pub clicks_archive: Toggle,
    #[command(flatten)]
    pub archive: ArchiveArgs,
    /// An archive object closes after this many events (or at the end of its spool segment,
    /// or after --clicks-archive-object-secs).
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_OBJECT_EVENTS", default_value_t = crate::archiver::DEFAULT_OBJECT_EVENTS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub clicks_archive_object_events: u64,
    /// An archive object closes this many seconds after its first event.
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_OBJECT_SECS", default_value_t = crate::archiver::DEFAULT_OBJECT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub clicks_archive_object_secs: u64,
    /// Archive objects larger than this many bytes go up as multipart uploads of parts this
    /// size (at least 5 MiB, S3's smallest part).
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_PART_BYTES", default_value_t = crate::archiver::DEFAULT_PART_BYTES,
          value_parser = part_bytes)]
    pub clicks_archive_part_bytes: usize,
    /// How often (seconds) the processor looks for days past their grace to rebuild from the
    /// archive with the current rules ("fresh, then correct"); 0 never. Needs the archive
    /// consumer beside it; with several processors a lock in the rollup store picks one.
    #[arg(
        long,
        env = "LASTHOP_CLICKS_RECOMPUTE_EVERY_SECS",
        default_value_t = 600
    )]
    pub clicks_recompute_every_secs: u64,
    /// Dedup window for event ids, seconds (at least 600).
    #[arg(long, env = "LASTHOP_CLICKS_DEDUP_SECS", default_value_t = 600)]
    pub clicks_dedup_secs: u64,
    /// How long after its end a day still counts late events, seconds.
    #[arg(long, env = "LASTHOP_CLICKS_GRACE_SECS", default_value_t = 7200)]
    pub clicks_grace_secs: u64,
    /// Flush interval: archive, rollups and offsets, milliseconds.
    #[arg(long, env = "LASTHOP_CLICKS_FLUSH_MS", default_value_t = 2000)]
    pub clicks_flush_ms: u64,
    /// Days of raw events kept in the archive.
    #[arg(long, env = "LASTHOP_CLICKS_ARCHIVE_DAYS", default_value_t = 90)]
    pub clicks_archive_days: u32,
    /// An `.open` spool file untouched this long (seconds) belongs to a dead writer; at least
    /// 120 (engines seal their segments after 30 s).
    #[arg(long, env = "LASTHOP_CLICKS_SPOOL_STALE_SECS", default_value_t = 600)]
    pub clicks_spool_stale_secs: u64,
    #[command(flatten)]
    pub rules: RuleArgs,
}

impl ClicksTuning {
    /// `--clicks-store` with `--clicks-store-ca`.
    pub fn store_location(&self) -> anyhow::Result<crate::StoreLocation> {
        self.clicks_store
            .clone()
            .with_ca(self.clicks_store_ca.clone())
            .map_err(anyhow::Error::msg)
    }

    /// The processor's configuration for `data_dir` reading `source`.
    pub fn config(
        &self,
        data_dir: &std::path::Path,
        mut source: SourceConfig,
    ) -> anyhow::Result<ProcessorConfig> {
        anyhow::ensure!(
            (1000..=3_600_000).contains(&self.clicks_kafka_session_ms),
            "--clicks-kafka-session-ms must be 1000..=3600000"
        );
        if let SourceConfig::Kafka(k) = &mut source {
            k.session_timeout_ms = self.clicks_kafka_session_ms;
            k.options = self.clicks_kafka_options.clone();
        }
        anyhow::ensure!(
            self.clicks_dedup_secs >= 600,
            "--clicks-dedup-secs must be at least 600 (ten minutes)"
        );
        anyhow::ensure!(
            self.clicks_archive_days >= 1,
            "--clicks-archive-days must be at least 1"
        );
        let min_stale = crate::spool::MIN_STALE.as_secs();
        anyhow::ensure!(
            self.clicks_spool_stale_secs >= min_stale,
            "--clicks-spool-stale-secs must be at least {min_stale}: engines seal a segment after \
             30 s, and a shorter stale period would delete a live writer's .open file"
        );
        Ok(ProcessorConfig {
            clicks_dir: data_dir.join("clicks"),
            store: self.store_location()?,
            archive_peer: self.clicks_archive == Toggle::On,
            recompute_every: (self.clicks_recompute_every_secs > 0)
                .then(|| Duration::from_secs(self.clicks_recompute_every_secs)),
            source,
            dedup_ms: self.clicks_dedup_secs * 1000,
            grace_ms: self.clicks_grace_secs.saturating_mul(1000),
            flush_every: Duration::from_millis(self.clicks_flush_ms.max(10)),
            archive_days: self.clicks_archive_days,
            spool_stale: Duration::from_secs(self.clicks_spool_stale_secs),
            archive: self.archive.location(data_dir)?,
            object_events: self.clicks_archive_object_events,
            object_every: Duration::from_secs(self.clicks_archive_object_secs),
            part_bytes: self.clicks_archive_part_bytes,
            rules: self.rules.load()?,
        })
    }
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

/// Where events come from: Kafka with `kafka`, else the spool (`spool`, or DATA_DIR/clicks/spool).
pub fn source(
    data_dir: &std::path::Path,
    spool: Option<PathBuf>,
    kafka: Option<String>,
    topic: &str,
    group: &str,
) -> SourceConfig {
    match kafka {
        Some(brokers) => SourceConfig::Kafka(KafkaConfig {
            brokers,
            topic: topic.to_owned(),
            group: group.to_owned(),
            session_timeout_ms: crate::kafka::DEFAULT_SESSION_TIMEOUT_MS,
            options: Vec::new(),
        }),
        None => SourceConfig::Spool(spool.unwrap_or_else(|| data_dir.join("clicks").join("spool"))),
    }
}

/// The click processor and, with `--clicks-archive on`, the archive consumer beside it (the
/// processor flushes it before a recompute reads the archive).
pub fn open_clicks(
    config: ProcessorConfig,
    metrics: ClickMetrics,
) -> anyhow::Result<(Processor, Option<Archiver>)> {
    let archiver = config
        .archive_peer
        .then(|| Archiver::open(config.archiver(), &metrics))
        .transpose()
        .context("starting the archive consumer")?;
    let mut processor = Processor::open(config, metrics).context("starting the click processor")?;
    if let Some(a) = &archiver {
        processor.set_archive(a.handle());
    }
    Ok((processor, archiver))
}

/// The standalone commands' metrics: in a registry of their own, served at
/// `http://ADDR/metrics` when `--metrics-listen ADDR` is given.
fn metrics(listen: Option<std::net::SocketAddr>) -> anyhow::Result<ClickMetrics> {
    let Some(addr) = listen else {
        return Ok(ClickMetrics::standalone()?);
    };
    let registry = prometheus::Registry::new_custom(Some("lasthop".into()), None)?;
    let metrics = ClickMetrics::register(&registry)?;
    serve_metrics(addr, registry)?;
    Ok(metrics)
}

/// Serves `registry` at `GET /metrics` on `addr` from a thread of its own (one current-thread
/// runtime), for as long as the program runs; says where on stdout.
fn serve_metrics(addr: std::net::SocketAddr, registry: prometheus::Registry) -> anyhow::Result<()> {
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("--metrics-listen {addr}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the metrics listener's runtime")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!(error = %e, "the metrics listener failed"),
                };
                let app = axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move || {
                        let registry = registry.clone();
                        async move { render(&registry) }
                    }),
                );
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "the metrics listener failed");
                }
            })
        })?;
    println!("metrics listening on http://{bound}");
    Ok(())
}

/// The registry in Prometheus' text format.
fn render(registry: &prometheus::Registry) -> (axum::http::HeaderMap, String) {
    use prometheus::Encoder;
    let encoder = prometheus::TextEncoder::new();
    let mut buf = Vec::new();
    if let Err(e) = encoder.encode(&registry.gather(), &mut buf) {
        tracing::error!(error = %e, "encoding the metrics");
    }
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    (headers, String::from_utf8_lossy(&buf).into_owned())
}

/// Runs one `lasthop-clicks` command (also `lasthop-control clicks ...`).
pub fn run(command: ClicksCommand) -> anyhow::Result<()> {
    match command {
        ClicksCommand::Synth(a) => {
            anyhow::ensure!(
                (0.0..=1.0).contains(&a.bot_share),
                "--bot-share must be 0..=1"
            );
            let cfg = SynthConfig {
                events: a.events,
                codes: a.codes.max(1),
                fixed_codes: a.fixed_codes.clone(),
                visitors: a.visitors.max(1),
                bot_share: a.bot_share,
                days: a.days.max(1),
                seed: a.seed,
                now_ms: u64::try_from(lasthop_core::clock::now_ms()).unwrap_or(0),
            };
            let report = match (&a.spool, &a.kafka) {
                (Some(dir), _) => crate::synth::write_spool(dir, &a.writer, cfg)?,
                (None, Some(brokers)) => {
                    crate::synth::produce_kafka(brokers, &a.topic, &a.compression, cfg)?
                }
                (None, None) => anyhow::bail!("pass --spool DIR or --kafka BROKERS"),
            };
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        ClicksCommand::Process(a) => {
            let source = source(&a.data_dir, a.spool, a.kafka, &a.topic, &a.group);
            let config = a.tuning.config(&a.data_dir, source)?;
            let (processor, archiver) = open_clicks(config, metrics(a.metrics_listen)?)?;
            let archive = archiver.as_ref().map(Archiver::handle);
            if !a.exit_when_idle {
                let (handle, archive) = (processor.handle(), archive.clone());
                lasthop_cli::bootstrap::on_shutdown_signal(move || {
                    handle.stop();
                    if let Some(a) = archive {
                        a.stop();
                    }
                });
            }
            let exit_when_idle = a.exit_when_idle;
            let archiving = archiver.map(|ar| std::thread::spawn(move || ar.run(exit_when_idle)));
            let summary = processor.run(a.exit_when_idle);
            if let Some(t) = archiving {
                if let Some(a) = &archive {
                    a.stop();
                }
                match t.join() {
                    Ok(s) => tracing::info!(archived = s.archived, "archive consumer done"),
                    Err(_) => anyhow::bail!("the archive consumer panicked"),
                }
            }
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        ClicksCommand::Archive(a) => {
            let source = source(&a.data_dir, a.spool, a.kafka, &a.topic, &a.group);
            let config = a.tuning.config(&a.data_dir, source)?;
            let archiver = Archiver::open(config.archiver(), &metrics(a.metrics_listen)?)
                .context("starting the archive consumer")?;
            if !a.exit_when_idle {
                let handle = archiver.handle();
                lasthop_cli::bootstrap::on_shutdown_signal(move || handle.stop());
            }
            let summary = archiver.run(a.exit_when_idle);
            println!("{}", serde_json::to_string(&summary)?);
            Ok(())
        }
        ClicksCommand::Recompute {
            data_dir,
            day,
            rules,
            archive,
        } => {
            let day = Day::parse(&day).context("--day must be YYYY-MM-DD")?;
            let report = crate::recompute::recompute_offline(
                &data_dir.join("clicks"),
                &archive.location(&data_dir)?,
                day,
                rules.load()?,
            )?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        ClicksCommand::ArchiveConvert {
            data_dir,
            day,
            archive,
            part_bytes,
        } => {
            let day = Day::parse(&day).context("--day must be YYYY-MM-DD")?;
            let report = crate::convert::convert_day(
                &data_dir.join("clicks").join("archive"),
                &archive.location(&data_dir)?,
                day,
                part_bytes,
            )?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}
