//! The engine's XDP program, hand-assembled, and its loading, attaching and testing through
//! libbpf (the kernel's own loader library, vendored by `libbpf-sys`).
//!
//! The program is 33 to 40 instructions, by the filter (`instructions`' test counts them): TCP
//! over IPv4 or IPv6 to the engine's address (optional: both families without one) and port
//! (or its HTTPS port), not a fragment and on IPv6 with TCP as the fixed header's next header,
//! goes to the AF_XDP socket of the queue it arrived on (`bpf_redirect_map` on the XSKMAP,
//! falling back to `XDP_PASS` where that queue has no socket); everything else (ARP, ICMP,
//! ICMPv6 and so neighbour discovery, the other family, IPv6 behind extension headers, other
//! ports) passes to the kernel, so the host stays reachable. Every read is
//! preceded by the bounds check the verifier needs. Assembling it here keeps the build free of
//! clang and of an ELF step; [`Program::log`] and [`Program::test_run`] let tests see what the
//! kernel made of it (engine/DESIGN.md, "The AF_XDP path").
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use libbpf_sys as bpf;

use super::super::cvt;

/// What the program sends to the engine's sockets: TCP to this port (or to the second one, the
/// HTTPS listener's, when given), and to this address when one is given (of its family only);
/// without one, to every address of the interface, IPv4 and IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    pub addr: Option<IpAddr>,
    pub port: u16,
    pub tls_port: Option<u16>,
}

/// XDP verdicts (`enum xdp_action`).
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

/// One eBPF instruction, as the kernel reads it (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

// Opcode parts (include/uapi/linux/bpf_common.h, bpf.h).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const AND: u8 = 0x50;
const LSH: u8 = 0x60;
const MOV: u8 = 0xb0;
const JEQ: u8 = 0x10;
const JGT: u8 = 0x20;
const JNE: u8 = 0x50;
const JLT: u8 = 0xa0;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
const PSEUDO_MAP_FD: u8 = 1;
const FUNC_REDIRECT_MAP: i32 = 51;

/// `struct xdp_md` field offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

/// Where each jump goes, resolved when the program is finished.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// `XDP_PASS`: the kernel takes the frame.
    Pass,
    /// The IPv6 header's checks.
    Ipv6,
    /// The TCP header's: r2 points at it less the Ethernet header's 14 bytes.
    Tcp,
}

struct Asm {
    insns: Vec<Insn>,
    jumps: Vec<(usize, Target)>,
}

impl Asm {
    fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
    }
    fn mov(&mut self, dst: u8, src: u8) {
        self.op(ALU64 | MOV | X, dst, src, 0, 0);
    }
    fn mov_imm(&mut self, dst: u8, imm: i32) {
        self.op(ALU64 | MOV | K, dst, 0, 0, imm);
    }
    fn alu_imm(&mut self, op: u8, dst: u8, imm: i32) {
        self.op(ALU64 | op | K, dst, 0, 0, imm);
    }
    fn load(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.op(LDX | MEM | size, dst, src, off, 0);
    }
    /// `if dst <op> imm goto target` (64-bit compare, `imm` sign-extended).
    fn jump_imm(&mut self, op: u8, dst: u8, imm: i32, target: Target) {
        self.jumps.push((self.insns.len(), target));
        self.op(JMP | op | K, dst, 0, 0, imm);
    }
    /// `if (u32)dst <op> imm goto target`.
    fn jump32_imm(&mut self, op: u8, dst: u8, imm: i32, target: Target) {
        self.jumps.push((self.insns.len(), target));
        self.op(JMP32 | op | K, dst, 0, 0, imm);
    }
    /// `if dst <op> src goto target`.
    fn jump_reg(&mut self, op: u8, dst: u8, src: u8, target: Target) {
        self.jumps.push((self.insns.len(), target));
        self.op(JMP | op | X, dst, src, 0, 0);
    }
    /// `goto target`.
    fn goto(&mut self, target: Target) {
        self.jumps.push((self.insns.len(), target));
        self.op(JMP, 0, 0, 0, 0);
    }
    /// Resolves the jumps to the targets' instruction indexes (`None`: a target the program
    /// does not have, which no jump names).
    fn finish(mut self, pass: usize, ipv6: Option<usize>, tcp: usize) -> Vec<Insn> {
        for (at, target) in std::mem::take(&mut self.jumps) {
            let to = match target {
                Target::Pass => pass,
                // Only `instructions` jumps to the IPv6 checks, and only when it wrote them.
                Target::Ipv6 => ipv6.expect("the IPv6 checks are there when jumped to"),
                Target::Tcp => tcp,
            };
            self.insns[at].off = (to as isize - at as isize - 1) as i16;
        }
        self.insns
    }
}

