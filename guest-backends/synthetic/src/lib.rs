//! The synthetic MRDN fabric: the reference's `SyntheticNixlFabric`
//! (ADR-0006), an in-process map from handles to frames. `push` keeps a
//! copy of the frame under the next handle (from 1), `pull` returns it and
//! keeps it, `release` forgets it. Nothing leaves the instance, so it
//! needs no grant; its frames live as long as the instance.
//!
//! Settings (`[fabrics.<name>.settings]`):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `label` | `nixl-synth` | the telemetry label: `nixl-synth` or `mooncake-synth` (the reference's two synthetic fabrics) |

use std::cell::RefCell;

use kvwasm_guest_support::{Error, Fabric, Payload, PayloadExt, Settings, export_fabric};

use kvwasm_guest_support::frames::Frames;

/// The labels the reference gives its synthetic fabrics.
const LABELS: [&str; 2] = ["nixl-synth", "mooncake-synth"];

/// The configured label, or why the settings are unusable.
fn configured_label(settings: &Settings) -> Result<&'static str, Error> {
    match settings.get("label") {
        None => Ok(LABELS[0]),
        Some(text) => LABELS.into_iter().find(|l| *l == text).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "setting `label` = {text:?}: expected \"nixl-synth\" or \"mooncake-synth\""
            ))
        }),
    }
}

thread_local! {
    /// The settings' verdict, read at the first call.
    static LABEL: Result<&'static str, Error> =
        Settings::load().and_then(|s| configured_label(&s));
    static FRAMES: RefCell<Frames> = RefCell::default();
}

/// Run `f` on the frames, or fail every call with the settings' error.
fn with_frames<T>(f: impl FnOnce(&mut Frames) -> Result<T, Error>) -> Result<T, Error> {
    LABEL.with(|label| label.clone())?;
    FRAMES.with(|frames| f(&mut frames.borrow_mut()))
}

struct Synthetic;

impl Fabric for Synthetic {
    /// `label` cannot fail: with unusable settings it names the default,
    /// and every other call fails with the settings' error.
    fn label() -> String {
        LABEL
            .with(|label| label.clone().unwrap_or(LABELS[0]))
            .into()
    }

    fn push(frame: &Payload) -> Result<u64, Error> {
        with_frames(|frames| Ok(frames.push(frame.to_vec())))
    }

    fn pull(handle: u64) -> Result<Payload, Error> {
        with_frames(|frames| frames.get(handle).map(Payload::new))
    }

    fn release(handle: u64) -> Result<(), Error> {
        with_frames(|frames| frames.release(handle))
    }
}

export_fabric!(Synthetic);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_setting_chooses_between_the_two_synthetic_labels() {
        let label =
            |pairs: &[(&str, &str)]| configured_label(&Settings::from_pairs(pairs.to_vec()));
        assert_eq!(label(&[]).unwrap(), "nixl-synth");
        assert_eq!(
            label(&[("label", "mooncake-synth")]).unwrap(),
            "mooncake-synth"
        );
        let Err(Error::InvalidArgument(err)) = label(&[("label", "nixl")]) else {
            panic!("an unknown label must be refused");
        };
        assert!(err.contains("`label`") && err.contains("\"nixl\""), "{err}");
    }
}
