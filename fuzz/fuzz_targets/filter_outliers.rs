#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| canopy_fuzz_targets::filter_outliers(data));
