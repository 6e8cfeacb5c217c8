//! The latency filter's parameters: which events count as transfer, and how many steps the root keeps open.

use std::collections::HashMap;

use canopy_filter_common::Params;
use regex_lite::Regex;

/// Events counted as transfer by default: MPI (and its profiling interface), HDF5, NetCDF and ADIOS2 calls,
/// and the POSIX and C I/O calls by their plain names.
pub const DEFAULT_TRANSFER: &str = r"^(P?MPI_|H5[A-Z]|nc_|adios2?_)|^(read|write|pread|pwrite|readv|writev|fread|fwrite|open|close|fsync|send|recv|sendto|recvfrom)$";
/// Steps the root keeps open (started or stopped, not both) by default, and at most.
pub const DEFAULT_MAX_OPEN: u32 = 4096;
pub const MAX_OPEN: u32 = 1 << 20;

const KNOWN: [&str; 2] = ["transfer", "max_open"];

#[derive(Debug)]
pub struct Settings {
    pub transfer: Regex,
    pub max_open: usize,
}

impl Settings {
    /// Params: `{"transfer": "<regex over event names>", "max_open": 1..=1048576 (4096)}`.
    pub fn parse(text: &str) -> Result<Settings, String> {
        let params = Params::parse(text, &KNOWN)?;
        let pattern = params.string("transfer")?.unwrap_or(DEFAULT_TRANSFER);
        let transfer =
            Regex::new(pattern).map_err(|e| format!("transfer is not a regular expression: {e}"))?;
        let max_open = params.u32_between("max_open", DEFAULT_MAX_OPEN, 1, MAX_OPEN)? as usize;
        Ok(Settings { transfer, max_open })
    }
}

/// Which event ids are transfer, from the names the node has learned; an id whose name is unknown is compute.
#[derive(Debug, Default)]
pub struct Transfer {
    ids: HashMap<u64, bool>,
}

impl Transfer {
    pub fn learn(&mut self, pattern: &Regex, names: &[(u64, &str)]) {
        for (id, name) in names {
            self.ids.insert(*id, pattern.is_match(name));
        }
    }

    pub fn is_transfer(&self, id: u64) -> bool {
        self.ids.get(&id).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pattern_takes_mpi_and_io_and_leaves_the_rest() {
        let s = Settings::parse("{}").unwrap();
        for name in [
            "MPI_Send",
            "PMPI_Allreduce",
            "H5Dwrite",
            "nc_put_var",
            "adios2_put",
            "write",
            "fread",
        ] {
            assert!(s.transfer.is_match(name), "{name}");
        }
        for name in ["compute", "MPIX", "rewrite", "writer", "solve_H5"] {
            assert!(!s.transfer.is_match(name), "{name}");
        }
        assert_eq!(s.max_open, 4096);
    }

    #[test]
    fn bad_params_are_named() {
        assert_eq!(
            Settings::parse(r#"{"bins": 3}"#).unwrap_err(),
            "unknown parameter \"bins\" (known: transfer, max_open)"
        );
        assert!(
            Settings::parse(r#"{"transfer": "("}"#)
                .unwrap_err()
                .starts_with("transfer is not a regular expression"),
        );
        assert_eq!(
            Settings::parse(r#"{"transfer": 3}"#).unwrap_err(),
            "transfer must be a string, got 3"
        );
        assert!(
            Settings::parse(r#"{"max_open": 0}"#)
                .unwrap_err()
                .contains("max_open")
        );
    }
}
