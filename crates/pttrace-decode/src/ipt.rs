//! Thin safe wrapper over libipt's block and packet decoders (raw C API via `libipt_sys`):
//! the one module that names libipt's types. The rest of the crate sees [`Block`],
//! [`Event`], [`PtErr`] and the configuration built from [`TraceParams`] here.
//!
//! The safe `libipt` crate drops the partially decoded block that `pt_blk_next` returns
//! together with an error, and panics on event types it does not know; a decoder that must
//! never lose instructions nor panic on hostile input therefore talks to the C API here.
//! All `unsafe` of the decoder lives in this module.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void, CStr, CString};
use std::rc::Rc;

use libipt_sys as sys;

use super::config::{CpuParams, Errata, TraceParams};
use super::image::AddressSpace;
use super::insn::BlockKey;
use super::records::ExecMode;
use super::timing::TimingPacket;

/// The address space libipt reads through our callback, plus what the callback saw.
#[derive(Debug, Default)]
pub(crate) struct SharedImage {
    pub space: RefCell<AddressSpace>,
    /// The last address libipt asked for that no segment covers.
    pub last_nomap: Cell<Option<u64>>,
}

/// libipt's image section cache: a file section (and the block cache libipt builds for
/// it) made once and reused by every decoder given the same cache, instead of being
/// rebuilt, and its block cache zeroed again, for each new decoder (one per window).
///
/// libipt's block cache remembers each instruction's execution mode, so decoders that
/// share sections must all decode 64-bit code only (see [`crate::wire::only_64bit`]); otherwise what
/// one decoder cached would change what another decodes.
pub struct SectionCache {
    raw: std::ptr::NonNull<sys::pt_image_section_cache>,
}

// SAFETY: libipt is built with FEATURE_THREADS: the image section cache locks itself, and
// the pointer is only used through libipt's API.
unsafe impl Send for SectionCache {}
// SAFETY: as above; every libipt call on it takes the cache's own lock.
unsafe impl Sync for SectionCache {}

/// Sections kept mapped (with their block caches) at most; least recently used ones are
/// unmapped beyond it.
const SECTION_CACHE_LIMIT: u64 = 1 << 30;

impl SectionCache {
    /// A new, empty cache; `None` when libipt cannot allocate one.
    pub fn new() -> Option<SectionCache> {
        // SAFETY: a NULL name is allowed; the result is checked for NULL.
        let raw = unsafe { sys::pt_iscache_alloc(std::ptr::null()) };
        let raw = std::ptr::NonNull::new(raw)?;
        // SAFETY: raw is a live cache.
        unsafe { sys::pt_iscache_set_limit(raw.as_ptr(), SECTION_CACHE_LIMIT) };
        Some(SectionCache { raw })
    }

    /// Adds the file range as a cached section to `img`; false when that fails (the
    /// caller then adds the file directly).
    fn add_to(
        &self,
        img: *mut sys::pt_image,
        cpath: &CStr,
        offset: u64,
        size: u64,
        vaddr: u64,
    ) -> bool {
        // SAFETY: the cache is live; cpath is a valid C string for the call.
        let isid = unsafe {
            sys::pt_iscache_add_file(self.raw.as_ptr(), cpath.as_ptr(), offset, size, vaddr)
        };
        if isid < 0 {
            return false;
        }
        // SAFETY: img and the cache are live; a NULL asid means "any address space". The
        // image takes its own reference on the section.
        unsafe { sys::pt_image_add_cached(img, self.raw.as_ptr(), isid, std::ptr::null()) >= 0 }
    }
}

