//! `cpu`: /proc/stat's first line, the time all CPUs spent in each state since boot (in clock ticks), turned into
//! each state's share of the interval.

use canopy_proto::filters::v1::{CpuSample, NodeSample};

use super::{ProcFile, Roots, Sampler, SamplerError, SamplerKind};

/// The `cpu` line of /proc/stat: ticks of all CPUs together since boot, and how many CPUs it lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
    pub cpus: u32,
}

/// Reads /proc/stat's text: the `cpu` line (user, nice, system, idle, then iowait, irq, softirq and steal where
/// the kernel has them; guest time is inside user already) and the count of `cpuN` lines after it.
pub fn parse_stat(text: &str) -> Result<CpuTimes, String> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let mut fields = first.split_ascii_whitespace();
    if fields.next() != Some("cpu") {
        return Err(format!("the first line is not the cpu total: {first:?}"));
    }
    let mut ticks = [0u64; 8];
    for (i, slot) in ticks.iter_mut().enumerate() {
        match fields.next() {
            Some(f) => {
                *slot = f
                    .parse()
                    .map_err(|_| format!("cpu field {} is not a count: {f:?}", i + 1))?;
            }
            None if i >= 4 => break,
            None => return Err(format!("the cpu line has {i} fields, fewer than 4: {first:?}")),
        }
    }
    let cpus = lines.take_while(|l| l.starts_with("cpu")).count();
    let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks;
    Ok(CpuTimes {
        user,
        nice,
        system,
        idle,
        iowait,
        irq,
        softirq,
        steal,
        cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
    })
}

impl CpuTimes {
    /// Each state's share of the ticks between `before` and this reading; `None` when no tick passed. A counter
    /// that went back (the kernel's iowait can) counts nothing, so the shares still add up to 1.
    pub fn shares_since(&self, before: &CpuTimes) -> Option<CpuSample> {
        let d = |now: u64, then: u64| now.saturating_sub(then) as f64;
        let parts = [
            d(self.user, before.user),
            d(self.nice, before.nice),
            d(self.system, before.system),
            d(self.idle, before.idle),
            d(self.iowait, before.iowait),
            d(self.irq, before.irq) + d(self.softirq, before.softirq),
            d(self.steal, before.steal),
        ];
        let total: f64 = parts.iter().sum();
        if total == 0.0 {
            return None;
        }
        let [user, nice, system, idle, iowait, irq, steal] = parts.map(|p| p / total);
        Some(CpuSample {
            cpus: self.cpus,
            user_share: user,
            nice_share: nice,
            system_share: system,
            idle_share: idle,
            iowait_share: iowait,
            irq_share: irq,
            steal_share: steal,
        })
    }
}

#[derive(Debug)]
pub struct CpuSampler {
    stat: ProcFile,
    before: Option<CpuTimes>,
    /// The shares of the last interval in which a tick passed. /proc/stat counts in ticks of 10 ms: a read within
    /// the same tick as the one before it (rounds that close in a burst, each taking a sample) learns nothing new,
    /// and repeats these rather than leave its round without a CPU share.
    held: Option<CpuSample>,
}

impl CpuSampler {
    pub fn open(roots: &Roots) -> Result<Self, SamplerError> {
        Ok(Self {
            stat: ProcFile::open(roots.proc.join("stat"))?,
            before: None,
            held: None,
        })
    }
}

impl Sampler for CpuSampler {
    fn kind(&self) -> SamplerKind {
        SamplerKind::Cpu
    }

    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError> {
        let now = parse_stat(self.stat.read()?).map_err(|e| self.stat.bad(e))?;
        if let Some(before) = self.before.replace(now) {
            if let Some(shares) = now.shares_since(&before) {
                self.held = Some(shares);
            }
            sample.cpu = self.held;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of /proc/stat on a 2-CPU machine (Linux 6.1), and a second later with one CPU busy in user.
    const BEFORE: &str = "cpu  25035 0 3050 97057 233 0 21 22 0 0
cpu0 11645 0 1203 49828 15 0 4 9 0 0
cpu1 13390 0 1847 47228 218 0 17 12 0 0
intr 179143 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 14
ctxt 252921
btime 1764013680
processes 6480
procs_running 4
procs_blocked 0
softirq 107425 0 21457 4 1039 4438 0 1212 46823 0 32452
";
    const AFTER: &str = "cpu  25135 0 3060 97137 233 0 23 24 0 0
cpu0 11745 0 1205 49828 15 0 5 10 0 0
cpu1 13390 0 1855 47308 218 0 18 13 0 0
intr 179343 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 14
ctxt 253121
";

    #[test]
    fn the_cpu_line_and_the_cpus_are_read() {
        let t = parse_stat(BEFORE).unwrap();
        assert_eq!(
            t,
            CpuTimes {
                user: 25035,
                nice: 0,
                system: 3050,
                idle: 97057,
                iowait: 233,
                irq: 0,
                softirq: 21,
                steal: 22,
                cpus: 2,
            }
        );
        // A kernel without iowait and the rest (before 2.5.41) still reads.
        let old = parse_stat("cpu 1 2 3 4\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!((old.idle, old.iowait, old.steal, old.cpus), (4, 0, 0, 1));
    }

    #[test]
    fn a_busy_second_reads_as_shares_that_add_up_to_one() {
        let s = parse_stat(AFTER)
            .unwrap()
            .shares_since(&parse_stat(BEFORE).unwrap())
            .unwrap();
        // 194 ticks: user 100, system 10, idle 80, irq 2 (soft), steal 2.
        let total = 100.0 + 10.0 + 80.0 + 2.0 + 2.0;
        assert_eq!(s.cpus, 2);
        assert!((s.user_share - 100.0 / total).abs() < 1e-12, "{s:?}");
        assert!((s.system_share - 10.0 / total).abs() < 1e-12);
        assert!((s.idle_share - 80.0 / total).abs() < 1e-12);
        assert!((s.irq_share - 2.0 / total).abs() < 1e-12);
        assert!((s.steal_share - 2.0 / total).abs() < 1e-12);
        let sum = s.user_share
            + s.nice_share
            + s.system_share
            + s.idle_share
            + s.iowait_share
            + s.irq_share
            + s.steal_share;
        assert!((sum - 1.0).abs() < 1e-12);
    }

    #[test]
    fn no_tick_is_no_share_and_a_counter_that_went_back_counts_nothing() {
        let t = parse_stat(BEFORE).unwrap();
        assert_eq!(t.shares_since(&t), None);
        let mut later = t;
        later.idle += 10;
        later.iowait -= 3;
        let s = later.shares_since(&t).unwrap();
        assert_eq!((s.idle_share, s.iowait_share), (1.0, 0.0));
    }

    #[test]
    fn what_is_not_proc_stat_is_refused_with_the_line() {
        assert_eq!(
            parse_stat("intr 1 2\n").unwrap_err(),
            "the first line is not the cpu total: \"intr 1 2\""
        );
        assert_eq!(
            parse_stat("cpu 1 2 x 4\n").unwrap_err(),
            "cpu field 3 is not a count: \"x\""
        );
        assert_eq!(
            parse_stat("cpu 1 2\n").unwrap_err(),
            "the cpu line has 2 fields, fewer than 4: \"cpu 1 2\""
        );
        assert!(parse_stat("").is_err());
    }
}
