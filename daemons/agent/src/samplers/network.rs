//! `network`: /proc/net/dev's bytes received and sent since the sample before, summed over every interface but
//! loopback (the node's traffic with itself is not network traffic).

use canopy_proto::filters::v1::{NetworkSample, NodeSample};

use super::{ProcFile, Roots, Sampler, SamplerError, SamplerKind};

/// Bytes received and sent since boot over the interfaces but `lo`, and how many there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetTotals {
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub interfaces: u32,
}

/// Reads /proc/net/dev's text: two header lines, then `name: rx_bytes rx_packets ... (8 receive fields)
/// tx_bytes ...` per interface.
pub fn parse_net_dev(text: &str) -> Result<NetTotals, String> {
    let mut totals = NetTotals::default();
    for line in text.lines().skip(2) {
        // Interface names cannot hold a colon; a large count may follow it without a space.
        let Some((name, counts)) = line.split_once(':') else {
            return Err(format!("not an interface's line: {line:?}"));
        };
        let name = name.trim();
        if name == "lo" {
            continue;
        }
        let mut fields = counts.split_ascii_whitespace();
        let mut count = |n: usize, what: &str| -> Result<u64, String> {
            fields
                .nth(n)
                .and_then(|f| f.parse().ok())
                .ok_or_else(|| format!("{name}: no count of {what}"))
        };
        let rx = count(0, "bytes received")?;
        // The seven receive fields after the bytes, then the bytes sent.
        let tx = count(7, "bytes sent")?;
        totals.rx_bytes = totals.rx_bytes.saturating_add(rx);
        totals.tx_bytes = totals.tx_bytes.saturating_add(tx);
        totals.interfaces += 1;
    }
    Ok(totals)
}

#[derive(Debug)]
pub struct NetworkSampler {
    dev: ProcFile,
    before: Option<NetTotals>,
}

impl NetworkSampler {
    pub fn open(roots: &Roots) -> Result<Self, SamplerError> {
        Ok(Self {
            dev: ProcFile::open(roots.proc.join("net/dev"))?,
            before: None,
        })
    }
}

impl Sampler for NetworkSampler {
    fn kind(&self) -> SamplerKind {
        SamplerKind::Network
    }

    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError> {
        let now = parse_net_dev(self.dev.read()?).map_err(|e| self.dev.bad(e))?;
        if let Some(before) = self.before.replace(now) {
            // An interface that went away takes its counts with it: the sum can fall, which counts nothing.
            sample.network = Some(NetworkSample {
                rx_bytes: now.rx_bytes.saturating_sub(before.rx_bytes),
                tx_bytes: now.tx_bytes.saturating_sub(before.tx_bytes),
                interfaces: now.interfaces,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 74575234    2781    0    0    0     0          0         0   170225    1516    0    0    0     0       0          0
  ib0:12345678901 1 0 0 0 0 0 0 42 1 0 0 0 0 0 0
";

    #[test]
    fn every_interface_but_loopback_is_summed() {
        assert_eq!(
            parse_net_dev(DEV).unwrap(),
            NetTotals {
                rx_bytes: 74575234 + 12345678901,
                tx_bytes: 170225 + 42,
                interfaces: 3,
            }
        );
        let only_lo: String = DEV.lines().take(3).map(|l| format!("{l}\n")).collect();
        assert_eq!(parse_net_dev(&only_lo).unwrap(), NetTotals::default());
    }

    #[test]
    fn a_line_that_is_not_an_interface_is_refused() {
        let head: String = DEV.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(
            parse_net_dev(&format!("{head}eth0 1 2\n")).unwrap_err(),
            "not an interface's line: \"eth0 1 2\""
        );
        assert_eq!(
            parse_net_dev(&format!("{head}eth0: 1 2 3\n")).unwrap_err(),
            "eth0: no count of bytes sent"
        );
    }
}
