//! Hosts of a small cluster on one machine: each a network namespace with its own address on a switch (a bridge
//! in a namespace of its own), so daemons talk over real interfaces that a test can cut (`ip link set DEV down`)
//! and restore, as a rack loses its uplink. Needs root; `Lan::new` says why it cannot and returns `None`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Proc, bin_dir};

/// A switch and its hosts; every namespace is deleted when dropped.
pub struct Lan {
    switch: String,
    hosts: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl Lan {
    /// `hosts` hosts with the addresses [`Lan::addr`] gives, all up; `None` (and a line on stderr saying the
    /// test skipped) where namespaces cannot be made.
    pub fn new(hosts: usize) -> Option<Lan> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = format!("cy{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let mut lan = Lan {
            switch: format!("{tag}sw"),
            hosts: Vec::new(),
        };
        match lan.build(&tag, hosts) {
            Ok(()) => Some(lan),
            Err(e) => {
                eprintln!("skipped: cannot make network namespaces (needs root and iproute2): {e}");
                None
            }
        }
    }

    fn build(&mut self, tag: &str, hosts: usize) -> Result<(), String> {
        ip(&["netns", "add", &self.switch])?;
        ip(&["-n", &self.switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &self.switch, "link", "set", "br0", "up"])?;
        for i in 0..hosts {
            let ns = format!("{tag}h{i}");
            ip(&["netns", "add", &ns])?;
            self.hosts.push(ns.clone());
            let (host_end, switch_end) = (format!("{tag}a{i}"), Self::port(tag, i));
            ip(&[
                "link",
                "add",
                &host_end,
                "type",
                "veth",
                "peer",
                "name",
                &switch_end,
            ])?;
            ip(&["link", "set", &host_end, "netns", &ns])?;
            ip(&["link", "set", &switch_end, "netns", &self.switch])?;
            ip(&["-n", &ns, "link", "set", &host_end, "name", "eth0"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", Self::addr(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &self.switch, "link", "set", &switch_end, "master", "br0"])?;
            ip(&["-n", &self.switch, "link", "set", &switch_end, "up"])?;
        }
        Ok(())
    }

    fn port(tag: &str, i: usize) -> String {
        format!("{tag}p{i}")
    }

    fn tag(&self) -> &str {
        self.switch.trim_end_matches("sw")
    }

    /// Host `i`'s address.
    pub fn addr(i: usize) -> String {
        format!("10.77.0.{}", i + 1)
    }

    /// Cuts host `i` off the switch (its port goes down): its connections stall, nothing is refused.
    pub fn cut(&self, i: usize) {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &Self::port(self.tag(), i),
            "down",
        ])
        .expect("cut a host off");
    }

    /// Puts host `i` back on the switch.
    pub fn heal(&self, i: usize) {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &Self::port(self.tag(), i),
            "up",
        ])
        .expect("put a host back");
    }

    /// Starts `bin_dir()/name args...` on host `i`, its output into `dir/label.log`.
    pub fn start(&self, i: usize, dir: &Path, name: &str, label: &str, args: &[&str]) -> Proc {
        let mut launch = canopy_launch::Launch::new("ip");
        launch
            .args(["netns", "exec", &self.hosts[i]])
            .args([bin_dir().join(name).display().to_string()])
            .args(args.iter().copied());
        Proc::spawn(dir, label, &launch)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain([&self.switch]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
