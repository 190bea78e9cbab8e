//! The commit log of the embedded store: every commit is appended here, and made durable,
//! before it is acknowledged; the redb file itself is made durable only at checkpoints.
//!
//! A durable redb commit writes and syncs every page the commit touched, and the pages of
//! redb's own bookkeeping: about seventy page writes for a commit of four keys. A log record
//! is one sequential write and one `fdatasync`. So commits go to the log durably and to redb
//! without syncing; a checkpoint (a durable redb commit) now and then makes the log's records
//! redundant, and the log starts over.
//!
//! | bytes | field                                                                 |
//! |-------|-----------------------------------------------------------------------|
//! | 4     | payload length, little-endian                                         |
//! | 4     | CRC-32 (IEEE) of the payload, little-endian                           |
//! | 8     | payload: the group's sequence number, little-endian                   |
//! | 4     | payload: number of operations, little-endian                          |
//! | n     | payload: operations, each `op` (1 put, 2 delete), key length (u32 LE), key, and for a put value length (u32 LE) and value |
//!
//! A record that is cut short or fails its checksum ends the log: it was being written when
//! the process stopped, so it was never acknowledged.
//!
//! The file is reused: when the log starts over it is written again from its start, not
//! truncated, and it grows [`GROW`] bytes of zeros at a time. A commit then overwrites blocks
//! the file already has, and its `fdatasync` writes data only; appending to the file made
//! every sync also commit the file's new size to the file system's journal (a quarter more
//! time per sync, measured on the CI machines). What an earlier round of the log left after
//! the records of the current one is cut off on replay by sequence number: the groups'
//! numbers only grow, so the first record that does not follow on from the one before it
//! (one left from before the log started over) ends the log, as a torn one does.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::super::StagedWrites;

/// File name of the log inside the store's data directory.
pub const LOG_NAME: &str = "moraine.log";

const PUT: u8 = 1;
const DELETE: u8 = 2;
const HEADER: usize = 8;
/// Bytes a record's payload takes before its operations.
const PAYLOAD_HEAD: usize = 12;

/// One write of a logged commit: a key set to a value, or deleted.
pub(super) type LoggedWrite<'a> = (&'a [u8], Option<&'a [u8]>);

/// A commit group read back from the log.
#[derive(Debug)]
pub(super) struct Record<'a> {
    pub(super) seq: u64,
    pub(super) writes: Vec<LoggedWrite<'a>>,
}

/// The open log, positioned at its end.
#[derive(Debug)]
pub(super) struct Log {
    file: File,
    path: PathBuf,
    /// Where the log's records end: the next one goes there.
    len: u64,
    /// The file's length, at least `len`: the blocks past `len` are reused.
    allocated: u64,
    /// Most bytes kept when the log starts over ([`KEPT`]).
    kept: u64,
    /// Where a record is built before it is written, a chunk at a time; kept between appends.
    buf: Vec<u8>,
}

/// Bytes of a record built before they are written: a small record is one write, a large
/// one is written a chunk at a time while the next is built.
const CHUNK: usize = 1 << 20;

/// Bytes of zeros the file grows by when a record would end past it: the commit that grows
/// it writes them (about a millisecond), the next thousand-odd small commits overwrite them.
/// A record larger than this grows the file by itself.
const GROW: u64 = 1 << 20;

/// Most bytes of the file kept for reuse when the log starts over: what a checkpoint lets
/// the log reach ([`super::CHECKPOINT_LOG_BYTES`]), so that one very large commit does not
/// keep its size on disk for good.
const KEPT: u64 = 64 << 20;

/// Zeros to grow the file with, written a slice at a time.
static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

