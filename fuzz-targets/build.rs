//! Every filter plugin exports the same entry symbol (`canopy_filter_entry`, what the host looks up in each
//! shared object); linked together as Rust libraries into one test binary, the copies collide. Nothing here
//! calls that symbol, so the linker may keep any one of them.

fn main() {
    println!("cargo:rustc-link-arg=-Wl,--allow-multiple-definition");
}
