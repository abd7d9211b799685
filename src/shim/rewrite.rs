//! Optional fast path (`PTTRACER_REWRITE=1`): syscall sites found by Syscall User Dispatch
//! are patched into direct calls, so later syscalls at those sites cost a function call
//! instead of a SIGSYS round trip. **Async-signal-safe**: [`maybe_patch`] runs in the SIGSYS
//! handler and `fast_syscall` runs at arbitrary points of the application (inside its
//! malloc, its signal handlers…): no allocation, no locks, no std I/O, no panics.
//!
//! Mechanism (the technique of zpoline/lazypoline): the 2-byte `syscall` (0f 05) at a site
//! that trapped is replaced by the 2-byte `call *%rax` (ff d0). RAX holds the syscall
//! number, so the call lands in a page mapped at address 0: 512 NOPs slide into a jump to
//! `pttracer_fast_entry`, which saves the flags, the argument registers and the whole
//! extended (x87/SSE/AVX/AVX-512) state with `xsavec`, records the syscall like the SIGSYS
//! handler does ([`super::handler::general`]) and returns behind the site. Syscalls that
//! need the full handler (signals, clone/fork/vfork, exec, exit) are re-raised from
//! `pttracer_fast_fallback` outside the allowed range; the handler then pops the site's
//! resume address and continues as if the original instruction had trapped.
//!
//! Limits (why this is opt-in): mapping page 0 needs CAP_SYS_RAWIO or
//! `vm.mmap_min_addr=0`; page 0 becomes readable and executable, so a NULL *read* returns
//! NOP bytes instead of faulting (writes still fault; without PKU it cannot be made
//! execute-only); the `call` writes 8 bytes below the stack pointer, inside the 128-byte
//! red zone of the interrupted function (glibc's wrappers do not keep data there, arbitrary
//! inline `syscall` code could); a patched site later used with a number >= 512 jumps
//! outside the NOP sled. Only file-backed executable mappings present at start-up
//! (other than this library and the vDSO) are patched.

use super::handler;
use super::raw;
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
    // [rsp] = resume address behind the patched site; rax = syscall number.
    "    cmp rax, 511",
    "    ja 9f",
    "    lea r11, [rip + {special}]",
    "    bt qword ptr [r11], rax",
    "    jc 9f",
    "    pushfq",
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
    "9:",
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
    handler::general(nr, [a1, a2, a3, a4, a5, a6])
}

/// Executable ranges that may be patched (start, end), fixed at start-up.
const MAX_RANGES: usize = 256;
static RANGES: [(AtomicU64, AtomicU64); MAX_RANGES] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_RANGES];
static RANGE_COUNT: AtomicUsize = AtomicUsize::new(0);
static READY: AtomicBool = AtomicBool::new(false);
/// Sites patched so far (for the info file and tests).
pub static PATCHED: AtomicU64 = AtomicU64::new(0);

fn patchable(addr: u64) -> bool {
    let n = RANGE_COUNT.load(Acquire).min(MAX_RANGES);
    RANGES
        .iter()
        .take(n)
        .any(|(s, e)| addr >= s.load(Relaxed) && addr + 2 <= e.load(Relaxed))
}

/// Patches the `syscall` that ends just before `resume` into `call *%rax`, when allowed.
pub fn maybe_patch(resume: u64, nr: u64) {
    if !READY.load(Acquire) || nr >= SLED {
        return;
    }
    let site = resume.wrapping_sub(2);
    // A 2-byte store straddling a cache line is not atomic for concurrent executors.
    if site % 64 == 63 || !patchable(site) {
        return;
    }
    // SAFETY: site lies in an executable file mapping recorded at start-up (readable).
    let cur = unsafe { (site as *const [u8; 2]).read_volatile() };
    if cur != [0x0f, 0x05] {
        return;
    }
    // One patcher at a time: another thread's mprotect back to R-X must not land between
    // our mprotect and our store. A busy lock just leaves the site for its next trap.
    if PATCH_LOCK
        .compare_exchange(false, true, Acquire, Relaxed)
        .is_err()
    {
        return;
    }
    patch_locked(site);
    PATCH_LOCK.store(false, Release);
}

pub static PATCH_LOCK: AtomicBool = AtomicBool::new(false);

fn patch_locked(site: u64) {
    // Re-check under the lock: another thread may have patched it meanwhile.
    // SAFETY: as in maybe_patch.
    if unsafe { (site as *const [u8; 2]).read_volatile() } != [0x0f, 0x05] {
        return;
    }
    let page = site & !4095;
    let len = (site + 2).next_multiple_of(4096) - page;
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    if raw::sys3(libc::SYS_mprotect, page, len, rwx) != 0 {
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
    raw::sys3(
        libc::SYS_mprotect,
        page,
        len,
        (libc::PROT_READ | libc::PROT_EXEC) as u64,
    );
    PATCHED.fetch_add(1, Relaxed);
}

/// Maps the NOP sled at address 0 and records the patchable ranges (normal context,
/// before Syscall User Dispatch is armed). Err explains why the fast path is off.
pub fn setup() -> Result<(), String> {
    let cpuid = raw_cpuid::CpuId::new();
    let xsavec = cpuid
        .get_extended_state_info()
        .is_some_and(|x| x.has_xsavec());
    if !xsavec {
        return Err("PTTRACER_REWRITE needs the xsavec instruction, which this CPU lacks".into());
    }
    // cpuid leaf 0xD subleaf 0: EBX = XSAVE area size for the features enabled in XCR0.
    let size = core::arch::x86_64::__cpuid_count(0xD, 0).ebx as u64;
    PTTRACER_XSAVE_SIZE.store(size.max(1024) + 64, Relaxed);
    for &n in SPECIAL {
        PTTRACER_SPECIAL[(n / 64) as usize].fetch_or(1 << (n % 64), Relaxed);
    }
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
    let r = raw::sys3(
        libc::SYS_mprotect,
        buf as u64,
        4096,
        (libc::PROT_READ | libc::PROT_EXEC) as u64,
    );
    if r != 0 {
        raw::munmap(buf, 4096);
        return Err(format!(
            "PTTRACER_REWRITE: mprotect of the sled failed (errno {})",
            -r
        ));
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
            "PTTRACER_REWRITE: cannot map page 0 (errno {}; vm.mmap_min_addr={}): it needs \
             CAP_SYS_RAWIO or vm.mmap_min_addr=0; continuing with Syscall User Dispatch only",
            -r,
            min.trim()
        ));
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| e.to_string())?;
    let me = core::ptr::addr_of!(pttracer_fast_entry) as u64;
    let mut n = 0;
    for line in maps.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let path = it.nth(3).unwrap_or("");
        if !perms.starts_with("r-x") || !path.starts_with('/') {
            continue;
        }
        let mut r = range.split('-');
        let (Some(s), Some(e)) = (
            r.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
            r.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
        ) else {
            continue;
        };
        if (s..e).contains(&me) || n >= MAX_RANGES {
            continue;
        }
        RANGES[n].0.store(s, Relaxed);
        RANGES[n].1.store(e, Relaxed);
        n += 1;
    }
    RANGE_COUNT.store(n, Release);
    READY.store(true, Release);
    Ok(())
}

/// Whether the fast path is active in this process.
pub fn ready() -> bool {
    READY.load(Acquire)
}
