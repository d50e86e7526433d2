//! Signal configuration: the YAML file (named by `GT_CONFIG`) that says, per signal, how to
//! shard its tensors, which signal configures its gradients and whether to compile it.
//!
//! The format is the Python GT's: top-level keys are signal names.
//!
//! ```yaml
//! forward_layer1:
//!   shard:
//!     axis: 0                  # Shard batch dimension
//!     workers: [0, 1, 2, 3]    # Use workers 0-3
//!   backward: backward_layer1  # Different config for gradients
//!
//! params:
//!   shard:
//!     replicated: true
//! ```
//!
//! Bad files are rejected with a [`SignalConfigError`] naming the line, the column and the field
//! (`forward_layer1.shard.axis`). The checks run while the YAML is read (by visitors driven
//! by `serde_yaml`), so that every error carries the position of the offending value.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, EnumAccess, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize as _;

/// The environment variable that names the config file [`Config::from_env`] loads.
pub const CONFIG_ENV: &str = "GT_CONFIG";

/// How a signal's tensors are spread over the workers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardConfig {
    /// The axis to shard along; negative counts from the end (`-1` is the last axis).
    /// Defaults to 0.
    pub axis: i64,
    /// The workers to use, in order; `None` means all workers.
    pub workers: Option<Vec<usize>>,
    /// Replicate the tensors on every worker instead of sharding them. Defaults to false.
    pub replicated: bool,
}

/// The configuration of one signal.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SignalConfig {
    /// How to shard the signal's tensors; `None` when the file says nothing about it.
    pub shard: Option<ShardConfig>,
    /// The signal whose configuration applies to the gradients (the backward pass).
    pub backward: Option<String>,
    /// Compile the signal's region. Defaults to false.
    pub compile: bool,
    /// Mixed precision: the scope's matmuls and elementwise arithmetic run in this dtype
    /// (`bf16` or `f16`; `f32` turns it off inside an outer one), as
    /// [`crate::tensor::autocast`] does. `None` when the file says nothing.
    pub dtype: Option<gt_ir::DType>,
}

/// Signal configurations by signal name: what a config file holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    signals: BTreeMap<String, SignalConfig>,
}

/// A config file that could not be read or is not a valid config.
#[derive(Debug, thiserror::Error)]
pub struct SignalConfigError {
    /// Where the text came from: the file name (or what the caller of [`Config::parse`] gave).
    pub origin: String,
    /// The 1-based line of the offending text, when known.
    pub line: Option<usize>,
    /// The 1-based column of the offending text, when known.
    pub column: Option<usize>,
    /// The field at fault, as a path from the signal name: `forward_layer1.shard.axis`,
    /// `forward_layer1.shard.workers[2]`. `None` for errors about the file as a whole.
    pub field: Option<String>,
    /// What is wrong (boxed: the error travels in `Result`s, and the position is most of it).
    #[source]
    pub problem: Box<ConfigProblem>,
}

/// What is wrong with a config file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigProblem {
    /// The file could not be read.
    #[error("cannot read the config file{}: {source}", named_by.map_or(String::new(), |var| format!(" (named by {var})")))]
    Read {
        /// The environment variable that named the file, if one did.
        named_by: Option<&'static str>,
        /// Why.
        source: std::io::Error,
    },
    /// Not YAML, as `serde_yaml` found on its own (syntax, an unknown anchor, ...).
    #[error("invalid YAML: {yaml_message}{}", if *tabs { " (YAML does not allow tabs for indentation: use spaces)" } else { "" })]
    Yaml {
        /// `serde_yaml`'s own text (its position moved to the error's line and column).
        yaml_message: String,
        /// Whether the offending line is indented with tabs.
        tabs: bool,
    },
    /// More than one YAML document.
    #[error("the file holds more than one YAML document (separated by `---`); a config file holds one")]
    MultipleDocuments,
    /// Brackets nested past any config's depth (a YAML parser's time grows with its square).
    #[error("`[` and `{{` nest more than {max} deep here; a config nests a few levels")]
    TooDeep {
        /// The deepest nesting taken.
        max: usize,
    },
    /// A value of the wrong kind.
    #[error("expected {expected}, found {found}")]
    Mismatch {
        /// What the field takes.
        expected: Expected,
        /// The value found, described (`integer 1`, `a list`).
        found: String,
    },
    /// A number where a name is expected (a YAML name that reads as a number or boolean).
    #[error("expected {expected}, found {found}; quote it if it is a name")]
    NotAName {
        /// What the field takes.
        expected: Expected,
        /// The value found, described.
        found: String,
    },
    /// An integer beyond 128 bits.
    #[error("integer {value} is out of range")]
    IntegerOutOfRange {
        /// The integer.
        value: u128,
    },
    /// A signal named `""`.
    #[error("a signal name cannot be empty")]
    EmptySignalName,
    /// A signal configured twice.
    #[error("signal `{name}` is configured more than once")]
    SignalTwice {
        /// The signal.
        name: String,
    },
    /// A key twice in one mapping.
    #[error("duplicate key `{key}`: it appears more than once in this mapping")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A key the mapping does not have.
    #[error("unknown key `{key}`{} (the keys of {what} are {})", key_hint(key, *hint), list_keys(known))]
    UnknownKey {
        /// The key.
        key: String,
        /// A likely fix.
        hint: Option<KeyHint>,
        /// What the mapping is: "a signal", "`shard`".
        what: &'static str,
        /// Its keys.
        known: &'static [&'static str],
    },
    /// An axis beyond `i64`.
    #[error("axis {axis} is out of range")]
    AxisOutOfRange {
        /// The axis.
        axis: i128,
    },
    /// `backward: ""`.
    #[error("the signal name is empty")]
    EmptyBackward,
    /// `workers: []`.
    #[error("the list of workers is empty (leave `workers` out to use all workers)")]
    NoWorkers,
    /// A negative worker index.
    #[error("worker indices cannot be negative, found {worker}")]
    NegativeWorker {
        /// The index.
        worker: i128,
    },
    /// A worker listed twice.
    #[error("worker {worker} is listed more than once")]
    WorkerTwice {
        /// The index.
        worker: usize,
    },
    /// A worker index beyond `usize`.
    #[error("worker index {worker} is out of range")]
    WorkerOutOfRange {
        /// The index.
        worker: i128,
    },
}

