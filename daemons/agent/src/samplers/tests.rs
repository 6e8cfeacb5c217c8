//! The samplers as a set: names from the configuration, the files read again and again (a copy of /proc and /sys
//! that the tests rewrite), a sampler whose file is missing or turns bad left out while the others go on, the
//! real /proc of this machine, and the thread of a set period.

#![allow(
    clippy::disallowed_types,
    clippy::disallowed_methods,
    reason = "the samplers read real files over real time, on the test's own thread"
)]

use std::path::Path;
use std::time::Duration;

use super::disk::DiskSampler;
use super::*;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn names_are_checked_and_listed_in_the_error() {
    assert_eq!(
        parse_names(&names(&["cpu", "load"])).unwrap(),
        vec![SamplerKind::Cpu, SamplerKind::Load]
    );
    assert_eq!(parse_names(&names(&[])).unwrap(), vec![]);
    // A flag given as `--samplers ''` is none.
    assert_eq!(parse_names(&names(&[""])).unwrap(), vec![]);
    assert_eq!(
        parse_names(&names(&["cpu", "gpu"])).unwrap_err(),
        "unknown sampler \"gpu\" (samplers: cpu, memory, network, disk, load)"
    );
    assert_eq!(
        parse_names(&names(&["load", "load"])).unwrap_err(),
        "names the sampler \"load\" twice"
    );
}

/// A copy of the files the samplers read, at one moment of a node's life.
struct FakeNode {
    dir: tempfile::TempDir,
}

impl FakeNode {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for d in ["proc/net", "sys/block/vda/device", "sys/block/loop0"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let node = FakeNode { dir };
        node.at(0);
        node
    }

    fn roots(&self) -> Roots {
        Roots {
            proc: self.dir.path().join("proc"),
            sys: self.dir.path().join("sys"),
        }
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.path().join("proc").join(file), text).unwrap();
    }

    /// The files `k` seconds in: each second one CPU of two busy in user, 4 page faults (1 major), 1000 bytes
    /// in and 10 out on eth0 (and as much on lo), 2 sectors read and 8 written on vda (and on a loop device).
    fn at(&self, k: u64) {
        let (busy, idle) = (100 * k, 100 * k);
        self.write(
            "stat",
            &format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {busy} 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 {idle} 0 0 0 0 0 0\nintr 1\n"),
        );
        self.write(
            "meminfo",
            "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n",
        );
        self.write(
            "vmstat",
            &format!("nr_free_pages 1\npgfault {}\npgmajfault {}\n", 4 * k, k),
        );
        let (rx, tx) = (1000 * k, 10 * k);
        self.write(
            "net/dev",
            &format!(
                "Inter-| Receive | Transmit\n face |bytes ...|bytes ...\n    lo: {rx} 0 0 0 0 0 0 0 {rx} 0 0 0 0 0 0 0\n  eth0: {rx} 0 0 0 0 0 0 0 {tx} 0 0 0 0 0 0 0\n"
            ),
        );
        let (r, w) = (2 * k, 8 * k);
        self.write(
            "diskstats",
            &format!(
                " 254 0 vda 1 0 {r} 0 1 0 {w} 0 0 0 0\n 254 1 vda1 1 0 {r} 0 1 0 {w} 0 0 0 0\n 7 0 loop0 1 0 {r} 0 1 0 {w} 0 0 0 0\n"
            ),
        );
        self.write("loadavg", &format!("{k}.50 0.25 0.10 3/200 999\n"));
    }
}

#[test]
fn every_sampler_reads_what_happened_since_its_previous_read() {
    let node = FakeNode::new();
    let mut samplers = Samplers::start(&SamplerKind::ALL, &node.roots());
    assert_eq!(samplers.running(), SamplerKind::ALL.to_vec());
    node.at(2);
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    let cpu = s.cpu.unwrap();
    assert_eq!((cpu.cpus, cpu.user_share, cpu.idle_share), (2, 0.5, 0.5));
    let mem = s.memory.unwrap();
    assert_eq!(
        (mem.total_bytes, mem.available_bytes, mem.used_bytes),
        (1000 * 1024, 400 * 1024, 600 * 1024)
    );
    assert_eq!((mem.page_faults, mem.major_faults), (8, 2));
    let net = s.network.unwrap();
    assert_eq!((net.rx_bytes, net.tx_bytes, net.interfaces), (2000, 20, 1));
    let disk = s.disk.unwrap();
    assert_eq!(
        (disk.read_bytes, disk.write_bytes, disk.disks),
        (4 * 512, 16 * 512, 1)
    );
    let load = s.load.unwrap();
    assert_eq!((load.load_1m, load.runnable, load.threads), (2.5, 3, 200));
    assert!(s.sample_unix_ns > 0);
    assert!(s.interval_ns > 0);

    // The next sample counts from this one, not from the start.
    node.at(3);
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    assert_eq!(s.network.unwrap().rx_bytes, 1000);
    assert_eq!(s.memory.unwrap().page_faults, 4);
}

