//! Fast path for syscall sites: a site that trapped once through Syscall User Dispatch is
//! patched so that later syscalls there cost a function call instead of a SIGSYS round trip.
//! **Async-signal-safe**: [`maybe_patch`] runs in the SIGSYS handler and `fast_syscall`
//! runs at arbitrary points of the application (inside its malloc, its signal handlers…):
//! no allocation, no locks, no std I/O, no panics. [`setup`] is normal context.
//!
//! Both kinds of patch end in `pttracer_fast_entry`, which saves the flags, the argument
//! registers and the whole extended (x87/SSE/AVX/AVX-512) state with `xsavec`, records the
//! syscall like the SIGSYS handler does ([`super::window::general`]) and returns to the
//! patch, which resumes behind the original `syscall`.
//!
//! **Site stubs** (`PTTRACER_REWRITE=sites`, the default when no user code is stepped): the
//! common libc form `mov $nr,%eax; syscall` (`b8 imm32 0f 05`, or `48 c7 c0 imm32 0f 05`)
//! gets its `mov` replaced by a 5-byte `jmp` to a 32-byte stub of its own:
//! `lea -128(%rsp),%rsp; mov $nr,%eax; call *entry; lea 128(%rsp),%rsp; jmp resume`. Only
//! the `mov` changes and the `syscall` after it stays in place, so every instruction
//! boundary a branch could target still holds the original instruction there (a jump
//! straight to the `syscall` traps through Syscall User Dispatch as before). The stub
//! steps over the 128-byte red zone before its `call`. The new bytes are written with
//! one `lock cmpxchg16b` inside an aligned 16-byte block (other threads executing the site
//! see the old or the new instruction, never a mix); sites whose `mov` straddles such a
//! block, and syscalls that need the full handler (signals, clone/fork/vfork, exec, exit,
//! prctl: [`SPECIAL`]) stay on the SIGSYS path. Stubs live in 64 KiB areas mapped at
//! start-up within ±2 GiB of each patchable mapping. Needs no privileges.
//!
//! **Page-0 trampoline** (`PTTRACER_REWRITE=all`, the zpoline/lazypoline technique) for the
//! other sites: the 2-byte `syscall` (0f 05) is replaced by the 2-byte `call *%rax`
//! (ff d0). RAX holds the syscall number, so the call lands in a page mapped at address 0:
//! 512 NOPs slide into a jump to `pttracer_fast_entry`. Syscalls that need the full handler
//! are re-raised from `pttracer_fast_fallback` outside the allowed range; the handler then
//! pops the site's resume address and continues as if the original instruction had
//! trapped. Limits: mapping page 0 needs CAP_SYS_RAWIO or `vm.mmap_min_addr=0`; page 0
//! becomes readable and executable, so a NULL *read* returns NOP bytes instead of faulting;
//! the `call` writes 8 bytes below the stack pointer, inside the red zone of the
//! interrupted function (glibc's wrappers keep no data there, arbitrary inline `syscall`
//! code could); a patched site later used with a number >= 512 jumps outside the NOP sled.
//!
//! Both patch only file-backed executable mappings present at start-up (other than this
//! library and the vDSO). Patched code pages become private copies of the process. The
//! shim turns patching off when it steps user code (the decoder reads the original images).

use super::config::RewriteKind;
use super::raw;
use super::window;
use core::arch::global_asm;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// Syscall numbers covered by the NOP sled (exclusive bound).
pub const SLED: u64 = 512;
/// Syscalls that always take the full SIGSYS handler.
pub const SPECIAL: &[u64] = &[
    13,  // rt_sigaction
    14,  // rt_sigprocmask
    15,  // rt_sigreturn
    56,  // clone
    57,  // fork
    58,  // vfork
    59,  // execve
    60,  // exit
    130, // rt_sigsuspend
    157, // prctl (PR_SET_SYSCALL_USER_DISPATCH is refused)
    231, // exit_group
    270, // pselect6
    271, // ppoll
    281, // epoll_pwait
    322, // execveat
    435, // clone3
    441, // epoll_pwait2
];