impl Drop for SectionCache {
    fn drop(&mut self) {
        // SAFETY: allocated by pt_iscache_alloc, freed exactly once; images that still use
        // its sections hold their own references.
        unsafe { sys::pt_iscache_free(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for SectionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SectionCache")
    }
}

/// A libipt error code (positive) with its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PtErr(pub i32);

impl PtErr {
    pub fn is_eos(self) -> bool {
        self.0 == sys::pt_error_code_pte_eos as i32
    }
    pub fn is_bad_query(self) -> bool {
        self.0 == sys::pt_error_code_pte_bad_query as i32
    }
    pub fn is_nomap(self) -> bool {
        self.0 == sys::pt_error_code_pte_nomap as i32
    }
    /// A compressed return with no call on libipt's return stack.
    pub fn is_retstack_empty(self) -> bool {
        self.0 == sys::pt_error_code_pte_retstack_empty as i32
    }
    pub fn text(self) -> String {
        // SAFETY: pt_errstr returns a pointer to a static NUL-terminated string for any
        // code (unknown codes map to a generic text); never NULL.
        let p = unsafe { sys::pt_errstr(self.0 as sys::pt_error_code) };
        if p.is_null() {
            return format!("libipt error {}", self.0);
        }
        // SAFETY: non-NULL, static, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// libipt's configuration for a trace recorded with `params` on a CPU with `errata`
/// (without a trace buffer: the decoders set theirs).
fn pt_config(params: &TraceParams, errata: Errata) -> sys::pt_config {
    // SAFETY: pt_config is a plain C struct for which all-zero is the documented
    // "no options" value (libipt's pt_config_init does exactly this).
    let mut cfg: sys::pt_config = unsafe { std::mem::zeroed() };
    cfg.size = std::mem::size_of::<sys::pt_config>();
    let cpu = &params.cpu;
    if cpu.family != 0 {
        cfg.cpu.vendor = sys::pt_cpu_vendor_pcv_intel;
        cfg.cpu.family = cpu.family;
        cfg.cpu.model = cpu.model;
        cfg.cpu.stepping = cpu.stepping;
        cfg.errata = raw_errata(errata);
    }
    cfg.mtc_freq = cpu.mtc_freq;
    cfg.nom_freq = cpu.nom_freq;
    cfg.cpuid_0x15_eax = cpu.cpuid_0x15_eax;
    cfg.cpuid_0x15_ebx = cpu.cpuid_0x15_ebx;
    let ranges = &params.filter.ranges;
    let mut bits = 0u64;
    for (n, (c, _, _)) in ranges.iter().enumerate() {
        bits |= u64::from(*c & 0xf) << (4 * n);
    }
    cfg.addr_filter.config.addr_cfg = bits;
    let f = &mut cfg.addr_filter;
    (f.addr0_a, f.addr0_b) = (ranges[0].1, ranges[0].2);
    (f.addr1_a, f.addr1_b) = (ranges[1].1, ranges[1].2);
    (f.addr2_a, f.addr2_b) = (ranges[2].1, ranges[2].2);
    (f.addr3_a, f.addr3_b) = (ranges[3].1, ranges[3].2);
    cfg
}

fn raw_errata(e: Errata) -> sys::pt_errata {
    // SAFETY: pt_errata is a plain C bit-field struct; all-zero = no errata.
    let mut r: sys::pt_errata = unsafe { std::mem::zeroed() };
    r.set_bdm70(e.bdm70.into());
    r.set_bdm64(e.bdm64.into());
    r.set_skd007(e.skd007.into());
    r.set_skd022(e.skd022.into());
    r.set_skd010(e.skd010.into());
    r.set_skl014(e.skl014.into());
    r.set_apl12(e.apl12.into());
    r.set_apl11(e.apl11.into());
    r.set_skl168(e.skl168.into());
    r.set_skz84(e.skz84.into());
    r
}

/// The errata libipt 2.1.2's own list (`pt_cpu_errata`) gives an Intel CPU; `None` when
/// the CPU is not in it.
pub(crate) fn libipt_errata(family: u16, model: u8, stepping: u8) -> Option<Errata> {
    // SAFETY: pt_cpu and pt_errata are plain C structs; all-zero is valid for both.
    let (mut cpu, mut e): (sys::pt_cpu, sys::pt_errata) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    cpu.vendor = sys::pt_cpu_vendor_pcv_intel;
    (cpu.family, cpu.model, cpu.stepping) = (family, model, stepping);
    // SAFETY: both pointers are to live, properly typed locals.
    if unsafe { sys::pt_cpu_errata(&mut e, &cpu) } < 0 {
        return None;
    }
    Some(Errata {
        bdm70: e.bdm70() != 0,
        bdm64: e.bdm64() != 0,
        skd007: e.skd007() != 0,
        skd022: e.skd022() != 0,
        skd010: e.skd010() != 0,
        skl014: e.skl014() != 0,
        apl12: e.apl12() != 0,
        apl11: e.apl11() != 0,
        skl168: e.skl168() != 0,
        skz84: e.skz84() != 0,
    })
}

#[inline]
fn check(ret: c_int) -> Result<u32, PtErr> {
    if ret < 0 {
        Err(error_of(ret))
    } else {
        Ok(ret as u32)
    }
}

/// The error of a negative libipt return value (kept off the success path).
#[cold]
#[inline(never)]
fn error_of(ret: c_int) -> PtErr {
    PtErr(ret.saturating_neg())
}

/// Status flags returned by libipt on success.
pub(crate) const PTS_EVENT_PENDING: u32 = sys::pt_status_flag_pts_event_pending;
pub(crate) const PTS_EOS: u32 = sys::pt_status_flag_pts_eos;

/// Reads memory for libipt from the [`SharedImage`] behind `context`.
///
/// Called by libipt only for addresses no file section covers. Never panics or unwinds.
unsafe extern "C" fn read_image(
    buffer: *mut u8,
    size: usize,
    _asid: *const sys::pt_asid,
    ip: u64,
    context: *mut c_void,
) -> c_int {
    let nomap = -(sys::pt_error_code_pte_nomap as c_int);
    if buffer.is_null() || context.is_null() {
        return nomap;
    }
    // SAFETY: `context` is the `Rc<SharedImage>` pointer installed by `BlockDecoder::new`,
    // which keeps that Rc alive for as long as the decoder (and so this callback) exists.
    let shared = unsafe { &*(context as *const SharedImage) };
    // SAFETY: libipt passes a writable buffer of `size` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(buffer, size) };
    let n = match shared.space.try_borrow() {
        Ok(space) => space.read(ip, buf),
        Err(_) => 0,
    };
    if n == 0 {
        shared.last_nomap.set(Some(ip));
        return nomap;
    }
    n as c_int
}

/// What [`decode_unknown`] does with a TRIG whose IP bit binds it to the FUP after it.
/// The address of one of these statics is the callback's context.
struct UnknownPackets {
    /// Refuse it (`pte_bad_packet`): libipt 2.1.2 would take that FUP for the start of an
    /// asynchronous event and misread the flow. Flow decoders use this.
    refuse_fup_bound_trig: bool,
}

static LIST_UNKNOWN: UnknownPackets = UnknownPackets {
    refuse_fup_bound_trig: false,
};
static DECODE_UNKNOWN: UnknownPackets = UnknownPackets {
    refuse_fup_bound_trig: true,
};

/// Teaches libipt (2.1.2) the packets newer than it through its unknown-packet callback:
/// TRIG gets its size, so that libipt's decoders step over it as a `ppt_unknown` packet
/// (its event decoder ignores those) instead of failing with "unknown opcode". Every
/// libipt decoder this crate allocates gets its configuration through here. `flow`: the
/// configuration is for a flow (block) decoder, see [`UnknownPackets`].
fn teach_unknown_packets(cfg: &mut sys::pt_config, flow: bool) {
    let how: &'static UnknownPackets = if flow { &DECODE_UNKNOWN } else { &LIST_UNKNOWN };
    cfg.decode.callback = Some(decode_unknown);
    cfg.decode.context = std::ptr::from_ref(how).cast_mut().cast();
}

/// libipt's unknown-packet callback (see [`teach_unknown_packets`]): the size of the TRIG
/// packet at `pos`, or a negative libipt error code. Never unwinds into libipt.
unsafe extern "C" fn decode_unknown(
    _unknown: *mut sys::pt_packet_unknown,
    config: *const sys::pt_config,
    pos: *const u8,
    context: *mut c_void,
) -> c_int {
    let internal = -(sys::pt_error_code_pte_internal as c_int);
    let r = std::panic::catch_unwind(|| {
        if config.is_null() || pos.is_null() {
            return internal;
        }
        // SAFETY: libipt passes its decoder's own (live) configuration.
        let end = unsafe { (*config).end };
        if end.is_null() || end.cast_const() < pos {
            return -(sys::pt_error_code_pte_eos as c_int);
        }
        // SAFETY: `pos` and `end` point into the same trace buffer (libipt reads packets
        // between its configuration's begin and end), and `end >= pos`.
        let len = unsafe { end.cast_const().offset_from(pos) } as usize;
        // SAFETY: pos..end is the readable rest of the trace buffer (see above), which
        // outlives this call.
        let rest = unsafe { std::slice::from_raw_parts(pos, len) };
        if rest.first() != Some(&crate::wire::TRIG_OPCODE) {
            return -(sys::pt_error_code_pte_bad_opc as c_int);
        }
        let Some((trig, size)) = crate::wire::parse_trig(rest) else {
            return -(sys::pt_error_code_pte_eos as c_int);
        };
        // (Compared by address only: the context is one of the two statics.)
        let how = if std::ptr::eq(context.cast_const().cast(), &DECODE_UNKNOWN) {
            &DECODE_UNKNOWN
        } else {
            &LIST_UNKNOWN
        };
        if trig.ip && how.refuse_fup_bound_trig {
            return -(sys::pt_error_code_pte_bad_packet as c_int);
        }
        size as c_int
    });
    r.unwrap_or(internal)
}

/// An owned `pt_block_decoder` over a borrowed trace buffer.
pub(crate) struct BlockDecoder<'a> {
    raw: std::ptr::NonNull<sys::pt_block_decoder>,
    shared: Rc<SharedImage>,
    /// Generation of `shared.space` last pushed into libipt's image.
    synced_generation: Option<u64>,
    /// Where file sections come from when they are shared with other decoders.
    pub sections: Option<std::sync::Arc<SectionCache>>,
    /// `sections` are shared and not yet known to be safe to decode with (see
    /// `PtDecoder::check_sections`).
    pub sections_unchecked: bool,
    _trace: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> BlockDecoder<'a> {
    /// A decoder over `trace` for a CPU with `errata` (see [`crate::errata::of`]), with
    /// libipt's iflags events where `iflags_events`.
    pub fn new(
        params: &TraceParams,
        errata: Errata,
        trace: &'a [u8],
        shared: Rc<SharedImage>,
        iflags_events: bool,
    ) -> Result<Self, PtErr> {
        let mut cfg = pt_config(params, errata);
        if trace.is_empty() {
            return Err(PtErr(sys::pt_error_code_pte_eos as i32));
        }
        if iflags_events {
            // SAFETY: plain C bit-field flags; all zero is "no flags" (pt_config_init).
            let mut block: sys::pt_conf_flags__bindgen_ty_1__bindgen_ty_1 =
                unsafe { std::mem::zeroed() };
            block.set_enable_iflags_events(1);
            cfg.flags.variant.block = block;
        }
        teach_unknown_packets(&mut cfg, true);
        // libipt never writes through begin/end of a decoder's buffer.
        cfg.begin = trace.as_ptr().cast_mut();
        // SAFETY: one past the end of the same slice.
        cfg.end = unsafe { cfg.begin.add(trace.len()) };
        // SAFETY: cfg is fully initialised; libipt copies it and keeps only the buffer
        // pointers, which stay valid for 'a (PhantomData ties the decoder to `trace`).
        let raw = unsafe { sys::pt_blk_alloc_decoder(&cfg) };
        let raw = std::ptr::NonNull::new(raw).ok_or(PtErr(sys::pt_error_code_pte_nomem as i32))?;
        let dec = BlockDecoder {
            raw,
            shared,
            synced_generation: None,
            sections: None,
            sections_unchecked: false,
            _trace: std::marker::PhantomData,
        };
        // SAFETY: the decoder is live; its default image lives as long as it does. The
        // context pointer stays valid because `dec.shared` holds the Rc until drop.
        check(unsafe {
            let img = sys::pt_blk_get_image(dec.raw.as_ptr());
            sys::pt_image_set_callback(
                img,
                Some(read_image),
                Rc::as_ptr(&dec.shared) as *mut c_void,
            )
        })?;
        Ok(dec)
    }

    /// Makes libipt's file sections match the shared address space (after changes).
    /// File-backed segments become libipt file sections (fast, block-cached); in-memory
    /// segments are served by the read callback.
    #[inline]
    pub fn sync_image(&mut self) -> Result<bool, PtErr> {
        let generation = match self.shared.space.try_borrow() {
            Ok(s) => s.generation(),
            Err(_) => return Err(PtErr(sys::pt_error_code_pte_internal as i32)),
        };
        if self.synced_generation == Some(generation) {
            return Ok(false);
        }
        let shared = self.shared.clone();
        let space = match shared.space.try_borrow() {
            Ok(s) => s,
            Err(_) => return Err(PtErr(sys::pt_error_code_pte_internal as i32)),
        };
        self.push_sections(&space)
    }

    #[cold]
    fn push_sections(&mut self, space: &AddressSpace) -> Result<bool, PtErr> {
        // SAFETY: the decoder is live and not running (we are between libipt calls).
        let img = unsafe { sys::pt_blk_get_image(self.raw.as_ptr()) };
        // SAFETY: an all-zero pt_asid with its size set = "any address space"; the
        // image pointer is the decoder's own default image.
        unsafe {
            let mut asid: sys::pt_asid = std::mem::zeroed();
            asid.size = std::mem::size_of::<sys::pt_asid>();
            asid.cr3 = u64::MAX; // pt_asid_no_cr3
            asid.vmcs = u64::MAX; // pt_asid_no_vmcs
            check(sys::pt_image_remove_by_asid(img, &asid))?;
        }
        for seg in space.segments() {
            let Some(path) = seg.backing.path() else {
                continue;
            };
            let Ok(cpath) = CString::new(path.as_os_str().as_encoded_bytes()) else {
                continue; // NUL in the path: leave it to the callback
            };
            if let Some(c) = &self.sections {
                if c.add_to(img, &cpath, seg.offset, seg.len, seg.start) {
                    continue;
                }
            }
            // SAFETY: img is live, cpath is a valid C string for the call; a NULL asid
            // means "any address space".
            let r = unsafe {
                sys::pt_image_add_file(
                    img,
                    cpath.as_ptr(),
                    seg.offset,
                    seg.len,
                    std::ptr::null(),
                    seg.start,
                )
            };
            // A file libipt cannot open is still readable through the callback.
            let _ = r;
        }
        self.synced_generation = Some(space.generation());
        Ok(true)
    }

    /// Makes the next [`Self::sync_image`] push the sections again (they come from
    /// another section cache now).
    pub fn forget_image_sync(&mut self) {
        self.synced_generation = None;
    }

    /// Generation of the shared address space last pushed into libipt's image.
    #[inline]
    pub fn synced_generation(&self) -> Option<u64> {
        self.synced_generation
    }

    pub fn sync_forward(&mut self) -> Result<u32, PtErr> {
        // SAFETY: live decoder.
        check(unsafe { sys::pt_blk_sync_forward(self.raw.as_ptr()) })
    }

    /// Current position in the trace (for error reports).
    pub fn offset(&self) -> Option<u64> {
        let mut off = 0u64;
        // SAFETY: live decoder, valid out pointer.
        check(unsafe { sys::pt_blk_get_offset(self.raw.as_ptr(), &mut off) })
            .ok()
            .map(|_| off)
    }

    pub fn sync_offset(&self) -> Option<u64> {
        let mut off = 0u64;
        // SAFETY: live decoder, valid out pointer.
        check(unsafe { sys::pt_blk_get_sync_offset(self.raw.as_ptr(), &mut off) })
            .ok()
            .map(|_| off)
    }

    /// The next block. On error the block may still hold instructions decoded before it.
    #[inline]
    pub fn next_block(&mut self, blk: &mut Block) -> Result<u32, PtErr> {
        // SAFETY: live decoder; blk.0 is a valid pt_block of the size we pass.
        check(unsafe {
            sys::pt_blk_next(
                self.raw.as_ptr(),
                &mut blk.0,
                std::mem::size_of::<sys::pt_block>(),
            )
        })
    }

    /// The pending event, and the status after it.
    pub fn event(&mut self) -> Result<(u32, Event), PtErr> {
        // SAFETY: pt_event is plain C data; all-zero is a valid value.
        let mut ev: sys::pt_event = unsafe { std::mem::zeroed() };
        // SAFETY: live decoder; ev is a valid pt_event of the size we pass.
        let status = check(unsafe {
            sys::pt_blk_event(
                self.raw.as_ptr(),
                &mut ev,
                std::mem::size_of::<sys::pt_event>(),
            )
        })?;
        Ok((status, Event::of(&ev)))
    }
}

/// One block of instructions as libipt's block decoder gives it: `ninsn` instructions
/// from `ip` in one execution mode, each but the last followed by the next in memory or
/// by a direct jump or call.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Block(sys::pt_block);

impl Block {
    /// An empty block (output buffer for [`BlockDecoder::next_block`]).
    pub fn empty() -> Block {
        // SAFETY: pt_block is plain C data; all-zero is a valid (empty) value.
        Block(unsafe { std::mem::zeroed() })
    }

    /// The address of its first instruction.
    #[inline]
    pub fn ip(&self) -> u64 {
        self.0.ip
    }

    /// How many instructions it holds.
    #[inline]
    pub fn ninsn(&self) -> u16 {
        self.0.ninsn
    }

    /// The address of its last instruction.
    #[inline]
    pub fn end_ip(&self) -> u64 {
        self.0.end_ip
    }

    /// libipt's raw execution mode (0..=3).
    #[inline]
    pub fn raw_mode(&self) -> u32 {
        self.0.mode
    }

    #[inline]
    pub fn mode(&self) -> ExecMode {
        match self.0.mode {
            sys::pt_exec_mode_ptem_16bit => ExecMode::Bit16,
            sys::pt_exec_mode_ptem_32bit => ExecMode::Bit32,
            sys::pt_exec_mode_ptem_64bit => ExecMode::Bit64,
            _ => ExecMode::Unknown,
        }
    }

    /// Its block cache key. The mode part is libipt's raw mode (0..=3; anything else,
    /// which libipt never returns, shares 4): injective where [`Block::mode`] is, so equal
    /// keys still mean equal expansions, and cheaper than mapping it on every block.
    #[inline]
    pub fn key(&self) -> BlockKey {
        BlockKey {
            ip: self.0.ip,
            ninsn: self.0.ninsn,
            mode: self.0.mode.min(4) as u8,
        }
    }

    /// The bytes of its last instruction when that instruction lies across two sections
    /// of the image (libipt copies them into the block); `None` otherwise.
    pub fn truncated_insn(&self) -> Option<&[u8]> {
        (self.0.truncated() != 0).then(|| &self.0.raw[..usize::from(self.0.size).min(15)])
    }
}

/// What the pipeline uses of a libipt event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Event {
    pub kind: Ev,
    /// The time libipt gives it, if any.
    pub tsc: Option<u64>,
    /// It reports the state a PSB+ tells (not an event of the program's).
    pub status_update: bool,
    /// The execution mode it sets (libipt's raw value), if it sets one.
    pub exec_mode: Option<u32>,
}

impl Event {
    fn of(ev: &sys::pt_event) -> Event {
        let (kind, tsc, status_update) = classify_event(ev);
        Event {
            kind,
            tsc,
            status_update,
            exec_mode: exec_mode_of(ev),
        }
    }
}

impl Drop for BlockDecoder<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by pt_blk_alloc_decoder, freed exactly once.
        unsafe { sys::pt_blk_free_decoder(self.raw.as_ptr()) }
    }
}

