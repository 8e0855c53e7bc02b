//! One AF_XDP socket: its UMEM (the frames the kernel and the engine hand each other), the fill
//! and completion rings that move frames between them, and the RX and TX rings that carry
//! frames received and to send (the kernel's Documentation/networking/af_xdp.rst).
//!
//! The rings are single-producer, single-consumer queues in memory shared with the kernel: a
//! producer writes descriptors, then publishes its index with a release store; a consumer reads
//! the producer's index with an acquire load, reads the descriptors, then publishes its own. The
//! code is written here rather than taken from a crate: the one pure-Rust AF_XDP crate without
//! libbpf (xdpilone) is EUPL-1.2, the libbpf-based ones (xsk-rs) need libxdp at run time, and
//! these rings are the bypass path's hottest loop (engine/DESIGN.md, "The AF_XDP path").
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::super::cvt;

/// The sizes of one socket's memory. UMEM registration is charged to `RLIMIT_MEMLOCK` without
/// CAP_IPC_LOCK: `frames * frame_size` bytes (the default, 4096 frames of 2 KiB, is 8 MiB).
#[derive(Debug, Clone, Copy)]
pub struct XskConfig {
    /// Bytes a frame: 2048 or 4096 (the kernel's aligned-chunk sizes), at least one MTU.
    pub frame_size: u32,
    /// Frames in the UMEM: half are lent to the kernel for receiving, half kept for sending.
    pub frames: u32,
    /// Descriptors in each of the four rings (a power of two).
    pub ring_size: u32,
}

impl Default for XskConfig {
    fn default() -> XskConfig {
        XskConfig {
            frame_size: 2048,
            frames: 4096,
            ring_size: 2048,
        }
    }
}

/// The kernel's counters for one socket (`XDP_STATISTICS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames the kernel dropped for this socket (for instance the RX ring was full).
    pub rx_dropped: u64,
    /// Frames dropped because the fill ring had no frame to put them in.
    pub rx_fill_ring_empty: u64,
    /// TX descriptors the kernel refused (out of the UMEM, too long).
    pub tx_invalid: u64,
}

/// An AF_XDP socket bound to one queue of one interface, in copy mode (veth and most drivers
/// without zero-copy support), with its own UMEM.
pub struct Xsk {
    fd: OwnedFd,
    umem: MmapRaw,
    frame_size: u32,
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    /// Frames of the send half not queued on the TX ring.
    free: Vec<u64>,
    /// Received frames handled and waiting for room on the fill ring.
    refill: Vec<u64>,
    /// TX descriptors written since the last kick.
    unsent: u32,
}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk")
            .field("fd", &self.fd)
            .field("frame_size", &self.frame_size)
            .finish()
    }
}