impl Log {
    /// Opens (or creates) the log in `dir`, handing its records to `each` one at a time, in
    /// order (only one record is in memory at once). The log ends at a torn record, or at one
    /// whose sequence number is not above the one before it (left from before the log
    /// started over); the next record is written there.
    ///
    /// # Errors
    /// The file's I/O errors, and the first error of `each`.
    pub(super) fn open<E: From<io::Error>>(
        dir: &Path,
        mut each: impl FnMut(Record<'_>) -> Result<(), E>,
    ) -> Result<Self, E> {
        let path = dir.join(LOG_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        // The file's directory entry must survive a crash too.
        File::open(dir)?.sync_all()?;
        let total = file.metadata()?.len();
        let mut reader = io::BufReader::with_capacity(1 << 20, &file);
        let mut payload = Vec::new();
        let mut len = 0_u64;
        let mut last = None;
        while let Some(length) = next_payload(&mut reader, total - len, &mut payload)? {
            let Some(record) = parse(&payload) else { break };
            if last.is_some_and(|last| record.seq <= last) {
                break;
            }
            last = Some(record.seq);
            each(record)?;
            len += u64::try_from(HEADER + length).unwrap_or(u64::MAX);
        }
        drop(reader);
        Ok(Self {
            file,
            path,
            len,
            allocated: total,
            kept: KEPT,
            buf: Vec::new(),
        })
    }

    /// Bytes in the log.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// The log's file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the writes of one commit group, in order, and makes them durable. The record
    /// is built a chunk at a time and each chunk written as it fills, its checksum taken
    /// along; the header, which holds the checksum, is written last, before the sync. Until
    /// the sync, the record is nowhere acknowledged: a crash before it leaves a torn record,
    /// which the checksum cuts off.
    pub(super) fn append<'a>(
        &mut self,
        seq: u64,
        groups: &(impl Iterator<Item = &'a StagedWrites> + Clone),
    ) -> io::Result<()> {
        // Each group's keys are distinct, and replay applies a record's operations in turn, so
        // a group's keys may come in any order: the order they lie in memory.
        let ops = || groups.clone().flat_map(StagedWrites::written_unordered);
        let mut length = PAYLOAD_HEAD;
        let mut count = 0_usize;
        for (key, value) in ops() {
            count += 1;
            length += op_len(key, value);
        }
        let start = self.len;
        let mut checksum = crc32fast::Hasher::new();
        // Where the next chunk goes: the payload starts after the header.
        let mut at = start + HEADER as u64;
        let buf = &mut self.buf;
        buf.clear();
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&u32_of(count)?.to_le_bytes());
        for (key, value) in ops() {
            if buf.len() + op_len(key, value) > CHUNK && !buf.is_empty() {
                checksum.update(buf);
                self.file.write_all_at(buf, at)?;
                at += buf.len() as u64;
                buf.clear();
            }
            buf.push(if value.is_some() { PUT } else { DELETE });
            buf.extend_from_slice(&u32_of(key.len())?.to_le_bytes());
            buf.extend_from_slice(key);
            if let Some(value) = value {
                buf.extend_from_slice(&u32_of(value.len())?.to_le_bytes());
                buf.extend_from_slice(value);
            }
        }
        checksum.update(buf);
        let [l0, l1, l2, l3] = u32_of(length)?.to_le_bytes();
        let [c0, c1, c2, c3] = checksum.finalize().to_le_bytes();
        let header: [u8; HEADER] = [l0, l1, l2, l3, c0, c1, c2, c3];
        if at == start + HEADER as u64 {
            // One write for a record that fits a chunk.
            buf.splice(0..0, header);
            self.file.write_all_at(buf, start)?;
        } else {
            self.file.write_all_at(buf, at)?;
            self.file.write_all_at(&header, start)?;
        }
        if buf.capacity() > CHUNK + HEADER {
            *buf = Vec::new();
        }
        let end = start + u64::try_from(HEADER + length).unwrap_or(u64::MAX);
        if end > self.allocated {
            // Synced with the record: the commits after it overwrite these blocks.
            let grown = if end - self.allocated < GROW {
                self.allocated + GROW
            } else {
                end
            };
            self.zero(end, grown)?;
            self.allocated = grown;
        }
        self.file.sync_data()?;
        self.len = end;
        Ok(())
    }

    /// Writes zeros over `from..to` of the file.
    fn zero(&self, mut from: u64, to: u64) -> io::Result<()> {
        while from < to {
            let n = usize::try_from(to - from).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
            let zeros = ZEROS.get(..n).unwrap_or_default();
            self.file.write_all_at(zeros, from)?;
            from += n as u64;
        }
        Ok(())
    }

    /// Starts the log over, once a checkpoint has made every record in it redundant: the
    /// next record is written at the file's start, over the old ones (which stay redundant
    /// until then, and are cut off after it on replay). A file grown past [`KEPT`] bytes is
    /// cut back to that.
    pub(super) fn reset(&mut self) -> io::Result<()> {
        if self.allocated > self.kept {
            self.file.set_len(self.kept)?;
            self.file.sync_data()?;
            self.allocated = self.kept;
        }
        self.len = 0;
        Ok(())
    }
}

fn op_len(key: &[u8], value: Option<&[u8]>) -> usize {
    1 + 4 + key.len() + value.map_or(0, |value| 4 + value.len())
}

fn u32_of(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| io::Error::other("a commit larger than 4 GiB"))
}

