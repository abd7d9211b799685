//! Raw syscalls through the shim's own stub, and the assembly stubs Syscall User Dispatch
//! allows. **Async-signal-safe**: everything here is callable from the SIGSYS handler
//! (no allocation, no locks, no std I/O, no panics).
//!
//! Syscall User Dispatch lets syscalls through when the instruction *after* `syscall`
//! lies in `[SUD_BEGIN, SUD_BEGIN + len)`. The allowed range holds:
//! - `pttracer_syscall6`: `extern "C" fn(nr, a1..a6) -> i64`, used for every syscall the
//!   shim itself makes (so the selector byte never has to change);
//! - `pttracer_sigreturn`: `rt_sigreturn`, used as the SIGSYS handler's `sa_restorer` and as
//!   the resume point of an application `rt_sigreturn` that trapped;
//! - `pttracer_reissue_clone`: re-executes a thread-creating `clone`/`clone3` with the
//!   application's registers after the handler returned (the child must start on its own
//!   stack, which a syscall made inside the handler cannot give it). Parent and child find
//!   their resume address 136 bytes below their stack pointer and `ret 128` to it, so the
//!   128-byte red zone is preserved. The parent then jumps to `pttracer_notify_clone`,
//!   which lies *outside* the range: its `syscall` traps once more with the clone result in
//!   RAX (the trap is recognized by its address, [`notify_resume`]), so the handler can
//!   record the result and leave RAX unchanged. The child arms Syscall User Dispatch for
//!   itself first: the kernel does not carry it over to new threads (it does to forked
//!   processes). (No other register can carry the result: `syscall` itself overwrites
//!   RCX and R11, and the application expects every other register preserved.) When user
//!   code is stepped, the child then traps once from `pttracer_child_start` (outside the
//!   range), and the handler resumes it at its resume address with stepping armed, so the
//!   thread is traced from its first instruction.

use core::arch::global_asm;

global_asm!(
    ".pushsection .text.pttracer_sud,\"ax\",@progbits",
    ".p2align 4",
    ".globl pttracer_notify_clone",
    ".hidden pttracer_notify_clone",
    "pttracer_notify_clone:",
    "    syscall",
    "    ret 128",
    ".p2align 4",
    ".globl pttracer_child_start",
    ".hidden pttracer_child_start",
    "pttracer_child_start:",
    "    mov eax, 39",
    "    syscall",
    // Not reached: the handler resumes at the application's resume address.
    "    xor eax, eax",
    "    ret 128",
    ".p2align 4",
    ".globl pttracer_sud_begin",
    ".hidden pttracer_sud_begin",
    "pttracer_sud_begin:",
    ".globl pttracer_syscall6",
    ".hidden pttracer_syscall6",
    "pttracer_syscall6:",
    "    mov rax, rdi",
    "    mov rdi, rsi",
    "    mov rsi, rdx",
    "    mov rdx, rcx",
    "    mov r10, r8",
    "    mov r8, r9",
    "    mov r9, [rsp + 8]",
    "    syscall",
    "    ret",
    ".globl pttracer_sigreturn",
    ".hidden pttracer_sigreturn",
    "pttracer_sigreturn:",
    "    mov eax, 15",
    "    syscall",
    "    ud2",
    ".globl pttracer_reissue_clone",
    ".hidden pttracer_reissue_clone",
    "pttracer_reissue_clone:",
    "    syscall",
    "    test rax, rax",
    "    jnz pttracer_notify_clone",
    // The child. A new thread does not inherit Syscall User Dispatch: arm it here,
    // before it runs a single application instruction (registers saved on its new stack,
    // below the resume address).
    "    push rdi",
    "    push rsi",
    "    push rdx",
    "    push r10",
    "    push r8",
    "    mov eax, 157",
    "    mov edi, 59",
    "    mov esi, 1",
    "    lea rdx, [rip + pttracer_sud_begin]",
    "    lea r10, [rip + pttracer_sud_end]",
    "    sub r10, rdx",
    "    add r10, 1",
    "    lea r8, [rip + pttracer_selector]",
    "    syscall",
    "    pop r8",
    "    pop r10",
    "    pop rdx",
    "    pop rsi",
    "    pop rdi",
    // When new threads are stepped from their first instruction, trap once more from
    // outside the range: the handler then returns straight to the application with
    // stepping armed (see `child_start_resume`).
    "    cmp byte ptr [rip + pttracer_step_new_threads], 0",
    "    jne pttracer_child_start",
    "    xor eax, eax",
    "    ret 128",
    ".globl pttracer_sud_end",
    ".hidden pttracer_sud_end",
    "pttracer_sud_end:",
    "    ud2",
    ".popsection",
    ".pushsection .data.pttracer_selector,\"aw\",@progbits",
    ".globl pttracer_selector",
    ".hidden pttracer_selector",
    "pttracer_selector:",
    "    .byte 1",
    ".globl pttracer_step_new_threads",
    ".hidden pttracer_step_new_threads",
    "pttracer_step_new_threads:",
    "    .byte 0",
    ".popsection",
);

