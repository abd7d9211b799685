//! `drpttracer_init` as DynamoRIO's: false where nothing can trace (no `intel_pt` PMU and
//! no software backend asked for), with the reason; true with a software backend asked for.
//! (Own test binary: it sets PTTRACER_BACKEND, read by the first init of the process.)

use std::ffi::CStr;
use std::path::Path;

use drpttracer::ffi::*;

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(drpttracer_ext_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn init_is_false_without_a_backend_that_can_trace() {
    let pt = Path::new("/sys/bus/event_source/devices/intel_pt/type").exists();
    std::env::remove_var("PTTRACER_BACKEND");
    let ok = drpttracer_init();
    assert_eq!(ok, pt, "init with PTTRACER_BACKEND unset: {}", last_error());
    if ok {
        println!("SKIP: this machine has Intel PT; the no-PT case of init is not testable here");
        drpttracer_exit();
    } else {
        let msg = last_error();
        assert!(
            msg.starts_with("drpttracer_init: no Intel PT to trace with (")
                && msg.contains("PTTRACER_BACKEND=emulated"),
            "{msg}"
        );
        // A failed init counts nothing: handles are still refused.
        let mut h = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let st = unsafe { drpttracer_create_handle(std::ptr::null_mut(), 0, 4, 4, &mut h) };
        assert_eq!(st, drpttracer_status_t::DRPTTRACER_ERROR);
        assert!(last_error().contains("not initialized"), "{}", last_error());
    }

    std::env::set_var("PTTRACER_BACKEND", "bogus");
    assert!(!drpttracer_init());
    assert_eq!(
        last_error(),
        "drpttracer_init: PTTRACER_BACKEND=\"bogus\" is not a backend: use auto, hardware or \
         emulated"
    );

    std::env::set_var("PTTRACER_BACKEND", "emulated");
    assert!(drpttracer_init(), "{}", last_error());
    assert_eq!(last_error(), "");
    // Later inits only count (the environment is read by the first).
    std::env::set_var("PTTRACER_BACKEND", "bogus");
    assert!(drpttracer_init());
    let mut h = std::ptr::null_mut();
    std::env::set_var("PTTRACER_BACKEND", "emulated");
    // SAFETY: valid out pointer.
    let st = unsafe { drpttracer_create_handle(std::ptr::null_mut(), 0, 4, 4, &mut h) };
    assert_eq!(
        st,
        drpttracer_status_t::DRPTTRACER_SUCCESS,
        "{}",
        last_error()
    );
    assert_eq!(
        drpttracer_destroy_handle(std::ptr::null_mut(), h),
        drpttracer_status_t::DRPTTRACER_SUCCESS
    );
    drpttracer_exit();
    drpttracer_exit();
}