/// Reads the next record's payload into `payload` if the `left` bytes of the file hold a
/// whole one whose checksum holds; returns its length. `None` ends the log: nothing left, or
/// a record cut short or damaged.
fn next_payload(
    reader: &mut impl io::Read,
    left: u64,
    payload: &mut Vec<u8>,
) -> io::Result<Option<usize>> {
    let mut header = [0; HEADER];
    if left < HEADER as u64 {
        return Ok(None);
    }
    reader.read_exact(&mut header)?;
    let (length, checksum) = header.split_at(4);
    let length = u32::from_le_bytes(length.try_into().map_err(io::Error::other)?);
    let checksum = u32::from_le_bytes(checksum.try_into().map_err(io::Error::other)?);
    if u64::from(length) > left - HEADER as u64 {
        return Ok(None);
    }
    let length = usize::try_from(length).map_err(io::Error::other)?;
    payload.clear();
    payload.resize(length, 0);
    reader.read_exact(payload)?;
    Ok((crc32fast::hash(payload) == checksum).then_some(length))
}

fn parse(payload: &[u8]) -> Option<Record<'_>> {
    let mut reader = Reader(payload);
    let seq = u64::from_le_bytes(reader.array::<8>()?);
    let count = u32::from_le_bytes(reader.array::<4>()?);
    let mut writes = Vec::with_capacity(usize::try_from(count).ok()?.min(payload.len() / 5));
    for _ in 0..count {
        let [op] = reader.array::<1>()?;
        let key = reader.chunk()?;
        let value = match op {
            PUT => Some(reader.chunk()?),
            DELETE => None,
            _ => return None,
        };
        writes.push((key, value));
    }
    Some(Record { seq, writes })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn chunk(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(u32::from_le_bytes(self.array::<4>()?)).ok()?;
        let (chunk, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        Some(chunk)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::kv::{StagedWrites, Undo};
    use bytes::Bytes;

    fn writes(items: &[(&str, Option<&str>)]) -> StagedWrites {
        let mut staged = StagedWrites::new();
        let mut undo = Undo::off();
        for (key, value) in items {
            let key = Bytes::copy_from_slice(key.as_bytes());
            match value {
                Some(value) => staged
                    .put(key, Bytes::copy_from_slice(value.as_bytes()), &mut undo)
                    .expect("put"),
                None => staged.delete(key, &mut undo).expect("delete"),
            }
        }
        staged
    }

    /// An owned copy of a record read back.
    type Owned = (u64, Vec<(Vec<u8>, Option<Vec<u8>>)>);

    pub(in super::super) fn read(dir: &std::path::Path) -> (Log, Vec<Owned>) {
        let mut records = Vec::new();
        let log = Log::open(dir, |record: Record<'_>| {
            records.push((
                record.seq,
                record
                    .writes
                    .iter()
                    .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
                    .collect(),
            ));
            Ok::<_, io::Error>(())
        })
        .expect("open");
        (log, records)
    }

    #[test]
    fn records_come_back_in_order_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().expect("dir");
        let end = {
            let (mut log, records) = read(dir.path());
            assert!(records.is_empty());
            log.append(1, &[writes(&[("a", Some("1")), ("b", None)])].iter())
                .expect("append");
            log.append(
                2,
                &[writes(&[("c", Some("3"))]), writes(&[("a", Some("4"))])].iter(),
            )
            .expect("append");
            usize::try_from(log.len()).expect("small")
        };
        // A third record cut off midway: a crash while it was written.
        let path = dir.path().join(LOG_NAME);
        let whole = std::fs::read(&path).expect("read");
        let mut torn = whole.clone();
        torn[end..end + 9].copy_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, 9]);
        std::fs::write(&path, &torn).expect("write");
        let (mut log, records) = read(dir.path());
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].0, 1);
        assert_eq!(
            records[0].1,
            vec![(b"a".to_vec(), Some(b"1".to_vec())), (b"b".to_vec(), None)]
        );
        assert_eq!(
            records[1].1,
            vec![
                (b"c".to_vec(), Some(b"3".to_vec())),
                (b"a".to_vec(), Some(b"4".to_vec()))
            ]
        );
        assert_eq!(log.len(), u64::try_from(end).expect("small"));
        // The next record is written over the torn one.
        log.append(3, &[writes(&[("d", Some("5"))])].iter())
            .expect("append");
        drop(log);
        let (_, records) = read(dir.path());
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        // A flipped byte ends the log at that record.
        let mut flipped = whole;
        flipped[end - 1] ^= 1;
        std::fs::write(&path, &flipped).expect("write");
        let (_, records) = read(dir.path());
        assert_eq!(records.len(), 1);
    }

    /// The log started over is written from the file's start, over what it held: the
    /// records of the round before, left after the new ones (here one exactly where the new
    /// record ends, so that only its sequence number tells it apart), are not read back.
    /// The file grows by [`GROW`] bytes of zeros, and is reused rather than truncated unless
    /// it grew past what is kept.
    #[test]
    fn a_log_started_over_never_reads_back_the_round_before() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join(LOG_NAME);
        let record = |value: &str| writes(&[("key", Some(value))]);
        {
            let (mut log, _) = read(dir.path());
            for (seq, value) in [(1, "one"), (2, "two"), (3, "six")] {
                log.append(seq, &[record(value)].iter()).expect("append");
            }
            assert_eq!(
                std::fs::metadata(&path).expect("log").len(),
                GROW,
                "grown by zeros"
            );
            log.reset().expect("reset");
            assert_eq!(log.len(), 0);
            log.append(4, &[record("ten")].iter()).expect("append");
            assert_eq!(std::fs::metadata(&path).expect("log").len(), GROW, "reused");
        }
        let (log, records) = read(dir.path());
        assert_eq!(
            records,
            vec![(4, vec![(b"key".to_vec(), Some(b"ten".to_vec()))])],
            "records 2 and 3 of the round before follow record 4 and are not read"
        );
        let one = HEADER + PAYLOAD_HEAD + op_len(b"key", Some(b"ten"));
        assert_eq!(log.len(), u64::try_from(one).expect("small"));

        // A file grown past what is kept is cut back to it when the log starts over.
        let (mut log, _) = read(dir.path());
        log.kept = GROW;
        let large = "x".repeat(usize::try_from(2 * GROW).expect("small"));
        log.append(5, &[record(&large)].iter()).expect("append");
        assert!(std::fs::metadata(&path).expect("log").len() > 2 * GROW);
        log.reset().expect("reset");
        assert_eq!(std::fs::metadata(&path).expect("log").len(), GROW);
        log.append(6, &[record("end")].iter()).expect("append");
        drop(log);
        let (_, records) = read(dir.path());
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![6]);
    }

    /// A record larger than the chunks it is written in reads back whole, after a small
    /// one, and the next record follows it; one whose header was never written (a crash
    /// between its chunks and its header) ends the log there.
    #[test]
    fn a_record_of_many_chunks_reads_back_whole() {
        let dir = tempfile::tempdir().expect("dir");
        let value = |i: usize| format!("{i:08}").repeat(1000);
        let many: Vec<(String, String)> = (0..3 * CHUNK / 8000)
            .map(|i| (format!("k{i:06}"), value(i)))
            .collect();
        let items: Vec<(&str, Option<&str>)> = many
            .iter()
            .map(|(key, value)| (key.as_str(), Some(value.as_str())))
            .collect();
        {
            let (mut log, _) = read(dir.path());
            log.append(1, &[writes(&[("a", Some("1"))])].iter())
                .expect("append");
            log.append(2, &[writes(&items)].iter()).expect("append");
            log.append(3, &[writes(&[("z", None)])].iter())
                .expect("append");
        }
        let path = dir.path().join(LOG_NAME);
        let whole = std::fs::read(&path).expect("read");
        assert!(whole.len() > 3 * CHUNK, "the record spans chunks");
        let (_, records) = read(dir.path());
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        let expected: Vec<(Vec<u8>, Option<Vec<u8>>)> = many
            .iter()
            .map(|(key, value)| (key.clone().into_bytes(), Some(value.clone().into_bytes())))
            .collect();
        assert_eq!(records[1].1, expected);
        assert_eq!(records[2].1, vec![(b"z".to_vec(), None)]);
        // The large record's header zeroed: the log ends after the first record.
        let first = HEADER + PAYLOAD_HEAD + op_len(b"a", Some(b"1"));
        let mut headless = whole;
        headless[first..first + HEADER].fill(0);
        std::fs::write(&path, &headless).expect("write");
        let (log, records) = read(dir.path());
        assert_eq!(records.len(), 1);
        assert_eq!(log.len(), u64::try_from(first).expect("small"));
    }
}