/// The parts of a libipt event the pipeline uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ev {
    Enabled { ip: u64, resumed: bool },
    Disabled { ip: Option<u64> },
    AsyncDisabled { at: u64, ip: Option<u64> },
    AsyncBranch { from: u64, to: Option<u64> },
    Overflow { ip: Option<u64> },
    Iflags { enabled: bool, ip: Option<u64> },
    Other,
}

/// The execution mode `ev` sets (libipt's raw value), if it sets one.
fn exec_mode_of(ev: &sys::pt_event) -> Option<u32> {
    if ev.type_ != sys::pt_event_type_ptev_exec_mode {
        return None;
    }
    // SAFETY: the union's `exec_mode` variant is the one libipt fills for this event
    // type; it is plain integer data.
    Some(unsafe { ev.variant.exec_mode.mode })
}

/// Decodes `ev`'s type and payload; also returns (tsc if present, status_update).
fn classify_event(ev: &sys::pt_event) -> (Ev, Option<u64>, bool) {
    let suppressed = ev.ip_suppressed() != 0;
    let tsc = (ev.has_tsc() != 0).then_some(ev.tsc);
    let ip_opt = |ip: u64| (!suppressed).then_some(ip);
    // SAFETY: each union field read matches the event type libipt set in `type_`; all
    // fields are plain integers so any bit pattern is a valid value.
    let kind = unsafe {
        match ev.type_ {
            sys::pt_event_type_ptev_enabled => Ev::Enabled {
                ip: ev.variant.enabled.ip,
                resumed: ev.variant.enabled.resumed() != 0,
            },
            sys::pt_event_type_ptev_disabled => Ev::Disabled {
                ip: ip_opt(ev.variant.disabled.ip),
            },
            sys::pt_event_type_ptev_async_disabled => Ev::AsyncDisabled {
                at: ev.variant.async_disabled.at,
                ip: ip_opt(ev.variant.async_disabled.ip),
            },
            sys::pt_event_type_ptev_async_branch => Ev::AsyncBranch {
                from: ev.variant.async_branch.from,
                to: ip_opt(ev.variant.async_branch.to),
            },
            sys::pt_event_type_ptev_overflow => Ev::Overflow {
                ip: ip_opt(ev.variant.overflow.ip),
            },
            sys::pt_event_type_ptev_iflags => Ev::Iflags {
                enabled: ev.variant.iflags.iflag() != 0,
                ip: ip_opt(ev.variant.iflags.ip),
            },
            _ => Ev::Other,
        }
    };
    (kind, tsc, ev.status_update() != 0)
}

