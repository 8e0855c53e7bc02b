//! The provided-buffer ring a core's multishot receives read into: `count` buffers of `size`
//! bytes in plain heap memory (nothing registered as fixed buffers, so a non-root engine starts
//! under an 8 MiB memlock limit), and the page-aligned ring of entries that hands them to the
//! kernel, registered as buffer group [`BGID`].
#![allow(unsafe_code)]

use std::io;

use io_uring::IoUring;

/// The buffer group every receive selects from.
pub(super) const BGID: u16 = 0;

/// A provided-buffer ring: `count` buffers of `size` bytes, registered as group `BGID`.
pub(super) struct BufRing {
    /// The ring of `io_uring_buf` entries, page-aligned (mmap).
    ring: *mut io_uring::types::BufRingEntry,
    ring_bytes: usize,
    mem: Vec<u8>,
    count: u16,
    size: u32,
    tail: u16,
}

impl BufRing {
    pub(super) fn new(ring: &IoUring, count: u16, size: u32) -> io::Result<Self> {
        assert!(
            count.is_power_of_two(),
            "buffer count must be a power of two"
        );
        let ring_bytes = usize::from(count) * std::mem::size_of::<io_uring::types::BufRingEntry>();
        // SAFETY: anonymous private mapping, checked for MAP_FAILED; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut this = BufRing {
            ring: ptr.cast(),
            ring_bytes,
            mem: vec![0u8; usize::from(count) * size as usize],
            count,
            size,
            tail: 0,
        };
        // SAFETY: the mapping lives until Drop, which runs after the ring that uses it is
        // dropped (the loop owns both and drops the ring first); `count` entries fit in it.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(ptr as u64, count, BGID, 0)?;
        }
        for bid in 0..count {
            this.push(bid);
        }
        this.publish();
        Ok(this)
    }

    /// Queues buffer `bid` for the kernel (visible after `publish`).
    pub(super) fn push(&mut self, bid: u16) {
        let idx = usize::from(self.tail & (self.count - 1));
        let addr = self.mem.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: idx < count, so the entry lies inside the mapping; only this thread writes it.
        let entry = unsafe { &mut *self.ring.add(idx) };
        entry.set_addr(addr);
        entry.set_len(self.size);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes pushed buffers visible to the kernel.
    pub(super) fn publish(&self) {
        // SAFETY: the tail field lives in entry 0, inside the mapping; the kernel reads it with
        // acquire semantics, so a release store orders the entries written before it.
        unsafe {
            let tail = io_uring::types::BufRingEntry::tail(self.ring)
                as *const std::sync::atomic::AtomicU16;
            (*tail).store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    pub(super) fn data(&self, bid: u16, len: usize) -> &[u8] {
        let start = usize::from(bid) * self.size as usize;
        let end = start + len.min(self.size as usize);
        self.mem.get(start..end).unwrap_or(&[])
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `new` with exactly this length.
        unsafe {
            libc::munmap(self.ring.cast(), self.ring_bytes);
        }
    }
}