impl Xsk {
    /// Creates the socket and its UMEM and binds it to `queue` of the interface `ifindex`.
    /// Receiving starts when an XDP program redirects into it (an [`super::XskMap`] entry).
    pub fn open(ifindex: u32, queue: u32, config: &XskConfig) -> io::Result<Xsk> {
        let XskConfig {
            frame_size,
            frames,
            ring_size,
        } = *config;
        if !matches!(frame_size, 2048 | 4096) || frames < 2 || !ring_size.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP: frame_size must be 2048 or 4096, frames at least 2, ring_size a power of two",
            ));
        }
        // SAFETY: socket(2) takes no pointers; it returns a new descriptor or -1.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `raw` was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = frames as usize * frame_size as usize;
        let umem: MmapRaw = MmapOptions::new().len(len).populate().map_anon()?.into();
        let reg = libc::xdp_umem_reg {
            addr: umem.as_mut_ptr() as u64,
            len: len as u64,
            chunk_size: frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        set_option(&fd, libc::XDP_UMEM_REG, &reg)?;
        set_option(&fd, libc::XDP_UMEM_FILL_RING, &ring_size)?;
        set_option(&fd, libc::XDP_UMEM_COMPLETION_RING, &ring_size)?;
        set_option(&fd, libc::XDP_RX_RING, &ring_size)?;
        set_option(&fd, libc::XDP_TX_RING, &ring_size)?;
        let offsets: libc::xdp_mmap_offsets = get_option(&fd, libc::XDP_MMAP_OFFSETS)?;
        let fill = Ring::map(
            &fd,
            &offsets.fr,
            ring_size,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            true,
        )?;
        let completion = Ring::map(
            &fd,
            &offsets.cr,
            ring_size,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            false,
        )?;
        let rx = Ring::map(
            &fd,
            &offsets.rx,
            ring_size,
            libc::XDP_PGOFF_RX_RING as u64,
            false,
        )?;
        let tx = Ring::map(
            &fd,
            &offsets.tx,
            ring_size,
            libc::XDP_PGOFF_TX_RING as u64,
            true,
        )?;
        let mut xsk = Xsk {
            fd,
            umem,
            frame_size,
            fill,
            completion,
            rx,
            tx,
            free: Vec::new(),
            refill: Vec::new(),
            unsent: 0,
        };
        // The first half of the frames (as many as the fill ring holds) receive; the rest send.
        let lend = (frames / 2).clamp(1, ring_size);
        for i in 0..frames {
            let addr = u64::from(i) * u64::from(frame_size);
            if i < lend {
                xsk.fill.push(addr);
            } else {
                xsk.free.push(addr);
            }
        }
        xsk.fill.publish();
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `addr` is a valid sockaddr_xdp and the length passed is its size.
        cvt(unsafe {
            libc::bind(
                xsk.fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })?;
        Ok(xsk)
    }

    /// The socket's descriptor: the value an XSKMAP entry takes, and what to poll.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Waits up to `timeout_ms` for received frames or for `other` (an eventfd) to be readable.
    pub fn wait_with(&self, other: Option<RawFd>, timeout_ms: i32) -> io::Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: other.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds (a negative fd is ignored by poll), and the count is 2.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Calls `each` with every received frame (at most `max`), then lends the frames back to
    /// the kernel. Returns how many frames there were.
    pub fn receive(&mut self, max: u32, mut each: impl FnMut(&[u8])) -> u32 {
        let ready = self.rx.available().min(max);
        for _ in 0..ready {
            let desc = self.rx.pop();
            // A descriptor outside the UMEM (a kernel bug) is skipped, its address not reused.
            if let Some(frame) = self.frame(desc.addr, desc.len) {
                each(frame);
                // Copy mode hands back the chunk's own address: the frame goes back to the
                // fill ring, or waits for room there (the kernel publishes a received frame
                // before it releases the fill slot it took it from).
                self.refill
                    .push(desc.addr - desc.addr % u64::from(self.frame_size));
            }
        }
        if ready > 0 {
            self.rx.release();
        }
        self.lend();
        ready
    }

    /// Queues one frame to send (copied into a free frame of the UMEM). False when every send
    /// frame is in flight or the frame is longer than a UMEM frame: the caller drops it, as a
    /// NIC would.
    pub fn send(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.frame_size as usize {
            return false;
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        let Some(addr) = self.free.pop() else {
            return false;
        };
        if self.tx.free() == 0 {
            self.free.push(addr);
            return false;
        }
        // SAFETY: `addr` is a send frame nobody else holds (it came back on the completion
        // ring or was never queued), inside the UMEM, and `frame` is at most one frame long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                frame.as_ptr(),
                self.umem.as_mut_ptr().add(addr as usize),
                frame.len(),
            );
        }
        self.tx.push(libc::xdp_desc {
            addr,
            len: frame.len() as u32,
            options: 0,
        });
        self.unsent += 1;
        true
    }

    /// Publishes queued frames to the kernel, wakes it (copy mode sends from the `sendto`
    /// call, 32 frames a call), and takes back frames it has finished with.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.unsent > 0 {
            self.tx.publish();
            // Copy mode sends at most 32 frames a kick and says EAGAIN while more wait: kick
            // until the ring is drained (bounded: a ring's worth of kicks).
            for _ in 0..=self.unsent.div_ceil(32) {
                // SAFETY: a zero-length sendto with null buffers is AF_XDP's TX kick.
                let rc = unsafe {
                    libc::sendto(
                        self.fd(),
                        std::ptr::null(),
                        0,
                        libc::MSG_DONTWAIT,
                        std::ptr::null(),
                        0,
                    )
                };
                if rc >= 0 {
                    break;
                }
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => continue,
                    // The device is busy or down, or out of buffers: what the kernel could not
                    // send it drops and completes, as a NIC would.
                    Some(libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => break,
                    _ => return Err(e),
                }
            }
            self.unsent = 0;
        }
        self.reclaim();
        self.lend();
        Ok(())
    }

    /// Gives the kernel back the received frames waiting for room on the fill ring.
    fn lend(&mut self) {
        let mut lent = false;
        while !self.refill.is_empty() && self.fill.free() > 0 {
            let addr = self.refill.pop().expect("not empty");
            self.fill.push(addr);
            lent = true;
        }
        if lent {
            self.fill.publish();
        }
    }

    /// The kernel's counters for this socket.
    pub fn stats(&self) -> io::Result<XskStats> {
        let s: libc::xdp_statistics = get_option(&self.fd, libc::XDP_STATISTICS)?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped + s.rx_ring_full,
            rx_fill_ring_empty: s.rx_fill_ring_empty_descs,
            tx_invalid: s.tx_invalid_descs,
        })
    }

    fn reclaim(&mut self) {
        let done = self.completion.available();
        for _ in 0..done {
            let addr = self.completion.pop();
            self.free.push(addr);
        }
        if done > 0 {
            self.completion.release();
        }
    }

    /// The received bytes of a descriptor, if the kernel's descriptor is inside the UMEM.
    fn frame(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let end = addr.checked_add(u64::from(len))?;
        if end > self.umem.len() as u64 {
            return None;
        }
        // SAFETY: [addr, end) is inside the UMEM mapping (checked above), and the kernel wrote
        // this frame before publishing its descriptor (acquire load of the RX producer index);
        // it is not lent back to the kernel until `receive`'s callback has returned.
        Some(unsafe {
            std::slice::from_raw_parts(self.umem.as_ptr().add(addr as usize), len as usize)
        })
    }
}

