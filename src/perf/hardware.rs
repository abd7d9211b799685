//! The hardware backend: one per-thread `intel_pt` event with a DATA ring (sideband, AUX
//! and LOST records) and a linear AUX ring (the PT packets).
//!
//! start = discard what accumulated between windows, synthesize the executable mappings
//! (user modes), enable. stop = disable, copy the window's PT (with wrap-around) and
//! sideband, advance both tails so the handle serves the next window.
//!
//! Snapshot (flight-recorder) mode, [`HardwareSnapshot`]: the AUX area is mapped without
//! `PROT_WRITE` (overwrite mode: the kernel ignores `aux_tail` and keeps the newest
//! `aux_size` bytes); a snapshot disables the event, writes the `Snapshot` record and window
//! of the valid bytes from their first PSB on ([`crate::perf::hwsnap`]: the DATA ring's
//! records become the window's sideband; `PERF_AUX_FLAG_OVERWRITE` is expected there,
//! TRUNCATED/PARTIAL/COLLISION mean loss) and enables the event again.

use perf_event_open_sys::bindings::perf_event_attr;

use crate::capture::{current_tid, CaptureBackend, Mode, WindowCapture};
use crate::error::Result;
use crate::metadata::{BackendKind, ExtMetadata, TimeConv};
use crate::perf::event::PerfEvent;
use crate::perf::hwsnap::{snapshot_from_rings, Firing, SnapshotCursor, Written};
use crate::perf::pmu::IntelPtPmu;
use crate::perf::ring::{
    copy_ring_bytes, copy_ring_records, ControlPage, RingMemory, AUX_LOSS_FLAGS,
};
use crate::perf::sideband_event::{rdtsc, set_sideband_attrs};
use crate::sideband::record::SIDEBAND_SAMPLE_TYPE;
use crate::sideband::synth::synthesize_exec_mmap2;

/// The `mtc_period` we ask for when MTC is supported (an MTC every 2^(n+1) ART ticks).
const MTC_PERIOD: u64 = 3;

/// The perf config for `mode` on `pmu`: return compression off, TSC, MTC and (in user
/// modes) cycle-accurate packets where the PMU supports them.
pub fn pt_config(pmu: &IntelPtPmu, mode: Mode) -> Result<(u64, u8)> {
    let mut config = 0u64;
    pmu.set_term(&mut config, "noretcomp", 1)?;
    if pmu.format.contains_key("tsc") {
        pmu.set_term(&mut config, "tsc", 1)?;
    }
    let mut mtc_freq = 0u8;
    if pmu.cap("mtc") != 0
        && pmu.format.contains_key("mtc")
        && pmu.format.contains_key("mtc_period")
        && pmu.cap("mtc_periods") & (1 << MTC_PERIOD) != 0
    {
        pmu.set_term(&mut config, "mtc", 1)?;
        pmu.set_term(&mut config, "mtc_period", MTC_PERIOD)?;
        mtc_freq = MTC_PERIOD as u8;
    }
    if mode.traces_user() && pmu.cap("psb_cyc") != 0 && pmu.format.contains_key("cyc") {
        pmu.set_term(&mut config, "cyc", 1)?;
    }
    Ok((config, mtc_freq))
}

/// The perf_event_attr for `mode` (disabled; sideband records when tracing user code).
pub fn pt_attr(pmu_type: u32, config: u64, mode: Mode) -> perf_event_attr {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented default.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.type_ = pmu_type;
    attr.config = config;
    attr.set_disabled(1);
    attr.set_exclude_hv(1);
    attr.set_exclude_kernel(u64::from(!mode.traces_kernel()));
    attr.set_exclude_user(u64::from(!mode.traces_user()));
    if mode.has_sideband() {
        set_sideband_attrs(&mut attr, true);
    } else {
        // AUX/LOST records still need their sample_id for correlation.
        attr.set_sample_id_all(1);
        attr.sample_type = SIDEBAND_SAMPLE_TYPE;
    }
    attr
}

