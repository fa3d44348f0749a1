//! vLLM's multimodal settings that change which tensors a rank holds: `--language-model-only`
//! (no encoder at all: vLLM builds no vision tower, so its weights are neither loaded nor saved)
//! and `--mm-encoder-tp-mode` (`weights`: the encoder's layers split over the TP ranks like the
//! text model's; `data`: every rank holds the whole encoder and splits the images instead).
//! vLLM: `config/multimodal.py` `MultiModalConfig.language_model_only` (304),
//! `.mm_encoder_tp_mode` (385); flags in `engine/arg_utils.py:1497,1528`.

use std::fmt;

/// `--mm-encoder-tp-mode`, as vLLM spells it (`MMEncoderTPMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MmEncoderTpMode {
    /// Each encoder layer's weights split over the TP ranks (vLLM's default).
    #[default]
    Weights,
    /// The whole encoder on every TP rank; the batch of images is split instead.
    Data,
}

impl MmEncoderTpMode {
    /// vLLM's spelling, as the flag, wload.json and mapping expressions (`mm_encoder_tp_mode`)
    /// have it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MmEncoderTpMode::Weights => "weights",
            MmEncoderTpMode::Data => "data",
        }
    }

    /// The mode named `s` (`weights`, `data`); `None` for another word (a manifest from
    /// elsewhere may hold anything).
    pub fn parse(s: &str) -> Option<MmEncoderTpMode> {
        match s {
            "weights" => Some(MmEncoderTpMode::Weights),
            "data" => Some(MmEncoderTpMode::Data),
            _ => None,
        }
    }
}

impl fmt::Display for MmEncoderTpMode {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Both settings together: what the planner and mapping expressions see
/// (`language_model_only`, `mm_encoder_tp_mode`). vLLM ignores both for a text-only model (it
/// builds no `MultiModalConfig`, `config/model.py:831`), and so do text-only mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Multimodal {
    pub language_model_only: bool,
    pub mm_encoder_tp_mode: MmEncoderTpMode,
}

/// vLLM's warning when a model without data-parallel encoder support is given
/// `--mm-encoder-tp-mode data` (config/model.py:835–842), word for word.
pub(crate) const DATA_MODE_FALLBACK: &str = "This model does not support `--mm-encoder-tp-mode data`. Falling back to `--mm-encoder-tp-mode weights`.";

impl Multimodal {
    /// The settings vLLM serves a model with, given whether it can hold its encoder whole on
    /// every rank (`supports_encoder_tp_data`): `data` becomes `weights`, with vLLM's warning.
    pub(crate) fn served(self, encoder_tp_data: bool) -> (Multimodal, Option<&'static str>) {
        if encoder_tp_data || self.mm_encoder_tp_mode == MmEncoderTpMode::Weights {
            return (self, None);
        }
        let weights = Multimodal {
            mm_encoder_tp_mode: MmEncoderTpMode::Weights,
            ..self
        };
        (weights, Some(DATA_MODE_FALLBACK))
    }

    #[cfg(test)]
    /// Whether these are vLLM's defaults (neither flag changes anything): what wload.json and
    /// the serve line leave out.
    pub(crate) fn is_default(&self) -> bool {
        *self == Multimodal::default()
    }

    /// The encoder mode as wload.json and the plan record it: `None` for vLLM's default.
    pub(crate) fn recorded_mode(&self) -> Option<&'static str> {
        (self.mm_encoder_tp_mode != MmEncoderTpMode::Weights)
            .then(|| self.mm_encoder_tp_mode.as_str())
    }

    /// The flags that give these settings to vLLM (`--language-model-only`,
    /// `--mm-encoder-tp-mode data`), none for a default.
    pub(crate) fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.language_model_only {
            out.push("--language-model-only".to_string());
        }
        if self.mm_encoder_tp_mode != MmEncoderTpMode::Weights {
            out.push("--mm-encoder-tp-mode".to_string());
            out.push(self.mm_encoder_tp_mode.as_str().to_string());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_flags_name_only_what_differs() {
        for m in [MmEncoderTpMode::Weights, MmEncoderTpMode::Data] {
            assert_eq!(MmEncoderTpMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(MmEncoderTpMode::parse("Data"), None);
        assert!(Multimodal::default().flags().is_empty());
        let both = Multimodal {
            language_model_only: true,
            mm_encoder_tp_mode: MmEncoderTpMode::Data,
        };
        assert!(!both.is_default());
        assert_eq!(
            both.flags(),
            ["--language-model-only", "--mm-encoder-tp-mode", "data"]
        );
    }

    #[test]
    fn data_mode_falls_back_to_weights_with_vllms_warning_where_unsupported() {
        let data = Multimodal {
            language_model_only: false,
            mm_encoder_tp_mode: MmEncoderTpMode::Data,
        };
        assert_eq!(data.served(true), (data, None));
        let (served, warning) = data.served(false);
        assert!(served.is_default());
        assert_eq!(warning, Some(DATA_MODE_FALLBACK));
        assert_eq!(
            Multimodal::default().served(false),
            (Multimodal::default(), None)
        );
    }
}
