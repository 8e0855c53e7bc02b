//! The engine's operator surface in numbers: [`prom`], the text format's lines (a leaf every
//! counter-owning module uses), and [`engine`], the per-core counters and the whole process's
//! exposition.

pub mod engine;
pub mod prom;

pub use engine::{CoreMetrics, EngineMetrics, Health, OriginOutcome, StatusClass};