/// What a field of the config takes, for "expected ..., found ..." messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The whole file.
    TopLevel,
    /// A top-level key.
    SignalName,
    /// A key of a mapping with these keys.
    Key(&'static [&'static str]),
    /// A signal's settings.
    SignalSettings,
    /// `shard`'s settings.
    ShardSettings,
    /// `axis`.
    Integer,
    /// `replicated`, `compile`.
    Boolean,
    /// `backward`.
    BackwardSignal,
    /// `dtype`.
    AutocastDType,
    /// `workers`.
    Workers,
    /// One of `workers`.
    WorkerIndex,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::TopLevel => {
                f.write_str("a mapping from signal names to their settings (`name:` at the start of a line)")
            }
            Expected::SignalName => f.write_str("a signal name (a string)"),
            Expected::Key(known) => write!(f, "a key (one of {})", list_keys(known)),
            Expected::SignalSettings => {
                write!(f, "the signal's settings (a mapping with keys {}) or nothing", list_keys(SIGNAL_KEYS))
            }
            Expected::ShardSettings => {
                write!(f, "the shard settings (a mapping with keys {}) or nothing", list_keys(SHARD_KEYS))
            }
            Expected::Integer => f.write_str("an integer"),
            Expected::Boolean => f.write_str("a boolean (`true` or `false`)"),
            Expected::BackwardSignal => f.write_str("the name of a signal (a string)"),
            Expected::AutocastDType => f.write_str("a mixed-precision dtype: `bf16`, `f16` or `f32`"),
            Expected::Workers => f.write_str("a list of worker indices, like `[0, 1]`"),
            Expected::WorkerIndex => f.write_str("a worker index (a non-negative integer)"),
        }
    }
}

/// A likely fix for an unknown key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHint {
    /// A known key this one is a typo of.
    DidYouMean(&'static str),
    /// `<<`, which is not supported.
    MergeKey,
    /// A `shard` setting written at the signal's level.
    UnderShard,
    /// A signal setting written under `shard`.
    SignalLevel,
}

fn key_hint(key: &str, hint: Option<KeyHint>) -> String {
    match hint {
        None => String::new(),
        Some(KeyHint::DidYouMean(near)) => format!("; did you mean `{near}`?"),
        Some(KeyHint::MergeKey) => "; YAML merge keys are not supported".to_owned(),
        Some(KeyHint::UnderShard) => format!("; `{key}` goes under `shard:`"),
        Some(KeyHint::SignalLevel) => format!("; `{key}` is a setting of the signal, one level up"),
    }
}

impl fmt::Display for SignalConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        write!(f, "{}", self.problem)
    }
}

impl SignalConfigError {
    fn whole_file(origin: &str, problem: ConfigProblem) -> Self {
        SignalConfigError {
            origin: origin.to_owned(),
            line: None,
            column: None,
            field: None,
            problem: Box::new(problem),
        }
    }
}

/// How deep `[` and `{` may nest in a config file.
const MAX_FLOW_DEPTH: usize = 64;

/// The 1-based line and column where `text`'s flow collections (`[`, `{`, outside quoted
/// scalars and comments; they may span lines) first nest deeper than `max`, if they do.
fn nested_past(text: &str, max: usize) -> Option<(usize, usize)> {
    let (mut depth, mut quote) = (0usize, None);
    for (i, line) in text.lines().enumerate() {
        let mut previous = ' ';
        for (j, c) in line.chars().enumerate() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                // A quote opens a scalar only where one starts (`don't` is plain).
                (None, '\'' | '"') if previous.is_whitespace() || "[{,:".contains(previous) => quote = Some(c),
                (None, '#') if previous.is_whitespace() => break,
                (None, '[' | '{') => {
                    depth += 1;
                    if depth > max {
                        return Some((i + 1, j + 1));
                    }
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
            previous = c;
        }
    }
    None
}

impl Config {
    /// No signal configured.
    pub const fn new() -> Config {
        Config { signals: BTreeMap::new() }
    }