/// A 16-bit field as a little- or big-endian load of its network-order bytes reads it.
fn net16(v: u16) -> i32 {
    i32::from(u16::from_ne_bytes(v.to_be_bytes()))
}

/// The program's instructions for `filter`, with `map_fd` the XSKMAP's descriptor.
pub fn instructions(filter: &Filter, map_fd: RawFd) -> Vec<Insn> {
    const ETH: i16 = 14;
    const IPV6: i32 = 40;
    let (v4, v6) = match filter.addr {
        None => (true, true),
        Some(IpAddr::V4(_)) => (true, false),
        Some(IpAddr::V6(_)) => (false, true),
    };
    let mut a = Asm {
        insns: Vec::with_capacity(48),
        jumps: Vec::new(),
    };
    a.mov(6, 1); // r6 = ctx
    a.load(W, 2, 1, MD_DATA); // r2 = data
    a.load(W, 3, 1, MD_DATA_END); // r3 = data_end
    a.mov(4, 2);
    a.alu_imm(ADD, 4, i32::from(ETH) + 20); // r4 = data + Ethernet + minimal IPv4 header
    a.jump_reg(JGT, 4, 3, Target::Pass);
    a.load(H, 5, 2, 12); // EtherType
    match (v4, v6) {
        (true, true) => a.jump_imm(JEQ, 5, net16(0x86dd), Target::Ipv6),
        // IPv6 only: its checks follow.
        (false, _) => a.jump_imm(JNE, 5, net16(0x86dd), Target::Pass),
        (true, false) => {}
    }
    if v4 {
        a.jump_imm(JNE, 5, net16(0x0800), Target::Pass);
        a.load(B, 5, 2, ETH + 9); // IPv4 protocol
        a.jump_imm(JNE, 5, 6, Target::Pass);
        a.load(H, 5, 2, ETH + 6); // flags and fragment offset
        a.alu_imm(AND, 5, net16(0x3fff)); // MF or an offset: a fragment, the kernel reassembles
        a.jump_imm(JNE, 5, 0, Target::Pass);
        if let Some(IpAddr::V4(addr)) = filter.addr {
            a.load(W, 5, 2, ETH + 16); // destination address
            a.jump32_imm(
                JNE,
                5,
                u32::from_ne_bytes(addr.octets()) as i32,
                Target::Pass,
            );
        }
        a.load(B, 5, 2, ETH); // version and IHL
        a.alu_imm(AND, 5, 0x0f);
        a.alu_imm(LSH, 5, 2); // IPv4 header bytes, 0..=60
        a.jump_imm(JLT, 5, 20, Target::Pass);
        a.op(ALU64 | ADD | X, 2, 5, 0, 0); // r2 = data + IHL: the TCP header, less Ethernet
        if v6 {
            a.goto(Target::Tcp);
        }
    }
    let ipv6 = v6.then(|| {
        let at = a.insns.len();
        a.mov(4, 2);
        a.alu_imm(ADD, 4, i32::from(ETH) + IPV6); // the fixed header whole
        a.jump_reg(JGT, 4, 3, Target::Pass);
        // TCP first, or the kernel takes it (extension headers, fragments, ICMPv6 and so
        // neighbour discovery).
        a.load(B, 5, 2, ETH + 6); // next header
        a.jump_imm(JNE, 5, 6, Target::Pass);
        if let Some(IpAddr::V6(addr)) = filter.addr {
            // The destination address, 4 words at 24..40 of the header.
            for (i, word) in addr.octets().chunks_exact(4).enumerate() {
                a.load(W, 5, 2, ETH + 24 + 4 * i as i16);
                let word = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
                a.jump32_imm(JNE, 5, word as i32, Target::Pass);
            }
        }
        a.alu_imm(ADD, 2, IPV6); // r2 = the TCP header, less Ethernet
        at
    });
    let tcp = a.insns.len();
    a.mov(4, 2);
    a.alu_imm(ADD, 4, i32::from(ETH) + 4);
    a.jump_reg(JGT, 4, 3, Target::Pass);
    a.load(H, 5, 2, ETH + 2); // TCP destination port
    if let Some(tls_port) = filter.tls_port {
        // The plain port skips the HTTPS port's test.
        a.op(JMP | JEQ | K, 5, 0, 1, net16(filter.port));
        a.jump_imm(JNE, 5, net16(tls_port), Target::Pass);
    } else {
        a.jump_imm(JNE, 5, net16(filter.port), Target::Pass);
    }
    a.load(W, 2, 6, MD_RX_QUEUE_INDEX); // key: this queue
    a.op(LD | DW | IMM, 1, PSEUDO_MAP_FD, 0, map_fd); // r1 = the XSKMAP (two slots)
    a.op(0, 0, 0, 0, 0);
    a.mov_imm(3, XDP_PASS as i32); // no socket on this queue: pass
    a.op(JMP | CALL, 0, 0, 0, FUNC_REDIRECT_MAP);
    a.op(JMP | EXIT, 0, 0, 0, 0);
    let pass = a.insns.len();
    a.mov_imm(0, XDP_PASS as i32);
    a.op(JMP | EXIT, 0, 0, 0, 0);
    a.finish(pass, ipv6, tcp)
}

