//! `pttrace`: check, run, decode, dump and report Intel PT traces.

fn main() {
    println!("pttrace");
}