    /// Parses the text of a config file; `origin` (the file name) prefixes error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, SignalConfigError> {
        if let Some((line, column)) = nested_past(text, MAX_FLOW_DEPTH) {
            let mut error = SignalConfigError::whole_file(origin, ConfigProblem::TooDeep { max: MAX_FLOW_DEPTH });
            (error.line, error.column) = (Some(line), Some(column));
            return Err(error);
        }
        // First the YAML syntax, for the whole text: a syntax error is reported as such even
        // where a check of the part before it would fail first.
        let mut documents = serde_yaml::Deserializer::from_str(text);
        if let Some(document) = documents.next() {
            if let Err(e) = IgnoredAny::deserialize(document) {
                return Err(syntax_error(text, origin, &e));
            }
            if documents.next().is_some() {
                let mut error = SignalConfigError::whole_file(origin, ConfigProblem::MultipleDocuments);
                error.line = second_document_line(text);
                return Err(error);
            }
        }
        let ctx = Ctx::default();
        let seed = TopSeed(Drive(TopShape { ctx: &ctx }));
        match seed.deserialize(serde_yaml::Deserializer::from_str(text)) {
            Ok(signals) => Ok(Config { signals }),
            Err(e) => Err(match ctx.detail.into_inner() {
                // An error of ours: serde_yaml gives the position, `Ctx` the rest.
                Some(detail) if e.to_string().contains(&detail.problem.to_string()) => SignalConfigError {
                    origin: origin.to_owned(),
                    line: e.location().map(|l| l.line()),
                    column: e.location().map(|l| l.column()),
                    field: detail.field,
                    problem: Box::new(detail.problem),
                },
                _ => syntax_error(text, origin, &e),
            }),
        }
    }

    /// Reads and parses the config file at `path`. A file that cannot be read gives an error
    /// naming the path and the system's reason.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, SignalConfigError> {
        load_named_by(path.as_ref(), None)
    }

    /// Loads the config file named by the `GT_CONFIG` environment variable: `Ok(None)` when
    /// the variable is unset or empty.
    pub fn from_env() -> Result<Option<Config>, SignalConfigError> {
        match std::env::var_os(CONFIG_ENV) {
            Some(path) if !path.is_empty() => load_named_by(Path::new(&path), Some(CONFIG_ENV)).map(Some),
            _ => Ok(None),
        }
    }

    /// The configuration of signal `name`, if the config has one.
    pub fn signal(&self, name: &str) -> Option<&SignalConfig> {
        self.signals.get(name)
    }

    /// The configured signals, in name order.
    pub fn signals(&self) -> impl Iterator<Item = (&str, &SignalConfig)> {
        self.signals.iter().map(|(name, config)| (name.as_str(), config))
    }

    /// Sets the configuration of signal `name`, replacing any it had (the Python GT's
    /// `register_config`).
    pub fn insert(&mut self, name: impl Into<String>, config: SignalConfig) {
        self.signals.insert(name.into(), config);
    }

    /// Whether no signal is configured.
    pub fn is_empty(&self) -> bool {
        self.signals.is_empty()
    }

    /// The number of configured signals.
    pub fn len(&self) -> usize {
        self.signals.len()
    }
}

fn load_named_by(path: &Path, named_by: Option<&'static str>) -> Result<Config, SignalConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|source| SignalConfigError::whole_file(&origin, ConfigProblem::Read { named_by, source }))?;
    Config::parse(&text, &origin)
}

/// An error `serde_yaml` found on its own (YAML syntax, unknown anchor, ...), as a
/// [`SignalConfigError`]: its position moves to `line`/`column`, out of the message.
fn syntax_error(text: &str, origin: &str, e: &serde_yaml::Error) -> SignalConfigError {
    let location = e.location();
    let mut message = e.to_string();
    if let Some(l) = &location {
        let suffix = format!(" at line {} column {}", l.line(), l.column());
        if let Some(at) = message.find(&suffix) {
            message.replace_range(at..at + suffix.len(), "");
        }
    }
    let tabs = location.as_ref().is_some_and(|l| {
        let bad_line = text.lines().nth(l.line().saturating_sub(1)).unwrap_or("");
        bad_line.chars().take_while(|c| c.is_whitespace()).any(|c| c == '\t')
    });
    SignalConfigError {
        origin: origin.to_owned(),
        line: location.as_ref().map(|l| l.line()),
        column: location.as_ref().map(|l| l.column()),
        field: None,
        problem: Box::new(ConfigProblem::Yaml { yaml_message: message, tabs }),
    }
}

/// The line of the `---` that starts the second document (best effort).
fn second_document_line(text: &str) -> Option<usize> {
    let (mut content, mut starts) = (false, 0);
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("---") {
            if content || starts > 0 {
                return Some(i + 1);
            }
            starts += 1;
        } else if !(line.trim().is_empty() || line.trim_start().starts_with('#') || line.starts_with('%')) {
            content = true;
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// The checking deserializer. Every check runs inside the `Visitor` of the value it checks,
// so that `serde_yaml` stamps the error with that value's position; the field path and the
// problem travel beside the error, in `Ctx`.

const SIGNAL_KEYS: &[&str] = &["shard", "backward", "compile", "dtype"];
const SHARD_KEYS: &[&str] = &["axis", "workers", "replicated"];

/// The field and problem of the error being returned (set by [`Ctx::fail`]).
#[derive(Default)]
struct Ctx {
    detail: RefCell<Option<Detail>>,
}

struct Detail {
    field: Option<String>,
    problem: ConfigProblem,
}

impl Ctx {
    /// An error for `serde_yaml` to stamp with the position; the problem itself waits here
    /// (serde's errors carry only text).
    fn fail<E: de::Error>(&self, field: &str, problem: ConfigProblem) -> E {
        let error = E::custom(&problem);
        let field = (!field.is_empty()).then(|| field.to_owned());
        *self.detail.borrow_mut() = Some(Detail { field, problem });
        error
    }
}

/// A scalar as a check sees it.
#[derive(Clone, Copy)]
enum Raw<'v> {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'v str),
}

impl fmt::Display for Raw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Raw::Null => f.write_str("null (nothing)"),
            Raw::Bool(v) => write!(f, "boolean {v}"),
            Raw::Int(v) => write!(f, "integer {v}"),
            Raw::Float(v) => write!(f, "number {v:?}"),
            Raw::Str(v) if v.chars().count() > 40 => {
                write!(f, "string {:?}...", v.chars().take(40).collect::<String>())
            }
            Raw::Str(v) => write!(f, "string {v:?}"),
        }
    }
}