/// Bitmap of [`SPECIAL`] (bit n set: syscall n takes the fallback), read by the entry stub.
static PTTRACER_SPECIAL: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
/// Bytes reserved on the stack for `xsavec` (from cpuid leaf 0xD), set at start-up.
static PTTRACER_XSAVE_SIZE: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".pushsection .text.pttracer_fast,\"ax\",@progbits",
    ".p2align 4",
    ".globl pttracer_fast_entry",
    ".hidden pttracer_fast_entry",
    "pttracer_fast_entry:",
    // [rsp] = resume address behind the patched site; rax = syscall number. The flags
    // are saved first: a syscall preserves them, and the checks below change them.
    "    pushfq",
    "    cmp rax, 511",
    "    ja 8f",
    "    lea r11, [rip + {special}]",
    "    bt qword ptr [r11], rax",
    "    jc 8f",
    "    push rbp",
    "    mov rbp, rsp",
    "    push rdi",
    "    push rsi",
    "    push rdx",
    "    push r10",
    "    push r8",
    "    push r9",
    "    push rax",
    "    push rbx",
    "    sub rsp, qword ptr [rip + {xsave_size}]",
    "    and rsp, -64",
    "    mov rbx, rsp",
    // xrstor faults on a header whose reserved bytes are not zero, and xsavec does not
    // write all of them: clear the 64-byte header (at offset 512) first.
    "    xor eax, eax",
    "    mov [rbx + 512], rax",
    "    mov [rbx + 520], rax",
    "    mov [rbx + 528], rax",
    "    mov [rbx + 536], rax",
    "    mov [rbx + 544], rax",
    "    mov [rbx + 552], rax",
    "    mov [rbx + 560], rax",
    "    mov [rbx + 568], rax",
    "    mov eax, -1",
    "    mov edx, -1",
    "    xsavec [rbx]",
    "    lea rdi, [rbp - 56]",
    "    call {fast}",
    "    mov r11, rax",
    "    mov eax, -1",
    "    mov edx, -1",
    "    xrstor [rbx]",
    "    mov rax, r11",
    "    mov rbx, [rbp - 64]",
    "    mov r9, [rbp - 48]",
    "    mov r8, [rbp - 40]",
    "    mov r10, [rbp - 32]",
    "    mov rdx, [rbp - 24]",
    "    mov rsi, [rbp - 16]",
    "    mov rdi, [rbp - 8]",
    "    mov rsp, rbp",
    "    pop rbp",
    "    popfq",
    "    ret",
    "8:",
    "    popfq",
    ".globl pttracer_fast_fallback",
    ".hidden pttracer_fast_fallback",
    "pttracer_fast_fallback:",
    "    syscall",
    // Reached only when this thread has no Syscall User Dispatch (the shim's writer
    // thread): the syscall ran natively, return behind the site.
    "    ret",
    ".popsection",
    fast = sym fast_syscall,
    special = sym PTTRACER_SPECIAL,
    xsave_size = sym PTTRACER_XSAVE_SIZE,
);

extern "C" {
    static pttracer_fast_entry: u8;
    static pttracer_fast_fallback: u8;
}

/// RIP reported by a trap of the fallback `syscall`.
pub fn fallback_resume() -> u64 {
    core::ptr::addr_of!(pttracer_fast_fallback) as u64 + 2
}

