//! [`Count`]: the value parser of the count flags, with range errors in words.

/// A count flag (`--tp`, `--pp`, `--max-tp`, `--repeat`) whose range error says what the flag
/// needs (`--pp must be at least 1, not 0`), not clap's `0 is not in 1..18446744073709551615`.
#[derive(Debug, Clone, Copy)]
pub struct Count<T> {
    min: u64,
    max: u64,
    kind: std::marker::PhantomData<T>,
}

impl<T> Count<T> {
    /// `min` and up (to the type's largest value).
    pub const fn at_least(min: u64) -> Self {
        Count::new(min, u64::MAX)
    }

    pub const fn new(min: u64, max: u64) -> Self {
        Count {
            min,
            max,
            kind: std::marker::PhantomData,
        }
    }
}

impl<T> clap::builder::TypedValueParser for Count<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg
            .and_then(|a| a.get_long())
            .map_or("the value".into(), |l| format!("--{l}"));
        let text = value.to_string_lossy();
        let refuse = |why: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{why}\n"))
                .with_cmd(cmd)
        };
        let n: u64 = text.trim().parse().map_err(|_| {
            refuse(format!(
                "{flag} takes a whole number, such as 2, not '{}'",
                text
            ))
        })?;
        match (n < self.min, n > self.max) {
            (true, _) if self.max == u64::MAX => Err(refuse(format!(
                "{flag} must be at least {}, not {n}",
                self.min
            ))),
            (true, _) | (_, true) => Err(refuse(format!(
                "{flag} must be between {} and {}, not {n}",
                self.min, self.max
            ))),
            _ => T::try_from(n).map_err(|_| refuse(format!("{flag} is too large: {n}"))),
        }
    }
}