/// Copies one stopped window out of the rings and advances the tails.
///
/// `synth` (the synthesized initial mappings) goes first in the sideband output, then the
/// DATA ring's records. Used on the real mappings and on simulated rings in tests.
pub fn collect_window(
    ctl: &ControlPage,
    aux: &RingMemory,
    data: &RingMemory,
    synth: &[u8],
    pt: &mut [u8],
    sideband: Option<&mut [u8]>,
) -> WindowCapture {
    let aux_head = ctl.aux_head();
    let bw = copy_ring_bytes(aux, ctl.aux_tail(), aux_head, pt);
    ctl.set_aux_tail(aux_head);

    let data_head = ctl.data_head();
    let data_tail = ctl.data_tail();
    let mut cap = WindowCapture {
        pt_size: bw.copied,
        pt_truncated_by_output: bw.truncated_by_output,
        ..Default::default()
    };
    let rw = match sideband {
        Some(sb) => {
            let n = synth.len().min(sb.len());
            sb[..n].copy_from_slice(&synth[..n]);
            if n < synth.len() {
                cap.sideband_truncated_by_output = true;
            }
            let rw = copy_ring_records(data, data_tail, data_head, Some(&mut sb[n..]));
            cap.sideband_size = n + rw.copied;
            cap.sideband_truncated_by_output |= rw.records_not_copied > 0;
            rw
        }
        None => copy_ring_records(data, data_tail, data_head, None),
    };
    ctl.set_data_tail(data_head);
    cap.pt_lost = bw.overwritten || rw.aux_flags & AUX_LOSS_FLAGS != 0;
    cap.sideband_lost = rw.overwritten || rw.lost_records > 0;
    cap
}

/// The PMU and configuration an `intel_pt` event was opened with.
struct PtSetup {
    pmu: IntelPtPmu,
    config: u64,
    mtc_freq: u8,
}

impl PtSetup {
    /// Opens thread `tid`'s `intel_pt` event for `mode` (`what` is added to the event's
    /// name in errors).
    fn open_event(tid: i32, mode: Mode, what: &str) -> Result<(PerfEvent, PtSetup)> {
        let pmu = IntelPtPmu::probe()?;
        let (config, mtc_freq) = pt_config(&pmu, mode)?;
        let mut attr = pt_attr(pmu.pmu_type, config, mode);
        let event = PerfEvent::open(
            &mut attr,
            tid,
            -1,
            &format!(
                "intel_pt type {} config {config:#x}, {} mode{what}",
                pmu.pmu_type,
                mode.name()
            ),
        )?;
        Ok((
            event,
            PtSetup {
                pmu,
                config,
                mtc_freq,
            },
        ))
    }

    /// What a decoder needs to know of traces of this event (its DATA ring mapped: the
    /// time conversion comes from its control page).
    fn metadata(&self, event: &PerfEvent) -> ExtMetadata {
        let conv = event.control().and_then(|c| c.time_conv());
        let mut meta = ExtMetadata::for_this_cpu(BackendKind::Hardware, conv);
        if let Some((denominator, numerator)) = self.pmu.tsc_art_ratio {
            meta.cpuid_0x15_eax = denominator;
            meta.cpuid_0x15_ebx = numerator;
        }
        meta.nom_freq = self.pmu.max_nonturbo_ratio.unwrap_or(0).min(255) as u8;
        meta.mtc_freq = self.mtc_freq;
        meta.perf_type = self.pmu.pmu_type;
        meta.perf_config = self.config;
        meta
    }
}

/// Hardware Intel PT for the calling thread.
pub struct HardwareBackend {
    event: PerfEvent,
    mode: Mode,
    meta: ExtMetadata,
    synth: Vec<u8>,
}

impl HardwareBackend {
    /// Opens the `intel_pt` event for the calling thread and maps 2^`sb_shift` pages of
    /// DATA ring and 2^`pt_shift` pages of linear AUX ring.
    pub fn open(mode: Mode, pt_shift: u32, sb_shift: u32) -> Result<Self> {
        let (mut event, setup) = PtSetup::open_event(current_tid(), mode, "")?;
        event.map_data(sb_shift)?;
        event.map_aux(pt_shift, true)?;
        let meta = setup.metadata(&event);
        Ok(HardwareBackend {
            event,
            mode,
            meta,
            synth: Vec::new(),
        })
    }

