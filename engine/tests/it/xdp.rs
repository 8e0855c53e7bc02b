//! The AF_XDP path's kernel parts on a real veth pair: the engine's XDP program through the
//! verifier and `BPF_PROG_TEST_RUN`, attached natively to the server end of a veth pair whose
//! other end is this namespace, an AF_XDP socket receiving the redirected SYNs, and resets the
//! userspace side writes (`lasthop_edge::wire`) going back out through the socket's TX ring to
//! a real client, while ARP and other ports still reach the kernel. Needs root (CAP_NET_ADMIN,
//! CAP_BPF, `ip netns`); reported SKIPPED without it.
//!
//! The server side runs in its own network namespace: this test binary runs itself there
//! (`ip netns exec NS <this test> --exact xdp::...`) with `LASTHOP_XDP_ROLE=serve`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lasthop_edge::wire::{self, TcpControl, TcpRepr, TcpSeqNumber};
use lasthop_engine::io::xdp::{self, prog, Filter, Xsk, XskConfig, XskMap};

const ROLE: &str = "LASTHOP_XDP_ROLE";

/// Why this machine cannot run these tests, if it cannot: not root, no `ip`, a kernel (or a
/// container) that refuses BPF maps or network namespaces.
fn skip_reason(netns: bool) -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root (CAP_NET_ADMIN and CAP_BPF, ip netns)".into());
    }
    if !Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some("the ip command (iproute2) is not installed".into());
    }
    if netns
        && !Command::new("ethtool")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return Some("ethtool is not installed".into());
    }
    if let Err(e) = XskMap::new(1) {
        return Some(format!("this kernel refuses an XSKMAP: {e}"));
    }
    if netns {
        let probe = format!("lhxprobe{}", std::process::id());
        let out = Command::new("ip")
            .args(["netns", "add", &probe])
            .output()
            .ok()?;
        if !out.status.success() {
            return Some(format!(
                "ip netns add fails: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    }
    None
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace holding the server end of a veth pair; the client end stays here.
/// Deleted (with both ends) on drop.
struct Pair {
    ns: String,
    server_if: String,
    server: Ipv4Addr,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let pid = std::process::id();
        let ns = format!("lhx{}{tag}", pid % 1_000_000);
        let (client_if, server_if) = (format!("{ns}c"), format!("{ns}s"));
        // A /30 of 198.19.0.0/16 per process and tag, so parallel runs never collide.
        let slot = (pid % 4096) * 4 + u32::from(tag.as_bytes()[0] % 4);
        let base = u32::from(Ipv4Addr::new(198, 19, 0, 0)) + (slot % 16384) * 4;
        let (client, server) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        // What a killed earlier run with this pid left behind.
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &client_if])
            .output();
        ip(&["netns", "add", &ns]);
        let pair = Pair {
            ns: ns.clone(),
            server_if: server_if.clone(),
            server,
        };
        // One queue each way: the socket serves queue 0, so every frame must arrive there.
        let one = ["numtxqueues", "1", "numrxqueues", "1"];
        ip(&[
            &["link", "add", &client_if][..],
            &one,
            &["type", "veth", "peer", "name", &server_if],
            &one,
        ]
        .concat());
        ip(&["link", "set", &server_if, "netns", &ns]);
        ip(&["addr", "add", &format!("{client}/30"), "dev", &client_if]);
        // A veth hands the peer's frames over with their TCP checksum left to offload (partial);
        // a frame off a wire, what the socket expects, always carries the whole checksum.
        let out = Command::new("ethtool")
            .args(["-K", &client_if, "tx", "off"])
            .output()
            .expect("ethtool runs");
        assert!(
            out.status.success(),
            "ethtool -K {client_if} tx off: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ip(&["link", "set", &client_if, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{server}/30"),
            "dev",
            &server_if,
        ]);
        ip(&["-n", &ns, "link", "set", &server_if, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        pair
    }

    fn link_details(&self) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.ns, "-d", "link", "show", "dev", &self.server_if])
            .output()
            .expect("ip runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

#[test]
fn the_verifier_accepts_the_program_and_its_log_says_why_it_refuses_a_broken_one() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    if let Some(why) = skip_reason(false) {
        eprintln!("SKIPPED the XDP program's verifier test: {why}");
        return;
    }
    let map = XskMap::new(4).expect("an XSKMAP");
    for filter in [
        Filter {
            addr: None,
            port: 80,
        },
        Filter {
            addr: Some(Ipv4Addr::new(198, 19, 0, 2)),
            port: 8443,
        },
    ] {
        let program = prog::load(&filter, &map, 2).unwrap_or_else(|e| panic!("{filter:?}: {e}"));
        assert!(
            program.log.contains("processed"),
            "the verifier's log: {}",
            program.log
        );
    }
    // The same program without its first bounds check: the verifier must say which read.
    let mut broken = prog::instructions(
        &Filter {
            addr: None,
            port: 80,
        },
        map.fd(),
    );
    let check = broken
        .iter()
        .position(|i| i.code == 0x2d)
        .expect("a jgt reg");
    // Every jump lies after it and lands after it, so the offsets stay right.
    broken.remove(check);
    let err = prog::load_insns(&broken, 0).expect_err("an unchecked packet read is refused");
    assert!(err.log.contains("invalid access to packet"), "{err}");
}

