//! Sideband on the fast decoder: image changes (mmap, exec, code records) that happen
//! during a window, applied where libipt's path applies them.
//!
//! When: libipt's path applies the events whose perf time the trace's time has passed
//! before each block, and the trace's time moves only at events; so the fast decoder
//! applies them right after each event that moves its time (the same events, with the
//! same times: their timestamps are libipt's). Two cases where libipt's time could differ
//! go to libipt (the window whole, from its own image and events): the time going back
//! (a damaged TSC) over an event applied, which libipt's path may apply only later; and a
//! decode error while events are pending, after which libipt's time can come from
//! packets the fast decoder does not read.
//!
//! The blocks built before: they keep their records where the change leaves their code
//! as it was, the bytes of every page they were read from (a page found without code
//! included) the same before and after. Where one differs, code already decoded changed:
//! applied while tracing is off (no block is walked until it is on again), the blocks are
//! built anew from the new image at the TIP.PGE that enables it (as after every system
//! call where only user code is traced: where mappings change); applied while code is
//! walked, or followed by another way of enabling, the window goes to libipt.

use super::{Fallback, FlowTable, PtDecoder, CODE_PAGE};
use crate::image::AddressSpace;
use crate::insn::ArenaTied;
use crate::sideband::ImageChange;

/// Why the fast decoder hands a window over where sideband changed code it decoded.
pub(super) const CODE_CHANGED: Fallback =
    "an image change (sideband) over code decoded before it in the window";

/// The bytes of a page as an address space gives them (what it reads from the page's
/// start: a page partly or not mapped reads shorter).
fn page_bytes(space: &AddressSpace, page: u64) -> Vec<u8> {
    let mut buf = vec![0u8; CODE_PAGE as usize];
    let n = space.read(page.wrapping_mul(CODE_PAGE), &mut buf);
    buf.truncate(n);
    buf
}

/// The pages of `table` that `change` may alter.
fn pages_touched(table: &FlowTable, change: &ImageChange, out: &mut Vec<u64>) {
    let (addr, len) = match change {
        ImageChange::Map { addr, len, .. } => (*addr, *len),
        ImageChange::Code { addr, bytes } => (*addr, bytes.len() as u64),
        ImageChange::Exec { .. } => {
            out.extend(table.pages.iter().copied());
            return;
        }
        ImageChange::Lost { .. } => return,
    };
    if len == 0 {
        return;
    }
    let first = addr / CODE_PAGE;
    let last = addr.saturating_add(len - 1) / CODE_PAGE;
    if last - first >= table.pages.len() as u64 {
        out.extend(
            table
                .pages
                .iter()
                .copied()
                .filter(|p| (first..=last).contains(p)),
        );
    } else {
        out.extend((first..=last).filter(|p| table.pages.contains(p)));
    }
}

impl PtDecoder<'_> {
    /// Applies the sideband events the trace's time (`self.tsc`) has passed, keeping the
    /// blocks built so far where their code did not change; otherwise, while tracing is
    /// `off`, notes that they are built anew at the next TIP.PGE (`sideband_rebuild`),
    /// and while code is walked notes the fallback (`sideband_failed`: the run in
    /// progress ends in it, nothing after handed out).
    #[cold]
    #[inline(never)]
    pub(in crate::pipeline) fn flow_sideband(&mut self, off: bool) {
        if self.sideband_failed.is_some() {
            return;
        }
        let (Some(conv), Some(tsc)) = (self.params.time, self.tsc) else {
            return;
        };
        let now = conv.tsc_to_perf_time(tsc);
        if self.timeline.last_applied_time().is_some_and(|t| t > now) {
            // The trace's time went back (a damaged TSC...) over an event applied at the
            // later time: libipt's path, which applies them only before its next block,
            // may not have applied it yet.
            self.sideband_failed = Some("the trace's time went back over sideband applied");
            return;
        }
        let Some(due) = self.timeline.due(now) else {
            return;
        };
        let mut pages = Vec::new();
        for e in due {
            pages_touched(&self.blocks.flow, &e.change, &mut pages);
        }
        pages.sort_unstable();
        pages.dedup();
        let before: Vec<Vec<u8>> = match self.shared.space.try_borrow() {
            Ok(space) => pages.iter().map(|&p| page_bytes(&space, p)).collect(),
            Err(_) => {
                self.sideband_failed = Some("image busy");
                return;
            }
        };
        self.apply_sideband(Some(now));
        let Ok(space) = self.shared.space.try_borrow() else {
            self.sideband_failed = Some("image busy");
            return;
        };
        let same = pages
            .iter()
            .zip(&before)
            .all(|(&p, old)| page_bytes(&space, p) == *old);
        let generation = space.generation();
        drop(space);
        self.blocks.keep_for(generation);
        if !same {
            if off {
                self.sideband_rebuild = true;
            } else {
                self.sideband_failed = Some(CODE_CHANGED);
            }
        }
    }

    /// At a TIP.PGE, after sideband applied while tracing was off changed code already
    /// decoded: the blocks are built anew (the records already queued stay in the arena).
    pub(in crate::pipeline) fn flow_blocks_anew_for_sideband(&mut self) {
        if std::mem::take(&mut self.sideband_rebuild) {
            self.blocks.flow.clear();
        }
    }
}
