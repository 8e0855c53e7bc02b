//! What a maintained userspace TCP stack costs per poll as its connection count grows: the
//! measurement issue 19 asks for before choosing smoltcp or a purpose-built stack for the
//! AF_XDP path. smoltcp's `Interface::poll` with N TCP sockets (listening, 1 KiB buffers) on
//! an in-memory Ethernet device:
//!
//! - `smoltcp_idle/N`: a poll with nothing received (the egress pass over the sockets);
//! - `smoltcp_segment/N`: a poll that receives one SYN for a port no socket holds and sends the
//!   reset (the ingress search plus the egress pass).
//!
//! Beside them, `lasthop_edge::wire`'s parse and reset of the same SYN (`wire_segment`), and
//! `lasthop_edge::tcp` holding N established connections: a SYN answered with a cookie
//! (`tcp_syn/N`) and a duplicate ACK on one of the connections (`tcp_ack/N`, the lookup and
//! the acknowledgment processing), each a hash of the 4-tuple whatever N.
//!
//! Run: `cargo bench -p lasthop-benches --bench stack`.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use lasthop_edge::tcp::{Tcp, TcpConfig};
use lasthop_edge::wire::{parse, write_frame, write_reset, TcpControl, TcpRepr, TcpSeqNumber};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};

const SERVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// An Ethernet device in memory: `pending` copies of `frame` to receive, a count of sends.
struct Dev {
    frame: Vec<u8>,
    pending: usize,
    sent: usize,
}

struct Rx<'a>(&'a [u8]);
struct Tx<'a>(&'a mut usize);

impl RxToken for Rx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = [0u8; 1514];
        *self.0 += 1;
        f(&mut buf[..len])
    }
}

impl Device for Dev {
    type RxToken<'a> = Rx<'a>;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
        if self.pending == 0 {
            return None;
        }
        self.pending -= 1;
        Some((Rx(&self.frame), Tx(&mut self.sent)))
    }

    fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.sent))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = 1514;
        caps
    }
}

fn syn(port: u16) -> Vec<u8> {
    segment(40000, port, TcpControl::Syn, 1, None)
}

fn segment(sport: u16, dport: u16, control: TcpControl, seq: u32, ack: Option<u32>) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: sport,
        dst_port: dport,
        control,
        seq_number: TcpSeqNumber(seq as i32),
        ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
        window_len: 64240,
        window_scale: Some(7),
        max_seg_size: (control == TcpControl::Syn).then_some(1460),
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let mut out = vec![0u8; 128];
    let n = write_frame(
        CLIENT_MAC,
        SERVER_MAC,
        CLIENT.into(),
        SERVER.into(),
        &tcp,
        &mut out,
    )
    .expect("fits");
    out.truncate(n);
    out
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("stack");
    for n in [16usize, 256, 4096, 16384] {
        let mut dev = Dev {
            frame: syn(9),
            pending: 0,
            sent: 0,
        };
        let config = Config::new(HardwareAddress::Ethernet(EthernetAddress(SERVER_MAC)));
        let mut iface = Interface::new(config, &mut dev, Instant::from_secs(1));
        iface.update_ip_addrs(|addrs| {
            addrs
                .push(IpCidr::new(IpAddress::Ipv4(SERVER), 24))
                .expect("room");
        });
        let mut sockets = SocketSet::new(Vec::with_capacity(n));
        for i in 0..n {
            let rx = tcp::SocketBuffer::new(vec![0; 1024]);
            let tx = tcp::SocketBuffer::new(vec![0; 1024]);
            let mut socket = tcp::Socket::new(rx, tx);
            socket.listen(10_000 + i as u16).expect("a port");
            sockets.add(socket);
        }
        let now = Instant::from_secs(2);
        g.bench_with_input(BenchmarkId::new("smoltcp_idle", n), &n, |b, _| {
            b.iter(|| iface.poll(now, &mut dev, &mut sockets))
        });
        // Criterion runs a case only when its filter takes it: check the answers only then.
        let mut ran = false;
        g.bench_with_input(BenchmarkId::new("smoltcp_segment", n), &n, |b, _| {
            ran = true;
            b.iter(|| {
                dev.pending = 1;
                iface.poll(now, &mut dev, &mut sockets)
            })
        });
        assert!(
            !ran || dev.sent > 0,
            "smoltcp answered the SYNs with resets"
        );
    }
    for n in [16usize, 256, 4096, 16384] {
        let mut tcp = Tcp::new(TcpConfig::new(SERVER.into(), 80, SERVER_MAC, [9; 16]));
        let now = 1_000_000;
        let mut last_ack = Vec::new();
        for i in 0..n {
            let port = 1024 + i as u16;
            let mut synack = Vec::new();
            tcp.receive(
                &segment(port, 80, TcpControl::Syn, 100, None),
                now,
                &mut |f| synack = f.to_vec(),
                &mut |_| {},
            )
            .expect("ours");
            let isn = parse(&synack).expect("a SYN-ACK").tcp.seq_number.0 as u32;
            last_ack = segment(port, 80, TcpControl::None, 101, Some(isn.wrapping_add(1)));
            tcp.receive(&last_ack, now, &mut |_| {}, &mut |_| {})
                .expect("ours");
        }
        assert_eq!(tcp.len(), n);
        let syn = segment(9, 80, TcpControl::Syn, 7, None);
        g.bench_with_input(BenchmarkId::new("tcp_syn", n), &n, |b, _| {
            b.iter(|| {
                tcp.receive(
                    black_box(&syn),
                    now,
                    &mut |f| {
                        black_box(f);
                    },
                    &mut |_| {},
                )
            })
        });
        g.bench_with_input(BenchmarkId::new("tcp_ack", n), &n, |b, _| {
            b.iter(|| {
                tcp.receive(
                    black_box(&last_ack),
                    now,
                    &mut |f| {
                        black_box(f);
                    },
                    &mut |_| {},
                )
            })
        });
    }
    let frame = syn(9);
    let mut out = [0u8; 64];
    g.bench_function("wire_segment", |b| {
        b.iter(|| {
            let seg = parse(black_box(&frame)).expect("a SYN");
            write_reset(&seg, &mut out)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