#[test]
fn syns_reach_the_socket_and_its_resets_reach_the_client_while_other_traffic_reaches_the_kernel() {
    if std::env::var(ROLE).as_deref() == Ok("serve") {
        return serve();
    }
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    if let Some(why) = skip_reason(true) {
        eprintln!("SKIPPED the AF_XDP veth test: {why}");
        return;
    }
    let pair = Pair::new("a");
    let port = 8080u16;
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &pair.ns])
        .arg(&exe)
        .args([
            "--exact",
            "xdp::syns_reach_the_socket_and_its_resets_reach_the_client_while_other_traffic_reaches_the_kernel",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "serve")
        .env("LASTHOP_XDP_IF", &pair.server_if)
        .env("LASTHOP_XDP_ADDR", pair.server.to_string())
        .env("LASTHOP_XDP_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the server side starts");
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut ready = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        // libtest prints the test's name first, on the same line.
        if line.ends_with("xdp ready") {
            ready = true;
            break;
        }
    }
    assert!(
        ready,
        "the server side never became ready: {:?}",
        child.0.wait()
    );
    assert!(
        pair.link_details().contains("xdp"),
        "attached natively: {}",
        pair.link_details()
    );

    // The kernel in the namespace listens on the same port, so a connection that succeeded
    // would mean the SYN went to the kernel: it must be refused by our reset instead.
    let target = SocketAddr::from((pair.server, port));
    for _ in 0..3 {
        let started = Instant::now();
        let err = TcpStream::connect_timeout(&target, Duration::from_secs(5))
            .expect_err("the userspace side resets every SYN");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a reset, not a timeout"
        );
    }
    // Other ports pass to the kernel (and ARP did, or nothing above would have arrived).
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((pair.server, port + 1)),
        Duration::from_secs(5),
    )
    .expect("the kernel's listener on another port is reached");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"ping").unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"ping");
    drop(s);

    drop(child.0.stdin.take()); // tells the server side to stop
    let mut report = String::new();
    for line in lines {
        let line = line.unwrap();
        if let Some(at) = line.find("xdp syns=") {
            report = line[at..].to_owned();
        }
    }
    let status = child.0.wait().unwrap();
    assert!(status.success(), "the server side failed: {status}");
    let field = |name: &str| -> u64 {
        let at = report
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {report:?}"));
        report[at + name.len() + 1..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(field("syns") >= 3, "{report}");
    assert!(field("resets") >= 3, "{report}");
    assert_eq!(field("kernel_accepts"), 0, "{report}");
    assert_eq!(field("bad_frames"), 0, "{report}");
    // The program went with the process: the link detached it.
    assert!(
        !pair.link_details().contains("prog/xdp"),
        "detached: {}",
        pair.link_details()
    );
}

/// The server side's process, killed if the test fails before it is told to stop.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The server side, inside the namespace: the program, one socket on queue 0, the kernel's own
/// listeners on the port (which must see nothing) and on the next one (an echo).
fn serve() {
    let ifname = std::env::var("LASTHOP_XDP_IF").unwrap();
    let addr: Ipv4Addr = std::env::var("LASTHOP_XDP_ADDR").unwrap().parse().unwrap();
    let port: u16 = std::env::var("LASTHOP_XDP_PORT").unwrap().parse().unwrap();
    let ifindex = xdp::ifindex(&ifname).unwrap();
    let map = XskMap::new(1).unwrap();
    let mut xsk = Xsk::open(ifindex, 0, &XskConfig::default()).unwrap();
    map.set(0, xsk.fd()).unwrap();
    let filter = Filter {
        addr: Some(addr),
        port,
    };
    let program = prog::load(&filter, &map, 0).unwrap();
    check_verdicts(&program, addr, port);

    let mut kernel_accepts = 0u64;
    let same_port = TcpListener::bind((addr, port)).unwrap();
    same_port.set_nonblocking(true).unwrap();
    let echo = TcpListener::bind((addr, port + 1)).unwrap();
    std::thread::spawn(move || {
        for stream in echo.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 64];
            if let Ok(n) = s.read(&mut buf) {
                let _ = s.write_all(&buf[..n]);
            }
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stopper.store(true, Ordering::Relaxed);
    });

    let attached = program.attach(ifindex).unwrap();
    println!("xdp ready");
    std::io::stdout().flush().unwrap();
    let (mut syns, mut resets, mut bad) = (0u64, 0u64, 0u64);
    let mut replies: Vec<Vec<u8>> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        if same_port.accept().is_ok() {
            kernel_accepts += 1;
        }
        xsk.wait(20).unwrap();
        xsk.receive(64, |frame| match wire::parse(frame) {
            Ok(seg) if seg.dst == addr && seg.tcp.dst_port == port => {
                syns += u64::from(seg.tcp.control == TcpControl::Syn);
                let mut out = [0u8; 64];
                if let Some(n) = wire::write_reset(&seg, &mut out) {
                    replies.push(out[..n].to_vec());
                }
            }
            _ => bad += 1,
        });
        for reply in replies.drain(..) {
            resets += u64::from(xsk.send(&reply));
        }
        xsk.flush().unwrap();
    }
    let stats = xsk.stats().unwrap();
    drop(attached);
    println!(
        "xdp syns={syns} resets={resets} kernel_accepts={kernel_accepts} bad_frames={bad} rx_dropped={} tx_invalid={}",
        stats.rx_dropped,
        stats.tx_invalid
    );
}

