//! Intel PT packets as bytes (Intel SDM vol. 3C, chapter 32.4), written without allocation
//! into a [`Sink`], with the IP compression and TNT accumulation hardware performs.
//!
//! Packets: PSB (`02 82` × 8), PSBEND (`02 23`), TSC (`19` + 7 bytes), MODE.Exec (`99` +
//! one byte: CS.L = bit 0), short TNT (one byte: stop bit above up to 6 branch bits, bit 0
//! clear), long TNT (`02 A3` + 6 bytes: stop bit above up to 47 branch bits), the IP
//! packets TIP (`0D`), TIP.PGE (`11`), TIP.PGD (`01`) and FUP (`1D`) whose header's top
//! three bits say how many IP bytes follow (0 suppressed, 1 update-16, 2 update-32,
//! 3 sign-extended 48, 6 full 64), OVF (`02 F3`) and PAD (`00`). The oldest branch of a
//! TNT packet is its most significant branch bit.

use crate::EncodeError;

/// Where packets go: a growable vector, or a fixed buffer that reports when it is full.
pub trait Sink {
    /// Appends `bytes` whole, or fails without writing any of them.
    fn put(&mut self, bytes: &[u8]) -> Result<(), EncodeError>;
    /// Bytes written so far.
    fn len(&self) -> usize;
    /// Appends the first `n` bytes of `bytes` (a packet in a fixed-size scratch array:
    /// vectors copy the whole array, a constant-size move, and keep `n`).
    #[inline]
    fn put_first<const N: usize>(&mut self, bytes: &[u8; N], n: usize) -> Result<(), EncodeError> {
        self.put(&bytes[..n.min(N)])
    }
    /// True when nothing was written.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        self.extend_from_slice(bytes);
        Ok(())
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    #[inline]
    fn put_first<const N: usize>(&mut self, bytes: &[u8; N], n: usize) -> Result<(), EncodeError> {
        let keep = Vec::len(self) + n.min(N);
        self.extend_from_slice(bytes);
        self.truncate(keep);
        Ok(())
    }
}

impl Sink for &mut Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        Sink::put(&mut **self, bytes)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    #[inline]
    fn put_first<const N: usize>(&mut self, bytes: &[u8; N], n: usize) -> Result<(), EncodeError> {
        Sink::put_first(&mut **self, bytes, n)
    }
}

/// A fixed caller buffer (the single-step backend encodes into its output ring).
pub struct SliceSink<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> SliceSink<'a> {
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceSink { buf, pos: 0 }
    }
    /// Capacity of the buffer.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }
}

impl Sink for SliceSink<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), EncodeError> {
        let end = self.pos + bytes.len();
        match self.buf.get_mut(self.pos..end) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                self.pos = end;
                Ok(())
            }
            None => Err(EncodeError::OutputFull {
                needed: bytes.len(),
                at: self.pos,
                capacity: self.buf.len(),
            }),
        }
    }
    fn len(&self) -> usize {
        self.pos
    }
}

/// Packet opcodes of the IP packet family (low five bits of the header byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum IpPacket {
    Tip = 0x0d,
    TipPge = 0x11,
    TipPgd = 0x01,
    Fup = 0x1d,
}

/// The PSB pattern.
pub const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];
/// PSBEND.
pub const PSBEND: [u8; 2] = [0x02, 0x23];
/// OVF.
pub const OVF: [u8; 2] = [0x02, 0xf3];
/// MODE.Exec for 64-bit code (CS.L = 1, CS.D = 0).
pub const MODE_EXEC_64: [u8; 2] = [0x99, 0x01];
/// Most branch bits one long TNT packet carries.
pub const TNT_MAX_BITS: u8 = 47;

/// Writes packets into a [`Sink`], tracking the last IP (for compression) and pending TNT
/// bits like the hardware's packet generator does.
pub struct PacketWriter<S: Sink> {
    sink: S,
    /// The decoder's last IP; `None` after PSB or when the writer cannot know it.
    last_ip: Option<u64>,
    tnt: u64,
    tnt_bits: u8,
    psb_period: usize,
    next_psb: usize,
}