/// Called by `pttracer_fast_entry` with a pointer to the saved registers:
/// nr, r9, r8, r10, rdx, rsi, rdi (ascending addresses).
extern "C" fn fast_syscall(frame: *const u64) -> i64 {
    // SAFETY: the entry stub passes 7 readable u64 it pushed on its own stack.
    let f = unsafe { core::slice::from_raw_parts(frame, 7) };
    let (nr, a6, a5, a4, a3, a2, a1) = (f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    window::general(nr, [a1, a2, a3, a4, a5, a6])
}

/// An address range [start, end).
type Span = (u64, u64);

/// Executable ranges that may be patched (start, end), fixed at start-up.
const MAX_RANGES: usize = 256;
static RANGES: [(AtomicU64, AtomicU64); MAX_RANGES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_RANGES];
static RANGE_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Site stubs are ready (areas mapped, entry set up).
static SITES: AtomicBool = AtomicBool::new(false);
/// The page-0 trampoline is mapped.
static PAGE0: AtomicBool = AtomicBool::new(false);
/// Sites patched so far (for the info file and tests).
pub use super::process::PATCHED;

/// One patcher at a time: another thread's mprotect back to R-X must not land between our
/// mprotect and our store, and stub slots are handed out under it. A busy lock just leaves
/// the site for its next trap. (Reset in forked children: the holder was a parent thread.)
pub static PATCH_LOCK: AtomicBool = AtomicBool::new(false);

/// Stub areas: base address and the offset of the next free slot.
const MAX_AREAS: usize = 32;
const AREA_LEN: u64 = 64 * 1024;
const SLOT: u64 = 32;
/// Bytes of a stub that are code (the rest of the slot is int3).
const STUB_CODE: usize = 29;
static AREAS: [(AtomicU64, AtomicU64); MAX_AREAS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_AREAS];
static AREA_COUNT: AtomicUsize = AtomicUsize::new(0);

fn patchable(start: u64, end: u64) -> bool {
    let n = RANGE_COUNT.load(Acquire).min(MAX_RANGES);
    RANGES
        .iter()
        .take(n)
        .any(|(s, e)| start >= s.load(Relaxed) && end <= e.load(Relaxed))
}

fn is_special(nr: u64) -> bool {
    nr >= SLED || SPECIAL.contains(&nr)
}

/// Whether a rel32 displacement from `from` reaches `to`.
fn reaches(from: u64, to: u64) -> bool {
    i32::try_from((to as i64).wrapping_sub(from as i64)).is_ok()
}

/// Patches the syscall site whose `syscall` ends just before `resume`, when allowed (called
/// by the SIGSYS handler after it performed syscall `nr` from there).
pub fn maybe_patch(resume: u64, nr: u64) {
    if is_special(nr) {
        return;
    }
    if SITES.load(Acquire) && patch_with_stub(resume, nr) {
        return;
    }
    if PAGE0.load(Acquire) {
        patch_page0(resume);
    }
}

fn try_lock() -> bool {
    PATCH_LOCK
        .compare_exchange(false, true, Acquire, Relaxed)
        .is_ok()
}

fn unlock() {
    PATCH_LOCK.store(false, Release);
}

fn mprotect(page: u64, len: u64, prot: i32) -> bool {
    raw::sys3(libc::SYS_mprotect, page, len, prot as u64) == 0
}

const RX: i32 = libc::PROT_READ | libc::PROT_EXEC;
const RWX: i32 = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;

/// The `mov $nr, %eax|%rax` that ends at `sys` (the address of the `syscall`), if any:
/// (address, length).
fn mov_before(sys: u64, nr: u64) -> Option<(u64, u64)> {
    let imm = (nr as u32).to_le_bytes();
    for (len, prefix) in [(5u64, &[0xb8u8][..]), (7, &[0x48, 0xc7, 0xc0][..])] {
        let at = sys.wrapping_sub(len);
        if !patchable(at, sys + 2) {
            continue;
        }
        // SAFETY: [at, sys + 2) lies in an executable file mapping recorded at start-up,
        // which stays mapped and readable (only its protection gains W while patching).
        let code = unsafe { core::slice::from_raw_parts(at as *const u8, len as usize + 2) };
        let p = prefix.len();
        if code.get(..p) == Some(prefix)
            && code.get(p..p + 4) == Some(&imm[..])
            && code.get(p + 4..) == Some(&[0x0f, 0x05][..])
        {
            return Some((at, len));
        }
    }
    None
}

/// Site-stub patch; true when the site was patched or is being patched by another thread.
fn patch_with_stub(resume: u64, nr: u64) -> bool {
    let sys = resume.wrapping_sub(2);
    let Some((at, len)) = mov_before(sys, nr) else {
        return false;
    };
    // The new bytes must lie inside one aligned 16-byte block (one atomic store).
    if (at & 15) + len > 16 {
        return false;
    }
    if !try_lock() {
        return true;
    }
    let done = patch_with_stub_locked(at, len, sys, nr);
    unlock();
    done
}

fn patch_with_stub_locked(at: u64, len: u64, sys: u64, nr: u64) -> bool {
    // Re-check under the lock: another thread may have patched it meanwhile.
    if mov_before(sys, nr) != Some((at, len)) {
        return true;
    }
    let resume = sys + 2;
    // A free slot within reach of the site and of the resume address.
    let n = AREA_COUNT.load(Acquire).min(MAX_AREAS);
    let Some((area, slot)) = AREAS.iter().take(n).find_map(|(base, next)| {
        let (b, off) = (base.load(Relaxed), next.load(Relaxed));
        let slot = b + off;
        (off + SLOT <= AREA_LEN
            && reaches(at + 5, slot)
            && reaches(slot + STUB_CODE as u64, resume))
        .then_some((next, slot))
    }) else {
        return false;
    };
    let area_base = slot - area.load(Relaxed);
    let mut stub = [0xccu8; SLOT as usize];
    // lea rsp, [rsp - 128]
    stub[0..5].copy_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x80]);
    // mov eax, nr
    stub[5] = 0xb8;
    stub[6..10].copy_from_slice(&(nr as u32).to_le_bytes());
    // call [rip + disp32] -> the entry address stored at the area's start
    stub[10..12].copy_from_slice(&[0xff, 0x15]);
    let disp = (area_base as i64 - (slot + 16) as i64) as i32;
    stub[12..16].copy_from_slice(&disp.to_le_bytes());
    // lea rsp, [rsp + 128]
    stub[16..24].copy_from_slice(&[0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00]);
    // jmp resume
    stub[24] = 0xe9;
    let back = (resume as i64 - (slot + STUB_CODE as u64) as i64) as i32;
    stub[25..29].copy_from_slice(&back.to_le_bytes());

    let stub_page = slot & !4095;
    if !mprotect(stub_page, 4096, RWX) {
        return false;
    }
    // SAFETY: the slot is 32 unused bytes of our own stub area, writable now.
    unsafe { core::ptr::copy_nonoverlapping(stub.as_ptr(), slot as *mut u8, stub.len()) };
    mprotect(stub_page, 4096, RX);
    area.fetch_add(SLOT, Relaxed);

    // The site: jmp rel32 to the stub (+ nops for the 7-byte form), one 16-byte store.
    let block = at & !15;
    let page = block & !4095;
    if !mprotect(page, 4096, RWX) {
        return false;
    }
    // SAFETY: block is 16-byte aligned inside a patchable executable mapping (checked by
    // mov_before) and writable now.
    let old = unsafe { (block as *const [u8; 16]).read_volatile() };
    let mut new = old;
    let o = (at - block) as usize;
    let rel = (slot as i64 - (at + 5) as i64) as i32;
    new[o] = 0xe9;
    new[o + 1..o + 5].copy_from_slice(&rel.to_le_bytes());
    for b in new.iter_mut().take(o + len as usize).skip(o + 5) {
        *b = 0x90;
    }
    // SAFETY: as above; cmpxchg16b needs a 16-byte aligned, writable location.
    let ok = unsafe { store16(block, old, new) };
    mprotect(page, 4096, RX);
    if ok {
        PATCHED.fetch_add(1, Relaxed);
    }
    true
}

