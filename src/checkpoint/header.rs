//! One file's header: its prefix read, the file mapped, the `safetensors` crate's verdict, and
//! wload's own diagnosis when the crate refuses it.

use super::*;

/// Reads the header of one file with the `safetensors` crate's own parser and checks (offsets
/// packed, in bounds, matching shape × dtype, the data region ending at the file's end), so that
/// wload accepts exactly the files vLLM's `safe_open` can load. Only the header is read, with
/// `pread`: the file is not mapped, so a file truncated meanwhile cannot fault the process
/// (SIGBUS), and an address-space limit (`ulimit -v`) does not stop a large file. On top of the
/// crate, wload refuses duplicate names and dtypes it cannot convert, and when the crate refuses
/// a file, wload finds the problem itself to name the tensor and the fix.
///
/// The file's [`FileStamp`] is taken before any byte is read and checked again after: a header
/// read while the file changed is refused, and the stamp goes with the plan so that the engine
/// reads the data of this very file, unchanged.
pub fn read_header(path: &Path, name: &str, file_index: usize) -> Result<WeightFile, HeaderError> {
    let file = open_regular(path)?;
    let (stamp, header_len) = read_prefix(&file, path)?;
    let header = read_header_text(&file, path, header_len)?;
    let parsed = parse_header(path, name, file_index, stamp.size, header_len, &header)?;
    check_unchanged(&file, path, &stamp)?;
    Ok(WeightFile { stamp, ..parsed })
}

/// A header that was not read from a local file (a hub's `Range` answer, or the cache's copy of
/// one): parsed and validated by the very checks [`read_header`] makes, against the file's size
/// as the server stated it. The file has no local data: see [`Backing::HeaderOnly`].
pub(crate) fn read_remote_header(
    h: &RemoteHeader,
    file_index: usize,
) -> Result<WeightFile, HeaderError> {
    let path = &h.path;
    let header_len = check_prefix(path, h.size, &h.bytes)?;
    // At least 8 bytes: `check_prefix` refused a size under 8, and the prefix was read.
    let text = h.bytes.get(8..).and_then(|t| t.get(..header_len as usize));
    let Some(text) = text else {
        return Err(HeaderError::Io {
            path: path.clone(),
            source: std::io::Error::other(format!(
                "the hub sent {} of the header's {} bytes",
                h.bytes.len(),
                8 + header_len
            )),
        });
    };
    let mut parsed = parse_header(path, &h.name, file_index, h.size, header_len, text)?;
    parsed.stamp = FileStamp {
        size: h.size,
        ..FileStamp::default()
    };
    parsed.backing = if h.readable {
        Backing::Object {
            etag: h.etag.clone(),
        }
    } else {
        Backing::HeaderOnly {
            etag: h.etag.clone(),
        }
    };
    Ok(parsed)
}

/// The header's JSON (`text`, `header_len` bytes of a file of `size`) parsed and validated with
/// the `safetensors` crate's own parser and checks (offsets packed, in bounds, matching shape ×
/// dtype, the data region ending at the file's end), plus wload's: no duplicate names, dtypes it
/// can convert, and its own diagnosis when the crate refuses the file. The one place a header is
/// judged, whether read from a file or from the hub.
fn parse_header(
    path: &Path,
    name: &str,
    file_index: usize,
    size: u64,
    header_len: u64,
    text: &[u8],
) -> Result<WeightFile, HeaderError> {
    let p = || path.to_path_buf();
    let data_len = size - 8 - header_len;
    // Counted (values skipped, nothing built) before the crate builds its tables, which cost
    // about a kilobyte a tensor: a header of a million tiny entries is refused at that cost.
    let keys = count_tensor_keys(text);
    if let Some(count) = keys.filter(|&n| n > MAX_TENSORS_PER_FILE) {
        return Err(HeaderError::TooManyTensors {
            path: p(),
            count,
            limit: MAX_TENSORS_PER_FILE,
        });
    }
    let metadata = match parse_metadata(text, data_len) {
        Ok(metadata) => metadata,
        Err(reason) => {
            return Err(diagnose(path, text, data_len)
                .unwrap_or_else(|| HeaderError::Refused { path: p(), reason }));
        }
    };
    // The crate keeps the last of two equal names; vLLM would silently load one copy of two
    // tensors, so a file that names one twice is refused.
    if keys != Some(metadata.tensors().len()) {
        return Err(
            diagnose(path, text, data_len).unwrap_or_else(|| HeaderError::BadJson {
                path: p(),
                message: "a tensor name appears twice".into(),
            }),
        );
    }
    let tensors = tensor_table(path, &metadata, 8 + header_len, file_index)?;
    Ok(WeightFile {
        name: name.to_string(),
        path: path.to_path_buf(),
        size,
        header_len,
        stamp: FileStamp::default(),
        backing: Backing::File,
        metadata: metadata
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        tensors,
    })
}

