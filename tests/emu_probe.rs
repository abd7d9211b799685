use drpttracer::emu;
use drpttracer::{BackendChoice, Mode, OutputBuffers, Tracer, TracerConfig};

#[inline(never)]
fn work(n: u64) -> u64 {
    let mut s = 0u64;
    for i in 0..n {
        if i % 3 == 0 {
            s += i;
        }
    }
    unsafe { libc::getppid() };
    s
}

#[test]
fn probe() {
    let mut t = Tracer::new(TracerConfig {
        mode: Mode::UserOnly,
        pt_size_shift: 4,
        sideband_size_shift: 4,
        backend: BackendChoice::Emulated,
    })
    .unwrap();
    let mut out = OutputBuffers::new(4, 4).unwrap();
    emu::keep_observed_ips(true);
    t.start().unwrap();
    let r = work(std::hint::black_box(10));
    t.stop(&mut out).unwrap();
    let rep = emu::take_last_window().unwrap();
    println!(
        "r={r} rep: steps {} insns {} gaps {} sig {} far {} pt {} sb {}",
        rep.steps,
        rep.instructions,
        rep.gaps,
        rep.signals,
        rep.far_transfers,
        out.pt_size,
        out.sideband_size
    );
    let d = emu::oracle::decode_own_memory(out.pt_data()).unwrap();
    println!(
        "decoded {} errors {:?} events {:?}",
        d.ips.len(),
        d.errors,
        d.events
    );
    let ips = rep.ips.unwrap();
    let n = ips.len().min(d.ips.len());
    let first_diff = (0..n).find(|&i| ips[i] != d.ips[i]);
    println!("first diff {first_diff:?}");
    assert_eq!(ips, d.ips);
}
