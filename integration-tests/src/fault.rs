//! A TCP proxy that puts a cluster's link faults between two daemons on one machine: a stall (bytes held both
//! ways, connections kept open: a switch that drops everything, a black hole), a reset (every connection closed
//! at once), and a delay per direction (a slow or distant link). The machines here have network namespaces but
//! neither netem nor iptables, so the faults are made in the path itself.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Faults {
    /// Bytes from the client (the child) to the target (its parent) are held.
    stalled_up: AtomicBool,
    /// Bytes from the target back to the client are held.
    stalled_down: AtomicBool,
    /// Microseconds each chunk waits before it is passed on.
    delay_us: AtomicU64,
    /// Every connection's two ends, to close them on a reset.
    conns: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Counts resets: a pump that finds it changed drops what it holds, as a reset connection loses its buffers.
    generation: AtomicU64,
    stopped: AtomicBool,
}

/// A proxy from its own address on loopback to `target`; stopped when dropped.
pub struct FaultProxy {
    addr: String,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// Starts a proxy to `target` (host:port) on a free port of 127.0.0.1.
    pub fn start(target: &str) -> FaultProxy {
        Self::start_on("127.0.0.1:0", target)
    }

    /// Starts a proxy to `target` listening on `listen`.
    pub fn start_on(listen: &str, target: &str) -> FaultProxy {
        let listener = TcpListener::bind(listen).expect("fault proxy listen");
        let addr = listener.local_addr().expect("fault proxy addr").to_string();
        let faults = Arc::new(Faults::default());
        let target = target.to_string();
        let f = faults.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if f.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    f.conns.lock().unwrap().push((c, s));
                }
                let generation = f.generation.load(Ordering::SeqCst);
                for (from, to, up) in [(&client, &server, true), (&server, &client, false)] {
                    let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let f = f.clone();
                    std::thread::spawn(move || pump(from, to, &f, generation, up));
                }
            }
        });
        FaultProxy { addr, faults }
    }

    /// The address to give as the parent.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Holds every byte both ways until [`FaultProxy::resume`]; new connections are accepted and held too.
    pub fn stall(&self) {
        self.faults.stalled_up.store(true, Ordering::SeqCst);
        self.faults.stalled_down.store(true, Ordering::SeqCst);
    }

    /// Holds the bytes going up only (child to parent) until [`FaultProxy::resume`]: the parent's messages still
    /// reach the child, which learns of rounds closing while what it sent for them is still on the way.
    pub fn stall_up(&self) {
        self.faults.stalled_up.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.faults.stalled_up.store(false, Ordering::SeqCst);
        self.faults.stalled_down.store(false, Ordering::SeqCst);
    }

    /// Closes every connection through the proxy now, dropping the bytes in flight (both ends see the connection
    /// end); new ones go through.
    pub fn reset(&self) {
        self.faults.generation.fetch_add(1, Ordering::SeqCst);
        for (c, s) in self.faults.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Each chunk of bytes waits `d` before it is passed on, each way.
    pub fn delay(&self, d: Duration) {
        self.faults.delay_us.store(d.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.stopped.store(true, Ordering::SeqCst);
        self.resume();
        self.reset();
        // Wakes the accepting thread so it sees the stop.
        let _ = TcpStream::connect(&self.addr);
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "a proxy thread of the test harness: it waits by the wall clock, as the link it stands for"
)]
fn pump(mut from: TcpStream, mut to: TcpStream, faults: &Faults, generation: u64, up: bool) {
    let stalled = if up {
        &faults.stalled_up
    } else {
        &faults.stalled_down
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while stalled.load(Ordering::SeqCst) && !faults.stopped.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let delay = faults.delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        if faults.generation.load(Ordering::SeqCst) != generation {
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