/// Why a check rejected a scalar.
enum Reject {
    /// The wrong kind of value: the message says what was expected and what was found.
    Mismatch,
    /// The right kind but a bad value.
    Invalid(ConfigProblem),
    /// A bad value whose field (the path given) is not the shape's own (a mapping key).
    InvalidAt(String, ConfigProblem),
}

/// What a value must look like, and how to build the result from it.
trait Schema<'de> {
    type Out;
    fn ctx(&self) -> &Ctx;
    /// The field path, empty for the top level.
    fn field(&self) -> &str;
    /// What the value should be, for "expected ..., found ..." messages.
    fn expected(&self) -> Expected;

    fn scalar(&self, _raw: Raw<'_>) -> Result<Self::Out, Reject> {
        Err(Reject::Mismatch)
    }
    fn seq<A: SeqAccess<'de>>(&self, _seq: A) -> Result<Self::Out, A::Error> {
        Err(self.mismatch("a list"))
    }
    fn map<A: MapAccess<'de>>(&self, _map: A) -> Result<Self::Out, A::Error> {
        Err(self.mismatch("a mapping"))
    }

    fn fail<E: de::Error>(&self, problem: ConfigProblem) -> E {
        self.ctx().fail(self.field(), problem)
    }
    fn mismatch<E: de::Error>(&self, found: &str) -> E {
        self.fail(ConfigProblem::Mismatch { expected: self.expected(), found: found.to_owned() })
    }
}

/// Drives a [`Schema`] from any YAML value.
struct Drive<S>(S);

impl<S> Drive<S> {
    fn scalar<'de, E: de::Error>(&self, raw: Raw<'_>) -> Result<S::Out, E>
    where
        S: Schema<'de>,
    {
        self.0.scalar(raw).map_err(|reject| match reject {
            Reject::Mismatch => self.0.mismatch(&raw.to_string()),
            Reject::Invalid(problem) => self.0.fail(problem),
            Reject::InvalidAt(field, problem) => self.0.ctx().fail(&field, problem),
        })
    }
}

