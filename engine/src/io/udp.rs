//! UDP sockets for QUIC: one SO_REUSEPORT socket per serving core, datagrams in with `recvmsg`
//! (GRO: the kernel may hand several datagrams of one flow as one buffer, with their segment
//! size in a `UDP_GRO` control message) and out with `sendmsg` (GSO: one buffer of equal
//! segments and a `UDP_SEGMENT` control message, split by the kernel or the NIC). These are
//! the calls quinn-udp makes on a plain socket; that crate needs a newer Rust than the
//! workspace's, so they are reproduced here.
//!
//! Steering ([`steer_by_connection_id`]): a classic BPF program on the reuseport group picks
//! the socket from the first byte of the destination connection ID, which this engine's
//! connection IDs set to the owning core. A packet of a connection reaches the core holding its
//! state even after the client's address or port changes (NAT rebinding), which the kernel's
//! 4-tuple hash alone would send elsewhere. Initial and 0-RTT packets (whose connection ID the
//! client chose) fall back to the hash, which keeps a handshake's packets together.
#![allow(unsafe_code)]

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;
use super::socket::{addr_of, set_int, sockaddr};

/// Socket buffer sizes asked for (the kernel caps them at `net.core.{r,w}mem_max`).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// A non-blocking UDP socket bound to `addr` with SO_REUSEPORT, GRO on where the kernel has it,
/// and the destination address of each datagram reported (`IP_PKTINFO`/`IPV6_RECVPKTINFO`),
/// so replies leave from the address the client sent to.
pub fn reuseport_udp(addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the result is checked before use and owned right away.
    let fd = cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, SOCKET_BUFFER);
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, SOCKET_BUFFER);
    // Older kernels lack GRO: datagrams then come one per call.
    let _ = set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1);
    match addr {
        SocketAddr::V4(_) => set_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?,
        SocketAddr::V6(_) => {
            set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
            set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
        }
    }
    let (storage, len) = sockaddr(addr);
    // SAFETY: storage holds a valid sockaddr of `len` bytes for the call's duration.
    cvt(unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) })?;
    Ok(owned)
}

/// The steering program (see the module's doc): returns the index of the socket in the
/// reuseport group, or one past any group (the kernel then hashes the 4-tuple).
const STEER: [libc::sock_filter; 9] = [
    // A = first byte of the UDP payload (the kernel runs this program past the UDP header).
    bpf(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
    // Long header? Else to the short header's connection ID.
    bpf(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 5, 0x80),
    bpf(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K, 0, 0, 0x30),
    // A Handshake packet carries our connection ID; Initial, 0-RTT and Retry do not.
    bpf(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 2, 0x20),
    // Flags, version (4), DCID length (1): the DCID's first byte.
    bpf(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 6),
    bpf(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    bpf(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
    // Short header: flags, then the DCID.
    bpf(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 1),
    bpf(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
];

const fn bpf(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Attaches [`STEER`] to the reuseport group `fd` belongs to. The group's sockets must have
/// been bound in core order (socket `i` serves core `i`), and the first byte of every
/// connection ID this engine issues must be its core.
pub fn steer_by_connection_id(fd: RawFd) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: STEER.len() as u16,
        filter: STEER.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at a static program of `len` instructions; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// One `recvmsg`'s worth: `len` bytes of datagrams of `segment` bytes each (the last may be
/// shorter), from `from`, sent to `to` (our address, when the kernel said).
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub segment: usize,
    pub from: SocketAddr,
    pub to: Option<IpAddr>,
}

/// Control-message space for what [`recv`] asks for (GRO's segment size, the packet info).
#[repr(C, align(8))]
struct Control([u8; 128]);

/// Reads one (GRO-coalesced) buffer of datagrams into `buf`; `Ok(None)` when none is waiting.
pub fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    // SAFETY: zeroed sockaddr_storage is valid.
    let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut control = Control([0; 128]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: msg describes buffers valid for writes of the sizes given.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            io::ErrorKind::Interrupted => recv(fd, buf),
            _ => Err(e),
        };
    }
    let len = n as usize;
    let mut segment = len;
    let mut to = None;
    // SAFETY: the CMSG_* walk stays within `msg_controllen` bytes the kernel wrote, and each
    // payload read matches the type its level and type say it holds.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    let s = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                    if s > 0 {
                        segment = s as usize;
                    }
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let info = std::ptr::read_unaligned(data.cast::<libc::in_pktinfo>());
                    to = Some(IpAddr::from(info.ipi_addr.s_addr.to_ne_bytes()));
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let info = std::ptr::read_unaligned(data.cast::<libc::in6_pktinfo>());
                    to = Some(IpAddr::from(info.ipi6_addr.s6_addr));
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = addr_of(&from)?;
    Ok(Some(Received {
        len,
        segment,
        from,
        to,
    }))
}

/// One datagram, or with `segment` datagrams of that size (GSO), for [`send`] and
/// [`send_batch`]: to `to`, from `from` (the address the client sent to, pinned).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub to: SocketAddr,
    pub from: Option<IpAddr>,
    pub data: &'a [u8],
    pub segment: Option<usize>,
}

