//! CPU time, to tell a slower client from one that burns more CPU: this
//! thread's, this process's, and a server process's (from `/proc`).

/// CPU time of `clock` so far, ms.
fn clock_ms(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the duration of the call.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// CPU time this thread has used, ms.
pub(crate) fn thread_ms() -> f64 {
    clock_ms(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time this process has used, all its threads, ms.
pub(crate) fn process_ms() -> f64 {
    clock_ms(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Minor page faults this process has taken (pages first touched, such as
/// a new guest instance's linear memory), all its threads.
pub(crate) fn minor_faults() -> u64 {
    // SAFETY: all-zero is a valid `rusage`, which getrusage overwrites.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer for the duration of the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    u64::try_from(usage.ru_minflt).unwrap_or(0)
}

/// CPU time (user + system, all threads) process `pid` has used, ms, in
/// clock ticks (10 ms here); `None` if it cannot be read.
pub(crate) fn of_pid(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ticks_ms(&stat)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, ms. The command name (in
/// parentheses) may hold spaces and parentheses itself: fields are counted
/// from the last `)`.
fn ticks_ms(stat: &str) -> Option<f64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state is field 3 of proc(5), utime 14 and stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| (utime + stime) as f64 * 1e3 / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_an_odd_command_name_reads_its_times() {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 30 12 0 0 20 0 3 0";
        assert_eq!(ticks_ms(line), Some(42.0 * 1e3 / hz));
        assert_eq!(ticks_ms("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_is_readable_and_its_clocks_advance() {
        let (p0, t0) = (process_ms(), thread_ms());
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(process_ms() > p0 && thread_ms() > t0, "{x}");
        assert!(of_pid(std::process::id()).is_some());
        assert_eq!(of_pid(u32::MAX), None);
        // Pages touched for the first time are counted (a fresh mapping:
        // 64 MiB is past malloc's reuse of freed memory).
        let f0 = minor_faults();
        let pages = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(minor_faults() >= f0 + 1000, "{}", pages.len());
    }
}