impl<'de, S: Schema<'de>> DeserializeSeed<'de> for Drive<S> {
    type Value = S::Out;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<S::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Schema<'de>> Visitor<'de> for Drive<S> {
    type Value = S::Out;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.expected())
    }
    fn visit_unit<E: de::Error>(self) -> Result<S::Out, E> {
        self.scalar(Raw::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<S::Out, E> {
        self.scalar(Raw::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<S::Out, E> {
        self.scalar(Raw::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<S::Out, E> {
        self.scalar(Raw::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<S::Out, E> {
        self.scalar(Raw::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<S::Out, E> {
        self.scalar(Raw::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<S::Out, E> {
        match i128::try_from(v) {
            Ok(v) => self.scalar(Raw::Int(v)),
            Err(_) => Err(self.0.fail(ConfigProblem::IntegerOutOfRange { value: v })),
        }
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<S::Out, E> {
        self.scalar(Raw::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Out, E> {
        self.scalar(Raw::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<S::Out, A::Error> {
        self.0.seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<S::Out, A::Error> {
        self.0.map(map)
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<S::Out, A::Error> {
        let (tag, _) = data.variant::<String>()?;
        Err(self.0.mismatch(&format!("a value tagged `!{tag}` (YAML tags are not supported)")))
    }
}

/// The top level: an empty document is an empty config.
struct TopSeed<'a>(Drive<TopShape<'a>>);

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = BTreeMap<String, SignalConfig>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = BTreeMap<String, SignalConfig>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0 .0.expected())
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(BTreeMap::new())
    }
    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self.0)
    }
}

struct TopShape<'a> {
    ctx: &'a Ctx,
}

impl<'de> Schema<'de> for TopShape<'_> {
    type Out = BTreeMap<String, SignalConfig>;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        ""
    }
    fn expected(&self) -> Expected {
        Expected::TopLevel
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<Self::Out, Reject> {
        match raw {
            Raw::Null => Ok(BTreeMap::new()),
            _ => Err(Reject::Mismatch),
        }
    }
    fn map<A: MapAccess<'de>>(&self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut signals = BTreeMap::new();
        while let Some(name) = map.next_key_seed(Drive(SignalNameShape { ctx: self.ctx, seen: &signals }))? {
            let config = map.next_value_seed(Drive(SignalShape { ctx: self.ctx, field: name.clone() }))?;
            signals.insert(name, config);
        }
        Ok(signals)
    }
}

struct SignalNameShape<'a> {
    ctx: &'a Ctx,
    seen: &'a BTreeMap<String, SignalConfig>,
}

impl<'de> Schema<'de> for SignalNameShape<'_> {
    type Out = String;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        ""
    }
    fn expected(&self) -> Expected {
        Expected::SignalName
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<String, Reject> {
        match raw {
            Raw::Str("") => Err(Reject::Invalid(ConfigProblem::EmptySignalName)),
            Raw::Str(name) if self.seen.contains_key(name) => {
                Err(Reject::InvalidAt(name.to_owned(), ConfigProblem::SignalTwice { name: name.to_owned() }))
            }
            Raw::Str(name) => Ok(name.to_owned()),
            Raw::Bool(_) | Raw::Int(_) | Raw::Float(_) => {
                Err(Reject::Invalid(ConfigProblem::NotAName { expected: self.expected(), found: raw.to_string() }))
            }
            Raw::Null => Err(Reject::Mismatch),
        }
    }
}

/// A mapping key: one of `known`, not seen before in the mapping.
struct KeyShape<'a> {
    ctx: &'a Ctx,
    /// The path of the mapping.
    parent: &'a str,
    /// What the mapping is, for messages: "a signal", "`shard`".
    what: &'static str,
    known: &'static [&'static str],
    seen: &'a [&'static str],
}

impl<'de> Schema<'de> for KeyShape<'_> {
    type Out = &'static str;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        self.parent
    }
    fn expected(&self) -> Expected {
        Expected::Key(self.known)
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<&'static str, Reject> {
        let Raw::Str(key) = raw else { return Err(Reject::Mismatch) };
        let field = format!("{}.{key}", self.parent);
        match self.known.iter().find(|k| **k == key) {
            Some(k) if self.seen.contains(k) => {
                Err(Reject::InvalidAt(field, ConfigProblem::DuplicateKey { key: key.to_owned() }))
            }
            Some(k) => Ok(k),
            None => {
                let hint = if let Some(near) = suggest(key, self.known) {
                    Some(KeyHint::DidYouMean(near))
                } else if key == "<<" {
                    Some(KeyHint::MergeKey)
                } else if self.known == SIGNAL_KEYS && SHARD_KEYS.contains(&key) {
                    Some(KeyHint::UnderShard)
                } else if self.known == SHARD_KEYS && SIGNAL_KEYS.contains(&key) {
                    Some(KeyHint::SignalLevel)
                } else {
                    None
                };
                let problem =
                    ConfigProblem::UnknownKey { key: key.to_owned(), hint, what: self.what, known: self.known };
                Err(Reject::InvalidAt(field, problem))
            }
        }
    }
}

fn list_keys(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
}

/// The known key nearest `key`, if it is near enough to be a typo.
fn suggest(key: &str, known: &[&'static str]) -> Option<&'static str> {
    let key = key.to_lowercase();
    let limit = (key.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (strsim::osa_distance(&key, k), *k))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

struct SignalShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for SignalShape<'_> {
    type Out = SignalConfig;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::SignalSettings
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<SignalConfig, Reject> {
        match raw {
            Raw::Null => Ok(SignalConfig::default()),
            _ => Err(Reject::Mismatch),
        }
    }
    fn map<A: MapAccess<'de>>(&self, mut map: A) -> Result<SignalConfig, A::Error> {
        let mut config = SignalConfig::default();
        let mut seen = Vec::new();
        let ctx = self.ctx;
        while let Some(key) = map.next_key_seed(Drive(KeyShape {
            ctx,
            parent: &self.field,
            what: "a signal",
            known: SIGNAL_KEYS,
            seen: &seen,
        }))? {
            seen.push(key);
            let field = format!("{}.{key}", self.field);
            match key {
                "shard" => config.shard = Some(map.next_value_seed(Drive(ShardShape { ctx, field }))?),
                "backward" => config.backward = map.next_value_seed(Drive(BackwardShape { ctx, field }))?,
                "dtype" => config.dtype = Some(map.next_value_seed(Drive(DTypeShape { ctx, field }))?),
                _ => config.compile = map.next_value_seed(Drive(BoolShape { ctx, field }))?,
            }
        }
        Ok(config)
    }
}

struct ShardShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for ShardShape<'_> {
    type Out = ShardConfig;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::ShardSettings
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<ShardConfig, Reject> {
        match raw {
            Raw::Null => Ok(ShardConfig::default()),
            _ => Err(Reject::Mismatch),
        }
    }
    fn map<A: MapAccess<'de>>(&self, mut map: A) -> Result<ShardConfig, A::Error> {
        let mut config = ShardConfig::default();
        let mut seen = Vec::new();
        let ctx = self.ctx;
        while let Some(key) = map.next_key_seed(Drive(KeyShape {
            ctx,
            parent: &self.field,
            what: "`shard`",
            known: SHARD_KEYS,
            seen: &seen,
        }))? {
            seen.push(key);
            let field = format!("{}.{key}", self.field);
            match key {
                "axis" => config.axis = map.next_value_seed(Drive(AxisShape { ctx, field }))?,
                "workers" => config.workers = map.next_value_seed(Drive(WorkersShape { ctx, field }))?,
                _ => config.replicated = map.next_value_seed(Drive(BoolShape { ctx, field }))?,
            }
        }
        Ok(config)
    }
}

struct AxisShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for AxisShape<'_> {
    type Out = i64;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::Integer
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<i64, Reject> {
        match raw {
            Raw::Int(v) => i64::try_from(v).map_err(|_| Reject::Invalid(ConfigProblem::AxisOutOfRange { axis: v })),
            _ => Err(Reject::Mismatch),
        }
    }
}

struct BoolShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for BoolShape<'_> {
    type Out = bool;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::Boolean
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<bool, Reject> {
        match raw {
            Raw::Bool(v) => Ok(v),
            _ => Err(Reject::Mismatch),
        }
    }
}

/// `backward`: a signal name; null is the same as leaving it out.
struct BackwardShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for BackwardShape<'_> {
    type Out = Option<String>;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::BackwardSignal
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<Option<String>, Reject> {
        match raw {
            Raw::Null => Ok(None),
            Raw::Str("") => Err(Reject::Invalid(ConfigProblem::EmptyBackward)),
            Raw::Str(name) => Ok(Some(name.to_owned())),
            Raw::Bool(_) | Raw::Int(_) | Raw::Float(_) => {
                Err(Reject::Invalid(ConfigProblem::NotAName { expected: self.expected(), found: raw.to_string() }))
            }
        }
    }
}

