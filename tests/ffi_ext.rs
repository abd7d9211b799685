//! The drpttracer_ext_* extensions from Rust, through the exported C functions.

use std::ffi::{c_void, CStr};

use drpttracer::ffi::*;
use drpttracer::sideband::record::{Record, RecordIter, SIDEBAND_SAMPLE_TYPE};

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(drpttracer_ext_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn vdso_query_then_copy() {
    let (mut size, mut addr) = (0usize, 0u64);
    // SAFETY: NULL buffer asks for the size; out pointers are valid.
    let st = unsafe { drpttracer_ext_get_vdso(std::ptr::null_mut(), 0, &mut size, &mut addr) };
    assert_eq!(st, drpttracer_status_t::DRPTTRACER_ERROR_INVALID_PARAMETER);
    assert!(last_error().contains("bytes needed"), "{}", last_error());
    assert!(size >= 4096 && addr != 0);
    let mut buf = vec![0u8; size];
    // SAFETY: buf holds size bytes.
    let st = unsafe {
        drpttracer_ext_get_vdso(
            buf.as_mut_ptr() as *mut c_void,
            buf.len(),
            &mut size,
            &mut addr,
        )
    };
    assert_eq!(st, drpttracer_status_t::DRPTTRACER_SUCCESS);
    assert_eq!(&buf[..4], b"\x7fELF");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let vdso_line = maps.lines().find(|l| l.ends_with("[vdso]")).unwrap();
    assert!(vdso_line.starts_with(&format!("{addr:x}-")), "{vdso_line}");
}

#[test]
fn synthesized_mappings_parse_as_mmap2_records() {
    let mut size = 0usize;
    // SAFETY: size query.
    unsafe { drpttracer_ext_synthesize_mappings(std::ptr::null_mut(), 0, &mut size) };
    assert!(size > 0);
    let mut buf = vec![0u8; size + 4096];
    // SAFETY: buf holds buf.len() bytes.
    let st = unsafe {
        drpttracer_ext_synthesize_mappings(buf.as_mut_ptr() as *mut c_void, buf.len(), &mut size)
    };
    assert_eq!(
        st,
        drpttracer_status_t::DRPTTRACER_SUCCESS,
        "{}",
        last_error()
    );
    let names: Vec<String> = RecordIter::new(&buf[..size], SIDEBAND_SAMPLE_TYPE)
        .map(|r| match r.unwrap().1.record {
            Record::Mmap2(m) => m.filename,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
    assert!(names.iter().any(|n| n == "[vdso]"), "{names:?}");
    assert!(
        names.iter().any(|n| *n == exe.to_string_lossy()),
        "{names:?}"
    );
}

#[test]
fn ext_metadata_checks_struct_size_and_handle() {
    let mut m = drpttracer_ext_metadata_t::default();
    // SAFETY: NULL handle is rejected before anything is dereferenced.
    let st = unsafe { drpttracer_ext_get_metadata(std::ptr::null_mut(), &mut m) };
    assert_eq!(st, drpttracer_status_t::DRPTTRACER_ERROR_INVALID_PARAMETER);
    assert!(last_error().contains("NULL"), "{}", last_error());
    // Without Intel PT, init succeeds only where a software backend is asked for.
    std::env::set_var("PTTRACER_BACKEND", "auto");
    assert!(drpttracer_init(), "{}", last_error());
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    let st = unsafe { drpttracer_create_handle(std::ptr::null_mut(), 0, 4, 4, &mut h) };
    assert_eq!(
        st,
        drpttracer_status_t::DRPTTRACER_SUCCESS,
        "{}",
        last_error()
    );
    m.struct_size = 8;
    // SAFETY: m is a valid struct.
    let st = unsafe { drpttracer_ext_get_metadata(h, &mut m) };
    assert_eq!(st, drpttracer_status_t::DRPTTRACER_ERROR_INVALID_PARAMETER);
    assert!(last_error().contains("struct_size=8"), "{}", last_error());
    m.struct_size = std::mem::size_of::<drpttracer_ext_metadata_t>() as u32;
    // SAFETY: as above.
    let st = unsafe { drpttracer_ext_get_metadata(h, &mut m) };
    assert_eq!(
        st,
        drpttracer_status_t::DRPTTRACER_SUCCESS,
        "{}",
        last_error()
    );
    let (fam, model, step) = drpttracer::metadata::cpu_identity();
    assert_eq!(
        (m.cpu_family, m.cpu_model, m.cpu_stepping),
        (fam, model, step)
    );
    assert_eq!(m.sideband_sample_type, SIDEBAND_SAMPLE_TYPE);
    let expect_backend = if drpttracer::perf::pmu::IntelPtPmu::probe().is_ok() {
        0
    } else {
        1
    };
    assert_eq!(m.backend, expect_backend);
    assert_eq!(
        drpttracer_destroy_handle(std::ptr::null_mut(), h),
        drpttracer_status_t::DRPTTRACER_SUCCESS
    );
    drpttracer_exit();
}
