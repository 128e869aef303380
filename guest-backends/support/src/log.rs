//! One line to the guest's stderr, which the host logs as the backend's.
//!
//! Not `eprintln!`: it panics when stderr fails, and the message of that
//! panic links every `io::Error` description, 3 KiB of the data image each
//! instance of a backend maps (the fs backend's went from 4 memory pages
//! to 3). A line that cannot be written is dropped.

/// Log one line (`format!` arguments, no trailing newline) to stderr.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::log_line(::core::format_args!($($arg)*))
    };
}

/// What [`log!`] expands to: `line` and a newline, in one write.
pub fn log_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = std::io::stderr().write_fmt(format_args!("{line}\n"));
}
