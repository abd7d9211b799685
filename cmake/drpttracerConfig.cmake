# CMake package for libdrpttracer: find_package(drpttracer) gives drpttracer::drpttracer.
#
# Works from an install tree (<prefix>/lib/cmake/drpttracer/) and from a source checkout
# after `cargo build [--release]` (point drpttracer_DIR at <checkout>/cmake).
get_filename_component(_drpt_dir "${CMAKE_CURRENT_LIST_DIR}" REALPATH)

if(EXISTS "${_drpt_dir}/../include/drpttracer.h" AND EXISTS "${_drpt_dir}/../Cargo.toml")
  # Source checkout.
  set(_drpt_include "${_drpt_dir}/../include")
  set(_drpt_hints "${_drpt_dir}/../target/release" "${_drpt_dir}/../target/debug")
else()
  # Install tree: <prefix>/<libdir>/cmake/drpttracer
  get_filename_component(_drpt_prefix "${_drpt_dir}/../../.." REALPATH)
  get_filename_component(_drpt_libdir "${_drpt_dir}/../.." REALPATH)
  set(_drpt_include "${_drpt_prefix}/include")
  set(_drpt_hints "${_drpt_libdir}")
endif()

find_library(DRPTTRACER_LIBRARY NAMES drpttracer HINTS ${_drpt_hints} NO_DEFAULT_PATH)
find_path(DRPTTRACER_INCLUDE_DIR drpttracer.h HINTS "${_drpt_include}" NO_DEFAULT_PATH)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(drpttracer
  REQUIRED_VARS DRPTTRACER_LIBRARY DRPTTRACER_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "build the library first (cargo build --release) or install it")

if(drpttracer_FOUND AND NOT TARGET drpttracer::drpttracer)
  add_library(drpttracer::drpttracer SHARED IMPORTED)
  set_target_properties(drpttracer::drpttracer PROPERTIES
    IMPORTED_LOCATION "${DRPTTRACER_LIBRARY}"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${DRPTTRACER_INCLUDE_DIR}")
endif()