/// `dtype`: an autocast dtype, `bf16`, `f16` or `f32`.
struct DTypeShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for DTypeShape<'_> {
    type Out = gt_ir::DType;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::AutocastDType
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<gt_ir::DType, Reject> {
        match raw {
            Raw::Str(name) => match gt_ir::DType::from_name(name) {
                Some(d) if crate::tensor::autocast::takes(d) => Ok(d),
                _ => Err(Reject::Mismatch),
            },
            _ => Err(Reject::Mismatch),
        }
    }
}

/// `workers`: a non-empty list of distinct worker indices; null means all workers.
struct WorkersShape<'a> {
    ctx: &'a Ctx,
    field: String,
}

impl<'de> Schema<'de> for WorkersShape<'_> {
    type Out = Option<Vec<usize>>;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::Workers
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<Option<Vec<usize>>, Reject> {
        match raw {
            Raw::Null => Ok(None),
            _ => Err(Reject::Mismatch),
        }
    }
    fn seq<A: SeqAccess<'de>>(&self, mut seq: A) -> Result<Option<Vec<usize>>, A::Error> {
        let mut workers = Vec::new();
        loop {
            let field = format!("{}[{}]", self.field, workers.len());
            let shape = WorkerShape { ctx: self.ctx, field, seen: &workers };
            match seq.next_element_seed(Drive(shape))? {
                Some(worker) => workers.push(worker),
                None => break,
            }
        }
        if workers.is_empty() {
            return Err(self.fail(ConfigProblem::NoWorkers));
        }
        Ok(Some(workers))
    }
}

struct WorkerShape<'a> {
    ctx: &'a Ctx,
    field: String,
    seen: &'a [usize],
}

