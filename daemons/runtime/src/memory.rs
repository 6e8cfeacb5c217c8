//! A daemon's declared memory budget (`memory_budget_mb`): the buffers that grow with load take their bounds
//! from it (a link's copies kept for resending, the store's rounds kept for retry), and the daemon's resident
//! size is watched against it, logged when over, so an operator sizes the budget before the kernel's OOM killer
//! does.

use std::time::Duration;

use crate::config::ConfigIssue;

/// The default budget of every daemon, in MiB.
pub const DEFAULT_MEMORY_BUDGET_MB: u64 = 512;

/// The smallest budget a daemon runs with: its code, threads and one round's buffers.
pub const MIN_MEMORY_BUDGET_MB: u64 = 32;

/// How often the resident size is read.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// How often, at most, being over the budget is logged.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// Checks a budget from the configuration.
pub fn check(budget_mb: u64) -> Result<(), ConfigIssue> {
    if !(MIN_MEMORY_BUDGET_MB..=1 << 20).contains(&budget_mb) {
        return Err(ConfigIssue::new(
            "memory_budget_mb",
            format!("must be from {MIN_MEMORY_BUDGET_MB} to 1048576 (MiB)"),
        ));
    }
    Ok(())
}

/// The share of a budget of `budget_mb` MiB that one kind of buffer may hold: a quarter, in bytes.
pub fn share(budget_mb: u64) -> usize {
    usize::try_from((budget_mb << 20) / 4).unwrap_or(usize::MAX)
}

/// This process's resident size in bytes, from /proc/self/statm; `None` where it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096);
    Some(pages * page)
}

/// Watches the resident size on a thread of its own for the life of the process: over the budget, a warning at
/// most once a minute, with the size and the budget.
#[allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "a thread of its own, outside the runtime: it sleeps and times itself by the wall clock"
)]
pub fn watch(budget_mb: u64) {
    let budget = budget_mb << 20;
    let spawned = std::thread::Builder::new()
        .name("canopy-memory".into())
        .spawn(move || {
            let mut said: Option<std::time::Instant> = None;
            loop {
                std::thread::sleep(WATCH_EVERY);
                let Some(rss) = resident_bytes() else { return };
                if rss > budget && said.is_none_or(|t| t.elapsed() >= SAY_EVERY) {
                    said = Some(std::time::Instant::now());
                    tracing::warn!(
                        resident_mb = rss >> 20,
                        memory_budget_mb = budget_mb,
                        "resident memory is over the daemon's memory_budget_mb: raise it, or look at what grew"
                    );
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the resident memory: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_checked_and_shared() {
        assert!(check(DEFAULT_MEMORY_BUDGET_MB).is_ok());
        assert!(check(8).is_err());
        assert_eq!(share(512), 128 << 20);
        let rss = resident_bytes().unwrap();
        assert!(rss > 1 << 20 && rss < 64 << 30, "{rss}");
    }
}