impl<S: Sink> PacketWriter<S> {
    /// A writer that asks for a PSB+ every `psb_period` bytes (see [`Self::psb_due`]).
    pub fn new(sink: S, psb_period: usize) -> Self {
        let next_psb = sink.len().saturating_add(psb_period);
        PacketWriter {
            sink,
            last_ip: None,
            tnt: 0,
            tnt_bits: 0,
            psb_period,
            next_psb,
        }
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }
    pub fn into_sink(self) -> S {
        self.sink
    }
    /// Bytes written (pending TNT bits not included).
    #[inline]
    pub fn len(&self) -> usize {
        self.sink.len()
    }
    pub fn is_empty(&self) -> bool {
        self.sink.is_empty()
    }

    /// The branch bits not written yet, oldest highest, and how many
    /// ([`Self::set_pending_tnt`] puts them back: a caller's loop keeps them in registers
    /// while it only adds bits).
    #[inline(always)]
    pub fn pending_tnt(&self) -> (u64, u8) {
        (self.tnt, self.tnt_bits)
    }

    /// Replaces the branch bits not written yet with `bits` bits of `tnt` (fewer than
    /// [`TNT_MAX_BITS`]; as [`Self::pending_tnt`] gave them, and more added the way
    /// [`Self::branch`] adds them).
    #[inline(always)]
    pub fn set_pending_tnt(&mut self, tnt: u64, bits: u8) {
        (self.tnt, self.tnt_bits) = (tnt, bits);
    }

    /// A PSB+ is due (`psb_period` bytes since the last one).
    #[inline]
    pub fn psb_due(&self) -> bool {
        self.sink.len() >= self.next_psb
    }

    /// Forgets the last IP: the next IP packet carries a full (sign-extended 48-bit or 64-bit)
    /// address. Used where packets may later be inserted before this point.
    pub fn forget_last_ip(&mut self) {
        self.last_ip = None;
    }

    /// Restarts PSB spacing and IP state for a new, empty buffer (same sink).
    pub fn restart(&mut self) {
        self.last_ip = None;
        self.tnt = 0;
        self.tnt_bits = 0;
        self.next_psb = self.sink.len().saturating_add(self.psb_period);
    }

    /// Header bits and payload size for `ip` against the last IP (updates the last IP).
    fn compress(&mut self, ip: u64) -> (u8, usize) {
        let last = self.last_ip;
        self.last_ip = Some(ip);
        match last {
            Some(l) if ip >> 16 == l >> 16 => (1, 2),
            Some(l) if ip >> 32 == l >> 32 => (2, 4),
            _ if ((ip << 16) as i64 >> 16) as u64 == ip => (3, 6),
            _ => (6, 8),
        }
    }

    /// An IP packet; `ip = None` writes it with the IP suppressed.
    #[inline]
    pub fn ip_packet(&mut self, kind: IpPacket, ip: Option<u64>) -> Result<(), EncodeError> {
        self.flush_tnt()?;
        let mut b = [0u8; 9];
        let (ipb, n) = match ip {
            Some(ip) => {
                let (ipb, n) = self.compress(ip);
                b[1..1 + n].copy_from_slice(&ip.to_le_bytes()[..n]);
                (ipb, n)
            }
            None => (0, 0),
        };
        b[0] = (ipb << 5) | kind as u8;
        self.sink.put_first(&b, 1 + n)
    }

    /// TIP: target of an indirect branch or return.
    #[inline]
    pub fn tip(&mut self, ip: u64) -> Result<(), EncodeError> {
        self.ip_packet(IpPacket::Tip, Some(ip))
    }

    /// FUP: source IP of an asynchronous event (or the IP in PSB+).
    pub fn fup(&mut self, ip: u64) -> Result<(), EncodeError> {
        self.ip_packet(IpPacket::Fup, Some(ip))
    }