/// Atomically replaces the 16 bytes at `addr` (16-byte aligned) when they equal `old`.
///
/// # Safety
/// `addr` must be 16-byte aligned and writable.
unsafe fn store16(addr: u64, old: [u8; 16], new: [u8; 16]) -> bool {
    let (old_lo, old_hi) = split16(old);
    let (new_lo, new_hi) = split16(new);
    let seen_lo: u64;
    let seen_hi: u64;
    // SAFETY: the caller guarantees alignment and writability. RBX cannot be named as an
    // operand, so it is swapped with a scratch register around the instruction.
    unsafe {
        core::arch::asm!(
            "xchg rbx, {lo}",
            "lock cmpxchg16b xmmword ptr [{p}]",
            "mov rbx, {lo}",
            p = in(reg) addr,
            lo = inout(reg) new_lo => _,
            inout("rax") old_lo => seen_lo,
            inout("rdx") old_hi => seen_hi,
            in("rcx") new_hi,
            options(nostack)
        );
    }
    seen_lo == old_lo && seen_hi == old_hi
}

fn split16(b: [u8; 16]) -> (u64, u64) {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&b[..8]);
    hi.copy_from_slice(&b[8..]);
    (u64::from_le_bytes(lo), u64::from_le_bytes(hi))
}

/// Page-0 patch: the `syscall` that ends just before `resume` becomes `call *%rax`.
fn patch_page0(resume: u64) {
    let site = resume.wrapping_sub(2);
    // A 2-byte store straddling a cache line is not atomic for concurrent executors.
    if site % 64 == 63 || !patchable(site, site + 2) {
        return;
    }
    // SAFETY: site lies in an executable file mapping recorded at start-up (readable).
    let cur = unsafe { (site as *const [u8; 2]).read_volatile() };
    if cur != [0x0f, 0x05] || !try_lock() {
        return;
    }
    patch_page0_locked(site);
    unlock();
}