/// An XSKMAP: queue index → AF_XDP socket.
#[derive(Debug)]
pub struct XskMap {
    fd: OwnedFd,
}

impl XskMap {
    /// A map with room for queues `0..queues`.
    pub fn new(queues: u32) -> io::Result<XskMap> {
        let name = CString::new("lasthop_xsks").expect("no NUL");
        // SAFETY: `name` is a valid C string; null options mean defaults.
        let fd = libbpf_rc(unsafe {
            bpf::bpf_map_create(
                bpf::BPF_MAP_TYPE_XSKMAP,
                name.as_ptr(),
                4,
                4,
                queues.max(1),
                std::ptr::null(),
            )
        })?;
        // SAFETY: `fd` is a new map descriptor that nothing else owns.
        Ok(XskMap {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Points `queue`'s entry at the socket `xsk_fd`.
    pub fn set(&self, queue: u32, xsk_fd: RawFd) -> io::Result<()> {
        let value: u32 = xsk_fd as u32;
        // SAFETY: key and value point at 4-byte values, the map's key and value sizes.
        libbpf_rc(unsafe {
            bpf::bpf_map_update_elem(
                self.fd.as_raw_fd(),
                (&queue as *const u32).cast(),
                (&value as *const u32).cast(),
                u64::from(bpf::BPF_ANY),
            )
        })
        .map(drop)
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A loaded program (not yet attached).
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
    /// What the verifier said, when asked for its log.
    pub log: String,
}

/// The verifier refused the program: the errno and its log.
#[derive(Debug, thiserror::Error)]
#[error("the kernel refused the XDP program ({errno}){}", if log.is_empty() { String::new() } else { format!(": {}", log.trim_end()) })]
pub struct LoadError {
    pub errno: io::Error,
    pub log: String,
}

/// Loads the engine's program for `filter`, redirecting into `map`. `log_level` 0 asks for no
/// log (libbpf asks again with level 1 if the load fails); 1 or 2 return the verifier's log.
pub fn load(filter: &Filter, map: &XskMap, log_level: u32) -> Result<Program, LoadError> {
    load_insns(&instructions(filter, map.fd()), log_level)
}

/// Loads any XDP program (tests load broken ones to see the verifier's refusal).
pub fn load_insns(insns: &[Insn], log_level: u32) -> Result<Program, LoadError> {
    let raw: Vec<bpf::bpf_insn> = insns
        .iter()
        .map(|i| bpf::bpf_insn {
            code: i.code,
            _bitfield_align_1: [],
            _bitfield_1: bpf::bpf_insn::new_bitfield_1(i.dst, i.src),
            off: i.off,
            imm: i.imm,
        })
        .collect();
    let mut log = vec![0u8; 1 << 20];
    let opts = bpf::bpf_prog_load_opts {
        sz: std::mem::size_of::<bpf::bpf_prog_load_opts>() as _,
        log_level,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr().cast(),
        ..Default::default()
    };
    let mut opts = opts;
    let name = CString::new("lasthop_xdp").expect("no NUL");
    let license = CString::new("Apache-2.0").expect("no NUL");
    // SAFETY: every pointer is valid for the call: C strings, `raw.len()` instructions, a log
    // buffer of `log_size` bytes that libbpf and the kernel write at most that much of.
    let rc = unsafe {
        bpf::bpf_prog_load(
            bpf::BPF_PROG_TYPE_XDP,
            name.as_ptr(),
            license.as_ptr(),
            raw.as_ptr(),
            raw.len() as _,
            &mut opts,
        )
    };
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let log = String::from_utf8_lossy(&log[..end]).into_owned();
    match libbpf_rc(rc) {
        // SAFETY: `fd` is a new program descriptor that nothing else owns.
        Ok(fd) => Ok(Program {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            log,
        }),
        Err(errno) => Err(LoadError { errno, log }),
    }
}

impl Program {
    /// Runs the program once on `frame` in the kernel (`BPF_PROG_TEST_RUN`, nothing is sent)
    /// and returns its verdict.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        let mut opts = bpf::bpf_test_run_opts {
            sz: std::mem::size_of::<bpf::bpf_test_run_opts>() as _,
            data_in: frame.as_ptr().cast(),
            data_size_in: frame.len() as u32,
            repeat: 1,
            ..Default::default()
        };
        // SAFETY: `data_in` points at `data_size_in` readable bytes; no output buffers.
        libbpf_rc(unsafe { bpf::bpf_prog_test_run_opts(self.fd.as_raw_fd(), &mut opts) })?;
        Ok(opts.retval)
    }

    /// Attaches the program to `ifindex` in the driver's own XDP hook (native mode; veth has
    /// one) through a BPF link: the program detaches when the returned link is dropped, or
    /// when the process dies however it dies.
    pub fn attach(&self, ifindex: u32) -> io::Result<Attachment> {
        let opts = bpf::bpf_link_create_opts {
            sz: std::mem::size_of::<bpf::bpf_link_create_opts>() as _,
            flags: bpf::XDP_FLAGS_DRV_MODE,
            ..Default::default()
        };
        // SAFETY: the options struct is valid and sized; the descriptors are ours.
        let fd = libbpf_rc(unsafe {
            bpf::bpf_link_create(self.fd.as_raw_fd(), ifindex as i32, bpf::BPF_XDP, &opts)
        })?;
        // SAFETY: `fd` is a new link descriptor that nothing else owns.
        Ok(Attachment {
            _link: unsafe { OwnedFd::from_raw_fd(fd) },
            ifindex,
        })
    }
}

/// What the kernel says of an interface's XDP hook before the engine takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookState {
    /// The program attached now, in any mode (0: none). Native attaching fails while one is.
    pub prog_id: u32,
    /// The driver's XDP features (`NETDEV_XDP_ACT_*` bits, kernel 6.3 on); 0 where the kernel
    /// does not report them, or the driver has none.
    pub features: u64,
}

/// `NETDEV_XDP_ACT_BASIC` | `NETDEV_XDP_ACT_REDIRECT`: native XDP that can redirect, what the
/// engine's program needs.
pub const FEATURES_NEEDED: u64 = 1 | 2;

/// Queries `ifindex`'s XDP hook (netlink, through libbpf).
pub fn query(ifindex: u32) -> io::Result<HookState> {
    let mut opts = bpf::bpf_xdp_query_opts {
        sz: std::mem::size_of::<bpf::bpf_xdp_query_opts>() as _,
        ..Default::default()
    };
    // SAFETY: the options struct is valid and sized; libbpf writes only its fields.
    libbpf_rc(unsafe { bpf::bpf_xdp_query(ifindex as i32, 0, &mut opts) })?;
    // With programs in more than one mode the kernel reports no single id: take any.
    let prog_id = [
        opts.prog_id,
        opts.drv_prog_id,
        opts.skb_prog_id,
        opts.hw_prog_id,
    ]
    .into_iter()
    .find(|&id| id != 0)
    .unwrap_or(0);
    Ok(HookState {
        prog_id,
        features: opts.feature_flags,
    })
}

/// An attached program: dropping it detaches (the link's last descriptor closes).
#[derive(Debug)]
pub struct Attachment {
    _link: OwnedFd,
    pub ifindex: u32,
}

/// libbpf's convention: a negative return is `-errno` (and errno is set too).
fn libbpf_rc(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::from_raw_os_error(-rc))
    } else {
        cvt(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_forward_inside_the_program_and_both_paths_exit() {
        let v4 = Some(IpAddr::from([10, 0, 0, 1]));
        let v6 = Some(IpAddr::from([0x2001, 2, 0, 0, 0, 0, 0, 1]));
        // (filter, instructions): both families' checks without an address; one family's,
        // with its address's words compared, with one.
        for (addr, tls_port, expected) in [
            (None, None, 39),
            (v4, None, 33),
            (v4, Some(443), 34),
            (v6, None, 35),
            (v6, Some(443), 36),
            (None, Some(443), 40),
        ] {
            let filter = Filter {
                addr,
                port: 80,
                tls_port,
            };
            let insns = instructions(&filter, 7);
            assert_eq!(insns.len(), expected, "{filter:?}");
            for (at, i) in insns.iter().enumerate() {
                let class = i.code & 0x07;
                let op = i.code & 0xf0;
                if (class == JMP || class == JMP32) && op != CALL && op != EXIT {
                    let to = at as isize + 1 + isize::from(i.off);
                    assert!(
                        i.off > 0 && (to as usize) < insns.len(),
                        "jump at {at} to {to}"
                    );
                }
            }
            assert_eq!(insns.last().unwrap().code, JMP | EXIT);
            let map = insns.iter().find(|i| i.code == LD | DW | IMM).unwrap();
            assert_eq!((map.src, map.imm), (PSEUDO_MAP_FD, 7));
        }
    }

    #[test]
    fn fields_compare_in_network_order_as_loaded() {
        // A 16-bit load of the bytes 0x08 0x00 (the IPv4 EtherType) reads net16(0x0800).
        assert_eq!(net16(0x0800), i32::from(u16::from_ne_bytes([0x08, 0x00])));
        assert_eq!(
            net16(8080),
            i32::from(u16::from_ne_bytes(8080u16.to_be_bytes()))
        );
    }
}