/// A `msghdr` and what it points at, for one [`Outgoing`].
struct Prepared {
    storage: libc::sockaddr_storage,
    namelen: libc::socklen_t,
    iov: libc::iovec,
    control: Control,
    controllen: usize,
}

impl Prepared {
    fn new(o: &Outgoing<'_>) -> Prepared {
        let (storage, namelen) = sockaddr(o.to);
        let mut p = Prepared {
            storage,
            namelen,
            iov: libc::iovec {
                iov_base: o.data.as_ptr() as *mut libc::c_void,
                iov_len: o.data.len(),
            },
            control: Control([0; 128]),
            controllen: 0,
        };
        p.controllen = write_control(&mut p.control, o);
        p
    }

    /// The header over this (which must not move while the header is in use).
    fn header(&mut self) -> libc::msghdr {
        // SAFETY: zeroed msghdr is valid; the pointers set are into `self`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut self.storage as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = self.namelen;
        msg.msg_iov = &mut self.iov;
        msg.msg_iovlen = 1;
        if self.controllen > 0 {
            msg.msg_control = self.control.0.as_mut_ptr().cast();
            msg.msg_controllen = self.controllen;
        }
        msg
    }
}

/// Writes `o`'s control messages (the GSO segment size, the source address) into `control`;
/// returns their length.
fn write_control(control: &mut Control, o: &Outgoing<'_>) -> usize {
    // SAFETY: zeroed msghdr is valid; it only frames `control` for the CMSG_* walk.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    let mut used = 0usize;
    // SAFETY: each control message is written within `control` (CMSG_SPACE of its payload,
    // 128 bytes hold all of them) and the header walk follows what was written.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        if let Some(s) = o.segment.filter(|&s| s < o.data.len()) {
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), s as u16);
            used += libc::CMSG_SPACE(2) as usize;
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        match (o.from, o.to) {
            (Some(IpAddr::V4(ip)), SocketAddr::V4(_)) if !c.is_null() => {
                let size = std::mem::size_of::<libc::in_pktinfo>() as u32;
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(size) as usize;
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr {
                        s_addr: u32::from_ne_bytes(ip.octets()),
                    },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
                used += libc::CMSG_SPACE(size) as usize;
            }
            (Some(IpAddr::V6(ip)), SocketAddr::V6(_)) if !c.is_null() => {
                let size = std::mem::size_of::<libc::in6_pktinfo>() as u32;
                (*c).cmsg_level = libc::IPPROTO_IPV6;
                (*c).cmsg_type = libc::IPV6_PKTINFO;
                (*c).cmsg_len = libc::CMSG_LEN(size) as usize;
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: ip.octets(),
                    },
                    ipi6_ifindex: 0,
                };
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
                used += libc::CMSG_SPACE(size) as usize;
            }
            _ => {}
        }
    }
    used
}

/// Sends `data` to `to`: one datagram, or with `segment`, datagrams of that size (GSO). `from`
/// pins the source address (the one the client sent to). A full socket buffer is reported as
/// `WouldBlock`; the caller drops the datagrams (QUIC retransmits).
pub fn send(
    fd: &OwnedFd,
    to: SocketAddr,
    from: Option<IpAddr>,
    data: &[u8],
    segment: Option<usize>,
) -> io::Result<()> {
    let mut p = Prepared::new(&Outgoing {
        to,
        from,
        data,
        segment,
    });
    let msg = p.header();
    loop {
        // SAFETY: msg describes buffers (in `p`, `data`) valid for reads of the sizes given.
        let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, 0) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends every one of `out` in as few `sendmmsg` calls as the kernel allows (one, unless a
/// message fails). A message the kernel refuses is handed to `failed` with its index and error,
/// and the rest are sent after it. Returns how many were sent.
pub fn send_batch(
    fd: &OwnedFd,
    out: &[Outgoing<'_>],
    mut failed: impl FnMut(usize, io::Error),
) -> usize {
    let mut prepared: Vec<Prepared> = out.iter().map(Prepared::new).collect();
    let mut headers: Vec<libc::mmsghdr> = prepared
        .iter_mut()
        .map(|p| libc::mmsghdr {
            msg_hdr: p.header(),
            msg_len: 0,
        })
        .collect();
    let (mut at, mut sent) = (0usize, 0usize);
    while at < headers.len() {
        let rest = &mut headers[at..];
        // SAFETY: each header points into `prepared` (not moved since: the Vec is not touched
        // again) and into `out`'s data, valid for reads; `rest.len()` headers follow the pointer.
        let n = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                rest.as_mut_ptr(),
                rest.len().min(u32::MAX as usize) as libc::c_uint,
                0,
            )
        };
        if n > 0 {
            at += n as usize;
            sent += n as usize;
            continue;
        }
        if n == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        // The first message of `rest` failed (sendmmsg reports an error only for its first).
        failed(at, e);
        at += 1;
    }
    drop(prepared);
    sent
}

/// Whether a failed GSO send says the path cannot segment (a device or a kernel without UDP
/// segmentation offload answers `EIO`, an unsupported size `EINVAL`): the caller then sends
/// datagram by datagram ([`send_each`]) from now on, as quinn-udp does.
pub fn gso_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL))
}

