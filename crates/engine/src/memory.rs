//! Per-device statistics of the device buffers that live tensors hold: what
//! torch.tpu.memory_stats and torch.accelerator's memory functions report (through the shim's
//! DeviceAllocator). Counted where buffers are made and dropped (cell::DevBuf).
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// Devices beyond this index share the last slot's counters.
pub const MAX_DEVICES: usize = 64;

/// A quantity's current value, its peak since the last reset, and its total increase and
/// decrease since the last reset (CUDA's current/peak/allocated/freed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

struct Counter {
    current: AtomicI64,
    peak: AtomicI64,
    allocated: AtomicI64,
    freed: AtomicI64,
}

impl Counter {
    const fn new() -> Counter {
        Counter { current: AtomicI64::new(0), peak: AtomicI64::new(0), allocated: AtomicI64::new(0), freed: AtomicI64::new(0) }
    }

    fn add(&self, n: i64) {
        let now = self.current.fetch_add(n, Relaxed) + n;
        self.peak.fetch_max(now, Relaxed);
        self.allocated.fetch_add(n, Relaxed);
    }

    fn sub(&self, n: i64) {
        self.current.fetch_sub(n, Relaxed);
        self.freed.fetch_add(n, Relaxed);
    }

    fn get(&self) -> Stat {
        Stat {
            current: self.current.load(Relaxed),
            peak: self.peak.load(Relaxed),
            allocated: self.allocated.load(Relaxed),
            freed: self.freed.load(Relaxed),
        }
    }
}

struct DeviceCounters {
    buffers: Counter,
    bytes: Counter,
}

static DEVICES: [DeviceCounters; MAX_DEVICES] =
    [const { DeviceCounters { buffers: Counter::new(), bytes: Counter::new() } }; MAX_DEVICES];

fn slot(device: i32) -> &'static DeviceCounters {
    &DEVICES[(device.max(0) as usize).min(MAX_DEVICES - 1)]
}

pub(crate) fn on_alloc(device: i32, bytes: i64) {
    let d = slot(device);
    d.buffers.add(1);
    d.bytes.add(bytes);
}

pub(crate) fn on_free(device: i32, bytes: i64) {
    let d = slot(device);
    d.buffers.sub(1);
    d.bytes.sub(bytes);
}

/// (buffers, bytes) of one device.
pub fn stats(device: i32) -> (Stat, Stat) {
    let d = slot(device);
    (d.buffers.get(), d.bytes.get())
}

/// Live buffers on every device together (for leak checks).
pub fn live_buffers() -> i64 {
    DEVICES.iter().map(|d| d.buffers.current.load(Relaxed)).sum()
}

/// Starts new peaks from the values now (reset_peak_memory_stats).
pub fn reset_peak(device: i32) {
    let d = slot(device);
    for c in [&d.buffers, &d.bytes] {
        c.peak.store(c.current.load(Relaxed), Relaxed);
    }
}

/// Zeroes the allocated and freed totals (reset_accumulated_memory_stats).
pub fn reset_accumulated(device: i32) {
    let d = slot(device);
    for c in [&d.buffers, &d.bytes] {
        c.allocated.store(0, Relaxed);
        c.freed.store(0, Relaxed);
    }
}

/// Bytes the plugin's allocator holds for a device, free or not (CUDA's "reserved"): its pool
/// where the plugin reports one (GPU, TPU), else exactly the live buffers' bytes (the CPU
/// plugin allocates each buffer on its own).
pub fn reserved(device: i32) -> Stat {
    let own = stats(device).1;
    let pool = crate::runtime::is_initialized()
        .then(|| crate::runtime::runtime().ok()?.device(device).ok()?.memory_stats().ok()?)
        .flatten();
    match pool.and_then(|p| Some((p.pool_bytes?, p.peak_pool_bytes))) {
        Some((current, peak)) => Stat { current, peak: peak.unwrap_or(current).max(current), ..own },
        None => own,
    }
}

/// (free bytes, total bytes) of a device's memory: the plugin allocator's limit and use where
/// it reports a limit (GPU, TPU); on the CPU plugin the device memory is the host's RAM.
pub fn info(device: i32) -> Result<(i64, i64), crate::error::Error> {
    let rt = crate::runtime::runtime()?;
    let d = rt.device(device)?;
    if let Some(pjrt::MemoryStats { bytes_in_use, bytes_limit: Some(limit), .. }) = d.memory_stats()? {
        return Ok((limit - bytes_in_use, limit));
    }
    if rt.client.platform_name().eq_ignore_ascii_case("cpu") {
        let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| crate::error::Error::runtime(format!("torchtpu: /proc/meminfo: {e}")))?;
        let field = |name: &str| -> Option<i64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            Some(line[name.len()..].trim_start_matches(':').split_whitespace().next()?.parse::<i64>().ok()? * 1024)
        };
        if let (Some(free), Some(total)) = (field("MemAvailable"), field("MemTotal")) {
            return Ok((free, total));
        }
    }
    Err(crate::error::Error::runtime(format!("torchtpu: the {} plugin does not report its memory", rt.client.platform_name())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_current_peak_and_totals_per_device() {
        let dev = 7; // no other test uses this slot
        on_alloc(dev, 100);
        on_alloc(dev, 50);
        on_free(dev, 100);
        let (bufs, bytes) = stats(dev);
        assert_eq!(bufs, Stat { current: 1, peak: 2, allocated: 2, freed: 1 });
        assert_eq!(bytes, Stat { current: 50, peak: 150, allocated: 150, freed: 100 });
        reset_peak(dev);
        reset_accumulated(dev);
        assert_eq!(stats(dev).1, Stat { current: 50, peak: 50, allocated: 0, freed: 0 });
        on_free(dev, 50);
        assert_eq!(stats(dev).1, Stat { current: 0, peak: 50, allocated: 0, freed: 50 });
        assert_eq!(stats(dev + 1).1, Stat::default());
    }
}