fn patch_page0_locked(site: u64) {
    // Re-check under the lock: another thread may have patched it meanwhile.
    // SAFETY: as in patch_page0.
    if unsafe { (site as *const [u8; 2]).read_volatile() } != [0x0f, 0x05] {
        return;
    }
    let page = site & !4095;
    let len = (site + 2).next_multiple_of(4096) - page;
    if !mprotect(page, len, RWX) {
        return;
    }
    // SAFETY: the page is now writable; the site holds a 2-byte syscall instruction that
    // we replace with one 16-bit store inside a cache line (atomic for other threads that
    // may be executing it; the store may be unaligned, which x86 allows).
    unsafe {
        core::arch::asm!(
            "mov word ptr [{p}], {v:x}",
            p = in(reg) site,
            v = in(reg) u16::from_le_bytes([0xff, 0xd0]),
            options(nostack, preserves_flags)
        )
    };
    mprotect(page, len, RX);
    PATCHED.fetch_add(1, Relaxed);
}

/// What [`setup`] turned on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Active {
    pub sites: bool,
    pub page0: bool,
}

/// Prepares patching of the given kind (normal context, before Syscall User Dispatch is
/// armed). Returns what is active and a message for each part that could not be set up.
pub fn setup(kind: RewriteKind) -> (Active, Vec<String>) {
    let mut msgs = Vec::new();
    let none = Active {
        sites: false,
        page0: false,
    };
    if kind == RewriteKind::Off {
        return (none, msgs);
    }
    if let Err(e) = setup_entry() {
        msgs.push(e);
        return (none, msgs);
    }
    let maps = match std::fs::read_to_string("/proc/self/maps") {
        Ok(m) => m,
        Err(e) => {
            msgs.push(format!(
                "PTTRACER_REWRITE: cannot read /proc/self/maps: {e}"
            ));
            return (none, msgs);
        }
    };
    let (mappings, ranges) = parse_maps(&maps);
    for (i, &(s, e)) in ranges.iter().take(MAX_RANGES).enumerate() {
        RANGES[i].0.store(s, Relaxed);
        RANGES[i].1.store(e, Relaxed);
    }
    RANGE_COUNT.store(ranges.len().min(MAX_RANGES), Release);
    let mut active = none;
    match setup_areas(&mappings, &ranges) {
        Ok(()) => {
            SITES.store(true, Release);
            active.sites = true;
        }
        Err(e) => msgs.push(e),
    }
    if kind == RewriteKind::All {
        match setup_page0() {
            Ok(()) => {
                PAGE0.store(true, Release);
                active.page0 = true;
            }
            Err(e) => msgs.push(e),
        }
    }
    (active, msgs)
}

/// The entry's parameters: xsave area size and the [`SPECIAL`] bitmap.
fn setup_entry() -> Result<(), String> {
    let cpuid = raw_cpuid::CpuId::new();
    let xsavec = cpuid
        .get_extended_state_info()
        .is_some_and(|x| x.has_xsavec());
    if !xsavec {
        return Err(
            "PTTRACER_REWRITE needs the xsavec instruction, which this CPU lacks; \
                    every syscall takes the SIGSYS path"
                .into(),
        );
    }
    let cx16 = cpuid.get_feature_info().is_some_and(|f| f.has_cmpxchg16b());
    if !cx16 {
        return Err(
            "PTTRACER_REWRITE needs cmpxchg16b, which this CPU lacks; every \
                    syscall takes the SIGSYS path"
                .into(),
        );
    }
    // cpuid leaf 0xD subleaf 0: EBX = XSAVE area size for the features enabled in XCR0.
    let size = core::arch::x86_64::__cpuid_count(0xD, 0).ebx as u64;
    PTTRACER_XSAVE_SIZE.store(size.max(1024) + 64, Relaxed);
    for &n in SPECIAL {
        PTTRACER_SPECIAL[(n / 64) as usize].fetch_or(1 << (n % 64), Relaxed);
    }
    Ok(())
}

