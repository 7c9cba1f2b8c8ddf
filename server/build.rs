//! Rebuilds the server when the web pages it compiles in (`web/dist`, from `web/build.sh`)
//! change or first appear.

fn main() {
    let dist = std::path::Path::new("../web/dist");
    if dist.is_dir() {
        println!("cargo:rerun-if-changed=../web/dist");
    } else {
        // Not built yet: its appearance changes `web/`'s listing.
        println!("cargo:rerun-if-changed=../web");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