    fn time_conv(&self) -> TimeConv {
        TimeConv {
            time_shift: self.meta.base.time_shift,
            time_mult: self.meta.base.time_mult,
            time_zero: self.meta.base.time_zero,
        }
    }
}

impl CaptureBackend for HardwareBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hardware
    }

    fn start(&mut self) -> Result<()> {
        if let Some(ctl) = self.event.control() {
            ctl.set_aux_tail(ctl.aux_head());
            ctl.set_data_tail(ctl.data_head());
        }
        self.synth.clear();
        if self.mode.has_sideband() {
            let now = if self.meta.time_zero_valid {
                self.time_conv().tsc_to_perf_time(rdtsc())
            } else {
                0
            };
            self.synth = synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, now)?;
        }
        self.event.enable()
    }

    fn stop(&mut self, pt: &mut [u8], sideband: Option<&mut [u8]>) -> Result<WindowCapture> {
        self.event.disable()?;
        let (ctl, aux, data) = self.event.rings()?;
        Ok(collect_window(&ctl, &aux, &data, &self.synth, pt, sideband))
    }

    fn metadata(&self) -> ExtMetadata {
        self.meta
    }
}

/// Hardware Intel PT of the calling thread in snapshot mode: an overwrite-mode AUX area of
/// at least `size` bytes (a power of two of pages), tracing from [`Self::open`] on; each
/// [`Self::write_snapshot`] writes the `Snapshot` record and window of one firing
/// ([`crate::perf::hwsnap`]).
pub struct HardwareSnapshot {
    event: PerfEvent,
    cursor: SnapshotCursor,
    meta: ExtMetadata,
}

impl HardwareSnapshot {
    /// Opens and enables the calling thread's event (the AUX area mapped without
    /// `PROT_WRITE`: overwrite mode); fails with the reason where there is no Intel PT (as
    /// on QEMU's CPU model or a machine without it). In user modes the executable mappings
    /// are synthesized first (the first snapshot window carries them).
    pub fn open(mode: Mode, size: u64, sb_shift: u32) -> Result<Self> {
        Self::open_thread(current_tid(), mode, size, sb_shift)
    }

    /// [`Self::open`] for thread `tid` of this process (the shim's writer thread opens one
    /// per application thread: a per-thread event counts only while that thread runs).
    pub fn open_thread(tid: i32, mode: Mode, size: u64, sb_shift: u32) -> Result<Self> {
        let (mut event, setup) =
            PtSetup::open_event(tid, mode, &format!(", snapshot of thread {tid}"))?;
        event.map_data(sb_shift)?;
        event.map_aux(aux_shift_for(size), false)?;
        let meta = setup.metadata(&event);
        let synth = if mode.has_sideband() {
            let now = match event.control().and_then(|c| c.time_conv()) {
                Some(conv) => conv.tsc_to_perf_time(rdtsc()),
                None => 0,
            };
            synthesize_exec_mmap2(SIDEBAND_SAMPLE_TYPE, now)?
        } else {
            Vec::new()
        };
        event.enable()?;
        Ok(HardwareSnapshot {
            event,
            cursor: SnapshotCursor::new(size, synth),
            meta,
        })
    }

    pub fn metadata(&self) -> ExtMetadata {
        self.meta
    }

    /// The event's descriptor (for `PERF_EVENT_IOC_DISABLE` from a signal handler: the
    /// shim stops a thread's trace at its trigger syscall, before the writer writes it).
    pub fn raw_fd(&self) -> i32 {
        self.event.raw_fd()
    }

    /// A firing: disable, write the snapshot into `out` (a thread file), enable again
    /// (tracing goes on; the next snapshot holds only what comes after this one).
    pub fn write_snapshot(
        &mut self,
        firing: &Firing,
        out: &mut impl std::io::Write,
    ) -> Result<Written> {
        self.event.disable()?;
        let (ctl, aux, data) = self.event.rings()?;
        let written = snapshot_from_rings(&ctl, &aux, &data, &mut self.cursor, firing, out);
        self.event.enable()?;
        written.map_err(|e| {
            crate::error::Error::new(
                crate::error::Status::FailedToReadPtData,
                format!("writing snapshot {}: {e}", firing.number),
            )
        })
    }
}