/// All mappings (start, end) below the user-space top, sorted, and the patchable ranges:
/// file-backed r-x mappings other than this library.
fn parse_maps(maps: &str) -> (Vec<Span>, Vec<Span>) {
    let me = core::ptr::addr_of!(pttracer_fast_entry) as u64;
    let mut all = Vec::new();
    let mut ranges = Vec::new();
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let path = it.nth(3).unwrap_or("");
        let mut r = range.split('-');
        let (Some(s), Some(e)) = (
            r.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
            r.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
        ) else {
            continue;
        };
        if e > USER_TOP {
            continue;
        }
        all.push((s, e));
        if perms.starts_with("r-x") && path.starts_with('/') && !(s..e).contains(&me) {
            ranges.push((s, e));
        }
    }
    all.sort_unstable();
    (all, ranges)
}

/// Highest user-space address considered for stub areas.
const USER_TOP: u64 = 0x7fff_ffff_f000;
/// Lowest address considered for stub areas (above any vm.mmap_min_addr in use).
const USER_BOTTOM: u64 = 0x10_0000;

/// Maps stub areas so that every patchable range has one within rel32 reach.
fn setup_areas(mappings: &[(u64, u64)], ranges: &[(u64, u64)]) -> Result<(), String> {
    let entry = core::ptr::addr_of!(pttracer_fast_entry) as u64;
    let mut taken: Vec<(u64, u64)> = mappings.to_vec();
    let mut n = 0usize;
    for &(rs, re) in ranges {
        let covered = AREAS.iter().take(n).any(|(b, _)| {
            let b = b.load(Relaxed);
            area_serves(b, rs, re)
        });
        if covered {
            continue;
        }
        if n >= MAX_AREAS {
            return Err(format!(
                "PTTRACER_REWRITE: more than {MAX_AREAS} stub areas needed; sites beyond them \
                 take the SIGSYS path"
            ));
        }
        let Some(base) = map_area_near(&taken, rs, re) else {
            return Err(format!(
                "PTTRACER_REWRITE: no free address within 2 GiB of {rs:#x}-{re:#x} for \
                 syscall stubs; its sites take the SIGSYS path"
            ));
        };
        // SAFETY: base is a fresh RW mapping of AREA_LEN bytes.
        unsafe {
            core::ptr::write_bytes(base as *mut u8, 0xcc, AREA_LEN as usize);
            (base as *mut u64).write(entry);
        }
        if !mprotect(base, AREA_LEN, RX) {
            raw::munmap(base as *mut u8, AREA_LEN as usize);
            return Err("PTTRACER_REWRITE: mprotect of a stub area failed".into());
        }
        AREAS[n].0.store(base, Relaxed);
        // The first slot holds the entry address.
        AREAS[n].1.store(SLOT, Relaxed);
        n += 1;
        AREA_COUNT.store(n, Release);
        taken.push((base, base + AREA_LEN));
        taken.sort_unstable();
    }
    Ok(())
}

/// Whether an area at `base` is within rel32 reach of every site in [rs, re) and of every
/// resume address there, from every slot.
fn area_serves(base: u64, rs: u64, re: u64) -> bool {
    reaches(rs, base + AREA_LEN)
        && reaches(re + 16, base)
        && reaches(base + AREA_LEN, rs)
        && reaches(base, re + 16)
}