/// The file's stamp and header length, checked before the header is read. A file that is not
/// safetensors at all is the checkpoint's fault (exit 3).
fn read_prefix(file: &File, path: &Path) -> Result<(FileStamp, u64), HeaderError> {
    let p = || path.to_path_buf();
    let stamp = FileStamp::of_file(file).map_err(|source| HeaderError::Io { path: p(), source })?;
    let mut len_bytes = [0u8; 8];
    if stamp.size >= 8 {
        file.read_exact_at(&mut len_bytes, 0)
            .map_err(|source| HeaderError::Io { path: p(), source })?;
    }
    Ok((stamp, check_prefix(path, stamp.size, &len_bytes)?))
}

/// The header length that `prefix` (the file's first bytes, at least 8 unless the file is
/// shorter) states, checked against the file's `size` before any of the header is read. A file
/// that is not safetensors at all is the checkpoint's fault (exit 3). The one check of a header's
/// length, for local files and for the hub's.
pub(crate) fn check_prefix(path: &Path, size: u64, prefix: &[u8]) -> Result<u64, HeaderError> {
    let p = || path.to_path_buf();
    if size == 0 {
        return Err(HeaderError::Empty { path: p() });
    }
    if size < 8 {
        return Err(HeaderError::TooShort { path: p(), size });
    }
    let Some(len_bytes) = prefix.first_chunk::<8>() else {
        return Err(HeaderError::TooShort {
            path: p(),
            size: prefix.len() as u64,
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    // The crate checks these too, but says neither the length nor the file size.
    if header_len > MAX_HEADER_LEN {
        return Err(HeaderError::HeaderTooLarge {
            path: p(),
            len: header_len,
        });
    }
    if header_len > size - 8 {
        return Err(HeaderError::HeaderPastEnd {
            path: p(),
            len: header_len,
            size,
        });
    }
    Ok(header_len)
}

/// The header's JSON bytes (at most [`MAX_HEADER_LEN`], checked by [`read_prefix`]). A short
/// read means the file shrank after its size was taken.
fn read_header_text(file: &File, path: &Path, header_len: u64) -> Result<Vec<u8>, HeaderError> {
    let mut text = vec![0u8; header_len as usize];
    file.read_exact_at(&mut text, 8).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            changed_error(path, "it shrank while its header was read")
        } else {
            HeaderError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    Ok(text)
}

/// The header parsed and validated as `SafeTensors::read_metadata` does it, without the whole
/// file in memory: the crate's `Metadata` deserializer checks that the offsets are packed and
/// match each shape × dtype; the data region must then end exactly at the file's end
/// (`MetadataIncompleteBuffer` in the crate). The reason, in the crate's words, when refused.
fn parse_metadata(text: &[u8], data_len: u64) -> Result<safetensors::tensor::Metadata, String> {
    use safetensors::SafeTensorError;
    let text =
        std::str::from_utf8(text).map_err(|e| SafeTensorError::InvalidHeader(e).to_string())?;
    let metadata: safetensors::tensor::Metadata = serde_json::from_str(text)
        .map_err(|e| SafeTensorError::InvalidHeaderDeserialization(e).to_string())?;
    if metadata.data_len() as u64 != data_len {
        return Err(SafeTensorError::MetadataIncompleteBuffer.to_string());
    }
    Ok(metadata)
}

/// Refuses a file whose stamp moved while its header was read.
fn check_unchanged(file: &File, path: &Path, stamp: &FileStamp) -> Result<(), HeaderError> {
    let now = FileStamp::of_file(file).map_err(|source| HeaderError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match stamp.change_to(&now) {
        None => Ok(()),
        Some(change) => Err(changed_error(
            path,
            &format!("it changed while its header was read: {change}"),
        )),
    }
}

fn changed_error(path: &Path, what: &str) -> HeaderError {
    HeaderError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(format!(
            "{what}; something is writing the checkpoint (a download or sync?): run again once \
             nothing writes to it"
        )),
    }
}

/// The crate's tensors as wload's table, sorted by name, at absolute file offsets.
fn tensor_table(
    path: &Path,
    metadata: &safetensors::tensor::Metadata,
    data_start: u64,
    file_index: usize,
) -> Result<Vec<TensorInfo>, HeaderError> {
    // The names as a list, not the crate's `tensors()` map, which hashes and copies each once
    // more.
    let mut names = metadata.offset_keys();
    // Refused before anything per tensor is built: each costs wload a few hundred bytes and every
    // later stage walks them all.
    if names.len() > MAX_TENSORS_PER_FILE {
        return Err(HeaderError::TooManyTensors {
            path: path.to_path_buf(),
            count: names.len(),
            limit: MAX_TENSORS_PER_FILE,
        });
    }
    // Sorted before wload's own copies are made, so that they lie in memory in the order every
    // later stage walks them: the map and plan stages touch 90,000 names and shapes of a
    // DeepSeek-V3 checkpoint once each, and in hash order each touch was a cache miss.
    names.sort_unstable();
    let mut tensors = Vec::with_capacity(names.len());
    for tname in &names {
        let Some(info) = metadata.info(tname) else {
            continue;
        };
        // A dtype that a newer `safetensors` knows and wload does not is refused, not guessed.
        let dtype = Dtype::ALL
            .into_iter()
            .find(|&d| d.to_safetensors() == info.dtype)
            .ok_or_else(|| HeaderError::UnknownDtype {
                path: path.to_path_buf(),
                tensor: tname.clone(),
                dtype: info.dtype.to_string(),
            })?;
        let (start, end) = info.data_offsets;
        tensors.push(TensorInfo {
            name: tname.as_str().into(),
            dtype,
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            file: file_index,
            offset: data_start + start as u64,
            len: (end - start) as u64,
        });
    }
    Ok(tensors)
}

/// How many tensor entries (keys other than `__metadata__`) the header object has, duplicates
/// included; `None` when it is not a JSON object. Values are skipped, not built.
fn count_tensor_keys(text: &[u8]) -> Option<usize> {
    struct Count;
    impl<'de> Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
                map.next_value::<de::IgnoredAny>()?;
                n += usize::from(key != "__metadata__");
            }
            Ok(n)
        }
    }
    serde_json::Deserializer::from_slice(text)
        .deserialize_map(Count)
        .ok()
}

