//! What the source's two readers share: the processor ([`processor`](crate::processor)) and the
//! archive consumer ([`archiver`](crate::archiver)) read one spool or Kafka topic, each at a
//! position of its own, with one bound on event times and one pause when idle, and fail the
//! same ways.

use std::path::PathBuf;
use std::time::Duration;

use super::archive::ArchiveError;
use super::kafka::{KafkaConfig, KafkaSourceError};
use super::spool::SpoolError;
use super::store::StoreError;

/// Events further in the future than this are invalid (clock skew allowance): neither counted
/// nor archived.
pub const MAX_FUTURE_MS: u64 = 5 * 60 * 1000;

/// How long an idle poll waits before looking again.
pub(crate) const IDLE_WAIT: Duration = Duration::from_millis(100);

/// Where events come from.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// A spool directory.
    Spool(PathBuf),
    /// A Kafka consumer group.
    Kafka(KafkaConfig),
}

/// Why a reader of the source (the processor, or the archive consumer) could not start or
/// stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessorError {
    /// The rollup store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The archive's object store.
    #[error(transparent)]
    Objects(#[from] super::objects::ObjectsError),
    /// The spool directory.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The Kafka consumer.
    #[error(transparent)]
    Kafka(#[from] KafkaSourceError),
    /// The thread could not start.
    #[error("starting the processor thread: {0}")]
    Thread(std::io::Error),
}
