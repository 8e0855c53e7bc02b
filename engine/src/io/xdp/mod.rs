//! The AF_XDP data path's kernel parts (engine/DESIGN.md, "The AF_XDP path"): [`prog`], the
//! engine's XDP program, hand-assembled and loaded, tested and attached through libbpf; and
//! [`xsk`], one AF_XDP socket with its UMEM and rings. The frames they carry are parsed and
//! written by `lasthop_edge::wire`, and served by `lasthop_edge::tcp`; [`run`], the loop that
//! drives HTTP and HTTPS sessions on it (`--io xdp`).

pub mod prog;
pub mod run;
pub mod xsk;

pub use prog::{Attachment, Filter, LoadError, Program, XskMap};
pub use xsk::{Xsk, XskConfig, XskStats};

/// The Ethernet address of the interface `name` in this thread's network namespace (sysfs).
pub fn mac(name: &str) -> std::io::Result<[u8; 6]> {
    ifindex(name)?; // the same name checks, and "no such interface" said the same way
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/address"))?;
    let bytes: Option<Vec<u8>> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    bytes
        .and_then(|b| <[u8; 6]>::try_from(b).ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("interface {name} has no Ethernet address ({text:?})"),
            )
        })
}

/// How many RX queues the interface `name` has (sysfs `queues/rx-N`).
pub fn rx_queues(name: &str) -> std::io::Result<u32> {
    ifindex(name)?;
    let dir = std::fs::read_dir(format!("/sys/class/net/{name}/queues"))?;
    let mut count = 0;
    for entry in dir {
        if entry?.file_name().to_string_lossy().starts_with("rx-") {
            count += 1;
        }
    }
    Ok(count)
}

/// The index of the network interface `name` in this thread's network namespace (read from
/// sysfs, which `ip netns exec` mounts per namespace).
pub fn ifindex(name: &str) -> std::io::Result<u32> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not an interface name: {name:?}"),
        ));
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .map_err(|e| std::io::Error::new(e.kind(), format!("interface {name}: {e}")))?;
    text.trim().parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("interface {name}: ifindex {text:?}"),
        )
    })
}
