//! A deliberately hostile MRDN fabric, for tests only. It is the synthetic
//! fabric (same frame store, handles from 1), except for a frame whose
//! body (bytes 32.. of the frame) starts with `!` and a command word; the
//! command applies to that frame:
//!
//! | body starts with | behaviour                                                  |
//! |------------------|------------------------------------------------------------|
//! | `!loop`          | `push` spins forever (deadline)                            |
//! | `!hog`           | `push` allocates without bound (memory limit, trap)        |
//! | `!panic`         | `push` panics (trap)                                       |
//! | `!noisy`         | `push` writes 4 KiB to stderr, then panics (trap)          |
//! | `!sleep`         | `push` sleeps 60 s in `std::thread::sleep` (deadline)      |
//! | `!flip`          | `pull` returns the frame with one body bit flipped         |
//! | `!truncate`      | `pull` returns the frame minus its last byte               |
//! | `!wrong`         | `pull` returns the frame pushed just before it (handle − 1) |
//! | `!garbage`       | `pull` returns 64 bytes of junk                            |
//! | `!bighandle`     | `pull` returns a 10 MiB payload of zeros                   |
//!
//! Label `hostile`. No settings.

use std::cell::RefCell;

use kvwasm_guest_support::{Error, Fabric, Payload, PayloadExt, export_fabric};

use kvwasm_guest_support::frames::Frames;

/// Bytes of the MRDN header before the body.
const HEADER: usize = 32;

/// What a frame tells the fabric to do.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Loop,
    Hog,
    Panic,
    Noisy,
    Sleep,
    Flip,
    Truncate,
    Wrong,
    Garbage,
    BigHandle,
}

/// The command at the start of `frame`'s body, if any: `!` then a word of
/// lowercase letters, matched whole (`!flipped` is no command).
fn command(frame: &[u8]) -> Option<Command> {
    let rest = frame.get(HEADER..)?.strip_prefix(b"!")?;
    let word_len = rest
        .iter()
        .position(|b| !b.is_ascii_lowercase())
        .unwrap_or(rest.len());
    Some(match &rest[..word_len] {
        b"loop" => Command::Loop,
        b"hog" => Command::Hog,
        b"panic" => Command::Panic,
        b"noisy" => Command::Noisy,
        b"sleep" => Command::Sleep,
        b"flip" => Command::Flip,
        b"truncate" => Command::Truncate,
        b"wrong" => Command::Wrong,
        b"garbage" => Command::Garbage,
        b"bighandle" => Command::BigHandle,
        _ => return None,
    })
}

/// What `pull` hands back for the frame under `handle`.
fn pulled(frames: &Frames, handle: u64) -> Result<Vec<u8>, Error> {
    let frame = frames.get(handle)?;
    Ok(match command(frame) {
        Some(Command::Flip) => {
            let mut bytes = frame.to_vec();
            // The body's last byte: the body is at least `!flip`.
            *bytes.last_mut().expect("a command frame has a body") ^= 1;
            bytes
        }
        Some(Command::Truncate) => frame[..frame.len() - 1].to_vec(),
        Some(Command::Wrong) => frames.get(handle - 1)?.to_vec(),
        Some(Command::Garbage) => (0..64u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect(),
        Some(Command::BigHandle) => vec![0; 10 << 20],
        _ => frame.to_vec(),
    })
}

thread_local! {
    static FRAMES: RefCell<Frames> = RefCell::default();
}

struct HostileFabric;

impl Fabric for HostileFabric {
    fn label() -> String {
        "hostile".into()
    }

    fn push(frame: &Payload) -> Result<u64, Error> {
        let bytes = frame.to_vec();
        match command(&bytes) {
            Some(Command::Loop) => loop {
                std::hint::spin_loop();
            },
            Some(Command::Hog) => {
                let mut hoard: Vec<u8> = Vec::new();
                loop {
                    hoard.resize(hoard.len() + (1 << 20), 1);
                    std::hint::black_box(&hoard);
                }
            }
            Some(Command::Panic) => panic!("hostile fabric panics on purpose"),
            Some(Command::Noisy) => {
                // Last words the host quotes when the instance is lost.
                for line in 0..4 {
                    eprintln!("{line}: {}", "noise ".repeat(170));
                }
                panic!("hostile fabric panics after {}", "noise ".repeat(170));
            }
            Some(Command::Sleep) => std::thread::sleep(std::time::Duration::from_secs(60)),
            _ => {}
        }
        Ok(FRAMES.with(|frames| frames.borrow_mut().push(bytes)))
    }

    fn pull(handle: u64) -> Result<Payload, Error> {
        let bytes = FRAMES.with(|frames| pulled(&frames.borrow(), handle))?;
        Ok(Payload::new(&bytes))
    }

    fn release(handle: u64) -> Result<(), Error> {
        FRAMES.with(|frames| frames.borrow_mut().release(handle))
    }
}

export_fabric!(HostileFabric);

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        [&[0u8; HEADER][..], body].concat()
    }

    #[test]
    fn commands_are_whole_words_at_the_start_of_the_body() {
        assert_eq!(command(&frame(b"!flip")), Some(Command::Flip));
        assert_eq!(
            command(&frame(b"!bighandle please")),
            Some(Command::BigHandle)
        );
        assert_eq!(command(&frame(b"!flipped")), None);
        assert_eq!(command(&frame(b" !flip")), None);
        assert_eq!(command(&frame(b"")), None);
        // The header is not the body.
        assert_eq!(command(b"!flip"), None);
    }

    #[test]
    fn pull_corrupts_only_the_commanded_frames() {
        let mut frames = Frames::default();
        let plain = frames.push(frame(b"KVC1 chunk"));
        let flip = frames.push(frame(b"!flip this"));
        let truncate = frames.push(frame(b"!truncate"));
        let wrong = frames.push(frame(b"!wrong"));
        let garbage = frames.push(frame(b"!garbage"));
        let big = frames.push(frame(b"!bighandle"));

        assert_eq!(pulled(&frames, plain).unwrap(), frame(b"KVC1 chunk"));
        let flipped = pulled(&frames, flip).unwrap();
        let original = frame(b"!flip this");
        assert_eq!(flipped.len(), original.len());
        let differing: u32 = flipped
            .iter()
            .zip(&original)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(differing, 1);
        assert_eq!(flipped[..HEADER], original[..HEADER]);
        assert_eq!(pulled(&frames, truncate).unwrap(), frame(b"!truncat"));
        assert_eq!(pulled(&frames, wrong).unwrap(), frame(b"!truncate"));
        let junk = pulled(&frames, garbage).unwrap();
        assert_eq!(junk.len(), 64);
        assert_ne!(&junk[..4], b"MRDN");
        assert_eq!(pulled(&frames, big).unwrap(), vec![0; 10 << 20]);
        // Pulling never changes what is stored.
        assert_eq!(pulled(&frames, flip).unwrap(), flipped);
        frames.release(plain).unwrap();
        assert!(matches!(pulled(&frames, plain), Err(Error::NotFound)));
    }
}