impl<'de> Schema<'de> for WorkerShape<'_> {
    type Out = usize;

    fn ctx(&self) -> &Ctx {
        self.ctx
    }
    fn field(&self) -> &str {
        &self.field
    }
    fn expected(&self) -> Expected {
        Expected::WorkerIndex
    }
    fn scalar(&self, raw: Raw<'_>) -> Result<usize, Reject> {
        match raw {
            Raw::Int(v) if v < 0 => Err(Reject::Invalid(ConfigProblem::NegativeWorker { worker: v })),
            Raw::Int(v) => match usize::try_from(v) {
                Ok(w) if self.seen.contains(&w) => Err(Reject::Invalid(ConfigProblem::WorkerTwice { worker: w })),
                Ok(w) => Ok(w),
                Err(_) => Err(Reject::Invalid(ConfigProblem::WorkerOutOfRange { worker: v })),
            },
            _ => Err(Reject::Mismatch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "\
# config.yaml
forward_layer1:
  shard:
    axis: 0                  # Shard batch dimension
    workers: [0, 1, 2, 3]    # Use workers 0-3
  backward: backward_layer1  # Different config for gradients

pipeline_stage_1:
  shard:
    axis: 0
    workers: [0, 1]
    replicated: false
  backward: pipeline_stage_1_bwd
  compile: true

params:
  shard:
    replicated: true
";

    fn err(text: &str) -> SignalConfigError {
        match Config::parse(text, "config.yaml") {
            Ok(config) => panic!("expected an error, parsed {config:?}"),
            Err(e) => e,
        }
    }

    /// Asserts the error is at `line`, about `field`, and its message contains each of `parts`.
    #[track_caller]
    fn check(e: &SignalConfigError, line: usize, field: Option<&str>, parts: &[&str]) {
        let shown = e.to_string();
        assert_eq!(e.line, Some(line), "{shown}");
        assert!(e.column.is_some(), "{shown}");
        assert_eq!(e.field.as_deref(), field, "{shown}");
        assert!(shown.starts_with(&format!("config.yaml:{line}:")), "{shown}");
        if let Some(field) = field {
            assert!(shown.contains(&format!("field `{field}`")), "{shown}");
        }
        for part in parts {
            assert!(shown.contains(part), "{shown:?} lacks {part:?}");
        }
        assert!(!shown.contains("invalid type"), "serde jargon in {shown}");
    }

    #[test]
    fn parses_the_example() {
        let config = Config::parse(EXAMPLE, "config.yaml").unwrap();
        assert_eq!(config.len(), 3);
        assert!(!config.is_empty());
        assert_eq!(
            config.signal("forward_layer1"),
            Some(&SignalConfig {
                shard: Some(ShardConfig { axis: 0, workers: Some(vec![0, 1, 2, 3]), replicated: false }),
                backward: Some("backward_layer1".to_owned()),
                compile: false,
                dtype: None,
            })
        );
        assert_eq!(
            config.signal("pipeline_stage_1"),
            Some(&SignalConfig {
                shard: Some(ShardConfig { axis: 0, workers: Some(vec![0, 1]), replicated: false }),
                backward: Some("pipeline_stage_1_bwd".to_owned()),
                compile: true,
                dtype: None,
            })
        );
        assert_eq!(
            config.signal("params"),
            Some(&SignalConfig {
                shard: Some(ShardConfig { axis: 0, workers: None, replicated: true }),
                backward: None,
                compile: false,
                dtype: None,
            })
        );
        assert_eq!(config.signal("backward_layer1"), None);
        let names: Vec<&str> = config.signals().map(|(name, _)| name).collect();
        assert_eq!(names, ["forward_layer1", "params", "pipeline_stage_1"]);
    }

    #[test]
    fn block_lists_negative_axes_and_nulls() {
        let text = "a:\n  shard:\n    axis: -1\n    workers:\n      - 2\n      - 0\n  backward: ~\nb:\n  shard:\n";
        let config = Config::parse(text, "c.yaml").unwrap();
        let a = config.signal("a").unwrap();
        assert_eq!(a.shard, Some(ShardConfig { axis: -1, workers: Some(vec![2, 0]), replicated: false }));
        assert_eq!(a.backward, None);
        assert_eq!(config.signal("b").unwrap().shard, Some(ShardConfig::default()));
    }

    #[test]
    fn empty_files_and_null_bodies() {
        for text in ["", "\n\n", "# nothing here\n  # still nothing\n", "---\n", "~\n", "{}\n"] {
            let config = Config::parse(text, "empty.yaml").unwrap();
            assert!(config.is_empty(), "{text:?}");
            assert_eq!(config, Config::default());
        }
        let config = Config::parse("params:\nother: ~\n", "c.yaml").unwrap();
        assert_eq!(config.len(), 2);
        assert_eq!(config.signal("params"), Some(&SignalConfig::default()));
        assert_eq!(config.signal("other"), Some(&SignalConfig::default()));
    }

    #[test]
    fn insert_replaces() {
        let mut config = Config::default();
        config.insert("x", SignalConfig { compile: true, ..SignalConfig::default() });
        config.insert(String::from("x"), SignalConfig::default());
        assert_eq!(config.len(), 1);
        assert_eq!(config.signal("x"), Some(&SignalConfig::default()));
    }

    #[test]
    fn unknown_keys_are_named_with_suggestions() {
        let e = err("forward_layer1:\n  shards:\n    axis: 0\n");
        check(&e, 2, Some("forward_layer1.shards"), &["unknown key `shards`", "did you mean `shard`?", "`backward`"]);
        let e = err("a:\n  shard: ~\n  complie: true\n");
        check(&e, 3, Some("a.complie"), &["unknown key `complie`", "did you mean `compile`?"]);
        let e = err("a:\n  shard:\n    axis: 1\n    wrokers: [1]\n");
        check(&e, 4, Some("a.shard.wrokers"), &["did you mean `workers`?", "`axis`, `workers`, `replicated`"]);
        let e = err("a:\n  axis: 1\n");
        check(&e, 2, Some("a.axis"), &["unknown key `axis`", "goes under `shard:`"]);
        let e = err("a:\n  zzz: 1\n");
        check(&e, 2, Some("a.zzz"), &["unknown key `zzz`", "`shard`, `backward`, `compile`"]);
        assert!(matches!(&*e.problem, ConfigProblem::UnknownKey { hint: None, .. }), "{e}");
        assert!(!e.problem.to_string().contains("did you mean"), "{e}");
        let e = err("base: &base\n  compile: true\na:\n  <<: *base\n");
        check(&e, 4, Some("a.<<"), &["merge keys are not supported"]);
        let e = err("a:\n  1: x\n");
        check(&e, 2, Some("a"), &["expected a key", "found integer 1"]);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = err("forward_layer1:\n  shard:\n    axis: x\n");
        check(&e, 3, Some("forward_layer1.shard.axis"), &["expected an integer, found string \"x\""]);
        assert_eq!(e.column, Some(11));
        assert_eq!(
            e.to_string(),
            "config.yaml:3:11: field `forward_layer1.shard.axis`: expected an integer, found string \"x\""
        );
        let e = err("a:\n  shard:\n    axis: 1.5\n");
        check(&e, 3, Some("a.shard.axis"), &["expected an integer, found number 1.5"]);
        let e = err("a:\n  shard:\n    workers: 3\n");
        check(&e, 3, Some("a.shard.workers"), &["expected a list of worker indices", "found integer 3"]);
        let e = err("a:\n  shard:\n    workers: [0, one]\n");
        check(&e, 3, Some("a.shard.workers[1]"), &["expected a worker index", "found string \"one\""]);
        let e = err("a:\n  compile: yes\n");
        check(&e, 2, Some("a.compile"), &["expected a boolean", "found string \"yes\""]);
        // Mixed precision takes a half dtype (or f32, off).
        let c = Config::parse("a:\n  dtype: bf16\n", "c.yaml").unwrap();
        assert_eq!(c.signal("a").and_then(|s| s.dtype), Some(gt_ir::DType::BF16));
        let e = err("a:\n  dtype: i32\n");
        check(&e, 2, Some("a.dtype"), &["expected a mixed-precision dtype: `bf16`, `f16` or `f32`", "i32"]);
        let e = err("a:\n  shard:\n    replicated: 1\n");
        check(&e, 3, Some("a.shard.replicated"), &["expected a boolean", "found integer 1"]);
        let e = err("a:\n  backward: [b]\n");
        check(&e, 2, Some("a.backward"), &["expected the name of a signal", "found a list"]);
        let e = err("a:\n  backward: 12\n");
        check(&e, 2, Some("a.backward"), &["found integer 12", "quote it"]);
        let e = err("a:\n  shard: 0\n");
        check(&e, 2, Some("a.shard"), &["expected the shard settings", "found integer 0"]);
        let e = err("a:\n  shard: !custom {axis: 0}\n");
        check(&e, 2, Some("a.shard"), &["tagged `!custom`"]);
        let e = err("\n\nmy_signal: [1, 2]\n");
        check(&e, 3, Some("my_signal"), &["expected the signal's settings", "found a list"]);
    }

    #[test]
    fn top_level_must_be_a_mapping() {
        let e = err("# a list\n- a\n- b\n");
        check(&e, 2, None, &["expected a mapping from signal names", "found a list"]);
        let e = err("\nhello\n");
        check(&e, 2, None, &["found string \"hello\""]);
        let e = err("a: ~\n123: ~\n");
        check(&e, 2, None, &["expected a signal name", "found integer 123", "quote it"]);
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let e = err("a:\n  compile: true\n  compile: false\n");
        check(&e, 3, Some("a.compile"), &["duplicate key `compile`"]);
        let e = err("a:\n  shard:\n    axis: 0\n    axis: 1\n");
        check(&e, 4, Some("a.shard.axis"), &["duplicate key `axis`"]);
        let e = err("a:\n  compile: true\nb: ~\na: ~\n");
        check(&e, 4, Some("a"), &["signal `a` is configured more than once"]);
    }

    #[test]
    fn bad_worker_lists() {
        let e = err("a:\n  shard:\n    workers: []\n");
        check(&e, 3, Some("a.shard.workers"), &["the list of workers is empty"]);
        let e = err("a:\n  shard:\n    workers: [0, 1, 1]\n");
        check(&e, 3, Some("a.shard.workers[2]"), &["worker 1 is listed more than once"]);
        assert_eq!(e.column, Some(21));
        let e = err("a:\n  shard:\n    workers:\n      - 0\n      - -2\n");
        check(&e, 5, Some("a.shard.workers[1]"), &["worker indices cannot be negative, found -2"]);
    }

    #[test]
    fn yaml_syntax_errors() {
        let e = err("a:\n  shard:\n\t axis: 0\n");
        check(&e, 3, None, &["invalid YAML", "tabs"]);
        let e = err("a:\n  shard: [0, 1\n  compile: true\n");
        assert!(e.line.is_some() && e.to_string().contains("invalid YAML"), "{e}");
        let e = err("a: b: c\n");
        check(&e, 1, None, &["invalid YAML", "mapping values are not allowed"]);
        // A syntax error is reported even when an earlier part is also wrong.
        let e = err("a:\n  shard: 3\nb: [\n");
        assert!(e.to_string().contains("invalid YAML"), "{e}");
        let e = err("a:\n  backward: *nowhere\n");
        check(&e, 2, None, &["invalid YAML", "unknown anchor"]);
        let e = err("a: ~\n---\nb: ~\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(
            e.to_string().starts_with("config.yaml:2: ") && matches!(*e.problem, ConfigProblem::MultipleDocuments),
            "{e}"
        );
        // Brackets nested 100,000 deep are refused where they pass 64, before the YAML
        // parser, whose time grows with the depth's square; across lines too. Brackets in
        // quotes and comments do not count, nor a quote inside a plain word.
        let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
        let e = err(&deep);
        assert!(matches!(*e.problem, ConfigProblem::TooDeep { max: 64 }) && e.column == Some(68), "{e}");
        let e = err(&format!("a:\n  shard: {}", "{\n".repeat(70)));
        assert_eq!(e.line, Some(66), "{e}");
        let quoted = format!("# {}\n\"{}\": ~\ndon't{}: ~\n", "[".repeat(99), "[".repeat(99), "]".repeat(9));
        assert_eq!(Config::parse(&quoted, "config.yaml").map(|c| c.signals.len()).ok(), Some(2));
    }

    #[test]
    fn load_reads_files_and_names_missing_ones() {
        let dir = std::env::temp_dir();
        let missing = dir.join(format!("gt-config-missing-{}.yaml", std::process::id()));
        let e = Config::load(&missing).unwrap_err();
        let shown = e.to_string();
        assert!(shown.starts_with(&missing.display().to_string()), "{shown}");
        assert!(shown.contains("cannot read the config file"), "{shown}");
        assert_eq!(e.line, None);

        let path = dir.join(format!("gt-config-load-{}.yaml", std::process::id()));
        std::fs::write(&path, EXAMPLE).unwrap();
        let config = Config::load(&path).unwrap();
        assert_eq!(config, Config::parse(EXAMPLE, "x").unwrap());
        std::fs::write(&path, "a:\n  compile: maybe\n").unwrap();
        let e = Config::load(&path).unwrap_err();
        assert_eq!(e.origin, path.display().to_string());
        assert_eq!(e.line, Some(2));
        std::fs::remove_file(&path).unwrap();
    }

    /// The only test that touches the environment (through `std::env`, which serializes
    /// its own reads and writes).
    #[test]
    fn from_env() {
        let saved = std::env::var_os(CONFIG_ENV);
        std::env::remove_var(CONFIG_ENV);
        assert!(matches!(Config::from_env(), Ok(None)));
        std::env::set_var(CONFIG_ENV, "");
        assert!(matches!(Config::from_env(), Ok(None)));

        let missing = std::env::temp_dir().join(format!("gt-config-env-missing-{}.yaml", std::process::id()));
        std::env::set_var(CONFIG_ENV, &missing);
        let e = Config::from_env().unwrap_err();
        assert!(e.to_string().contains(&missing.display().to_string()), "{e}");
        assert!(matches!(*e.problem, ConfigProblem::Read { named_by: Some(CONFIG_ENV), .. }), "{e}");
        assert!(e.to_string().contains(&format!("(named by {CONFIG_ENV})")), "{e}");

        let path = std::env::temp_dir().join(format!("gt-config-env-{}.yaml", std::process::id()));
        std::fs::write(&path, "params:\n  shard:\n    replicated: true\n").unwrap();
        std::env::set_var(CONFIG_ENV, &path);
        let config = Config::from_env().unwrap().unwrap();
        assert!(config.signal("params").unwrap().shard.as_ref().unwrap().replicated);
        std::fs::remove_file(&path).unwrap();

        match saved {
            Some(v) => std::env::set_var(CONFIG_ENV, v),
            None => std::env::remove_var(CONFIG_ENV),
        }
    }
}
