//! A guest's stderr: each line goes to the host log (debug level, tagged
//! with the backend), and the last few lines are kept so that when the guest
//! traps, the error can quote its last words, typically a Rust panic
//! message. Writes never fail or block: a chatty guest costs host CPU, never
//! a trap, and at most 50 of its lines a second per backend reach the log
//! (the rest are counted).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Longest line kept; longer lines are cut.
const MAX_LINE: usize = 1024;
/// Lines logged per second per backend; the rest are counted.
const LINES_PER_SECOND: u32 = 50;
/// Lines kept for trap reports.
const KEPT_LINES: usize = 4;

/// The stderr of one guest instance.
#[derive(Clone)]
pub(crate) struct GuestStderr {
    backend: Arc<str>,
    lines: Arc<Mutex<Lines>>,
}

#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
    last: VecDeque<String>,
}

impl GuestStderr {
    pub(crate) fn new(backend: &str) -> GuestStderr {
        GuestStderr {
            backend: backend.into(),
            lines: Arc::default(),
        }
    }

    fn write(&self, bytes: &[u8]) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        for &byte in bytes {
            if byte == b'\n' {
                let line =
                    String::from_utf8_lossy(&std::mem::take(&mut lines.partial)).into_owned();
                if line.trim().is_empty() {
                    continue;
                }
                if tracing::enabled!(tracing::Level::DEBUG)
                    && let Some(suppressed) = crate::log_limit::admit_up_to(
                        ("guest stderr", &*self.backend),
                        LINES_PER_SECOND,
                    )
                {
                    tracing::debug!(backend = %self.backend, suppressed, "guest stderr: {line}");
                }
                if lines.last.len() == KEPT_LINES {
                    lines.last.pop_front();
                }
                lines.last.push_back(line);
            } else if lines.partial.len() < MAX_LINE {
                lines.partial.push(byte);
            }
        }
    }

    /// The last lines the guest wrote (and any unfinished one), joined.
    pub(crate) fn last_words(&self) -> Option<String> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let mut words: Vec<&str> = lines.last.iter().map(String::as_str).collect();
        let partial = String::from_utf8_lossy(&lines.partial);
        if !partial.is_empty() {
            words.push(&partial);
        }
        let joined = words.join(" | ");
        (!joined.trim().is_empty()).then_some(joined)
    }
}

impl IsTerminal for GuestStderr {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestStderr {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestStderr {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        GuestStderr::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(usize::MAX)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestStderr {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestStderr {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        GuestStderr::write(&self, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_lines_and_the_unfinished_one() {
        let log = GuestStderr::new("t");
        assert_eq!(log.last_words(), None);
        log.write(b"one\ntwo\nthree\nfour\nfive\npanicked at src/lib.rs:7:");
        assert_eq!(
            log.last_words().as_deref(),
            Some("two | three | four | five | panicked at src/lib.rs:7:")
        );
        log.write(&vec![b'x'; 5000]);
        log.write(b"\n");
        assert!(
            log.last_words()
                .unwrap()
                .ends_with(&"x".repeat(MAX_LINE - "panicked at src/lib.rs:7:".len()))
        );
    }
}
