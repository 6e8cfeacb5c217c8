//! `memory`: /proc/meminfo's total and available memory at the sample, and /proc/vmstat's page faults since the
//! sample before.

use canopy_proto::filters::v1::{MemorySample, NodeSample};

use super::{ProcFile, Roots, Sampler, SamplerError, SamplerKind};

/// MemTotal and MemAvailable of /proc/meminfo, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// Reads /proc/meminfo's text (`Key:   N kB` lines).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let (mut total, mut available) = (None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => &mut total,
            "MemAvailable" => &mut available,
            _ => continue,
        };
        *slot = Some(kilobytes(key, value)?);
        if total.is_some() && available.is_some() {
            break;
        }
    }
    Ok(MemInfo {
        total_bytes: total.ok_or("no MemTotal line")?,
        available_bytes: available.ok_or("no MemAvailable line (Linux 3.14 and later have it)")?,
    })
}

/// A meminfo value, `N kB`, in bytes.
fn kilobytes(key: &str, value: &str) -> Result<u64, String> {
    let mut parts = value.split_ascii_whitespace();
    let n: u64 = parts
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{key} is not a count: {value:?}"))?;
    match parts.next() {
        Some("kB") => Ok(n.saturating_mul(1024)),
        None => Ok(n),
        Some(unit) => Err(format!("{key} is in {unit:?}, not kB")),
    }
}

/// Page faults since boot: all of them (pgfault) and the major ones (pgmajfault).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub faults: u64,
    pub major: u64,
}

/// Reads /proc/vmstat's text (`name N` lines).
pub fn parse_vmstat(text: &str) -> Result<Faults, String> {
    let (mut faults, mut major) = (None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        let slot = match key {
            "pgfault" => &mut faults,
            "pgmajfault" => &mut major,
            _ => continue,
        };
        *slot = Some(
            value
                .trim()
                .parse()
                .map_err(|_| format!("{key} is not a count: {value:?}"))?,
        );
        if faults.is_some() && major.is_some() {
            break;
        }
    }
    Ok(Faults {
        faults: faults.ok_or("no pgfault line")?,
        major: major.ok_or("no pgmajfault line")?,
    })
}

#[derive(Debug)]
pub struct MemorySampler {
    meminfo: ProcFile,
    vmstat: ProcFile,
    before: Option<Faults>,
}

impl MemorySampler {
    pub fn open(roots: &Roots) -> Result<Self, SamplerError> {
        Ok(Self {
            meminfo: ProcFile::open(roots.proc.join("meminfo"))?,
            vmstat: ProcFile::open(roots.proc.join("vmstat"))?,
            before: None,
        })
    }
}

impl Sampler for MemorySampler {
    fn kind(&self) -> SamplerKind {
        SamplerKind::Memory
    }

    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError> {
        let mem = parse_meminfo(self.meminfo.read()?).map_err(|e| self.meminfo.bad(e))?;
        let faults = parse_vmstat(self.vmstat.read()?).map_err(|e| self.vmstat.bad(e))?;
        if let Some(before) = self.before.replace(faults) {
            sample.memory = Some(MemorySample {
                total_bytes: mem.total_bytes,
                available_bytes: mem.available_bytes,
                used_bytes: mem.total_bytes.saturating_sub(mem.available_bytes),
                page_faults: faults.faults.saturating_sub(before.faults),
                major_faults: faults.major.saturating_sub(before.major),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24684084 kB
MemFree:        22770724 kB
MemAvailable:   24136372 kB
Buffers:            8028 kB
Cached:          1536552 kB
HugePages_Total:       0
";

    const VMSTAT: &str = "nr_free_pages 789882
nr_zone_inactive_anon 48677
pgfault 5186164
pgmajfault 807
pgrefill 0
";

    #[test]
    fn total_and_available_memory_read_in_bytes() {
        assert_eq!(
            parse_meminfo(MEMINFO).unwrap(),
            MemInfo {
                total_bytes: 24684084 * 1024,
                available_bytes: 24136372 * 1024,
            }
        );
        assert_eq!(
            parse_meminfo("MemTotal: 10 kB\nMemFree: 5 kB\n").unwrap_err(),
            "no MemAvailable line (Linux 3.14 and later have it)"
        );
        assert_eq!(
            parse_meminfo("MemTotal: ten kB\n").unwrap_err(),
            "MemTotal is not a count: \" ten kB\""
        );
        assert_eq!(
            parse_meminfo("MemTotal: 10 MB\n").unwrap_err(),
            "MemTotal is in \"MB\", not kB"
        );
    }

    #[test]
    fn page_faults_read_from_vmstat() {
        assert_eq!(
            parse_vmstat(VMSTAT).unwrap(),
            Faults {
                faults: 5186164,
                major: 807
            }
        );
        assert_eq!(parse_vmstat("pgfault 3\n").unwrap_err(), "no pgmajfault line");
        assert_eq!(
            parse_vmstat("pgfault x\npgmajfault 1\n").unwrap_err(),
            "pgfault is not a count: \"x\""
        );
    }
}