extern "C" {
    fn pttracer_syscall6(nr: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64, a6: u64) -> i64;
    static pttracer_sud_begin: u8;
    static pttracer_sud_end: u8;
    static pttracer_sigreturn: u8;
    static pttracer_reissue_clone: u8;
    static pttracer_notify_clone: u8;
    static pttracer_selector: u8;
    static pttracer_child_start: u8;
    static mut pttracer_step_new_threads: u8;
}

/// Makes new threads trap once at their start (see `child_start_resume`), so that user-mode
/// stepping covers them from their first instruction. Normal context, at start-up.
pub fn step_new_threads() {
    // SAFETY: a byte of our own data section, written before any thread is created through
    // the shim and read only by the clone stub.
    unsafe { core::ptr::addr_of_mut!(pttracer_step_new_threads).write_volatile(1) };
}

/// Address just after the `syscall` of the child-start stub (the RIP its trap reports):
/// a new thread whose next instruction is `ret 128` to its resume address, RAX to be 0.
pub fn child_start_resume() -> u64 {
    // `mov eax, 39` (5 bytes) + `syscall` (2 bytes).
    core::ptr::addr_of!(pttracer_child_start) as u64 + 7
}

/// The process-wide Syscall User Dispatch selector byte: BLOCK (1) from the start and never
/// changed (the shim's own syscalls are in the allowed range).
pub fn selector_addr() -> u64 {
    core::ptr::addr_of!(pttracer_selector) as u64
}

/// Start and length of the range SUD lets through (covers the byte after the last
/// `syscall` of the range).
pub fn allowed_range() -> (u64, u64) {
    // Taking the address of a linker symbol reads nothing.
    let (b, e) = (
        core::ptr::addr_of!(pttracer_sud_begin) as u64,
        core::ptr::addr_of!(pttracer_sud_end) as u64,
    );
    (b, e - b + 1)
}

/// Address of the in-range `rt_sigreturn` stub.
pub fn sigreturn_stub() -> u64 {
    core::ptr::addr_of!(pttracer_sigreturn) as u64
}

/// Address of the in-range clone reissue stub.
pub fn reissue_clone_stub() -> u64 {
    core::ptr::addr_of!(pttracer_reissue_clone) as u64
}

/// Address just after the `syscall` of the notify stub (the RIP its trap reports).
pub fn notify_resume() -> u64 {
    // The stub starts with `syscall` (2 bytes).
    core::ptr::addr_of!(pttracer_notify_clone) as u64 + 2
}

