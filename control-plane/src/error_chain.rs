//! An error and its causes on one line, for log fields: `error: cause: cause`.
//!
//! A library error's message says what failed and leaves the underlying failure to
//! [`std::error::Error::source`], so a log line that showed only the message would lose it (the
//! binary's `{:#}` of its error shows the same line). Some errors also repeat their cause in
//! their own message ([`crate::store::StoreError`]'s `{what}: {source}`): a cause the line
//! already ends with is not written again.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its causes, `: ` between them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            if !line.ends_with(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = e.source();
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("reading a file")]
        Context(#[source] std::io::Error),
        #[error("the store: {0}")]
        Repeats(#[source] std::io::Error),
    }

    #[test]
    fn causes_follow_the_message_once() {
        let io = || std::io::Error::other("disk on fire");
        assert_eq!(
            ErrorChain(&Outer::Context(io())).to_string(),
            "reading a file: disk on fire"
        );
        assert_eq!(
            ErrorChain(&Outer::Repeats(io())).to_string(),
            "the store: disk on fire"
        );
        assert_eq!(ErrorChain(&io()).to_string(), "disk on fire");
    }
}
