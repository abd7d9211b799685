//! Writing the output files. **Async-signal-safe**: these functions run on the writer thread
//! and, at `exit_group`/`execve` or when a queue is full and no writer exists, inside the
//! SIGSYS handler; they use only the shim's raw syscalls, stack buffers, per-slot scratch
//! memory and `mmap`ed temporary buffers (no allocation, no std I/O, no panics).
//!
//! Files (see [`crate::format::ptt`] for the byte layout):
//! - `<out>/<pid>-<nonce>.info`: the process info file of one process image;
//! - `<out>/<pid>-<nonce>-<tid>.ptt`: one per thread;
//! - `<out>/kernel.raw/<tid>.raw.pt`: DynamoRIO's PDB format, kernel modes only.
//!
//! `<nonce>` is 8 hex digits of the TSC when the image started tracing; it tells apart the
//! images of one pid before and after `execve`.

use super::frame::write_frame_parts;
use super::raw;
use super::slots::{self, Slot, EXITED, FREE, STATIC};
use crate::format::ptt::{
    self, encode_frame, encode_window, EndReason, FileKind, RecordType, Window,
};
use std::sync::atomic::Ordering::*;

use super::paths::{image_base as base_path, Path};

const CREATE: i32 = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC;

/// A temporary buffer from `mmap` holding a whole file read with raw syscalls.
struct MappedFile {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

impl MappedFile {
    fn read(path: &[u8]) -> Option<MappedFile> {
        let fd = raw::open(path, libc::O_RDONLY | libc::O_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let mut cap = 256 * 1024;
        let mut ptr = raw::mmap_anon(cap)?;
        let mut len = 0usize;
        loop {
            if len == cap {
                let ncap = cap * 2;
                let Some(np) = raw::mmap_anon(ncap) else {
                    break;
                };
                // SAFETY: both mappings are live, disjoint and at least `len` bytes long.
                unsafe { std::ptr::copy_nonoverlapping(ptr, np, len) };
                raw::munmap(ptr, cap);
                ptr = np;
                cap = ncap;
            }
            // ptr+len .. ptr+cap is inside the mapping.
            let r = raw::sys3(
                libc::SYS_read,
                fd as u64,
                ptr.wrapping_add(len) as u64,
                (cap - len) as u64,
            );
            if r == -(libc::EINTR as i64) {
                continue;
            }
            if r <= 0 {
                break;
            }
            len += r as usize;
        }
        raw::close(fd);
        Some(MappedFile { ptr, len, cap })
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the mapping were filled by read().
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        raw::munmap(self.ptr, self.cap);
    }
}

/// The identity of one process image: whose files are written.
#[derive(Clone, Copy, Debug)]
pub struct Image {
    pub pid: i32,
    pub nonce: u64,
    pub start_tsc: u64,
}

impl Image {
    /// The current image of this process (from the globals).
    pub fn current() -> Image {
        Image {
            pid: slots::PID.load(Relaxed),
            nonce: slots::NONCE.load(Relaxed),
            start_tsc: slots::START_TSC.load(Relaxed),
        }
    }
}

/// Creates the process info file for the current image (pid/nonce from the globals) and
/// keeps it open in `INFO_FD`.
pub fn write_info_file() -> bool {
    let fd = create_info_file(&Image::current());
    if fd < 0 {
        return false;
    }
    let old = slots::INFO_FD.swap(fd, AcqRel);
    raw::close(old);
    slots::PROCESS_ENDED.store(false, Relaxed);
    super::process::THREAD_FILES.store(0, Relaxed);
    true
}

/// Creates and fills the info file of `img`; returns its descriptor (O_APPEND) or -1.
pub fn create_info_file(img: &Image) -> i32 {
    let Some(st) = STATIC.get() else {
        return -1;
    };
    let Some(mut path) = base_path(img.pid, img.nonce) else {
        return -1;
    };
    if !path.push(b".info") {
        return -1;
    }
    let fd = raw::open(path.c_str(), CREATE | libc::O_APPEND, 0o644);
    if fd < 0 {
        return -1;
    }
    raw::write_all(fd, &ptt::encode_header(FileKind::ProcessInfo));
    let mono = raw::monotonic_ns();
    let tsc_now = raw::rdtsc();
    let mut fixed = [0u8; 40];
    fixed[0..4].copy_from_slice(&img.pid.to_le_bytes());
    fixed[4..8].copy_from_slice(&raw::getppid().to_le_bytes());
    fixed[8..16].copy_from_slice(&img.nonce.to_le_bytes());
    fixed[16..24].copy_from_slice(&img.start_tsc.to_le_bytes());
    fixed[24..32].copy_from_slice(&mono.to_le_bytes());
    fixed[32] = st.mode;
    fixed[33] = st.window.code();
    fixed[34] = st.backend;
    fixed[35] = u8::from(st.pt_present);
    write_frame_parts(fd, RecordType::Process, &[&fixed, st.reason.as_bytes()]);
    write_frame_parts(fd, RecordType::Config, &[st.config_text.as_bytes()]);
    write_frame_parts(fd, RecordType::Metadata, &[&st.metadata]);
    let mut clock = [0u8; 16];
    clock[0..8].copy_from_slice(&mono.to_le_bytes());
    clock[8..16].copy_from_slice(&tsc_now.to_le_bytes());
    write_frame_parts(fd, RecordType::Clock, &[&clock]);
    if let Some(f) = MappedFile::read(b"/proc/self/cmdline\0") {
        write_frame_parts(fd, RecordType::Cmdline, &[f.bytes()]);
    }
    let mut exe = [0u8; 4096];
    let n = raw::sys4(
        libc::SYS_readlinkat,
        libc::AT_FDCWD as i64 as u64,
        c"/proc/self/exe".as_ptr() as u64,
        exe.as_mut_ptr() as u64,
        exe.len() as u64,
    );
    if n > 0 {
        write_frame_parts(fd, RecordType::Exe, &[exe.get(..n as usize).unwrap_or(&[])]);
    }
    if let Some(f) = MappedFile::read(b"/proc/self/maps\0") {
        write_frame_parts(fd, RecordType::Maps, &[f.bytes()]);
    }
    let (vaddr, vlen) = st.vdso;
    if vaddr != 0 && vlen != 0 {
        // SAFETY: the vDSO is mapped readable at vaddr for vlen bytes for the whole life of
        // the process (measured from its ELF headers at start-up).
        let image = unsafe { std::slice::from_raw_parts(vaddr as *const u8, vlen) };
        write_frame_parts(fd, RecordType::Vdso, &[&vaddr.to_le_bytes(), image]);
    }
    fd
}

/// Appends a `Clock` and `ProcessEnd` to the info file (once).
pub fn write_process_end(reason: EndReason, code: i32) {
    if slots::PROCESS_ENDED.swap(true, AcqRel) {
        return;
    }
    let files = super::process::THREAD_FILES.load(Acquire);
    write_process_end_to(slots::INFO_FD.load(Acquire), reason, code, files);
}

/// Appends a `Clock` and `ProcessEnd` to the info file `fd` of an image for which
/// `thread_files` thread files were created.
pub fn write_process_end_to(fd: i32, reason: EndReason, code: i32, thread_files: u64) {
    if fd < 0 {
        return;
    }
    let mut clock = [0u8; 16];
    clock[0..8].copy_from_slice(&raw::monotonic_ns().to_le_bytes());
    clock[8..16].copy_from_slice(&raw::rdtsc().to_le_bytes());
    write_frame_parts(fd, RecordType::Clock, &[&clock]);
    let patched = super::process::PATCHED.load(Relaxed);
    let end = ptt::process_end_payload(reason, code, patched, thread_files);
    write_frame_parts(fd, RecordType::ProcessEnd, &[&end]);
}

fn open_thread_file(slot: &Slot, st: &slots::Static) -> i32 {
    let img = Image {
        pid: slot.pid.load(Relaxed),
        nonce: slot.nonce.load(Acquire),
        start_tsc: slots::START_TSC.load(Relaxed),
    };
    let fd = create_thread_file(&img, slot.tid.load(Relaxed), st);
    if fd >= 0 {
        super::process::THREAD_FILES.fetch_add(1, Release);
    }
    fd
}

/// Creates the file of thread `tid` of image `img` with its header; returns the fd or -1.
pub fn create_thread_file(img: &Image, tid: i32, st: &slots::Static) -> i32 {
    let (pid, nonce) = (img.pid, img.nonce);
    let Some(mut path) = base_path(pid, nonce) else {
        return -1;
    };
    if !(path.push(b"-") && path.push_dec(tid as u32 as u64) && path.push(b".ptt")) {
        return -1;
    }
    let fd = raw::open(path.c_str(), CREATE, 0o644);
    if fd < 0 {
        return fd;
    }
    let mut head = [0u8; 28];
    head[0..4].copy_from_slice(&pid.to_le_bytes());
    head[4..8].copy_from_slice(&tid.to_le_bytes());
    head[8] = st.mode;
    head[9] = st.window.code();
    head[10] = st.backend;
    head[11] = u8::from(st.pt_present);
    head[12..20].copy_from_slice(&nonce.to_le_bytes());
    head[20..28].copy_from_slice(&img.start_tsc.to_le_bytes());
    // One write for the file header and the ThreadHeader: a kill cannot leave a file
    // with one and not the other (the reason text is cut to fit a page).
    let mut buf = [0u8; 4096];
    buf[..ptt::HEADER_SIZE].copy_from_slice(&ptt::encode_header(FileKind::Thread));
    let room = buf.len() - ptt::HEADER_SIZE - ptt::FRAME_OVERHEAD - head.len();
    let reason = st.reason.as_bytes();
    let reason = reason.get(..room.min(reason.len())).unwrap_or(&[]);
    let n = encode_frame(
        buf.get_mut(ptt::HEADER_SIZE..).unwrap_or(&mut []),
        RecordType::ThreadHeader,
        |c| {
            c.bytes(&head);
            c.bytes(reason);
        },
    )
    .unwrap_or(0);
    raw::write_all(fd, buf.get(..ptt::HEADER_SIZE + n).unwrap_or(&[]));
    fd
}

use crate::format::pdb::{
    entry as pdb_entry, PDB_PID, PDB_PT_DATA_BOUNDARY as PDB_DATA,
    PDB_PT_METADATA_BOUNDARY as PDB_META, PDB_SYSCALL_ARGS_NUM as PDB_NARGS,
    PDB_SYSCALL_IDX as PDB_IDX, PDB_SYSNUM, PDB_THREAD_ID as PDB_TID,
};
/// Arguments written per syscall PDB (all six registers).
const PDB_ARGS: u64 = 6;

fn open_kernel_raw(slot: &Slot, st: &slots::Static) -> i32 {
    create_kernel_raw(slot.pid.load(Relaxed), slot.tid.load(Relaxed), st)
}

/// Opens (creating it with its metadata PDB when new) `kernel.raw/<tid>.raw.pt`.
pub fn create_kernel_raw(pid: i32, tid: i32, st: &slots::Static) -> i32 {
    let mut dir = Path::new();
    if !(dir.push(&st.out_dir) && dir.push(b"/kernel.raw")) {
        return -1;
    }
    raw::sys3(
        libc::SYS_mkdirat,
        libc::AT_FDCWD as i64 as u64,
        dir.c_str().as_ptr() as u64,
        0o755,
    );
    if !(dir.push(b"/") && dir.push_dec(tid as u32 as u64) && dir.push(b".raw.pt")) {
        return -1;
    }
    // A tid's file survives execve (same tid, new image): append, with the metadata PDB
    // only when the file is new.
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC;
    let fd = raw::open(dir.c_str(), flags | libc::O_EXCL, 0o644);
    if fd >= 0 {
        let pid = pid as u32 as u64;
        let mut b = [0u8; 24 + 18];
        b[0..8].copy_from_slice(&pdb_entry(PDB_PID, pid).to_le_bytes());
        b[8..16].copy_from_slice(&pdb_entry(PDB_TID, tid as u32 as u64).to_le_bytes());
        b[16..24].copy_from_slice(&pdb_entry(PDB_META, 18).to_le_bytes());
        b[24..42].copy_from_slice(&st.pt_metadata);
        raw::write_all(fd, &b);
        return fd;
    }
    raw::open(dir.c_str(), flags, 0o644)
}

/// One syscall PDB of `slot`'s thread without PT bytes (PT is absent or written by the
/// capture path).
pub fn encode_pdb(out: &mut [u8], slot: &Slot, w: &Window) -> Option<usize> {
    encode_pdb_for(out, slot.pid.load(Relaxed), slot.tid.load(Relaxed), w, 0)
}

/// The header and arguments of one syscall PDB of thread `tid` of process `pid` whose
/// `pt_len` PT bytes follow (written by the caller).
pub fn encode_pdb_for(
    out: &mut [u8],
    pid: i32,
    tid: i32,
    w: &Window,
    pt_len: u64,
) -> Option<usize> {
    let n = 48 + 8 * PDB_ARGS as usize;
    let dst = out.get_mut(..n)?;
    let (pid, tid) = (pid as u32 as u64, tid as u32 as u64);
    let entries = [
        pdb_entry(PDB_PID, pid).to_le_bytes(),
        pdb_entry(PDB_TID, tid).to_le_bytes(),
        pdb_entry(PDB_DATA, 48 + 8 * PDB_ARGS + pt_len).to_le_bytes(),
        pdb_entry(PDB_SYSNUM, w.nr).to_le_bytes(),
        pdb_entry(PDB_IDX, w.index).to_le_bytes(),
        pdb_entry(PDB_NARGS, PDB_ARGS).to_le_bytes(),
    ];
    for (i, e) in entries.iter().enumerate() {
        dst.get_mut(i * 8..i * 8 + 8)?.copy_from_slice(e);
    }
    for (i, a) in w.args.iter().enumerate() {
        dst.get_mut(48 + i * 8..56 + i * 8)?
            .copy_from_slice(&a.to_le_bytes());
    }
    Some(n)
}

/// Drains `slot` into its files. The caller holds the slot's drain lock.
pub fn drain_locked(slot: &Slot) {
    drain_locked_with(slot, true);
}

/// [`drain_locked`]; with `may_end` false, a thread that ended keeps its end for a later
/// call (the writer ends threads only after every window queued before their end, in any
/// thread, went through: see `super::writer`).
pub fn drain_locked_with(slot: &Slot, may_end: bool) {
    let Some(st) = STATIC.get() else { return };
    if slot.state.load(Acquire) == FREE {
        return;
    }
    let mut fd = slot.fd.load(Relaxed);
    if fd < 0 {
        fd = open_thread_file(slot, st);
        if fd < 0 {
            return;
        }
        slot.fd.store(fd, Relaxed);
    }
    let mut kfd = slot.kfd.load(Relaxed);
    if st.kernel_raw && kfd < 0 {
        kfd = open_kernel_raw(slot, st);
        slot.kfd.store(kfd, Relaxed);
    }
    // SAFETY: we hold the drain lock.
    let scratch = unsafe { slot.scratch() };
    let half = scratch.len() / 2;
    let (buf, kbuf) = scratch.split_at_mut(half);
    let (mut n, mut kn) = (0usize, 0usize);
    let flush = |buf: &mut [u8], n: &mut usize, fd: i32| {
        if *n > 0 {
            raw::write_all(fd, buf.get(..*n).unwrap_or(&[]));
            *n = 0;
        }
    };
    // Snapshot mode (see `super::snapshot::ring`): on the writer thread windows go into the
    // thread's ring; drained anywhere else (a handler at an exit, after the writer wrote
    // the rings) they belong to no snapshot and are not written.
    let snap = super::snapshot::writer_side::on();
    let snap_writer = snap && slots::untraced();
    // Windows leave the queue (and the spool) only once they are in the file: a kill in
    // between leaves them in the spool for the reader (see `super::spool`).
    let mut count = 0u64;
    while let Some(mut w) = slot.peek(count) {
        // A window closed after a cut request the writer has not taken yet waits for it
        // (at the next pass), with the windows behind it.
        if snap_writer
            && !super::snapshot::writer_side::may_take(super::userpt::closed_at(slot, &w))
        {
            break;
        }
        count += 1;
        if snap {
            if snap_writer {
                match super::userpt::window_pt(slot, &w, super::snapshot::writer_side::cut()) {
                    super::userpt::WindowPt::Pieces {
                        pieces,
                        sideband,
                        flags,
                        cuts,
                    } => super::snapshot::writer_side::push(
                        slot, fd, &w, pieces, sideband, flags, cuts,
                    ),
                    super::userpt::WindowPt::Some {
                        pt,
                        sideband,
                        flags,
                    } => {
                        let p = super::userpt::Piece {
                            pt,
                            tsc_start: w.tsc_start,
                            tsc_end: w.tsc_end,
                            mark: None,
                        };
                        let cuts = super::userpt::Cuts::default();
                        super::snapshot::writer_side::push(
                            slot,
                            fd,
                            &w,
                            vec![p],
                            sideband,
                            flags,
                            cuts,
                        );
                    }
                    super::userpt::WindowPt::Dropped => {
                        w.flags |= ptt::WF_PT_DROPPED;
                        super::snapshot::writer_side::push_plain(slot, fd, &w);
                    }
                    super::userpt::WindowPt::None => {
                        super::snapshot::writer_side::push_plain(slot, fd, &w)
                    }
                    super::userpt::WindowPt::Cut { fired } => {
                        super::snapshot::writer_side::cut_returned(slot, fd, &w, fired)
                    }
                }
            } else {
                // Not encodable here: its step buffer is freed, the window not written.
                let _ = super::userpt::window_pt(slot, &w, None);
            }
            continue;
        }
        // Hardware PT of a kernel-mode window, in place in the AUX mapping.
        if let Some(kp) = super::kernelpt::take_for(slot, &w) {
            flush(buf, &mut n, fd);
            w.flags |= kp.flags;
            super::userpt::write_window_parts(fd, &w, &kp.pieces, &[]);
            if kfd >= 0 {
                flush(kbuf, &mut kn, kfd);
                let (pid, tid) = (slot.pid.load(Relaxed), slot.tid.load(Relaxed));
                let mut head = [0u8; 128];
                if let Some(m) = encode_pdb_for(&mut head, pid, tid, &w, kp.len() as u64) {
                    raw::write_all(kfd, head.get(..m).unwrap_or(&[]));
                    for p in kp.pieces {
                        raw::write_all(kfd, p);
                    }
                }
            }
            super::kernelpt::release(slot, &kp);
            continue;
        }
        let put = |buf: &mut [u8], n: &mut usize, w: &Window| {
            for _ in 0..2 {
                if let Some(m) = encode_window(buf.get_mut(*n..).unwrap_or(&mut []), w, &[], &[]) {
                    *n += m;
                    return;
                }
                flush(buf, n, fd);
            }
        };
        // User PT of thread windows (emulated backend), see `super::userpt`.
        match super::userpt::window_pt(slot, &w, None) {
            super::userpt::WindowPt::Some {
                pt,
                sideband,
                flags,
            } => {
                flush(buf, &mut n, fd);
                w.flags |= flags;
                super::userpt::write_window(fd, &w, &pt, &sideband);
            }
            super::userpt::WindowPt::Dropped => {
                w.flags |= ptt::WF_PT_DROPPED;
                put(buf, &mut n, &w);
            }
            // (Pieces come only with a cut, in snapshot mode.)
            super::userpt::WindowPt::None
            | super::userpt::WindowPt::Pieces { .. }
            | super::userpt::WindowPt::Cut { .. } => put(buf, &mut n, &w),
        }
        if kfd >= 0 {
            for _ in 0..2 {
                if let Some(m) = encode_pdb(kbuf.get_mut(kn..).unwrap_or(&mut []), slot, &w) {
                    kn += m;
                    break;
                }
                flush(kbuf, &mut kn, kfd);
            }
        }
    }
    let dropped = slot.dropped().load(Relaxed);
    let dw = slot.dropped_written.load(Relaxed);
    if dropped > dw {
        let m = encode_frame(
            buf.get_mut(n..).unwrap_or(&mut []),
            RecordType::Dropped,
            |c| {
                c.u64(dropped - dw);
                c.u64(dropped);
            },
        );
        match m {
            Some(m) => n += m,
            None => {
                flush(buf, &mut n, fd);
                let mut tmp = [0u8; 32];
                if let Some(m) = encode_frame(&mut tmp, RecordType::Dropped, |c| {
                    c.u64(dropped - dw);
                    c.u64(dropped);
                }) {
                    raw::write_all(fd, tmp.get(..m).unwrap_or(&[]));
                }
            }
        }
        slot.dropped_written.store(dropped, Relaxed);
    }
    flush(buf, &mut n, fd);
    flush(kbuf, &mut kn, kfd);
    slot.release(count);
    if snap_writer {
        super::snapshot::writer_side::end_drain(slot, fd);
    }
    if !snap {
        slot.written.fetch_add(count, Relaxed);
    }
    let reason = slot.end_reason.load(Acquire);
    if may_end && reason != u32::MAX && slot.queued() == 0 && !slot.end_written.load(Relaxed) {
        if snap_writer {
            if let Some(r) = EndReason::from_raw(reason) {
                super::snapshot::writer_side::thread_end(slot, fd, r);
            }
        }
        let mut tmp = [0u8; 48];
        let written = slot.written.load(Relaxed);
        if let Some(m) = encode_frame(&mut tmp, RecordType::End, |c| {
            c.u32(reason);
            c.u32(0);
            c.u64(written);
            c.u64(dropped);
        }) {
            raw::write_all(fd, tmp.get(..m).unwrap_or(&[]));
        }
        slot.end_written.store(true, Relaxed);
        // The file is complete: the spool has nothing left to give.
        super::spool::remove(
            slot.pid.load(Relaxed),
            slot.nonce.load(Relaxed),
            slot.tid.load(Relaxed),
        );
        super::snapshot::writer_side::remove(
            slot.pid.load(Relaxed),
            slot.nonce.load(Relaxed),
            slot.tid.load(Relaxed),
        );
        if slot.state.load(Acquire) == EXITED {
            slot.forget_spool();
            slot.kpt.close();
            raw::close(fd);
            raw::close(kfd);
            slot.fd.store(-1, Relaxed);
            slot.kfd.store(-1, Relaxed);
            slot.state.store(FREE, Release);
        }
    }
}

/// Drains every slot of this process; with `end`, also ends every thread file and the
/// process info file. Used at `exit_group`, `execve` and by the writer's final pass.
pub fn drain_all(end: Option<(EndReason, i32)>) {
    for i in 0..slots::slot_count() {
        let Some(s) = slots::slot_at(i) else { continue };
        if s.state.load(Acquire) == FREE {
            continue;
        }
        s.lock_drain();
        if let Some((reason, _)) = end {
            let _ = s
                .end_reason
                .compare_exchange(u32::MAX, reason as u32, AcqRel, Relaxed);
        }
        drain_locked(s);
        s.unlock_drain();
    }
    if let Some((reason, code)) = end {
        write_process_end(reason, code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_pdb_boundary_counts_the_pt_that_follows() {
        let w = Window {
            index: 5,
            nr: 39,
            args: [1, 2, 3, 4, 5, 6],
            ..Window::default()
        };
        let mut out = [0u8; 128];
        let u = |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        for pt_len in [0u64, 100] {
            let n = encode_pdb_for(&mut out, 7, 8, &w, pt_len).unwrap();
            assert_eq!(n, 96);
            // [PID, TID, PT_DATA_BOUNDARY, SYSNUM, SYSCALL_IDX, ARGS_NUM] then 6 args;
            // the boundary is 48 + 8 * args + PT bytes (DynamoRIO's writer, REFERENCE §5).
            assert_eq!(u(&out, 0), pdb_entry(PDB_PID, 7));
            assert_eq!(u(&out, 1), pdb_entry(PDB_TID, 8));
            assert_eq!(u(&out, 2), pdb_entry(PDB_DATA, 96 + pt_len));
            assert_eq!(u(&out, 3), pdb_entry(PDB_SYSNUM, 39));
            assert_eq!(u(&out, 4), pdb_entry(PDB_IDX, 5));
            assert_eq!(u(&out, 5), pdb_entry(PDB_NARGS, 6));
            assert_eq!(u(&out, 6), 1);
            assert_eq!(u(&out, 11), 6);
        }
    }
}
