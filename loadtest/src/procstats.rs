//! CPU time and peak memory of a process, from Linux `/proc`.
//!
//! CPU seconds are `utime + stime` (fields 14 and 15 of `/proc/<pid>/stat`,
//! user and system time of the process itself, not of its waited-for
//! children) divided by the kernel clock tick. The tick is read once per
//! process from `getconf CLK_TCK`; if that cannot run or prints something
//! unusable, 100 is assumed, which is what Linux reports on every mainstream
//! architecture. Peak RSS is `VmHWM` from `/proc/<pid>/status`, the
//! resident-set high-water mark since the process started.
//!
//! A process that no longer exists, or has exited and waits to be reaped (a
//! zombie, whose memory is already gone), gives [`Error::ProcessGone`].

use std::io::ErrorKind;
use std::process::Command;
use std::sync::OnceLock;

use serde::Serialize;

use crate::Error;

/// The clock tick assumed when `getconf CLK_TCK` is unavailable.
pub const DEFAULT_CLOCK_TICKS: u64 = 100;

/// One reading of a process's resource use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProcStats {
    /// User plus system CPU time so far.
    pub cpu_seconds: f64,
    /// Peak resident set size so far.
    pub peak_rss_bytes: u64,
}

/// Clock ticks per second, from `getconf CLK_TCK` on first use.
pub fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .unwrap_or(DEFAULT_CLOCK_TICKS)
    })
}

/// Reads the CPU time and peak RSS of process `pid`.
pub fn sample(pid: u32) -> Result<ProcStats, Error> {
    let stat = read_proc(pid, "stat")?;
    let (state, ticks) = parse_stat(pid, &stat)?;
    if state == 'Z' || state == 'X' {
        return Err(Error::ProcessGone { pid });
    }
    let status = read_proc(pid, "status")?;
    let peak_rss_bytes = parse_vm_hwm(pid, &status)?;
    Ok(ProcStats {
        cpu_seconds: ticks as f64 / clock_ticks_per_second() as f64,
        peak_rss_bytes,
    })
}

fn read_proc(pid: u32, file: &'static str) -> Result<String, Error> {
    let path = format!("/proc/{pid}/{file}");
    std::fs::read_to_string(&path).map_err(|source| match source.kind() {
        // ESRCH surfaces when the process exits between opening and reading.
        ErrorKind::NotFound => Error::ProcessGone { pid },
        _ if source.raw_os_error() == Some(3) => Error::ProcessGone { pid },
        _ => Error::Io {
            path: path.into(),
            source,
        },
    })
}

/// The state letter and `utime + stime` in clock ticks. The command name
/// (field 2) is in parentheses and may itself contain spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(pid: u32, stat: &str) -> Result<(char, u64), Error> {
    let format = |problem| Error::ProcFormat {
        pid,
        file: "stat",
        problem,
    };
    let after_comm = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| format("no `)` closing the command name"))?;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // fields[0] is field 3 (state), so field n is fields[n - 3].
    let state = fields
        .first()
        .and_then(|s| s.chars().next())
        .ok_or_else(|| format("no state field"))?;
    let tick_field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format("utime or stime missing or not a number"))
    };
    Ok((state, tick_field(14)? + tick_field(15)?))
}

/// `VmHWM` in bytes (the file gives kB, meaning KiB).
fn parse_vm_hwm(pid: u32, status: &str) -> Result<u64, Error> {
    let format = |problem| Error::ProcFormat {
        pid,
        file: "status",
        problem,
    };
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .ok_or_else(|| format("no VmHWM line (a kernel thread has none)"))?;
    let kib = line
        .trim()
        .strip_suffix("kB")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| format("VmHWM is not a number of kB"))?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_its_own_process() -> Result<(), Error> {
        // Burn a little CPU so there is something to count; the assertion
        // is only that the reading is sane, never how long anything took.
        let busy: u64 = (0..2_000_000u64).fold(0, |a, x| a.wrapping_add(x * x));
        std::hint::black_box(busy);
        let s = sample(std::process::id())?;
        assert!(s.cpu_seconds.is_finite() && s.cpu_seconds >= 0.0);
        assert!(s.peak_rss_bytes > 0);
        let later = sample(std::process::id())?;
        assert!(later.cpu_seconds >= s.cpu_seconds);
        // Not compared with the first reading: the kernel derives VmHWM from
        // per-CPU RSS counters that it syncs lazily, so while other test
        // threads free memory a second reading can come out lower.
        assert!(later.peak_rss_bytes > 0);
        Ok(())
    }

    #[test]
    fn missing_process_is_gone() {
        // Above any pid_max Linux allows (2^22), so it can never exist.
        let pid = u32::MAX;
        assert!(matches!(sample(pid), Err(Error::ProcessGone { pid: p }) if p == pid));
    }

    #[test]
    fn clock_tick_is_positive() {
        assert!(clock_ticks_per_second() > 0);
    }

    #[test]
    fn stat_with_awkward_command_name() -> Result<(), Error> {
        let stat =
            "42 (a) b (c) d) S 1 42 42 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 1 0 99 1000 200";
        assert_eq!(parse_stat(42, stat)?, ('S', 267));
        assert!(matches!(
            parse_stat(42, "42 (x) S 1"),
            Err(Error::ProcFormat { file: "stat", .. })
        ));
        assert!(matches!(
            parse_stat(42, "garbage"),
            Err(Error::ProcFormat { .. })
        ));
        Ok(())
    }

    #[test]
    fn status_high_water_mark() -> Result<(), Error> {
        let status = "Name:\tcat\nVmPeak:\t  9000 kB\nVmHWM:\t    1536 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(parse_vm_hwm(7, status)?, 1536 * 1024);
        assert!(matches!(
            parse_vm_hwm(7, "Name:\tkthreadd\n"),
            Err(Error::ProcFormat { file: "status", .. })
        ));
        Ok(())
    }
}