/// The program's verdicts on frames built here, run in the kernel with a socket in the map.
fn check_verdicts(program: &prog::Program, addr: Ipv4Addr, port: u16) {
    let frame = |dst: Ipv4Addr, dport: u16| {
        let tcp = TcpRepr {
            src_port: 40000,
            dst_port: dport,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(1),
            ack_number: None,
            window_len: 1024,
            window_scale: None,
            max_seg_size: Some(1460),
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let mut out = vec![0u8; 128];
        let n = wire::write_frame(
            [2, 0, 0, 0, 0, 2],
            [2, 0, 0, 0, 0, 1],
            Ipv4Addr::new(198, 19, 9, 9),
            dst,
            &tcp,
            &mut out,
        )
        .unwrap();
        out.truncate(n);
        out
    };
    let ours = frame(addr, port);
    let verdict = |f: &[u8]| program.test_run(f).unwrap();
    assert_eq!(
        verdict(&ours),
        prog::XDP_REDIRECT,
        "a SYN to our address and port"
    );
    assert_eq!(
        verdict(&frame(addr, port + 1)),
        prog::XDP_PASS,
        "another port"
    );
    assert_eq!(
        verdict(&frame(Ipv4Addr::new(198, 19, 9, 10), port)),
        prog::XDP_PASS,
        "another address"
    );
    let mut arp = ours.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(verdict(&arp), prog::XDP_PASS, "ARP");
    let mut udp = ours.clone();
    udp[14 + 9] = 17;
    assert_eq!(verdict(&udp), prog::XDP_PASS, "UDP");
    let mut fragment = ours.clone();
    fragment[14 + 6] |= 0x20;
    assert_eq!(verdict(&fragment), prog::XDP_PASS, "an IPv4 fragment");
    let mut options = ours.clone();
    options[14] = 0x46; // a 24-byte IPv4 header: the TCP ports move, the program must follow
    assert_eq!(
        verdict(&options),
        prog::XDP_PASS,
        "the port read at the IHL's offset"
    );
    assert_eq!(
        verdict(&ours[..14 + 20 + 2]),
        prog::XDP_PASS,
        "cut inside the TCP header"
    );
}
