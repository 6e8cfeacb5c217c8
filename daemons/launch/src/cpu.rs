//! The CPU time of a daemon's process, read from /proc/PID/stat. A process that has exited keeps its final
//! figures there until it is reaped, so a daemon's last reading is taken before its exit status is collected.

use std::time::Duration;

/// One reading of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// User plus system time.
    pub cpu: Duration,
    /// The process has exited (a zombie): this reading is its last.
    pub exited: bool,
}

/// Reads /proc/PID/stat; `None` if the process is gone or /proc cannot be read.
pub fn read(pid: u32) -> Option<Reading> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(&stat, ticks_per_second()?)
}

fn ticks_per_second() -> Option<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

/// A stat line: `pid (comm) state ...`, where comm may hold spaces and parentheses; utime and stime are the
/// 12th and 13th fields after the closing parenthesis, in clock ticks.
fn parse(stat: &str, ticks: u64) -> Option<Reading> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = *fields.first()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let t = utime + stime;
    Some(Reading {
        cpu: Duration::from_secs(t / ticks) + Duration::from_nanos((t % ticks) * 1_000_000_000 / ticks),
        exited: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_user_plus_system_time_and_the_state() {
        // comm with a space and a parenthesis; utime 150 and stime 50 ticks at 100 per second.
        let line = "4242 (canopy (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 3 0 1000 0 0";
        assert_eq!(
            parse(line, 100),
            Some(Reading {
                cpu: Duration::from_secs(2),
                exited: false
            })
        );
        let zombie = line.replace(") S ", ") Z ");
        assert!(parse(&zombie, 100).unwrap().exited);
        assert_eq!(parse("4242 (short) S 1 2", 100), None);
    }

    #[test]
    fn this_process_has_a_reading() {
        // Burn CPU until the reading shows it: a reading that never grows fails the test by its timeout.
        let mut x = 0u64;
        let r = loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            let r = read(std::process::id()).expect("/proc/self/stat");
            if r.cpu >= Duration::from_millis(20) {
                break r;
            }
        };
        assert!(!r.exited);
    }
}