/// The first problem in a header that the `safetensors` crate refused, in wload's words: the
/// file, the tensor, and what is wrong with it. `None` when wload finds nothing to add to the
/// crate's own reason.
fn diagnose(path: &Path, text: &[u8], data_len: u64) -> Option<HeaderError> {
    let p = || path.to_path_buf();
    let text = match std::str::from_utf8(text) {
        Ok(t) => t,
        Err(e) => {
            return Some(HeaderError::NotUtf8 {
                path: p(),
                at: e.valid_up_to(),
            });
        }
    };
    let raw = match RawHeader::parse(text) {
        Ok(raw) => raw,
        Err(e) => {
            return Some(HeaderError::BadJson {
                path: p(),
                message: e.to_string(),
            });
        }
    };
    let mut spans = Vec::with_capacity(raw.tensors.len());
    for (tname, rt) in raw.tensors {
        match check_tensor(path, &tname, rt, data_len) {
            Ok(span) => spans.push(span),
            Err(e) => return Some(e),
        }
    }
    check_packing(path, spans, data_len).err()
}

/// A tensor's place in the data region: (start, end, name).
type Span<'a> = (u64, u64, Cow<'a, str>);

/// One tensor's entry on its own: a known dtype, offsets in order, a size that matches its
/// shape, and an end inside the data region.
fn check_tensor<'a>(
    path: &Path,
    tname: &Cow<'a, str>,
    rt: RawTensor,
    data_len: u64,
) -> Result<Span<'a>, HeaderError> {
    let p = || path.to_path_buf();
    let dtype: Dtype = rt.dtype.0.parse().map_err(|()| HeaderError::UnknownDtype {
        path: p(),
        tensor: tname.to_string(),
        dtype: rt.dtype.0.to_string(),
    })?;
    let (start, end) = rt.data_offsets;
    if end < start {
        return Err(HeaderError::ReversedOffsets {
            path: p(),
            tensor: tname.to_string(),
            start,
            end,
        });
    }
    let numel = rt.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let expected = numel.and_then(|n| dtype.byte_size(n));
    if expected != Some(end - start) {
        return Err(HeaderError::SizeMismatch {
            path: p(),
            dtype,
            shape: rt.shape,
            expected: match (numel, expected) {
                (Some(n), None) if n.checked_mul(dtype.bits()).is_some() => {
                    format!("a fractional number of bytes ({n} × {} bits)", dtype.bits())
                }
                (_, Some(b)) => format!("{b} bytes"),
                _ => "more than 2^64 bytes".to_string(),
            },
            tensor: tname.to_string(),
            found: end - start,
        });
    }
    if end > data_len {
        return Err(HeaderError::PastEnd {
            path: p(),
            tensor: tname.to_string(),
            end,
            data_len,
        });
    }
    Ok((start, end, tname.clone()))
}