#[test]
fn a_read_within_the_tick_of_the_one_before_repeats_the_last_cpu_shares() {
    let node = FakeNode::new();
    let mut samplers = Samplers::start(&[SamplerKind::Cpu], &node.roots());
    // No tick since the baseline and none before it: nothing is known yet.
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    assert_eq!(s.cpu, None);
    node.at(1);
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    let first = s.cpu.unwrap();
    assert_eq!((first.user_share, first.idle_share), (0.5, 0.5));
    // Rounds that close in a burst each read /proc/stat within one of its 10 ms ticks: the same counters.
    for _ in 0..2 {
        let mut s = NodeSample::default();
        samplers.read(&mut s);
        assert_eq!(s.cpu, Some(first));
    }
    // The next tick is counted from the last read: both CPUs busy since.
    node.write(
        "stat",
        "cpu  300 0 0 100 0 0 0 0 0 0\ncpu0 200 0 0 0 0 0 0 0 0 0\ncpu1 100 0 0 100 0 0 0 0 0 0\n",
    );
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    let cpu = s.cpu.unwrap();
    assert_eq!((cpu.user_share, cpu.idle_share), (1.0, 0.0));
}

#[test]
fn a_sampler_whose_file_is_missing_or_turns_bad_is_left_out_and_the_others_go_on() {
    let node = FakeNode::new();
    std::fs::remove_file(node.dir.path().join("proc/net/dev")).unwrap();
    let mut samplers = Samplers::start(&SamplerKind::ALL, &node.roots());
    assert_eq!(
        samplers.running(),
        vec![
            SamplerKind::Cpu,
            SamplerKind::Memory,
            SamplerKind::Disk,
            SamplerKind::Load
        ]
    );
    node.at(1);
    node.write("loadavg", "not a load\n");
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    assert_eq!((s.network, s.load), (None, None));
    assert!(s.cpu.is_some() && s.memory.is_some() && s.disk.is_some());
    assert_eq!(
        samplers.running(),
        vec![SamplerKind::Cpu, SamplerKind::Memory, SamplerKind::Disk]
    );

    // Without /sys/block no disk can be told from a partition: the disk sampler is left out at the start.
    std::fs::remove_dir_all(node.dir.path().join("sys/block")).unwrap();
    let samplers = Samplers::start(&[SamplerKind::Disk, SamplerKind::Cpu], &node.roots());
    assert_eq!(samplers.running(), vec![SamplerKind::Cpu]);
    let e = DiskSampler::open(&node.roots()).unwrap_err().to_string();
    let want = format!("cannot read {}: ", node.dir.path().join("sys/block").display());
    assert!(e.starts_with(&want), "{e}");
}

#[test]
fn this_machines_proc_reads_with_every_sampler() {
    if !Path::new("/proc/stat").exists() {
        return;
    }
    let mut samplers = Samplers::start(&SamplerKind::ALL, &Roots::default());
    // A container may have no whole disk in /sys/block, but the other four always read.
    for kind in [
        SamplerKind::Cpu,
        SamplerKind::Memory,
        SamplerKind::Network,
        SamplerKind::Load,
    ] {
        assert!(samplers.running().contains(&kind), "{kind:?}");
    }
    // Long enough for the CPU counters to tick (10 ms each).
    std::thread::sleep(Duration::from_millis(60));
    let mut s = NodeSample::default();
    samplers.read(&mut s);
    let cpu = s.cpu.expect("ticks passed");
    let sum = cpu.user_share
        + cpu.nice_share
        + cpu.system_share
        + cpu.idle_share
        + cpu.iowait_share
        + cpu.irq_share
        + cpu.steal_share;
    assert!((sum - 1.0).abs() < 1e-9, "{cpu:?}");
    assert!(cpu.cpus >= 1);
    let mem = s.memory.unwrap();
    assert!(
        mem.total_bytes > 0 && mem.used_bytes <= mem.total_bytes,
        "{mem:?}"
    );
    assert!(s.load.is_some() && s.network.is_some());
    assert!(s.interval_ns >= 60_000_000, "{}", s.interval_ns);
}

/// The names of this process's threads.
fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

#[test]
fn with_a_period_a_thread_samples_and_rounds_take_the_newest() {
    let node = FakeNode::new();
    let samplers = Samplers::start(&[SamplerKind::Network], &node.roots());
    let mut periodic = Periodic::spawn(samplers, Duration::from_millis(20)).unwrap();
    // The thread names itself once it runs.
    until_sampling_thread(true);
    let mut s = NodeSample::default();
    periodic.sample(&mut s);
    assert_eq!(s.sample_unix_ns, 0, "nothing sampled before the first period");
    node.at(5);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = NodeSample::default();
        periodic.sample(&mut s);
        if s.network.is_some_and(|n| n.rx_bytes == 5000) {
            assert!(s.interval_ns >= 15_000_000, "{}", s.interval_ns);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no sample of the rewritten files: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(periodic);
    until_sampling_thread(false);
}

/// Waits until a sampling thread runs in this process, or none does.
fn until_sampling_thread(running: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads().iter().any(|t| t == THREAD_NAME) != running {
        assert!(
            Instant::now() < deadline,
            "a sampling thread should run: {running}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_configured_sampler_is_none_each_round_or_a_thread() {
    let node = FakeNode::new();
    assert!(node_sampler(&[], 0, &node.roots()).unwrap().is_none());
    let each = node_sampler(&[SamplerKind::Load], 0, &node.roots())
        .unwrap()
        .unwrap();
    assert!(format!("{each:?}").starts_with("Samplers"), "{each:?}");
    let periodic = node_sampler(&[SamplerKind::Load], 1000, &node.roots())
        .unwrap()
        .unwrap();
    assert!(format!("{periodic:?}").starts_with("Periodic"), "{periodic:?}");
}
