//! The collapsed stacks of every thread, as one trie of frame names (a thread's stacks
//! under its command's name), and the bounded ways to write it: `stacks.folded` within a
//! size (the stacks of the least executed subtrees merged into one `[merged]` frame under
//! their caller, which says so) and the lines a flame graph can show.

use rustc_hash::FxHashMap;
use std::io::{self, Write};

use drpttracer::decode::callstack::StackTrie;

/// The frame that stands for merged stacks.
pub const MERGED: &str = "[merged: smaller stacks]";

const NONE: u32 = u32::MAX;

#[derive(Default)]
pub struct Folded {
    /// (parent, name id, self count); a node's parent comes before it.
    nodes: Vec<(u32, u32, u64)>,
    index: FxHashMap<(u32, u32), u32>,
}

/// What [`Folded::write`] wrote.
pub struct Written {
    /// Frames merged, and the instructions below which a subtree was merged (0: none).
    pub merged_frames: u64,
    pub merged_below: u64,
}

impl Folded {
    fn node(&mut self, parent: u32, name: u32) -> u32 {
        if let Some(&n) = self.index.get(&(parent, name)) {
            return n;
        }
        let n = self.nodes.len() as u32;
        self.nodes.push((parent, name, 0));
        self.index.insert((parent, name), n);
        n
    }

    /// Adds a thread's stacks under the frame `root` (its command), each node named by
    /// `name(key)`.
    pub fn add_thread(&mut self, root: u32, trie: &StackTrie, mut name: impl FnMut(u64) -> u32) {
        let top = self.node(NONE, root);
        let mut map = vec![NONE; trie.nodes.len()];
        trie.walk(|k, parent, n| {
            let p = parent
                .and_then(|p| map.get(p as usize).copied())
                .unwrap_or(top);
            let id = self.node(p, name(n.key));
            if let Some(m) = map.get_mut(k as usize) {
                *m = id;
            }
            if let Some(node) = self.nodes.get_mut(id as usize) {
                node.2 += n.count;
            }
        });
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.iter().all(|n| n.2 == 0)
    }

    /// Instructions of each node's subtree.
    fn inclusive(&self) -> Vec<u64> {
        let mut inc: Vec<u64> = self.nodes.iter().map(|n| n.2).collect();
        for i in (0..self.nodes.len()).rev() {
            let p = self.nodes[i].0;
            if p != NONE {
                let v = inc[i];
                if let Some(x) = inc.get_mut(p as usize) {
                    *x += v;
                }
            }
        }
        inc
    }

    /// Bytes of the file when subtrees under `t` instructions are merged. (`merged`: a
    /// node's merged instructions, all 0, left so; `touched`: scratch. Made once for the
    /// search: a table of every node zeroed for each try was most of its time.)
    fn size(
        &self,
        inc: &[u64],
        pathlen: &[u64],
        t: u64,
        (merged, touched): (&mut [u64], &mut Vec<u32>),
    ) -> u64 {
        let mut size = 0u64;
        let digits = |v: u64| v.checked_ilog10().map_or(1, |d| d as u64 + 1);
        for (i, &(p, _, count)) in self.nodes.iter().enumerate() {
            if p != NONE && inc[i] < t {
                // (A root is written whatever its size, as `lines` writes it.)
                let parent_kept =
                    inc[p as usize] >= t || self.nodes.get(p as usize).is_some_and(|n| n.0 == NONE);
                if parent_kept {
                    if let Some(m) = merged.get_mut(p as usize) {
                        if *m == 0 {
                            touched.push(p);
                        }
                        *m += inc[i];
                    }
                }
                continue;
            }
            if count > 0 {
                size += pathlen[i] + 2 + digits(count);
            }
        }
        for p in touched.drain(..) {
            if let Some(m) = merged.get_mut(p as usize) {
                size += pathlen[p as usize] + 1 + MERGED.len() as u64 + 2 + digits(*m);
                *m = 0;
            }
        }
        size
    }