/// The tensors together, walked in data order: no overlap, no gap, nothing after the last.
fn check_packing(path: &Path, mut spans: Vec<Span>, data_len: u64) -> Result<(), HeaderError> {
    let p = || path.to_path_buf();
    spans.sort_by_key(|&(s, e, _)| (s, e));
    let mut cursor = 0u64;
    let mut prev: Option<&Span> = None;
    for t in &spans {
        let (s, e, ref name) = *t;
        if let Some(q) = prev.filter(|_| s < cursor) {
            return Err(HeaderError::Overlap {
                path: p(),
                first: q.2.to_string(),
                first_start: q.0,
                first_end: q.1,
                second: name.to_string(),
                second_start: s,
                second_end: e,
            });
        }
        if s > cursor {
            return Err(HeaderError::Gap {
                path: p(),
                tensor: name.to_string(),
                at: s,
                gap: s - cursor,
            });
        }
        cursor = e;
        prev = Some(t);
    }
    if cursor != data_len {
        return Err(HeaderError::TrailingBytes {
            path: p(),
            covered: cursor,
            data_len,
        });
    }
    Ok(())
}

/// Opens `path` for reading if it is a regular file. Non-blocking, so that a FIFO answers at once
/// instead of waiting for a writer; the flag changes nothing for regular files.
fn open_regular(path: &Path) -> Result<File, HeaderError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let unreadable = |problem: String, fix| HeaderError::Unreadable {
        path: path.to_path_buf(),
        problem,
        fix,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => unreadable(
                "permission denied".into(),
                "make it readable (`chmod a+r`), or run as a user who can read it",
            ),
            _ if e.raw_os_error() == Some(libc::ELOOP) => unreadable(
                format!("cannot follow its symbolic link ({e})"),
                "fix or remove the link",
            ),
            // Listed, then gone: a link whose target does not exist (a broken Hugging Face
            // cache, a folder copied without its blobs) is the checkpoint's fault, as the
            // resolver reports such links among a checkpoint's files.
            std::io::ErrorKind::NotFound if std::fs::symlink_metadata(path).is_ok() => unreadable(
                format!(
                    "is a symbolic link to {}, which does not exist",
                    std::fs::read_link(path)
                        .map_or_else(|_| "?".into(), |t| t.display().to_string())
                ),
                "fix or remove the link, or copy the file it should point to",
            ),
            _ if e.raw_os_error() == Some(libc::ENXIO) => unreadable(
                "is a socket or a device without a reader, not a regular file".into(),
                "rename or remove it",
            ),
            _ => HeaderError::Io {
                path: path.to_path_buf(),
                source: e,
            },
        })?;
    let ft = file
        .metadata()
        .map_err(|source| HeaderError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a folder"
        } else if ft.is_fifo() {
            "a FIFO (named pipe)"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(unreadable(
            format!("is {kind}, not a regular file"),
            "rename or remove it",
        ));
    }
    Ok(file)
}

#[derive(Deserialize)]
struct RawTensor<'a> {
    #[serde(borrow)]
    dtype: Text<'a>,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A JSON string, borrowed from the header text unless it has escapes (which tensor names and