/// One mapped ring: the kernel's producer and consumer indexes and the descriptor array.
struct Ring<T: Copy> {
    _map: MmapRaw,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    /// Our producer index (producer rings) or consumer index (consumer rings), published on
    /// `publish` / `release`.
    local: u32,
    /// The other side's index as last read.
    seen: u32,
}

impl<T: Copy> Ring<T> {
    fn map(
        fd: &OwnedFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
        producer_side: bool,
    ) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = MmapOptions::new()
            .offset(pgoff)
            .len(len)
            .populate()
            .map_raw(fd.as_raw_fd())?;
        let base = map.as_mut_ptr();
        // SAFETY: the kernel's offsets place the two u32 indexes and the descriptor array
        // inside the `len` bytes just mapped (it sized the ring from `size`); the indexes are
        // 4-byte aligned and only ever accessed atomically, by us and the kernel.
        let (producer, consumer, desc) = unsafe {
            (
                base.add(off.producer as usize) as *const AtomicU32,
                base.add(off.consumer as usize) as *const AtomicU32,
                base.add(off.desc as usize) as *mut T,
            )
        };
        let mut ring = Ring {
            _map: map,
            producer,
            consumer,
            desc,
            mask: size - 1,
            local: 0,
            seen: 0,
        };
        // A new ring starts at zero on both sides; read them anyway (what is mapped is true):
        // ours is the producer index on a ring we fill, the consumer index on one we drain.
        ring.local = ring.index(producer_side).load(Ordering::Relaxed);
        ring.seen = ring.index(!producer_side).load(Ordering::Acquire);
        Ok(ring)
    }

    fn index(&self, producer: bool) -> &AtomicU32 {
        // SAFETY: both pointers point into `_map`, which lives as long as `self`.
        unsafe {
            &*(if producer {
                self.producer
            } else {
                self.consumer
            })
        }
    }

    // Producer side (fill, TX).

    /// Descriptors that can be written now.
    fn free(&mut self) -> u32 {
        let size = self.mask + 1;
        if size - self.local.wrapping_sub(self.seen) == 0 {
            self.seen = self.index(false).load(Ordering::Acquire);
        }
        size - self.local.wrapping_sub(self.seen)
    }

    /// Writes one descriptor; the caller has seen `free() > 0`.
    fn push(&mut self, value: T) {
        // SAFETY: the slot is inside the descriptor array (masked), and not the kernel's until
        // `publish` stores the producer index past it.
        unsafe {
            self.desc
                .add((self.local & self.mask) as usize)
                .write(value)
        };
        self.local = self.local.wrapping_add(1);
    }

    fn publish(&mut self) {
        self.index(true).store(self.local, Ordering::Release);
    }

    // Consumer side (RX, completion).

    /// Descriptors the kernel has published and we have not read.
    fn available(&mut self) -> u32 {
        self.seen = self.index(true).load(Ordering::Acquire);
        self.seen.wrapping_sub(self.local)
    }

    fn pop(&mut self) -> T {
        // SAFETY: the slot is inside the descriptor array (masked) and was published by the
        // kernel (`available` counted it after an acquire load of its producer index).
        let value = unsafe { self.desc.add((self.local & self.mask) as usize).read() };
        self.local = self.local.wrapping_add(1);
        value
    }

    fn release(&mut self) {
        self.index(false).store(self.local, Ordering::Release);
    }
}

fn set_option<T>(fd: &OwnedFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a valid T for the option and the length passed is its size.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn get_option<T: Copy>(fd: &OwnedFd, name: libc::c_int) -> io::Result<T> {
    let mut value = std::mem::MaybeUninit::<T>::zeroed();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the buffer is `len` writable bytes; the kernel writes at most that many.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            value.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    // SAFETY: zero is a valid value of the plain-integer structs read here, and the kernel
    // filled what it knows of them.
    Ok(unsafe { value.assume_init() })
}
