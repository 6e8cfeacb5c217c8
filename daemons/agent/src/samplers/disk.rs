//! `disk`: /proc/diskstats' bytes read and written since the sample before, summed over the node's whole disks.
//!
//! A whole disk is a device of /sys/block that a device backs (`/sys/block/NAME/device` exists): sda, vda,
//! nvme0n1. Partitions are not in /sys/block, and loop, ram, zram, device-mapper and md devices have no `device`
//! there; counting them too would count the same bytes twice (a partition's with its disk's, a dm volume's with
//! the disk under it). The answer per name is kept, so /sys is looked at once per device.

use std::collections::HashMap;
use std::path::PathBuf;

use canopy_proto::filters::v1::{DiskSample, NodeSample};

use super::{ProcFile, Roots, Sampler, SamplerError, SamplerKind};

/// Bytes a sector counts in /proc/diskstats, whatever the device's own sector size.
pub const SECTOR_BYTES: u64 = 512;

/// Bytes read and written since boot over the whole disks, and how many there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTotals {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub disks: u32,
}

/// Reads /proc/diskstats' text (`major minor name reads merged sectors_read ms writes merged sectors_written
/// ...`), counting the devices `is_disk` takes.
pub fn parse_diskstats(text: &str, mut is_disk: impl FnMut(&str) -> bool) -> Result<DiskTotals, String> {
    let mut totals = DiskTotals::default();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.nth(2) else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(format!("not a device's line: {line:?}"));
        };
        if !is_disk(name) {
            continue;
        }
        let mut count = |n: usize, what: &str| -> Result<u64, String> {
            fields
                .nth(n)
                .and_then(|f| f.parse::<u64>().ok())
                .ok_or_else(|| format!("{name}: no count of {what}"))
        };
        // After the name: reads, reads merged, then the sectors read; ms reading, writes, writes merged, then the
        // sectors written.
        let read = count(2, "sectors read")?;
        let written = count(3, "sectors written")?;
        totals.read_bytes = totals
            .read_bytes
            .saturating_add(read.saturating_mul(SECTOR_BYTES));
        totals.write_bytes = totals
            .write_bytes
            .saturating_add(written.saturating_mul(SECTOR_BYTES));
        totals.disks += 1;
    }
    Ok(totals)
}

/// Which device names are whole disks, from /sys/block, remembered per name.
#[derive(Debug)]
struct WholeDisks {
    sys_block: PathBuf,
    known: HashMap<String, bool>,
}

impl WholeDisks {
    fn is_disk(&mut self, name: &str) -> bool {
        if let Some(&disk) = self.known.get(name) {
            return disk;
        }
        let disk = self.sys_block.join(name).join("device").exists();
        self.known.insert(name.to_string(), disk);
        disk
    }
}

#[derive(Debug)]
pub struct DiskSampler {
    diskstats: ProcFile,
    disks: WholeDisks,
    before: Option<DiskTotals>,
}

impl DiskSampler {
    pub fn open(roots: &Roots) -> Result<Self, SamplerError> {
        let sys_block = roots.sys.join("block");
        // Without /sys/block no disk could be told from a partition: refuse rather than count nothing.
        if let Err(source) = std::fs::read_dir(&sys_block) {
            return Err(SamplerError::Io {
                path: sys_block,
                source,
            });
        }
        Ok(Self {
            diskstats: ProcFile::open(roots.proc.join("diskstats"))?,
            disks: WholeDisks {
                sys_block,
                known: HashMap::new(),
            },
            before: None,
        })
    }
}

impl Sampler for DiskSampler {
    fn kind(&self) -> SamplerKind {
        SamplerKind::Disk
    }

    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError> {
        let disks = &mut self.disks;
        let now = parse_diskstats(self.diskstats.read()?, |name| disks.is_disk(name))
            .map_err(|e| self.diskstats.bad(e))?;
        if let Some(before) = self.before.replace(now) {
            sample.disk = Some(DiskSample {
                read_bytes: now.read_bytes.saturating_sub(before.read_bytes),
                write_bytes: now.write_bytes.saturating_sub(before.write_bytes),
                disks: now.disks,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc/diskstats of a machine with an NVMe disk, its partitions, a dm volume on one of them, loop devices
    /// and a SATA disk (Linux 6.1: 20 fields).
    const DISKSTATS: &str = "   7       0 loop0 53 0 2254 13 0 0 0 0 0 36 13 0 0 0 0 0 0
   7       1 loop1 12 0 60 2 0 0 0 0 0 8 2 0 0 0 0 0 0
 259       0 nvme0n1 191846 60512 14637042 33546 357409 210862 23917192 245180 0 192884 288426 0 0 0 0 7860 9699
 259       1 nvme0n1p1 286 1222 14206 49 2 0 2 0 0 72 49 0 0 0 0 0 0
 259       2 nvme0n1p2 191488 59290 14616012 33480 357407 210862 23917190 245180 0 192816 278660 0 0 0 0 0 0
 253       0 dm-0 250714 0 14615122 44184 568268 0 23917184 1020328 0 193224 1064512 0 0 0 0 0 0
   8       0 sda 1000 0 2048 10 500 0 4096 20 0 30 30
";

    fn whole(name: &str) -> bool {
        matches!(name, "nvme0n1" | "sda")
    }

    #[test]
    fn whole_disks_are_summed_in_bytes_and_the_rest_left_out() {
        assert_eq!(
            parse_diskstats(DISKSTATS, whole).unwrap(),
            DiskTotals {
                read_bytes: (14637042 + 2048) * 512,
                write_bytes: (23917192 + 4096) * 512,
                disks: 2,
            }
        );
        let mut asked = Vec::new();
        parse_diskstats(DISKSTATS, |name| {
            asked.push(name.to_string());
            false
        })
        .unwrap();
        assert_eq!(asked.len(), 7, "every device is asked about: {asked:?}");
    }

    #[test]
    fn a_short_line_of_a_disk_is_refused() {
        assert_eq!(
            parse_diskstats("8 0 sda 1 0 2\n", whole).unwrap_err(),
            "sda: no count of sectors written"
        );
        assert_eq!(
            parse_diskstats("8 0\n", whole).unwrap_err(),
            "not a device's line: \"8 0\""
        );
        // A short line of a device that is not counted does not matter.
        assert!(parse_diskstats("7 0 loop0 1\n", whole).is_ok());
    }
}