/// A PSB found in a trace: its offset and what its PSB+ (the packets up to PSBEND) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsbInfo {
    pub offset: u64,
    /// The FUP IP of its PSB+ (tracing enabled there).
    pub fup: Option<u64>,
    /// Offset of the PSBEND packet that ends the PSB+ (`None`: no PSBEND found).
    pub psbend: Option<u64>,
    /// The TSC packet of the PSB+.
    pub tsc: Option<u64>,
    /// Whether the PSB+ has a MODE.Exec packet.
    pub mode_exec: bool,
}

/// An owned `pt_packet_decoder` over a borrowed trace buffer.
pub(crate) struct PacketDecoder<'a> {
    raw: std::ptr::NonNull<sys::pt_packet_decoder>,
    _trace: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> PacketDecoder<'a> {
    pub fn new(trace: &'a [u8]) -> Result<Self, PtErr> {
        Self::with_cpu(trace, &CpuParams::default(), Errata::default())
    }

    /// A packet decoder for `cpu` (its identity, errata and frequencies).
    pub fn with_cpu(trace: &'a [u8], cpu: &CpuParams, errata: Errata) -> Result<Self, PtErr> {
        let params = TraceParams {
            cpu: *cpu,
            ..Default::default()
        };
        let mut cfg = pt_config(&params, errata);
        if trace.is_empty() {
            return Err(PtErr(sys::pt_error_code_pte_eos as i32));
        }
        teach_unknown_packets(&mut cfg, false);
        cfg.begin = trace.as_ptr().cast_mut();
        // SAFETY: one past the end of the same slice.
        cfg.end = unsafe { cfg.begin.add(trace.len()) };
        // SAFETY: cfg is initialised; the buffer outlives the decoder ('a).
        let raw = unsafe { sys::pt_pkt_alloc_decoder(&cfg) };
        let raw = std::ptr::NonNull::new(raw).ok_or(PtErr(sys::pt_error_code_pte_nomem as i32))?;
        Ok(PacketDecoder {
            raw,
            _trace: std::marker::PhantomData,
        })
    }

    pub fn sync_forward(&mut self) -> Result<u32, PtErr> {
        // SAFETY: live decoder.
        check(unsafe { sys::pt_pkt_sync_forward(self.raw.as_ptr()) })
    }

    pub fn offset(&self) -> Option<u64> {
        let mut off = 0u64;
        // SAFETY: live decoder, valid out pointer.
        check(unsafe { sys::pt_pkt_get_offset(self.raw.as_ptr(), &mut off) })
            .ok()
            .map(|_| off)
    }

    pub fn sync_offset(&self) -> Option<u64> {
        let mut off = 0u64;
        // SAFETY: live decoder, valid out pointer.
        check(unsafe { sys::pt_pkt_get_sync_offset(self.raw.as_ptr(), &mut off) })
            .ok()
            .map(|_| off)
    }

    /// Positions the decoder at `offset` (which must hold a PSB).
    pub fn sync_set(&mut self, offset: u64) -> Result<u32, PtErr> {
        // SAFETY: live decoder; libipt checks the offset against its buffer.
        check(unsafe { sys::pt_pkt_sync_set(self.raw.as_ptr(), offset) })
    }

    /// The next packet (size in bytes on success).
    pub fn next(&mut self, pkt: &mut sys::pt_packet) -> Result<u32, PtErr> {
        // SAFETY: live decoder; pkt is a valid pt_packet of the size we pass.
        check(unsafe {
            sys::pt_pkt_next(
                self.raw.as_ptr(),
                pkt,
                std::mem::size_of::<sys::pt_packet>(),
            )
        })
    }
}

