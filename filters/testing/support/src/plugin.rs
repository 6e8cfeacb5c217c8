//! For the tests of a plugin as the daemons load it: where cargo put its shared object, and what its
//! descriptors define.

use std::path::PathBuf;

use prost::Message;

/// Where cargo puts a built shared object, for a test executable: beside it or one directory up.
pub fn search_path() -> Vec<PathBuf> {
    let exe = std::env::current_exe().expect("the test executable's path");
    let here = exe.parent().expect("a directory").to_path_buf();
    let up = here.parent().expect("a parent directory").to_path_buf();
    vec![here, up]
}

/// The messages of package `canopy.filters.v1` that encoded descriptors (a `FileDescriptorSet`) define.
pub fn filter_messages(descriptors: &[u8]) -> Vec<String> {
    prost_types::FileDescriptorSet::decode(descriptors)
        .expect("the plugin's descriptors decode")
        .file
        .iter()
        .filter(|f| f.package() == "canopy.filters.v1")
        .flat_map(|f| f.message_type.iter().map(|m| m.name().to_string()))
        .collect()
}