/// The AUX shift (2^n pages) whose area holds at least `size` bytes.
pub fn aux_shift_for(size: u64) -> u32 {
    let page = crate::capture::page_size() as u64;
    let pages = size.div_ceil(page).max(1).next_power_of_two();
    pages.trailing_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::ring::sim::SimMapping;
    use crate::sideband::record::{encode_aux, encode_lost, SampleId, PERF_AUX_FLAG_TRUNCATED};

    fn fake_pmu(caps: &[(&str, u64)]) -> IntelPtPmu {
        let mut p = IntelPtPmu {
            dir: "/fake/intel_pt".into(),
            pmu_type: 8,
            format: Default::default(),
            caps: Default::default(),
            max_nonturbo_ratio: Some(20),
            tsc_art_ratio: None,
        };
        for (n, t) in [
            ("noretcomp", "config:11"),
            ("tsc", "config:10"),
            ("mtc", "config:9"),
            ("mtc_period", "config:14-17"),
            ("cyc", "config:1"),
        ] {
            p.format
                .insert(n.into(), crate::perf::pmu::FormatTerm::parse(t).unwrap());
        }
        for (n, v) in caps {
            p.caps.insert((*n).into(), *v);
        }
        p
    }

    #[test]
    fn config_and_attr_per_mode() {
        let pmu = fake_pmu(&[("mtc", 1), ("mtc_periods", 0x249), ("psb_cyc", 1)]);
        let (c, mtc) = pt_config(&pmu, Mode::UserOnly).unwrap();
        assert_eq!(c, (1 << 11) | (1 << 10) | (1 << 9) | (3 << 14) | (1 << 1));
        assert_eq!(mtc, 3);
        let (ck, _) = pt_config(&pmu, Mode::KernelOnly).unwrap();
        assert_eq!(ck & (1 << 1), 0, "no cyc in kernel-only mode");
        let bare = fake_pmu(&[]);
        assert_eq!(
            pt_config(&bare, Mode::UserOnly).unwrap(),
            ((1 << 11) | (1 << 10), 0)
        );

        let a = pt_attr(8, c, Mode::UserOnly);
        assert_eq!((a.type_, a.config), (8, c));
        assert_eq!(
            (
                a.disabled(),
                a.exclude_kernel(),
                a.exclude_user(),
                a.exclude_hv()
            ),
            (1, 1, 0, 1)
        );
        assert_eq!(
            (
                a.mmap2(),
                a.comm(),
                a.task(),
                a.context_switch(),
                a.sample_id_all()
            ),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(a.sample_type, SIDEBAND_SAMPLE_TYPE);
        let k = pt_attr(8, c, Mode::KernelOnly);
        assert_eq!((k.exclude_kernel(), k.exclude_user(), k.mmap2()), (0, 1, 0));
        let uk = pt_attr(8, c, Mode::UserAndKernel);
        assert_eq!(
            (uk.exclude_kernel(), uk.exclude_user(), uk.mmap2()),
            (0, 0, 1)
        );
    }

    fn sample() -> SampleId {
        SampleId {
            pid: Some(1),
            tid: Some(2),
            time: Some(3),
            cpu: Some(0),
            identifier: Some(4),
            ..Default::default()
        }
    }

    #[test]
    fn window_collection_wraps_and_reuses_the_rings() {
        let mut sim = SimMapping::new(256, 128);
        let synth = b"SYNTHREC".to_vec();
        let mut pos = 0u64;
        for round in 0..6u8 {
            // The "kernel" writes 100 PT bytes and one AUX record per window.
            let pt: Vec<u8> = (0..100).map(|i| i as u8 ^ round).collect();
            sim.produce_aux(pos, &pt);
            let rec = encode_aux(pos, 100, 0, &sample(), SIDEBAND_SAMPLE_TYPE);
            let dpos = sim.ctl().data_head();
            sim.produce_data(dpos, &rec);
            pos += 100;
            let mut out = vec![0u8; 256];
            let mut sb = vec![0u8; 256];
            let cap = collect_window(
                &sim.ctl(),
                &sim.aux(),
                &sim.data(),
                &synth,
                &mut out,
                Some(&mut sb),
            );
            assert_eq!(cap.pt_size, 100, "round {round}");
            assert_eq!(&out[..100], &pt[..]);
            assert_eq!(cap.sideband_size, synth.len() + rec.len());
            assert_eq!(&sb[..8], b"SYNTHREC");
            assert_eq!(&sb[8..cap.sideband_size], &rec[..]);
            assert_eq!(cap.status(), crate::Status::Success);
            assert_eq!(sim.ctl().aux_tail(), pos);
        }
    }

    #[test]
    fn loss_is_reported_not_silent() {
        // AUX TRUNCATED flag -> PT lost.
        let mut sim = SimMapping::new(256, 256);
        sim.produce_aux(0, &[1u8; 50]);
        sim.produce_data(
            0,
            &encode_aux(
                0,
                50,
                PERF_AUX_FLAG_TRUNCATED,
                &sample(),
                SIDEBAND_SAMPLE_TYPE,
            ),
        );
        let mut out = vec![0u8; 256];
        let cap = collect_window(&sim.ctl(), &sim.aux(), &sim.data(), &[], &mut out, None);
        assert!(cap.pt_lost);
        assert_eq!(cap.status(), crate::Status::OverwrittenPtTrace);
        // LOST record -> sideband lost.
        let mut sim = SimMapping::new(256, 256);
        sim.produce_data(0, &encode_lost(4, 3, &sample(), SIDEBAND_SAMPLE_TYPE));
        let mut sb = vec![0u8; 256];
        let cap = collect_window(
            &sim.ctl(),
            &sim.aux(),
            &sim.data(),
            &[],
            &mut out,
            Some(&mut sb),
        );
        assert!(cap.sideband_lost && !cap.pt_lost);
        assert_eq!(cap.status(), crate::Status::OverwrittenSidebandData);
        // Head beyond tail + ring size -> overwritten.
        let mut sim = SimMapping::new(256, 256);
        sim.produce_aux(0, &[7u8; 300]);
        let cap = collect_window(&sim.ctl(), &sim.aux(), &sim.data(), &[], &mut out, None);
        assert!(cap.pt_lost);
        assert_eq!(cap.pt_size, 256);
        // Output smaller than the window.
        let mut sim = SimMapping::new(256, 256);
        sim.produce_aux(0, &[7u8; 200]);
        let mut small = vec![0u8; 64];
        let cap = collect_window(&sim.ctl(), &sim.aux(), &sim.data(), &[], &mut small, None);
        assert_eq!((cap.pt_size, cap.pt_truncated_by_output), (64, true));
        assert_eq!(cap.status(), crate::Status::FailedToReadPtData);
    }

    #[test]
    fn snapshot_aux_area_sizes() {
        assert_eq!(aux_shift_for(64 * 1024), 4);
        assert_eq!(aux_shift_for(5000), 1);
        assert_eq!(aux_shift_for(1), 0);
    }

    #[test]
    fn snapshot_open_fails_cleanly_without_intel_pt() {
        if IntelPtPmu::probe().is_ok() {
            println!("SKIP: this machine has an intel_pt PMU");
            return;
        }
        let e = HardwareSnapshot::open(Mode::UserOnly, 64 * 1024, 2)
            .err()
            .expect("must fail");
        assert_eq!(e.status, crate::Status::FailedToOpenPerfEvent);
        assert!(e.message.contains("no intel_pt PMU"), "{}", e.message);
    }

    #[test]
    fn open_fails_cleanly_without_intel_pt() {
        if IntelPtPmu::probe().is_ok() {
            println!(
                "SKIP: this machine has an intel_pt PMU; the no-PT error path is not reachable"
            );
            return;
        }
        let e = HardwareBackend::open(Mode::UserOnly, 2, 2)
            .err()
            .expect("must fail");
        assert_eq!(e.status, crate::Status::FailedToOpenPerfEvent);
        assert!(e.message.contains("no intel_pt PMU"), "{}", e.message);
    }
}