    /// TIP.PGE: tracing (re-)enabled at `ip`.
    pub fn tip_pge(&mut self, ip: u64) -> Result<(), EncodeError> {
        self.ip_packet(IpPacket::TipPge, Some(ip))
    }

    /// TIP.PGD: tracing disabled; `None` = the target is not traced (kernel), IP suppressed.
    pub fn tip_pgd(&mut self, ip: Option<u64>) -> Result<(), EncodeError> {
        self.ip_packet(IpPacket::TipPgd, ip)
    }

    /// One conditional branch outcome (written when 47 are pending, or at the next packet).
    #[inline]
    pub fn branch(&mut self, taken: bool) -> Result<(), EncodeError> {
        self.tnt = (self.tnt << 1) | u64::from(taken);
        self.tnt_bits += 1;
        if self.tnt_bits == TNT_MAX_BITS {
            self.write_tnt()?;
        }
        Ok(())
    }

    /// Writes the pending branch bits as one short (≤ 6) or long TNT packet.
    #[inline]
    pub fn flush_tnt(&mut self) -> Result<(), EncodeError> {
        if self.tnt_bits == 0 {
            return Ok(());
        }
        self.write_tnt()
    }

    #[inline(never)]
    fn write_tnt(&mut self) -> Result<(), EncodeError> {
        let n = self.tnt_bits;
        let payload = (1u64 << n) | self.tnt;
        let r = if n <= 6 {
            self.sink.put_first(&[(payload as u8) << 1], 1)
        } else {
            let mut b = [0u8; 8];
            b[0] = 0x02;
            b[1] = 0xa3;
            b[2..8].copy_from_slice(&payload.to_le_bytes()[..6]);
            self.sink.put_first(&b, 8)
        };
        if r.is_ok() {
            self.tnt = 0;
            self.tnt_bits = 0;
        }
        r
    }

    /// TSC (the low 56 bits of the time-stamp counter).
    pub fn tsc(&mut self, tsc: u64) -> Result<(), EncodeError> {
        self.flush_tnt()?;
        let mut b = [0u8; 8];
        b[0] = 0x19;
        b[1..8].copy_from_slice(&tsc.to_le_bytes()[..7]);
        self.sink.put_first(&b, 8)
    }

    /// MODE.Exec for 64-bit code.
    pub fn mode_exec64(&mut self) -> Result<(), EncodeError> {
        self.flush_tnt()?;
        self.sink.put(&MODE_EXEC_64)
    }

    /// OVF: trace lost here; a FUP or TIP.PGE says where tracing resumes.
    pub fn ovf(&mut self) -> Result<(), EncodeError> {
        self.flush_tnt()?;
        self.last_ip = None;
        self.sink.put(&OVF)
    }

    /// PSB+: PSB, TSC, MODE.Exec, FUP (`fup` = the next IP when tracing is enabled), PSBEND.
    pub fn psb_plus(&mut self, tsc: Option<u64>, fup: Option<u64>) -> Result<(), EncodeError> {
        self.flush_tnt()?;
        self.sink.put(&PSB)?;
        self.last_ip = None;
        if let Some(t) = tsc {
            self.tsc(t)?;
        }
        self.mode_exec64()?;
        if let Some(ip) = fup {
            self.fup(ip)?;
        }
        self.sink.put(&PSBEND)?;
        self.next_psb = self.sink.len().saturating_add(self.psb_period);
        Ok(())
    }

    /// TSC, MODE.Exec and TIP.PGE at `ip` (hardware announces the mode with every enable).
    pub fn enable(&mut self, ip: u64, tsc: Option<u64>) -> Result<(), EncodeError> {
        if let Some(t) = tsc {
            self.tsc(t)?;
        }
        self.mode_exec64()?;
        self.tip_pge(ip)
    }

    /// Asynchronous disable before the instruction at `ip` executes: FUP + TIP.PGD.
    pub fn async_disable(&mut self, ip: u64) -> Result<(), EncodeError> {
        self.fup(ip)?;
        self.tip_pgd(None)
    }
}
