//! The names of a view's frames: one string table for the whole view, each process
//! image's frames (span addresses, inline keys) named through its [`ImageNames`], and what
//! a span of each costs in the JSON timeline.

use rustc_hash::FxHashMap;

use super::{spill, JSON_BYTES_PER_CALL};
use crate::names::ImageNames;

/// Interned frame names.
#[derive(Default)]
pub(super) struct Names {
    pub(super) strings: Vec<String>,
    pub(super) index: FxHashMap<String, u32>,
}

impl Names {
    pub(super) fn intern(&mut self, s: String) -> u32 {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.index.insert(s.clone(), i);
        self.strings.push(s);
        i
    }
    pub(super) fn get(&self, i: u32) -> &str {
        self.strings.get(i as usize).map_or("?", String::as_str)
    }
}

/// Names frames of one process image ([`ImageNames`]) as ids of the view's string table.
pub(super) struct Namer {
    pub(super) image: ImageNames,
    /// Name id of each frame address (trie node key) met.
    pub(super) ids: FxHashMap<u64, u32>,
    pub(super) frames: FrameTable,
}

/// The frames of one image's spans: the names each stands for (one, or for inlined code
/// one per function of its chain, outermost first) and what one of its spans costs in the
/// JSON timeline.
#[derive(Default)]
pub(super) struct FrameTable {
    pub(super) chains: Vec<Vec<u32>>,
    pub(super) costs: Vec<u64>,
    pub(super) index: FxHashMap<(u64, bool), u32>,
}

impl FrameTable {
    pub(super) fn chain(&self, frame: u32) -> &[u32] {
        self.chains.get(frame as usize).map_or(&[], Vec::as_slice)
    }
}

/// A frame name as folded stacks can hold it (their separators replaced).
pub(super) fn folded_safe(n: &str) -> String {
    n.chars()
        .map(|c| if c == ';' || c.is_control() { ':' } else { c })
        .collect()
}

/// The name id of a frame address (a trie node's key): an inline key's chain of functions
/// is one name of as many frames (folded stacks separate frames with ';').
pub(super) fn name_id(
    image: &ImageNames,
    ids: &mut FxHashMap<u64, u32>,
    names: &mut Names,
    addr: u64,
) -> u32 {
    if let Some(&i) = ids.get(&addr) {
        return i;
    }
    let name = match image.inline_chain(addr) {
        Some(chain) => chain
            .iter()
            .map(|n| format!("{} (inlined)", folded_safe(n)))
            .collect::<Vec<_>>()
            .join(";"),
        None => folded_safe(&image.name(addr)),
    };
    let i = names.intern(name);
    ids.insert(addr, i);
    i
}

impl Namer {
    pub(super) fn new(image: ImageNames) -> Self {
        Namer {
            image,
            ids: FxHashMap::default(),
            frames: FrameTable::default(),
        }
    }
}

/// [`spill::FrameIds`] of one image: a span's address -> its frame in the image's table.
pub(super) struct FrameNamer<'a> {
    pub(super) image: &'a ImageNames,
    pub(super) ids: &'a mut FxHashMap<u64, u32>,
    pub(super) frames: &'a mut FrameTable,
    pub(super) names: &'a mut Names,
}

impl spill::FrameIds for FrameNamer<'_> {
    fn frame(&mut self, addr: u64, inlined: bool) -> (u32, u64, u32) {
        if let Some(&f) = self.frames.index.get(&(addr, inlined)) {
            let width = self.frames.chain(f).len() as u32;
            return (
                f,
                self.frames.costs.get(f as usize).copied().unwrap_or(0),
                width,
            );
        }
        let chain = match self.image.inline_chain(addr).filter(|_| inlined) {
            Some(chain) => chain
                .iter()
                .map(|n| self.names.intern(format!("{} (inlined)", folded_safe(n))))
                .collect(),
            None => vec![name_id(self.image, self.ids, self.names, addr)],
        };
        let f = self.frames.chains.len() as u32;
        let c = chain
            .iter()
            .map(|&n| JSON_BYTES_PER_CALL + self.names.get(n).len() as u64)
            .sum();
        let width = chain.len() as u32;
        self.frames.chains.push(chain);
        self.frames.costs.push(c);
        self.frames.index.insert((addr, inlined), f);
        (f, c, width)
    }
}