impl Drop for PacketDecoder<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by pt_pkt_alloc_decoder, freed exactly once.
        unsafe { sys::pt_pkt_free_decoder(self.raw.as_ptr()) }
    }
}

/// A zeroed packet (output buffer for `PacketDecoder::next`).
pub(crate) fn empty_packet() -> sys::pt_packet {
    // SAFETY: pt_packet is plain C data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Every PSB in `trace` with the FUP of its PSB+ (if any).
pub fn psb_offsets(trace: &[u8]) -> Vec<PsbInfo> {
    psbs_in(trace, 0, trace.len())
}

/// [`psb_offsets`] found on up to `threads` threads, each scanning a range of the trace
/// (a PSB belongs to the range it starts in; its PSB+ is read on past the range's end).
pub fn psb_offsets_parallel(trace: &[u8], threads: usize) -> Vec<PsbInfo> {
    // (Below this, starting threads costs more than the scan.)
    const MIN_PER_THREAD: usize = 256 * 1024;
    let threads = threads.clamp(1, (trace.len() / MIN_PER_THREAD).max(1));
    if threads == 1 {
        return psb_offsets(trace);
    }
    let per = trace.len().div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (from, to) = (k * per, ((k + 1) * per).min(trace.len()));
                s.spawn(move || psbs_in(trace, from, to))
            })
            .collect();
        // (A scan that failed leaves its PSBs out: fewer places to cut, nothing wrong.)
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// The PSBs of `trace` that start in `from..to`, as [`psb_offsets`] gives them.
fn psbs_in(trace: &[u8], from: usize, to: usize) -> Vec<PsbInfo> {
    let mut out = Vec::new();
    let Some(tail) = trace.get(from..) else {
        return out;
    };
    let Ok(mut dec) = PacketDecoder::new(tail) else {
        return out;
    };
    let mut pkt = empty_packet();
    while dec.sync_forward().is_ok() {
        let Some(offset) = dec.sync_offset().map(|o| o + from as u64) else {
            break;
        };
        if offset >= to as u64 {
            break;
        }
        let mut info = PsbInfo {
            offset,
            fup: None,
            psbend: None,
            tsc: None,
            mode_exec: false,
        };
        // Walk the PSB+ (PSB .. PSBEND).
        for _ in 0..64 {
            let at = dec.offset();
            if dec.next(&mut pkt).is_err() {
                break;
            }
            match pkt.type_ {
                sys::pt_packet_type_ppt_psbend => {
                    info.psbend = at.map(|o| o + from as u64);
                    break;
                }
                sys::pt_packet_type_ppt_fup => {
                    // SAFETY: the union's `ip` variant is the one libipt fills for FUP.
                    let ip = unsafe { pkt.payload.ip };
                    if ip.ipc != sys::pt_ip_compression_pt_ipc_suppressed {
                        info.fup = Some(ip_value(ip.ipc, ip.ip));
                    }
                }
                sys::pt_packet_type_ppt_tsc => {
                    // SAFETY: the union's `tsc` variant is the one libipt fills for TSC.
                    info.tsc = Some(unsafe { pkt.payload.tsc.tsc });
                }
                sys::pt_packet_type_ppt_mode => {
                    // SAFETY: the union's `mode` variant is the one libipt fills for MODE.
                    let leaf = unsafe { pkt.payload.mode.leaf };
                    if leaf == sys::pt_mode_leaf_pt_mol_exec {
                        info.mode_exec = true;
                    }
                }
                _ => {}
            }
        }
        out.push(info);
    }
    out
}

/// Every offset at which libipt can synchronize in `trace` (each PSB `pt_sync_forward`
/// finds from some position), ascending.
pub(crate) fn psb_positions(trace: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    let Ok(mut dec) = PacketDecoder::new(trace) else {
        return out;
    };
    while dec.sync_forward().is_ok() {
        match dec.sync_offset() {
            Some(off) if out.last().is_none_or(|&l| l < off) => out.push(off),
            _ => break,
        }
    }
    out
}

/// Whether libipt could meet a CYC packet decoding from the PSBs in `from..to` of `trace`
/// (`psbs`: [`psb_positions`] of `trace`). A decoder only ever parses packets onwards from
/// a PSB it synchronized to, so this parses from each of those PSBs until a packet error,
/// the end, or a PSB whose own parse covers the rest (one at or after `to`, or one already
/// parsed): any CYC libipt can process lies on one of these parses.
pub(crate) fn cyc_possible(trace: &[u8], psbs: &[u64], from: u64, to: u64) -> bool {
    let Ok(mut dec) = PacketDecoder::new(trace) else {
        return false;
    };
    let mut pkt = empty_packet();
    let lo = psbs.partition_point(|&p| p < from);
    let hi = psbs.partition_point(|&p| p < to);
    let mut reached = vec![false; hi - lo];
    for k in lo..hi {
        if reached[k - lo] || dec.sync_set(psbs[k]).is_err() {
            continue;
        }
        // Index of the first PSB after the parse's position.
        let mut next = k + 1;
        while let Some(off) = dec.offset() {
            while psbs.get(next).is_some_and(|&p| p < off) {
                next += 1;
            }
            if psbs.get(next) == Some(&off) {
                // In step with another PSB: its own parse covers the rest.
                match reached.get_mut(next - lo) {
                    Some(r) if !*r => *r = true,
                    _ => break,
                }
            }
            if dec.next(&mut pkt).is_err() {
                break;
            }
            if pkt.type_ == sys::pt_packet_type_ppt_cyc {
                return true;
            }
        }
    }
    false
}

/// The IP of a PSB+ FUP (no last-IP context: a PSB resets it to zero).
fn ip_value(ipc: sys::pt_ip_compression, ip: u64) -> u64 {
    match ipc {
        sys::pt_ip_compression_pt_ipc_sext_48 => (((ip << 16) as i64) >> 16) as u64,
        _ => ip,
    }
}

