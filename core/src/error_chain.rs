//! An error and its causes on one line, for log fields: `error: cause: cause`.
//!
//! A library error's message says what failed and leaves the underlying failure to
//! [`std::error::Error::source`], so a log line that showed only the message would lose it (the
//! binary's `{:#}` of its error shows the same line). An error that writes its cause into its
//! own message does not also report it as its source (the store's `StoreError`), so no cause
//! is written twice.

use std::error::Error;
use std::fmt;

/// A failure's cause, kept whole (with its own `source` chain) for the log.
pub type Cause = Box<dyn Error + Send + Sync + 'static>;

/// A [`Cause`] and its own causes on one line (see [`ErrorChain`]).
pub fn chain(cause: &Cause) -> ErrorChain<'_> {
    ErrorChain(&**cause)
}

/// Displays an error followed by each of its causes, `: ` between them.
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading a file")]
        Context(#[source] std::io::Error),
    }

    #[test]
    fn causes_follow_the_message() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(
            ErrorChain(&Outer::Context(io())).to_string(),
            "reading a file: disk on fire"
        );
        assert_eq!(ErrorChain(&io()).to_string(), "disk on fire");
    }
}
