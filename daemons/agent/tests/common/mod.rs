//! What the heap tests share.

/// Minor page faults of the calling thread so far (/proc/thread-self/stat, field 10).
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let after = &stat[stat.rfind(')').expect("stat has the command in parentheses") + 2..];
    after
        .split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .expect("minflt in stat")
}