/// Whether every packet of `trace` decodes and every MODE.Exec in it says 64-bit: then
/// libipt's block cache entries it makes and uses are all 64-bit, and sharing sections
/// with other such decoders cannot change what it decodes. (The decoder asks
/// [`crate::wire::only_64bit`], which reads the packets itself; this is its oracle.)
#[cfg(test)]
pub(crate) fn only_64bit(trace: &[u8]) -> bool {
    let Ok(mut dec) = PacketDecoder::new(trace) else {
        return true; // empty: nothing decoded
    };
    let mut pkt = empty_packet();
    if dec.sync_forward().is_err() {
        return true;
    }
    loop {
        match dec.next(&mut pkt) {
            Ok(_) => {}
            Err(e) if e.is_eos() => return true,
            Err(_) => return false,
        }
        if pkt.type_ == sys::pt_packet_type_ppt_mode {
            // SAFETY: the union's `mode` variant is the one libipt fills for MODE.
            let m = unsafe { pkt.payload.mode };
            if m.leaf == sys::pt_mode_leaf_pt_mol_exec {
                // SAFETY: the `exec` variant is the one filled for the exec leaf.
                let e = unsafe { m.bits.exec };
                if e.csl() == 0 {
                    return false;
                }
            }
        }
    }
}

/// Whether `trace` contains a TSC packet (stops at the first one).
pub fn has_tsc(trace: &[u8]) -> bool {
    let Ok(mut dec) = PacketDecoder::new(trace) else {
        return false;
    };
    let mut pkt = empty_packet();
    while dec.sync_forward().is_ok() {
        while dec.next(&mut pkt).is_ok() {
            if pkt.type_ == sys::pt_packet_type_ppt_tsc {
                return true;
            }
        }
    }
    false
}

/// A packet as ptdump prints it: its name, its payload column and, for the packets
/// ptdump tracks (PIP, VMCS, CFE, EVD), the tracking column's name and text.
pub(crate) struct PacketText {
    pub name: &'static str,
    pub payload: String,
    pub tracking: Option<(&'static str, String)>,
    /// An IP packet's compression and payload (ptdump's `--lastip` follows them).
    pub ip: Option<(u32, u64)>,
    /// MODE.Exec's mode as ptdump's `--exec-mode` names it.
    pub exec_mode: Option<&'static str>,
    /// A timing packet's values (ptdump's `--time` and `--tcal` follow them).
    pub timing: Option<TimingPacket>,
}

impl PacketText {
    fn new(name: &'static str, payload: String) -> Self {
        PacketText {
            name,
            payload,
            tracking: None,
            ip: None,
            exec_mode: None,
            timing: None,
        }
    }

    fn timing(name: &'static str, payload: String, timing: TimingPacket) -> Self {
        PacketText {
            timing: Some(timing),
            ..PacketText::new(name, payload)
        }
    }

    /// With ptdump's tracking column: what it tracks, the value.
    fn tracked(name: &'static str, payload: String, id: &'static str, value: String) -> Self {
        PacketText {
            tracking: Some((id, value)),
            ..PacketText::new(name, payload)
        }
    }
}

/// The last IP as ptdump's `--lastip` tracks it: the last-IP register
/// ([`crate::wire::LastIp`]), and whether an IP was seen and the last packet suppressed
/// it; it starts over where the listing synchronizes again after an error.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LastIpTrack {
    last: crate::wire::LastIp,
    ip: Option<u64>,
    suppressed: bool,
}

impl LastIpTrack {
    /// Applies an IP packet (compression, payload: libipt's `pt_ip_compression` values
    /// are the packet's IPBytes): the tracking column's text, or the error ptdump reports
    /// before the packet's line.
    pub fn update(&mut self, ipc: u32, ip: u64) -> Result<String, &'static str> {
        let ipc = u8::try_from(ipc)
            .ok()
            .filter(|c| matches!(c, 0..=4 | 6))
            .ok_or("unknown packet")?;
        match self.last.apply(crate::wire::IpPayload { ipc, raw: ip }) {
            Some(at) => (self.ip, self.suppressed) = (Some(at), false),
            None => self.suppressed = true,
        }
        match self.ip {
            None => Err("no ip"),
            Some(_) if self.suppressed => Ok("<suppressed>".to_string()),
            Some(at) => Ok(format!("{at:016x}")),
        }
    }
}

/// ptdump's payload of a TRIG: the trigger bits in hex, then ", ip", ", mult" and the
/// instruction count where the packet has them.
fn format_trig(t: &crate::wire::Trig) -> String {
    let mut s = format!("{:02x}", t.trbv);
    if t.ip {
        s.push_str(", ip");
    }
    if t.mult {
        s.push_str(", mult");
    }
    if let Some(n) = t.icnt {
        s.push_str(&format!(", icnt: {n}"));
    }
    s
}

/// ptdump's name of a CFE type (Intel SDM, "Control Flow Event (CFE) Packet").
fn cfe_type_name(ty: u32) -> &'static str {
    match ty {
        1 => "intr",
        2 => "iret",
        3 => "smi",
        4 => "rsm",
        5 => "sipi",
        6 => "init",
        7 => "vmentry",
        8 => "vmexit",
        9 => "vmexit_intr",
        10 => "shutdown",
        12 => "uintr",
        13 => "uiret",
        14 => "swintr",
        15 => "syscall",
        _ => "unknown",
    }
}

/// ptdump's payload of a CFE: the type number, the vector where the type has one (in hex
/// for SIPI), ", ip" when a FUP gives the event's IP.
fn format_cfe(ty: u32, vector: u8, ip: bool) -> String {
    let ip = if ip { ", ip" } else { "" };
    match ty {
        1 | 9 | 12 | 14 => format!("{ty}: {vector}{ip}"),
        5 => format!("{ty}: {vector:x}{ip}"),
        _ => format!("{ty}{ip}"),
    }
}

/// ptdump's name of an EVD type.
fn evd_type_name(ty: u32) -> &'static str {
    match ty {
        0 => "cr2",
        1 => "vmxq",
        2 => "vmxr",
        _ => "unknown",
    }
}

/// ptdump's payload of an IP packet: the compression's number, then the bits the packet
/// gives (sign-extended for sext48) with `?` for those kept from the last IP. (Put
/// together without `fmt`: `dump` makes one per IP packet.)
fn format_ip(ip: &sys::pt_packet_ip) -> String {
    let ipc = ip.ipc;
    let (unknown, digits, v) = match ipc {
        sys::pt_ip_compression_pt_ipc_suppressed => (16, 0, 0),
        sys::pt_ip_compression_pt_ipc_update_16 => (12, 4, ip.ip),
        sys::pt_ip_compression_pt_ipc_update_32 => (8, 8, ip.ip),
        sys::pt_ip_compression_pt_ipc_update_48 => (4, 12, ip.ip),
        sys::pt_ip_compression_pt_ipc_sext_48 => (0, 16, ((ip.ip << 16) as i64 >> 16) as u64),
        _ => (0, 16, ip.ip),
    };
    let mut s = String::with_capacity(24);
    crate::hex::push_padded(&mut s, u64::from(ipc), 1);
    s.push_str(": ");
    s.extend(std::iter::repeat_n('?', unknown));
    if digits > 0 {
        crate::hex::push_padded(&mut s, v, digits);
    }
    s
}

/// An IP packet's text, with its compression and payload kept for `--lastip`.
fn ip_text(name: &'static str, ip: &sys::pt_packet_ip) -> PacketText {
    let mut t = PacketText::new(name, format_ip(ip));
    t.ip = Some((ip.ipc, ip.ip));
    t
}

/// Joins the flags that are set with ", " (ptdump's lists: "cs.d, cs.l, if").
fn flags(parts: &[(bool, &str)]) -> String {
    let on: Vec<&str> = parts.iter().filter(|(b, _)| *b).map(|(_, n)| *n).collect();
    on.join(", ")
}

