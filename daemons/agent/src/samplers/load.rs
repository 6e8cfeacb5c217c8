//! `load`: /proc/loadavg at the sample, the run queue averaged over 1, 5 and 15 minutes and the threads
//! runnable now.

use canopy_proto::filters::v1::{LoadSample, NodeSample};

use super::{ProcFile, Roots, Sampler, SamplerError, SamplerKind};

/// Reads /proc/loadavg's text: `1m 5m 15m runnable/threads last_pid`.
pub fn parse_loadavg(text: &str) -> Result<LoadSample, String> {
    let mut fields = text.split_ascii_whitespace();
    let mut average = |what: &str| -> Result<f64, String> {
        let f = fields.next().unwrap_or_default();
        f.parse()
            .map_err(|_| format!("the {what} load is not a number: {f:?}"))
    };
    let (load_1m, load_5m, load_15m) = (average("1-minute")?, average("5-minute")?, average("15-minute")?);
    let threads = fields.next().unwrap_or_default();
    let (runnable, all) = threads
        .split_once('/')
        .and_then(|(r, t)| Some((r.parse().ok()?, t.parse().ok()?)))
        .ok_or_else(|| format!("not runnable/threads: {threads:?}"))?;
    Ok(LoadSample {
        load_1m,
        load_5m,
        load_15m,
        runnable,
        threads: all,
    })
}

#[derive(Debug)]
pub struct LoadSampler {
    loadavg: ProcFile,
}

impl LoadSampler {
    pub fn open(roots: &Roots) -> Result<Self, SamplerError> {
        Ok(Self {
            loadavg: ProcFile::open(roots.proc.join("loadavg"))?,
        })
    }
}

impl Sampler for LoadSampler {
    fn kind(&self) -> SamplerKind {
        SamplerKind::Load
    }

    fn read(&mut self, sample: &mut NodeSample) -> Result<(), SamplerError> {
        sample.load = Some(parse_loadavg(self.loadavg.read()?).map_err(|e| self.loadavg.bad(e))?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_averages_and_the_threads_are_read() {
        assert_eq!(
            parse_loadavg("2.57 1.02 0.38 4/114 6478\n").unwrap(),
            LoadSample {
                load_1m: 2.57,
                load_5m: 1.02,
                load_15m: 0.38,
                runnable: 4,
                threads: 114,
            }
        );
        assert_eq!(
            parse_loadavg("2.57 x 0.38 4/114 6478\n").unwrap_err(),
            "the 5-minute load is not a number: \"x\""
        );
        assert_eq!(
            parse_loadavg("2.57 1.02 0.38 4 6478\n").unwrap_err(),
            "not runnable/threads: \"4\""
        );
        assert!(parse_loadavg("").is_err());
    }
}
