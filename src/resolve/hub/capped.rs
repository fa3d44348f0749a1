//! File lists read with a cap on their entries (the hub's answer and the cache's saved copy):
//! kept apart from the HTTP client, which only moves the bytes.

use std::fmt;

use serde::Deserialize;

use super::http::MAX_LISTING_FILES;

/// The hub's file list: `[{"rfilename": NAME, …}, …]`, the other fields of each entry skipped
/// as they are read.
pub(super) fn capped_names<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    struct Sibling {
        rfilename: String,
    }
    capped::<D, Sibling>(d).map(|v| v.into_iter().map(|s| s.rfilename).collect())
}

/// The cache's copy of a file list: `[NAME, …]`.
pub(super) fn capped_strings<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<String>, D::Error> {
    capped::<D, String>(d)
}

/// A list of at most [`MAX_LISTING_FILES`] entries, refused as soon as it has more: memory
/// stays proportional to what a real repo lists, however many empty entries a server sends.
fn capped<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    struct Entries<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Entries<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of files")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut entries = Vec::new();
            while let Some(e) = seq.next_element::<T>()? {
                if entries.len() == MAX_LISTING_FILES {
                    return Err(serde::de::Error::custom(format!(
                        "it lists more than {MAX_LISTING_FILES} files, wload's limit (the largest real repos list a few thousand)"
                    )));
                }
                entries.push(e);
            }
            Ok(entries)
        }
    }
    d.deserialize_seq(Entries(std::marker::PhantomData))
}
