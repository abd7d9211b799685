//! A handle still alive when its thread exits is destroyed with it: no fd leak.
//! (Own test binary: it counts this process's file descriptors.)

use std::ffi::{c_void, CStr};

use drpttracer::ffi::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn handles_alive_at_thread_exit_are_cleaned_up() {
    // Without Intel PT, init succeeds only where a software backend is asked for.
    std::env::set_var("PTTRACER_BACKEND", "auto");
    assert!(drpttracer_init());
    let before = open_fds();
    for _ in 0..4 {
        std::thread::spawn(move || {
            let mut h: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out pointer.
            let st = unsafe {
                drpttracer_create_handle(
                    std::ptr::null_mut(),
                    drpttracer_tracing_mode_t::DRPTTRACER_TRACING_ONLY_USER as i32,
                    4,
                    4,
                    &mut h,
                )
            };
            // SAFETY: the library returns a NUL-terminated thread-local string.
            let msg = unsafe { CStr::from_ptr(drpttracer_ext_last_error()) };
            assert_eq!(st, drpttracer_status_t::DRPTTRACER_SUCCESS, "{msg:?}");
            assert!(open_fds() > before, "a handle holds at least one perf fd");
            // The thread exits without destroying the handle.
        })
        .join()
        .unwrap();
    }
    assert_eq!(
        open_fds(),
        before,
        "perf fds of exited threads' handles were closed"
    );
    drpttracer_exit();
}
