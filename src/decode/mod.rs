//! Decoder: PT + sideband + images -> drmemtrace-style records (libipt).