/// dtypes almost never do): one allocation less per tensor for the name, and none for the dtype.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            // The same wording as `String`'s, so error messages do not change.
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

/// The header object's tensor entries, for [`diagnose`]: deserialised by hand so that duplicate
/// keys are caught and named. Names borrow from the header text.
struct RawHeader<'de> {
    tensors: Vec<(Cow<'de, str>, RawTensor<'de>)>,
}

impl<'de> RawHeader<'de> {
    /// What `serde_json::from_str` does, plus a size hint, which serde_json does not give: a
    /// duplicate-key set that grows entry by entry costs about as much as the parse itself.
    fn parse(text: &'de str) -> serde_json::Result<RawHeader<'de>> {
        // A tensor's entry is rarely under 64 bytes of JSON.
        let capacity = text.len() / 64;
        let mut de = serde_json::Deserializer::from_str(text);
        let header = de.deserialize_map(HeaderVisitor { capacity })?;
        de.end()?;
        Ok(header)
    }
}

struct HeaderVisitor {
    capacity: usize,
}

impl<'de> Visitor<'de> for HeaderVisitor {
    type Value = RawHeader<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to {dtype, shape, data_offsets}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader<'de>, A::Error> {
        let mut tensors = Vec::with_capacity(self.capacity);
        // Cloning a borrowed key is free.
        let mut seen: HashSet<Cow<'de, str>, NameHasher> =
            HashSet::with_capacity_and_hasher(self.capacity, NameHasher::default());
        while let Some(Text(key)) = map.next_key::<Text<'de>>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format_args!("key '{key}' appears twice")));
            }
            if key == "__metadata__" {
                // Checked as the crate reads it: absent, null, or strings to strings.
                map.next_value::<Option<BTreeMap<String, String>>>()?;
            } else {
                let t: RawTensor = map
                    .next_value()
                    .map_err(|e| de::Error::custom(format_args!("tensor '{key}': {e}")))?;
                tensors.push((key, t));
            }
        }
        Ok(RawHeader { tensors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's first bytes: one F32 tensor of 4 elements (16 data bytes).
    fn remote(lie: Option<u64>, cut: usize) -> RemoteHeader {
        let text = br#"{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
        let mut bytes = lie.unwrap_or(text.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(text);
        let size = bytes.len() as u64 + 16;
        bytes.truncate(bytes.len() - cut);
        RemoteHeader {
            name: "m.safetensors".into(),
            path: "snap/m.safetensors".into(),
            size,
            bytes,
            etag: "e1".into(),
            readable: false,
        }
    }

    /// A remote header goes through the local checks, and its checkpoint refuses to be read.
    #[test]
    fn remote_headers_are_checked_as_local_ones_and_hold_no_data() {
        let f = read_remote_header(&remote(None, 0), 0).unwrap();
        assert_eq!(f.tensors.len(), 1);
        assert_eq!(f.tensors[0].offset, f.data_start());
        assert_eq!(f.backing, Backing::HeaderOnly { etag: "e1".into() });
        let ck = Checkpoint::from_files(vec![f]);
        match ck.data_readable() {
            Err(e @ HeaderError::HeaderOnly { .. }) => {
                assert!(e.to_string().contains("snap/m.safetensors"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_remote_header(&remote(Some(1 << 20), 0), 0),
            Err(HeaderError::HeaderPastEnd { len: 1_048_576, .. })
        ));
        assert!(matches!(
            read_remote_header(&remote(None, 5), 0),
            Err(HeaderError::Io { .. })
        ));
    }

    /// The header reader is also what a hub snapshot goes through, without the folder listing's
    /// checks: a FIFO must be refused at once (a blocking open would wait for a writer forever),
    /// a folder named like a weight file likewise, both as the checkpoint's fault.
    #[test]
    fn fifo_and_folder_are_refused_without_waiting() {
        let tmp = tempfile::TempDir::new().unwrap();
        let fifo = tmp.path().join("pipe.safetensors");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a file system entry.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let dir = tmp.path().join("dir.safetensors");
        std::fs::create_dir(&dir).unwrap();
        for (path, kind) in [(&fifo, "a FIFO"), (&dir, "a folder")] {
            match read_header(path, "x", 0) {
                Err(HeaderError::Unreadable { problem, .. }) => {
                    assert!(problem.contains(kind), "{problem}")
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
    }
}