/// Performs syscall `nr` through the allowed stub; returns the raw result (-errno on error).
#[inline]
pub fn sys6(nr: u64, a: [u64; 6]) -> i64 {
    // SAFETY: the stub is a plain syscall; the caller is responsible for the syscall's
    // own memory semantics (callers below only pass pointers to live buffers).
    unsafe { pttracer_syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

#[inline]
pub fn sys0(nr: i64) -> i64 {
    sys6(nr as u64, [0; 6])
}
#[inline]
pub fn sys1(nr: i64, a: u64) -> i64 {
    sys6(nr as u64, [a, 0, 0, 0, 0, 0])
}
#[inline]
pub fn sys2(nr: i64, a: u64, b: u64) -> i64 {
    sys6(nr as u64, [a, b, 0, 0, 0, 0])
}
#[inline]
pub fn sys3(nr: i64, a: u64, b: u64, c: u64) -> i64 {
    sys6(nr as u64, [a, b, c, 0, 0, 0])
}
#[inline]
pub fn sys4(nr: i64, a: u64, b: u64, c: u64, d: u64) -> i64 {
    sys6(nr as u64, [a, b, c, d, 0, 0])
}

/// Reads the time-stamp counter.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc is available on every x86-64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

pub fn gettid() -> i32 {
    sys0(libc::SYS_gettid) as i32
}
pub fn getpid() -> i32 {
    sys0(libc::SYS_getpid) as i32
}
pub fn getppid() -> i32 {
    sys0(libc::SYS_getppid) as i32
}

/// CLOCK_MONOTONIC in ns via the real syscall (not the vDSO, which SUD would trap when it
/// falls back to a syscall).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let r = sys2(
        libc::SYS_clock_gettime,
        libc::CLOCK_MONOTONIC as u64,
        core::ptr::addr_of_mut!(ts) as u64,
    );
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Writes all of `buf` to `fd` (in calls of at most [`pttrace_format::ptt::WRITE_PIECE`]
/// bytes, retrying on EINTR and short writes). Returns false on error.
pub fn write_all(fd: i32, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        let r = sys3(
            libc::SYS_write,
            fd as u64,
            buf.as_ptr() as u64,
            buf.len().min(pttrace_format::ptt::WRITE_PIECE) as u64,
        );
        if r == -(libc::EINTR as i64) {
            continue;
        }
        if r <= 0 {
            return false;
        }
        buf = buf.get(r as usize..).unwrap_or(&[]);
    }
    true
}

/// Opens NUL-terminated `path`.
pub fn open(path: &[u8], flags: i32, mode: u32) -> i32 {
    sys4(
        libc::SYS_openat,
        libc::AT_FDCWD as i64 as u64,
        path.as_ptr() as u64,
        flags as u64,
        u64::from(mode),
    ) as i32
}

pub fn close(fd: i32) {
    if fd >= 0 {
        sys1(libc::SYS_close, fd as u64);
    }
}

pub fn ftruncate(fd: i32, len: u64) -> i64 {
    sys2(libc::SYS_ftruncate, fd as u64, len)
}

/// Current file offset (lseek(fd, 0, SEEK_CUR)).
pub fn tell(fd: i32) -> i64 {
    sys3(libc::SYS_lseek, fd as u64, 0, libc::SEEK_CUR as u64)
}

/// Size of the file behind `fd` (moves the offset to the end; for O_APPEND files).
pub fn end_of(fd: i32) -> i64 {
    if fd < 0 {
        return -1;
    }
    sys3(libc::SYS_lseek, fd as u64, 0, libc::SEEK_END as u64)
}

pub fn sched_yield() {
    sys0(libc::SYS_sched_yield);
}

/// Sleeps for `ns` nanoseconds (EINTR ends the sleep early).
pub fn nanosleep(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    sys2(libc::SYS_nanosleep, core::ptr::addr_of!(ts) as u64, 0);
}

/// Anonymous private read-write mapping; `None` on failure.
pub fn mmap_anon(len: usize) -> Option<*mut u8> {
    let r = sys6(
        libc::SYS_mmap as u64,
        [
            0,
            len as u64,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    );
    if (-4095..0).contains(&r) {
        None
    } else {
        Some(r as *mut u8)
    }
}

/// Shared read-write mapping of the first `len` bytes of `fd`; `None` on failure.
pub fn mmap_shared(fd: i32, len: usize) -> Option<*mut u8> {
    let r = sys6(
        libc::SYS_mmap as u64,
        [
            0,
            len as u64,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            libc::MAP_SHARED as u64,
            fd as u64,
            0,
        ],
    );
    if (-4095..0).contains(&r) {
        None
    } else {
        Some(r as *mut u8)
    }
}

/// fallocate(fd, 0, 0, len): reserves the blocks (a store into a shared mapping of a sparse
/// file on a full disk would raise SIGBUS).
pub fn fallocate(fd: i32, len: u64) -> i64 {
    sys4(libc::SYS_fallocate, fd as u64, 0, 0, len)
}

/// Renames NUL-terminated `from` to `to`.
pub fn rename(from: &[u8], to: &[u8]) -> i64 {
    sys4(
        libc::SYS_renameat,
        libc::AT_FDCWD as i64 as u64,
        from.as_ptr() as u64,
        libc::AT_FDCWD as i64 as u64,
        to.as_ptr() as u64,
    )
}

/// Removes NUL-terminated `path`.
pub fn unlink(path: &[u8]) -> i64 {
    sys3(
        libc::SYS_unlinkat,
        libc::AT_FDCWD as i64 as u64,
        path.as_ptr() as u64,
        0,
    )
}

pub fn munmap(p: *mut u8, len: usize) {
    sys2(libc::SYS_munmap, p as u64, len as u64);
}

/// futex(FUTEX_WAKE) on `word` (all waiters).
pub fn futex_wake(word: &core::sync::atomic::AtomicU32) {
    sys3(
        libc::SYS_futex,
        word.as_ptr() as u64,
        libc::FUTEX_WAKE as u64,
        i32::MAX as u64,
    );
}

/// futex(FUTEX_WAIT) on `word` while it equals `val`, at most `ns` nanoseconds.
pub fn futex_wait(word: &core::sync::atomic::AtomicU32, val: u32, ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    sys4(
        libc::SYS_futex,
        word.as_ptr() as u64,
        libc::FUTEX_WAIT as u64,
        u64::from(val),
        core::ptr::addr_of!(ts) as u64,
    );
}

/// Formats `v` in decimal into `out`, returning the digits written.
pub fn fmt_dec(out: &mut [u8], v: u64) -> usize {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    let mut x = v;
    loop {
        if let Some(t) = tmp.get_mut(n) {
            *t = b'0' + (x % 10) as u8;
        }
        n += 1;
        x /= 10;
        if x == 0 || n >= tmp.len() {
            break;
        }
    }
    let mut w = 0;
    while w < n {
        match (out.get_mut(w), tmp.get(n - 1 - w)) {
            (Some(o), Some(t)) => *o = *t,
            _ => return w,
        }
        w += 1;
    }
    n
}

/// Formats `v` as `digits` lowercase hex digits into `out`.
pub fn fmt_hex(out: &mut [u8], v: u64, digits: usize) -> usize {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut w = 0;
    while w < digits {
        let shift = 4 * (digits - 1 - w);
        let nib = if shift < 64 { (v >> shift) & 0xF } else { 0 };
        match out.get_mut(w) {
            Some(o) => *o = HEX[nib as usize],
            None => return w,
        }
        w += 1;
    }
    w
}

/// A small append-only byte buffer on the stack for building paths without allocation.
pub struct PathBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for PathBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> PathBuf<N> {
    pub const fn new() -> Self {
        PathBuf {
            buf: [0; N],
            len: 0,
        }
    }
    /// Appends bytes; returns false (and appends nothing) when they do not fit with a NUL.
    pub fn push(&mut self, b: &[u8]) -> bool {
        let end = self.len + b.len();
        if end + 1 > N {
            return false;
        }
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            dst.copy_from_slice(b);
            self.len = end;
            true
        } else {
            false
        }
    }
    pub fn push_dec(&mut self, v: u64) -> bool {
        let mut t = [0u8; 20];
        let n = fmt_dec(&mut t, v);
        self.push(t.get(..n).unwrap_or(&[]))
    }
    pub fn push_hex(&mut self, v: u64, digits: usize) -> bool {
        let mut t = [0u8; 16];
        let n = fmt_hex(&mut t, v, digits.min(16));
        self.push(t.get(..n).unwrap_or(&[]))
    }
    /// The NUL-terminated bytes.
    pub fn c_str(&mut self) -> &[u8] {
        if let Some(b) = self.buf.get_mut(self.len) {
            *b = 0;
        }
        self.buf.get(..=self.len).unwrap_or(&[])
    }
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_performs_syscalls() {
        assert_eq!(getpid(), std::process::id() as i32);
        assert_eq!(gettid(), crate::tracer::current_tid());
        // A bad fd gives -EBADF, not a crash.
        assert_eq!(sys1(libc::SYS_close, u64::MAX >> 1), -(libc::EBADF as i64));
    }

    #[test]
    fn range_covers_every_allowed_syscall() {
        let (b, len) = allowed_range();
        for stub in [sigreturn_stub(), reissue_clone_stub()] {
            assert!(stub >= b && stub < b + len);
        }
        // The notify stub must trap: its resume address lies outside the range.
        let n = notify_resume();
        assert!(n < b || n >= b + len);
        // The bytes at the notify stub are what notify_resume assumes.
        // SAFETY: reading 5 bytes of our own code.
        let code = unsafe { std::slice::from_raw_parts((n - 2) as *const u8, 5) };
        assert_eq!(&code[0..2], &[0x0f, 0x05]); // syscall
        assert_eq!(&code[2..5], &[0xc2, 0x80, 0x00]); // ret 128
    }

    /// A buffer of several pieces, the last one short, is written whole and in order.
    #[test]
    fn write_all_writes_a_large_buffer_whole() {
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join(format!("pttrace-raw-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        let buf: Vec<u8> = (0..pttrace_format::ptt::WRITE_PIECE * 2 + 12345)
            .map(|i| (i % 253) as u8)
            .collect();
        assert!(write_all(f.as_raw_fd(), &buf));
        assert!(write_all(f.as_raw_fd(), b"end"));
        drop(f);
        let got = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(got.len(), buf.len() + 3);
        assert!(got[..buf.len()] == buf[..] && &got[buf.len()..] == b"end");
    }

    #[test]
    fn formatting() {
        let mut p = PathBuf::<32>::new();
        assert!(p.push(b"/a/"));
        assert!(p.push_dec(4096));
        assert!(p.push(b"-"));
        assert!(p.push_hex(0xbeef, 8));
        assert_eq!(p.as_bytes(), b"/a/4096-0000beef");
        assert_eq!(p.c_str().last(), Some(&0));
        let mut small = PathBuf::<4>::new();
        assert!(!small.push(b"abcd"));
        assert!(small.push(b"abc"));
    }
}
