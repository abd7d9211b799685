//! TSC -> perf time for the emulated backend.
//!
//! The dummy event's mmap page publishes the conversion only when the kernel's sched_clock
//! is the native TSC one (`cap_user_time_zero`); KVM guests use a paravirtual clock and get
//! none. Then the conversion is measured once per process against the kernel's own record
//! timestamps: a `PR_SET_NAME` (same name) makes the kernel write a COMM record stamped with
//! perf time, bracketed by two TSC reads; two such points 20 ms apart give mult/shift/zero
//! (error about 1 µs per point, i.e. ~50 ppm).

use std::sync::OnceLock;

use crate::capture::current_tid;
use crate::metadata::TimeConv;
use crate::perf::sideband_event::{rdtsc, SidebandEvent};
use crate::sideband::record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};

/// The measured conversion (cached for the process); None when it cannot be measured.
pub fn calibrated() -> Option<TimeConv> {
    static CONV: OnceLock<Option<TimeConv>> = OnceLock::new();
    *CONV.get_or_init(measure)
}

/// One (tsc, perf time) pair: the best of a few tries (narrowest TSC bracket).
fn point(ev: &SidebandEvent) -> Option<(u64, u64)> {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes + NUL into a 17-byte buffer.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } != 0 {
        return None;
    }
    let mut best: Option<(u64, u64, u64)> = None;
    let mut buf = vec![0u8; 16 * 4096];
    for _ in 0..5 {
        ev.discard();
        ev.enable().ok()?;
        let t0 = rdtsc();
        // SAFETY: sets the thread name to its current (NUL-terminated) value.
        let rc = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
        let t1 = rdtsc();
        let _ = ev.disable();
        if rc != 0 {
            return None;
        }
        let w = ev.drain(Some(&mut buf));
        let time = RecordIter::new(&buf[..w.copied], SIDEBAND_SAMPLE_TYPE)
            .filter_map(|r| r.ok())
            .find_map(|(_, r)| match r.record {
                Record::Comm { .. } => r.sample.time,
                _ => None,
            });
        if let Some(time) = time {
            let width = t1.wrapping_sub(t0);
            if best.is_none_or(|b| width < b.2) {
                best = Some((t0 + width / 2, time, width));
            }
        }
    }
    best.map(|(tsc, time, _)| (tsc, time))
}

fn measure() -> Option<TimeConv> {
    let ev = SidebandEvent::open(current_tid(), 4).ok()?;
    let (tsc1, time1) = point(&ev)?;
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (tsc2, time2) = point(&ev)?;
    from_points((tsc1, time1), (tsc2, time2))
}

/// The conversion through two (tsc, time) points.
pub fn from_points(a: (u64, u64), b: (u64, u64)) -> Option<TimeConv> {
    let dt = b.1.checked_sub(a.1)?;
    let dtsc = b.0.checked_sub(a.0)?;
    if dt == 0 || dtsc == 0 {
        return None;
    }
    // ns per tick as mult / 2^shift with the largest shift that keeps mult in u32.
    let mut shift = 31u16;
    let mult = loop {
        let m = (u128::from(dt) << shift) / u128::from(dtsc);
        if m <= u128::from(u32::MAX) {
            break m as u32;
        }
        shift = shift.checked_sub(1)?;
    };
    let base = TimeConv {
        time_shift: shift,
        time_mult: mult,
        time_zero: 0,
    };
    Some(TimeConv {
        time_zero: a.1.wrapping_sub(base.tsc_to_perf_time(a.0)),
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_points_give_an_exact_line() {
        // 2.5 GHz: 0.4 ns per tick.
        let a = (1_000_000_000u64, 5_000_000u64);
        let b = (3_500_000_000u64, 5_000_000 + 1_000_000_000);
        let c = from_points(a, b).unwrap();
        assert_eq!(c.time_shift, 31);
        assert!(c.tsc_to_perf_time(a.0).abs_diff(a.1) <= 1);
        assert!(c.tsc_to_perf_time(b.0).abs_diff(b.1) <= 2);
        assert_eq!(from_points(b, a), None);
    }

    #[test]
    fn measured_conversion_matches_kernel_record_times() {
        let conv = calibrated().expect("calibration against COMM record times");
        let ev = SidebandEvent::open(current_tid(), 4).unwrap();
        let (tsc, time) = point(&ev).unwrap();
        let predicted = conv.tsc_to_perf_time(tsc);
        // Within 200 µs of the kernel's own timestamp.
        assert!(predicted.abs_diff(time) < 200_000, "{predicted} vs {time}");
    }
}
