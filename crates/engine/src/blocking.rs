//! Launch-blocking mode (TORCHTPU_LAUNCH_BLOCKING=1, or torch.tpu.set_launch_blocking(True)),
//! for debugging as CUDA_LAUNCH_BLOCKING=1: every op runs its own program at its call and waits
//! for it, so a device-side failure (an index out of range, memory full) raises at the op that
//! caused it, with the user's traceback. Fused eager recording is off while it is on.
use std::sync::atomic::{AtomicU8, Ordering};

static MODE: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether ops wait for their programs: TORCHTPU_LAUNCH_BLOCKING=1, read at the first question,
/// unless `set_enabled` said first.
pub fn enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var("TORCHTPU_LAUNCH_BLOCKING").is_ok_and(|v| v.trim() == "1");
            let _ = MODE.compare_exchange(UNSET, if on { ON } else { OFF }, Ordering::Relaxed, Ordering::Relaxed);
            MODE.load(Ordering::Relaxed) == ON
        }
        mode => mode == ON,
    }
}

pub fn set_enabled(on: bool) {
    MODE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}