/// Sends `data` as datagrams of `segment` bytes (the last may be shorter), one `sendmsg` each.
pub fn send_each(
    fd: &OwnedFd,
    to: SocketAddr,
    from: Option<IpAddr>,
    data: &[u8],
    segment: usize,
) -> io::Result<()> {
    for d in data.chunks(segment.max(1)) {
        send(fd, to, from, d, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_out_gro_in_and_the_source_address() {
        let a = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b_addr = super::super::socket::local_addr(b.as_raw_fd()).unwrap();
        let a_addr = super::super::socket::local_addr(a.as_raw_fd()).unwrap();
        // Three datagrams of 1200 bytes and one of 100, in one call.
        let data: Vec<u8> = (0..3700u32).map(|i| i as u8).collect();
        send(&a, b_addr, Some(a_addr.ip()), &data, Some(1200)).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < data.len() && std::time::Instant::now() < deadline {
            if let Some(r) = recv(&b, &mut buf).unwrap() {
                assert_eq!(r.from, a_addr);
                assert_eq!(r.to, Some(b_addr.ip()));
                got.extend_from_slice(&buf[..r.len]);
                sizes.extend(buf[..r.len].chunks(r.segment).map(<[u8]>::len));
            }
        }
        assert_eq!(got, data);
        assert_eq!(sizes, [1200, 1200, 1200, 100], "segments as sent");
        assert!(recv(&b, &mut buf).unwrap().is_none());
    }

    #[test]
    fn without_gso_each_datagram_goes_alone() {
        let a = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b_addr = super::super::socket::local_addr(b.as_raw_fd()).unwrap();
        let data: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
        send_each(&a, b_addr, None, &data, 1200).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < data.len() && std::time::Instant::now() < deadline {
            if let Some(r) = recv(&b, &mut buf).unwrap() {
                got.extend_from_slice(&buf[..r.len]);
                sizes.extend(buf[..r.len].chunks(r.segment).map(<[u8]>::len));
            }
        }
        assert_eq!(got, data);
        assert_eq!(sizes, [1200, 1200, 100]);
        assert!(gso_unsupported(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!gso_unsupported(&io::Error::from_raw_os_error(
            libc::EAGAIN
        )));
    }

    #[test]
    fn a_batch_of_messages_in_one_call_gso_and_single() {
        let a = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let c = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let local = |s: &OwnedFd| super::super::socket::local_addr(s.as_raw_fd()).unwrap();
        let (a_addr, b_addr, c_addr) = (local(&a), local(&b), local(&c));
        let gso: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let one = vec![7u8; 300];
        let out = [
            Outgoing {
                to: b_addr,
                from: Some(a_addr.ip()),
                data: &gso,
                segment: Some(1200),
            },
            Outgoing {
                to: c_addr,
                from: None,
                data: &one,
                segment: None,
            },
            Outgoing {
                to: b_addr,
                from: None,
                data: &one[..10],
                segment: None,
            },
        ];
        let mut failures = 0;
        assert_eq!(send_batch(&a, &out, |_, _| failures += 1), 3);
        assert_eq!(failures, 0);
        let mut buf = vec![0u8; 65_536];
        let read_all = |s: &OwnedFd, buf: &mut Vec<u8>, want: usize| {
            let mut sizes = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while sizes.iter().sum::<usize>() < want && std::time::Instant::now() < deadline {
                if let Some(r) = recv(s, buf).unwrap() {
                    assert_eq!(r.from, a_addr);
                    sizes.extend(buf[..r.len].chunks(r.segment).map(<[u8]>::len));
                }
            }
            sizes
        };
        assert_eq!(read_all(&b, &mut buf, 2510), [1200, 1200, 100, 10]);
        assert_eq!(read_all(&c, &mut buf, 300), [300]);
        // A message the kernel refuses (a datagram over UDP's 65,507 bytes: EMSGSIZE) is
        // reported with its index; the ones after it still go.
        let big = vec![1u8; 70_000];
        let out = [
            Outgoing {
                to: c_addr,
                from: None,
                data: &big,
                segment: None,
            },
            Outgoing {
                to: c_addr,
                from: None,
                data: &one,
                segment: None,
            },
        ];
        let mut failed = Vec::new();
        let sent = send_batch(&a, &out, |i, _| failed.push(i));
        assert_eq!((sent, failed), (1, vec![0]));
        assert_eq!(read_all(&c, &mut buf, 300), [300]);
    }

    #[test]
    fn the_steering_program_is_accepted() {
        let a = reuseport_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        steer_by_connection_id(a.as_raw_fd()).unwrap();
    }
}