    /// The length of each node's path (`a;b;c`), its names' lengths given by `names`.
    fn path_lengths(&self, names: &dyn Fn(u32) -> usize) -> Vec<u64> {
        let mut pathlen = vec![0u64; self.nodes.len()];
        for (i, &(p, name, _)) in self.nodes.iter().enumerate() {
            let above = if p == NONE {
                0
            } else {
                pathlen[p as usize] + 1
            };
            pathlen[i] = above + names(name) as u64;
        }
        pathlen
    }

    /// The smallest subtree size kept so that the file stays within `limit` bytes (1: all).
    fn threshold(&self, inc: &[u64], names: &dyn Fn(u32) -> usize, limit: Option<u64>) -> u64 {
        let Some(limit) = limit else {
            return 1;
        };
        let pathlen = self.path_lengths(names);
        let mut merged = vec![0u64; self.nodes.len()];
        let mut touched = Vec::new();
        let mut size = |t| self.size(inc, &pathlen, t, (&mut merged, &mut touched));
        if size(1) <= limit {
            return 1;
        }
        let (mut lo, mut hi) = (1u64, inc.iter().copied().max().unwrap_or(1) + 1);
        // size(lo) > limit >= size(hi)
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if size(mid) <= limit {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// Calls `line` with each line (`a;b;c N`) of the stacks, subtrees of fewer than `t`
    /// instructions merged; in depth-first order, siblings by name.
    fn lines<'n>(
        &self,
        inc: &[u64],
        names: &dyn Fn(u32) -> &'n str,
        t: u64,
        mut line: impl FnMut(&str) -> io::Result<()>,
    ) -> io::Result<(u64, u64)> {
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); self.nodes.len()];
        let mut roots = Vec::new();
        for (i, &(p, _, _)) in self.nodes.iter().enumerate() {
            match children.get_mut(p as usize) {
                Some(c) => c.push(i as u32),
                None => roots.push(i as u32),
            }
        }
        let by_name = |v: &mut Vec<u32>| {
            v.sort_by(|&a, &b| names(self.nodes[a as usize].1).cmp(names(self.nodes[b as usize].1)))
        };
        by_name(&mut roots);
        let (mut lines, mut merged_frames) = (0u64, 0u64);
        let mut path = String::new();
        // (node, path length before it); a node is visited once on the way down.
        let mut todo: Vec<(u32, usize)> = roots.iter().rev().map(|&r| (r, 0)).collect();
        while let Some((k, above)) = todo.pop() {
            path.truncate(above);
            let (_, name, count) = self.nodes[k as usize];
            if above > 0 {
                path.push(';');
            }
            path.push_str(names(name));
            let len = path.len();
            if count > 0 {
                path.push_str(&format!(" {count}"));
                line(&path)?;
                lines += 1;
                path.truncate(len);
            }
            let kids = &mut children[k as usize];
            by_name(kids);
            let mut merged = 0u64;
            for &c in kids.iter() {
                if inc[c as usize] < t {
                    merged += inc[c as usize];
                    merged_frames += 1;
                }
            }
            if merged > 0 {
                path.push(';');
                path.push_str(MERGED);
                path.push_str(&format!(" {merged}"));
                line(&path)?;
                lines += 1;
                path.truncate(len);
            }
            for &c in kids.iter().rev() {
                if inc[c as usize] >= t {
                    todo.push((c, len));
                }
            }
        }
        Ok((lines, merged_frames))
    }

    /// Writes the lines to `out`, within `limit` bytes when given.
    pub fn write<'n>(
        &self,
        names: &dyn Fn(u32) -> &'n str,
        limit: Option<u64>,
        out: &mut dyn Write,
    ) -> io::Result<Written> {
        let inc = self.inclusive();
        let t = self.threshold(&inc, &|n| names(n).len(), limit);
        let (_, merged_frames) = self.lines(&inc, names, t, |l| {
            out.write_all(l.as_bytes())?;
            out.write_all(b"\n")
        })?;
        Ok(Written {
            merged_frames,
            merged_below: if merged_frames > 0 { t } else { 0 },
        })
    }

    /// The lines a flame graph of `width` pixels can show (subtrees narrower than a tenth
    /// of a pixel merged).
    pub fn lines_for_width<'n>(&self, names: &dyn Fn(u32) -> &'n str, width: u64) -> Vec<String> {
        let total: u64 = self.nodes.iter().map(|n| n.2).sum();
        let t = (total / (width.max(1) * 10)).max(1);
        let mut v = Vec::new();
        let _ = self.lines(&self.inclusive(), names, t, |l| {
            v.push(l.to_string());
            Ok(())
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program's stacks: `prog` calling `main`, which calls 40 functions of 1 to 40
    /// instructions' subtrees (each with a callee of its own), and `init`.
    fn stacks() -> (Folded, Vec<String>) {
        let mut names = vec!["prog".to_string(), "main".to_string(), "init".to_string()];
        let mut f = Folded::default();
        let prog = f.node(NONE, 0);
        let main = f.node(prog, 1);
        let init = f.node(prog, 2);
        f.nodes[main as usize].2 = 7;
        f.nodes[init as usize].2 = 3;
        for k in 1..=40u64 {
            names.push(format!("f{k}"));
            names.push(format!("g{k}"));
            let fk = f.node(main, names.len() as u32 - 2);
            let gk = f.node(fk, names.len() as u32 - 1);
            f.nodes[fk as usize].2 = k / 2;
            f.nodes[gk as usize].2 = k - k / 2;
        }
        (f, names)
    }

    /// Each line's count, summed.
    fn total(text: &str) -> u64 {
        text.lines()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// The size the threshold search computes is the size of the lines written, at every
    /// threshold; a limit keeps the file within it, merges the smallest subtrees into
    /// `[merged: smaller stacks]` frames under their callers and keeps every instruction.
    #[test]
    fn bounded_stacks_are_within_the_limit_and_count_every_instruction() {
        let (f, names) = stacks();
        let name = |n: u32| names[n as usize].as_str();
        let inc = f.inclusive();
        let pathlen = f.path_lengths(&|n| name(n).len());
        let (mut merged, mut touched) = (vec![0u64; f.nodes.len()], Vec::new());
        for t in [1, 2, 5, 17, 39, 41, 100, 1000] {
            let mut text = String::new();
            f.lines(&inc, &name, t, |l| {
                text.push_str(l);
                text.push('\n');
                Ok(())
            })
            .unwrap();
            let size = f.size(&inc, &pathlen, t, (&mut merged, &mut touched));
            assert_eq!(size, text.len() as u64, "threshold {t}:\n{text}");
            assert!(merged.iter().all(|&m| m == 0), "the table is left cleared");
            assert_eq!(total(&text), 830, "threshold {t}");
        }
        let mut all = Vec::new();
        f.write(&name, None, &mut all).unwrap();
        let all = String::from_utf8(all).unwrap();
        assert_eq!(all.lines().count(), 81, "f1 has no instructions of its own");
        let n = all.len() as u64;
        for limit in [n, n * 2 / 3, n / 3, n / 8] {
            let mut out = Vec::new();
            let w = f.write(&name, Some(limit), &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.len() as u64 <= limit, "{} > {limit}", text.len());
            assert_eq!(total(&text), 830);
            if limit == n {
                assert_eq!(text, all);
                assert_eq!(w.merged_frames, 0);
                continue;
            }
            // The smallest subtrees merged: under `prog;main`, with what they held.
            assert!(w.merged_frames > 0 && w.merged_below > 1);
            let merged_line = text
                .lines()
                .find(|l| l.starts_with("prog;main;[merged: smaller stacks] "))
                .unwrap();
            let kept: Vec<u64> = text
                .lines()
                .filter_map(|l| l.strip_prefix("prog;main;f"))
                .filter_map(|l| l.split([';', ' ']).next()?.parse().ok())
                .collect();
            let merged_sum: u64 = (1..=40).filter(|k| !kept.contains(k)).sum();
            assert_eq!(
                merged_line,
                format!("prog;main;[merged: smaller stacks] {merged_sum}")
            );
            assert!(kept.iter().all(|&k| k >= w.merged_below), "{kept:?}");
        }
    }
}