/// A decoded packet in ptdump's syntax (with its default options: no time or last-IP
/// tracking); `raw` holds the packet's bytes (libipt gives only those of a packet it does
/// not know itself).
pub(crate) fn format_packet(p: &sys::pt_packet, raw: &[u8]) -> PacketText {
    let plain = |name: &'static str| PacketText::new(name, String::new());
    // SAFETY: every arm reads the union variant libipt fills for that packet type
    // (intel-pt.h documents the mapping); all variants are plain integer data.
    unsafe {
        match p.type_ {
            sys::pt_packet_type_ppt_invalid => plain("<invalid>"),
            sys::pt_packet_type_ppt_pad => plain("pad"),
            sys::pt_packet_type_ppt_psb => plain("psb"),
            sys::pt_packet_type_ppt_psbend => plain("psbend"),
            sys::pt_packet_type_ppt_ovf => plain("ovf"),
            sys::pt_packet_type_ppt_stop => plain("stop"),
            sys::pt_packet_type_ppt_fup => ip_text("fup", &p.payload.ip),
            sys::pt_packet_type_ppt_tip => ip_text("tip", &p.payload.ip),
            sys::pt_packet_type_ppt_tip_pge => ip_text("tip.pge", &p.payload.ip),
            sys::pt_packet_type_ppt_tip_pgd => ip_text("tip.pgd", &p.payload.ip),
            sys::pt_packet_type_ppt_tnt_8 | sys::pt_packet_type_ppt_tnt_64 => {
                let t = p.payload.tnt;
                let n = u32::from(t.bit_size).min(64);
                let mut b = [0u8; 64];
                for (k, c) in (0..n).rev().zip(b.iter_mut()) {
                    *c = if (t.payload >> k) & 1 == 1 {
                        b'!'
                    } else {
                        b'.'
                    };
                }
                let bits = std::str::from_utf8(b.get(..n as usize).unwrap_or(&[]))
                    .unwrap_or("")
                    .to_string();
                let name = if p.type_ == sys::pt_packet_type_ppt_tnt_8 {
                    "tnt.8"
                } else {
                    "tnt.64"
                };
                PacketText::new(name, bits)
            }
            sys::pt_packet_type_ppt_mode => {
                let m = p.payload.mode;
                if m.leaf == sys::pt_mode_leaf_pt_mol_exec {
                    let e = m.bits.exec;
                    let text = flags(&[
                        (e.csd() != 0, "cs.d"),
                        (e.csl() != 0, "cs.l"),
                        (e.iflag() != 0, "if"),
                    ]);
                    let mut t = PacketText::new("mode.exec", text);
                    t.exec_mode = Some(match (e.csl() != 0, e.csd() != 0) {
                        (true, false) => "64-bit",
                        (false, true) => "32-bit",
                        (false, false) => "16-bit",
                        (true, true) => "unknown",
                    });
                    t
                } else if m.leaf == sys::pt_mode_leaf_pt_mol_tsx {
                    let t = m.bits.tsx;
                    let text = flags(&[(t.intx() != 0, "intx"), (t.abrt() != 0, "abrt")]);
                    PacketText::new("mode.tsx", text)
                } else {
                    PacketText::new("mode", format!("leaf: {:x}", m.leaf))
                }
            }
            sys::pt_packet_type_ppt_pip => {
                let pip = p.payload.pip;
                let nr = if pip.nr() != 0 { ", nr" } else { "" };
                PacketText::tracked(
                    "pip",
                    format!("{:x}{nr}", pip.cr3),
                    "cr3",
                    format!("{:016x}", pip.cr3),
                )
            }
            sys::pt_packet_type_ppt_vmcs => {
                let base = p.payload.vmcs.base;
                PacketText::tracked("vmcs", format!("{base:x}"), "vmcs", format!("{base:016x}"))
            }
            sys::pt_packet_type_ppt_cbr => {
                let r = p.payload.cbr.ratio;
                PacketText::timing("cbr", format!("{r:x}"), TimingPacket::Cbr(r))
            }
            sys::pt_packet_type_ppt_tsc => {
                let t = p.payload.tsc.tsc;
                PacketText::timing("tsc", format!("{t:x}"), TimingPacket::Tsc(t))
            }
            sys::pt_packet_type_ppt_tma => {
                let (ctc, fc) = (p.payload.tma.ctc, p.payload.tma.fc);
                let payload = format!("{ctc:x}, {fc:x}");
                PacketText::timing("tma", payload, TimingPacket::Tma { ctc, fc })
            }
            sys::pt_packet_type_ppt_mtc => {
                let c = p.payload.mtc.ctc;
                PacketText::timing("mtc", format!("{c:x}"), TimingPacket::Mtc(c))
            }
            sys::pt_packet_type_ppt_cyc => {
                let c = p.payload.cyc.value;
                PacketText::timing("cyc", format!("{c:x}"), TimingPacket::Cyc(c))
            }
            sys::pt_packet_type_ppt_mnt => {
                PacketText::new("mnt", format!("{:x}", p.payload.mnt.payload))
            }
            sys::pt_packet_type_ppt_exstop => {
                let ip = if p.payload.exstop.ip() != 0 { "ip" } else { "" };
                PacketText::new("exstop", ip.to_string())
            }
            sys::pt_packet_type_ppt_mwait => {
                let m = p.payload.mwait;
                PacketText::new("mwait", format!("{:08x}, {:08x}", m.hints, m.ext))
            }
            sys::pt_packet_type_ppt_pwre => {
                // The C-states as ptdump numbers them: the packet's fields plus one.
                let w = p.payload.pwre;
                let hw = if w.hw() != 0 { ", hw" } else { "" };
                let state = (u32::from(w.state) + 1) & 0xf;
                let sub = (u32::from(w.sub_state) + 1) & 0xf;
                PacketText::new("pwre", format!("c{state}.{sub}{hw}"))
            }
            sys::pt_packet_type_ppt_pwrx => {
                let w = p.payload.pwrx;
                // Why the core woke: one of int, st, hw ("bad" for none or several; st
                // and hw with ptdump's leading space).
                let why = match (w.interrupt() != 0, w.store() != 0, w.autonomous() != 0) {
                    (true, false, false) => "int",
                    (false, true, false) => " st",
                    (false, false, true) => " hw",
                    _ => "bad",
                };
                let last = (u32::from(w.last) + 1) & 0xf;
                let deepest = (u32::from(w.deepest) + 1) & 0xf;
                PacketText::new("pwrx", format!("{why}: c{last}, c{deepest}"))
            }
            sys::pt_packet_type_ppt_ptw => {
                let w = p.payload.ptw;
                let ip = if w.ip() != 0 { ", ip" } else { "" };
                PacketText::new("ptw", format!("{:x}: {:x}{ip}", w.plc, w.payload))
            }
            sys::pt_packet_type_ppt_cfe => {
                let c = p.payload.cfe;
                PacketText::tracked(
                    "cfe",
                    format_cfe(c.type_, c.vector, c.ip() != 0),
                    "type",
                    cfe_type_name(c.type_).to_string(),
                )
            }
            sys::pt_packet_type_ppt_evd => {
                let e = p.payload.evd;
                PacketText::tracked(
                    "evd",
                    format!("{}: {:x}", e.type_, e.payload),
                    "type",
                    evd_type_name(e.type_).to_string(),
                )
            }
            sys::pt_packet_type_ppt_unknown => match crate::wire::parse_trig(raw) {
                Some((t, _)) => PacketText::new("trig", format_trig(&t)),
                None => plain("<unknown>"),
            },
            _ => PacketText::new("<unknown>", format!("type {}", p.type_)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AddrFilter;

    #[test]
    fn ip_payloads_are_those_fmt_made() {
        let by_fmt = |ipc: sys::pt_ip_compression, ip: u64| match ipc {
            sys::pt_ip_compression_pt_ipc_suppressed => format!("{ipc:x}: ????????????????"),
            sys::pt_ip_compression_pt_ipc_update_16 => format!("{ipc:x}: ????????????{ip:04x}"),
            sys::pt_ip_compression_pt_ipc_update_32 => format!("{ipc:x}: ????????{ip:08x}"),
            sys::pt_ip_compression_pt_ipc_update_48 => format!("{ipc:x}: ????{ip:012x}"),
            sys::pt_ip_compression_pt_ipc_sext_48 => {
                format!("{ipc:x}: {:016x}", ((ip << 16) as i64 >> 16) as u64)
            }
            _ => format!("{ipc:x}: {ip:016x}"),
        };
        for ipc in [
            sys::pt_ip_compression_pt_ipc_suppressed,
            sys::pt_ip_compression_pt_ipc_update_16,
            sys::pt_ip_compression_pt_ipc_update_32,
            sys::pt_ip_compression_pt_ipc_update_48,
            sys::pt_ip_compression_pt_ipc_sext_48,
            sys::pt_ip_compression_pt_ipc_full,
        ] {
            for ip in [
                0,
                1,
                0x1002,
                0xffff,
                0x1_0000,
                0xdead_beef,
                0x8000_0000_0000,
                u64::MAX,
            ] {
                let p = sys::pt_packet_ip { ipc, ip };
                assert_eq!(format_ip(&p), by_fmt(ipc, ip), "ipc {ipc}, ip {ip:#x}");
            }
        }
    }

    #[test]
    fn psbs_found_on_threads_are_the_ones_found_on_one() {
        // PSBs every ~300 bytes (timed, with FUPs), so that range ends fall inside PSB+s
        // and PSB patterns too.
        let prog = crate::testgen::CallProgram::new(0x40_0000, 4, 4);
        let t = prog.trace(crate::testgen::CallTraceOptions {
            ret_compression: true,
            timing: true,
            psb_every: 300,
            min_insns: 4_500_000,
            seed: 7,
        });
        let one = psb_offsets(&t.pt);
        assert!(t.pt.len() > 1 << 20, "{} bytes", t.pt.len());
        assert!(one.len() > 3000, "{} PSBs", one.len());
        assert!(one.iter().all(|p| p.psbend.is_some() && p.tsc.is_some()));
        for threads in [2, 3, 4, 7] {
            assert_eq!(
                psb_offsets_parallel(&t.pt, threads),
                one,
                "{threads} threads"
            );
        }
        // Every range end inside a PSB pattern or its PSB+: found once, by its range.
        let tail = &t.pt[..1 << 20];
        let want = psb_offsets(tail);
        for (k, p) in want.iter().enumerate().take(40) {
            for cut in [p.offset + 1, p.offset + 8, p.offset + 17] {
                let (a, b) = (tail, cut as usize);
                let mut got = psbs_in(a, 0, b);
                got.extend(psbs_in(a, b, a.len()));
                assert_eq!(got, want, "PSB {k} cut at {cut}");
            }
        }
    }

    #[test]
    fn the_configuration_carries_the_cpu_its_errata_time_and_filters() {
        let mut filter = AddrFilter::default();
        filter.set("0:filter,0x1000,0x1fff").unwrap();
        filter.set("3:stop,0x5000,0x5fff").unwrap();
        let params = TraceParams {
            cpu: CpuParams {
                family: 6,
                model: 0x9e,
                stepping: 11,
                mtc_freq: 3,
                nom_freq: 24,
                cpuid_0x15_eax: 2,
                cpuid_0x15_ebx: 188,
            },
            time: None,
            filter,
        };
        // Each erratum alone reaches its own bit.
        let names = ["bdm70", "bdm64", "skd007", "skd022", "skd010"];
        let more = ["skl014", "apl12", "apl11", "skl168", "skz84"];
        for (k, name) in names.iter().chain(more.iter()).enumerate() {
            let mut e = Errata::default();
            let flags = [
                &mut e.bdm70,
                &mut e.bdm64,
                &mut e.skd007,
                &mut e.skd022,
                &mut e.skd010,
                &mut e.skl014,
                &mut e.apl12,
                &mut e.apl11,
                &mut e.skl168,
                &mut e.skz84,
            ];
            *flags.into_iter().nth(k).unwrap() = true;
            let r = pt_config(&params, e).errata;
            let got = [
                r.bdm70(),
                r.bdm64(),
                r.skd007(),
                r.skd022(),
                r.skd010(),
                r.skl014(),
                r.apl12(),
                r.apl11(),
                r.skl168(),
                r.skz84(),
            ];
            let want: Vec<u32> = (0..10).map(|i| u32::from(i == k)).collect();
            assert_eq!(got.to_vec(), want, "{name}");
            assert_eq!(e.names(), [*name]);
        }
        let cfg = pt_config(&params, Errata::default());
        assert_eq!(cfg.size, std::mem::size_of::<sys::pt_config>());
        assert_eq!(
            (cfg.cpu.family, cfg.cpu.model, cfg.cpu.stepping),
            (6, 0x9e, 11)
        );
        assert_eq!(cfg.cpu.vendor, sys::pt_cpu_vendor_pcv_intel);
        assert_eq!((cfg.mtc_freq, cfg.nom_freq), (3, 24));
        assert_eq!((cfg.cpuid_0x15_eax, cfg.cpuid_0x15_ebx), (2, 188));
        // SAFETY: reading a plain integer of a plain C union.
        let addr_cfg = unsafe { cfg.addr_filter.config.addr_cfg };
        assert_eq!(addr_cfg, 0x2001);
        let f = &cfg.addr_filter;
        assert_eq!((f.addr0_a, f.addr0_b), (0x1000, 0x1fff));
        assert_eq!((f.addr3_a, f.addr3_b), (0x5000, 0x5fff));
        // An unknown CPU (family 0): no vendor, no errata, whatever is passed.
        let unknown = TraceParams::default();
        let all = Errata {
            skd007: true,
            ..Default::default()
        };
        let cfg = pt_config(&unknown, all);
        assert_eq!(cfg.cpu.vendor, sys::pt_cpu_vendor_pcv_unknown);
        assert_eq!(cfg.errata.skd007(), 0);
        // libipt's own list, read back bit by bit: Kaby Lake (6/0x9e) has these, and
        // not APL11/APL12 (Apollo Lake's) nor SKZ84 (family 19's).
        let kbl = libipt_errata(6, 0x9e, 11).unwrap();
        let names = ["bdm70", "skd007", "skd022", "skd010", "skl014", "skl168"];
        assert_eq!(kbl.names(), names);
        assert_eq!(raw_errata(kbl).skl168(), 1);
    }
}