/// Maps AREA_LEN bytes (RW) in a free gap of `taken` as close to [rs, re) as possible, at
/// the top of the gap (never right above a mapping, where a heap would grow).
fn map_area_near(taken: &[(u64, u64)], rs: u64, re: u64) -> Option<u64> {
    const GUARD: u64 = 4096;
    let mut candidates = Vec::new();
    let mut prev_end = USER_BOTTOM;
    for &(s, e) in taken.iter().chain(std::iter::once(&(USER_TOP, USER_TOP))) {
        if s >= prev_end + AREA_LEN + 2 * GUARD {
            let a = s - GUARD - AREA_LEN;
            if area_serves(a, rs, re) {
                candidates.push((a.abs_diff(rs), a));
            }
        }
        prev_end = prev_end.max(e);
    }
    candidates.sort_unstable();
    for &(_, a) in candidates.iter().take(16) {
        let r = raw::sys6(
            libc::SYS_mmap as u64,
            [
                a,
                AREA_LEN,
                (libc::PROT_READ | libc::PROT_WRITE) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        );
        if r as u64 == a {
            return Some(a);
        }
        if !(-4095..0).contains(&r) {
            // An old kernel took the address as a hint only.
            raw::munmap(r as *mut u8, AREA_LEN as usize);
        }
    }
    None
}

/// Maps the NOP sled at address 0.
fn setup_page0() -> Result<(), String> {
    // Build the sled in an ordinary page, then move that page to address 0 (Rust code never
    // dereferences address 0).
    let buf = raw::mmap_anon(4096).ok_or("PTTRACER_REWRITE: mmap of the sled page failed")?;
    // SAFETY: buf is a fresh private RW mapping of 4096 bytes.
    let sled = unsafe { std::slice::from_raw_parts_mut(buf, 4096) };
    sled.fill(0x90);
    let entry = core::ptr::addr_of!(pttracer_fast_entry) as u64;
    // movabs r11, entry; jmp r11
    let mut code = [0u8; 13];
    code[0] = 0x49;
    code[1] = 0xbb;
    code[2..10].copy_from_slice(&entry.to_le_bytes());
    code[10..13].copy_from_slice(&[0x41, 0xff, 0xe3]);
    sled[SLED as usize..SLED as usize + 13].copy_from_slice(&code);
    if !mprotect(buf as u64, 4096, RX) {
        raw::munmap(buf, 4096);
        return Err("PTTRACER_REWRITE: mprotect of the sled failed".into());
    }
    // Refuse to replace anything already mapped at 0.
    if raw::sys3(libc::SYS_msync, 0, 4096, libc::MS_ASYNC as u64) != -(libc::ENOMEM as i64) {
        raw::munmap(buf, 4096);
        return Err("PTTRACER_REWRITE: page 0 is already mapped; not touching it".into());
    }
    let r = raw::sys6(
        libc::SYS_mremap as u64,
        [
            buf as u64,
            4096,
            4096,
            (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64,
            0,
            0,
        ],
    );
    if r != 0 {
        raw::munmap(buf, 4096);
        let min = std::fs::read_to_string("/proc/sys/vm/mmap_min_addr").unwrap_or_default();
        return Err(format!(
            "PTTRACER_REWRITE=all: cannot map page 0 (errno {}; vm.mmap_min_addr={}): it needs \
             CAP_SYS_RAWIO or vm.mmap_min_addr=0; other sites take the SIGSYS path",
            -r,
            min.trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_give_patchable_ranges_and_areas_stay_in_reach() {
        let maps = "\
555555554000-555555555000 r--p 00000000 08:01 1 /usr/bin/prog
555555555000-555555556000 r-xp 00001000 08:01 1 /usr/bin/prog
7ffff7dd0000-7ffff7f45000 r-xp 00028000 08:01 2 /usr/lib/libc.so.6
7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0 [vdso]
7ffff7fc5000-7ffff7fc6000 rwxp 00000000 00:00 0
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";
        let (all, ranges) = parse_maps(maps);
        // [vsyscall] lies above user space; the vDSO and anonymous code are not patched.
        assert_eq!(all.len(), 5);
        assert_eq!(
            ranges,
            vec![
                (0x5555_5555_5000, 0x5555_5555_6000),
                (0x7fff_f7dd_0000, 0x7fff_f7f4_5000)
            ]
        );
        // rel32 reach: +-2 GiB.
        assert!(reaches(0x1000, 0x1000 + i32::MAX as u64));
        assert!(!reaches(0x1000, 0x1000 + i32::MAX as u64 + 1));
        assert!(reaches(0x8000_1000, 0x1000));
        assert!(!reaches(0x8000_1001, 0x1000));
        let (rs, re) = ranges[1];
        assert!(area_serves(rs - 0x10_0000, rs, re));
        assert!(!area_serves(rs - (3u64 << 30), rs, re));
        assert!(!area_serves(re + (2u64 << 30), rs, re));
    }

    #[test]
    fn special_syscalls_are_never_patched() {
        for n in SPECIAL {
            assert!(is_special(*n));
        }
        assert!(is_special(SLED));
        assert!(!is_special(110));
        assert!(!is_special(0));
    }
}
