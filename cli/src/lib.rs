//! Config files for lasthop's programs: `--config FILE` names a TOML file whose keys are the
//! program's long flags (`listen = "0.0.0.0:80"`, `cpus = [0, 1]`, `fixed-response = true`).
//!
//! The file is a layer under the command line, read through the program's own clap
//! definition, so every flag has a key, with the same name, value syntax and checks, and nothing
//! can drift:
//!
//! 1. the command line is parsed as it is (flags and environment variables);
//! 2. each key of the file whose flag was given neither on the command line nor in the
//!    environment becomes `--key=value` (an array becomes the flag repeated; `true` a bare
//!    switch, `false` nothing);
//! 3. the whole is parsed again, so a bad value in the file is reported as clap reports a bad
//!    flag, and flags that conflict conflict.
//!
//! So the order of precedence is: command line, then environment, then file, then defaults. A
//! key that names no flag is an error that says where it is (`FILE:LINE:COLUMN`) and which key
//! was probably meant (the nearest by edit distance). Keys sit at the top level: there are no
//! sections. `config` and `check-config` themselves cannot be keys.
//!
//! A running program re-reads the file (SIGHUP) by calling [`parse`] again with the command
//! line it started with, then compares the [`FileConfig::values`] it runs with against the new
//! ones ([`FileConfig::changed_keys`]), applies what it can and says what needs a restart.

#[cfg(feature = "bootstrap")]
pub mod bootstrap;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command, FromArgMatches};

/// The flag that names the file, and the one that only checks it: never keys.
pub const CONFIG_FLAG: &str = "config";
pub const CHECK_FLAG: &str = "check-config";

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The command line, or the file through it, does not parse (clap's own message).
    #[error("{0}")]
    Args(#[from] clap::Error),
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML.
    #[error("{}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    /// A key the file may not have, or a value that cannot be a flag's value.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Key {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

impl ConfigError {
    /// The exit status for this error: clap's own for command-line errors (2 for a usage
    /// error, 0 for `--help` and `--version`), 1 for a bad file.
    pub fn exit_code(&self) -> i32 {
        match self {
            ConfigError::Args(e) => e.exit_code(),
            _ => 1,
        }
    }

    /// Prints the error (or the help or version text it carries) and exits, as clap does.
    pub fn exit(&self) -> ! {
        match self {
            ConfigError::Args(e) => e.exit(),
            other => {
                eprintln!("error: {other}");
                std::process::exit(other.exit_code())
            }
        }
    }
}

/// What a config file set: each key with the values it gave the flag, as strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileConfig {
    pub path: PathBuf,
    /// Key → the values written for it (one for a scalar; one per element for an array;
    /// `["true"]`/`["false"]` for a switch).
    pub values: Values,
}

impl FileConfig {
    /// The keys whose values differ between `self` (running) and `next` (re-read), including
    /// keys added or removed, in order.
    pub fn changed_keys(&self, next: &FileConfig) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> =
            self.values.keys().chain(next.values.keys()).collect();
        keys.into_iter()
            .filter(|k| self.values.get(*k) != next.values.get(*k))
            .cloned()
            .collect()
    }
}

/// The program's arguments from `argv` (its first element the program name) with the file
/// that `--config` names under them; `cmd` is the program's clap command (`T::command()`).
pub fn parse<T: FromArgMatches>(
    cmd: Command,
    argv: Vec<OsString>,
) -> Result<(T, Option<FileConfig>), ConfigError> {
    let (matches, file) = matches(cmd, argv)?;
    let args = T::from_arg_matches(&matches)?;
    Ok((args, file))
}

/// The matches of `argv` with the config file's keys layered under it.
pub fn matches(
    cmd: Command,
    argv: Vec<OsString>,
) -> Result<(ArgMatches, Option<FileConfig>), ConfigError> {
    let mut cmd = cmd;
    cmd.build();
    // The first pass only finds the file and what the command line and environment set: a
    // required flag may still come from the file, so it reports nothing but help and version.
    let first = cmd
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(argv.clone())?;
    // The subcommand that runs, and its matches.
    let (mut leaf, mut m) = (&cmd, &first);
    while let Some((name, sub)) = m.subcommand() {
        match leaf.find_subcommand(name) {
            Some(c) => {
                leaf = c;
                m = sub;
            }
            None => break,
        }
    }
    let Some(path) = m
        .try_get_one::<PathBuf>(CONFIG_FLAG)
        .ok()
        .flatten()
        .cloned()
    else {
        return Ok((cmd.try_get_matches_from(argv)?, None));
    };
    let (extra, values) = file_args(leaf, m, &path)?;
    let mut argv = argv;
    argv.extend(extra);
    let matches = cmd.try_get_matches_from(argv)?;
    Ok((matches, Some(FileConfig { path, values })))
}

/// Key → the values a file wrote for it ([`FileConfig::values`]).
pub type Values = BTreeMap<String, Vec<String>>;

/// The flags the file at `path` adds for `cmd` (whose matches so far are `m`), and what it set.
fn file_args(
    cmd: &Command,
    m: &ArgMatches,
    path: &Path,
) -> Result<(Vec<OsString>, Values), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let doc = toml_edit::Document::parse(text.as_str()).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let keys = valid_keys(cmd);
    let mut extra = Vec::new();
    let mut values = BTreeMap::new();
    for (key, item) in doc.as_table().iter() {
        let at = doc
            .as_table()
            .key(key)
            .and_then(toml_edit::Key::span)
            .map_or(0, |s| s.start);
        let fail = |message: String| {
            let (line, column) = line_column(&text, at);
            ConfigError::Key {
                path: path.to_path_buf(),
                line,
                column,
                message,
            }
        };
        if item.is_table() || item.is_array_of_tables() {
            return Err(fail(format!(
                "[{key}]: there are no sections; keys go at the top level"
            )));
        }
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key) && keys.contains(&key))
        else {
            let hint = match nearest(key, &keys) {
                Some(k) => format!("; the nearest valid key is `{k}`"),
                None => String::new(),
            };
            return Err(fail(format!("unknown key `{key}`{hint}")));
        };
        let Some(value) = item.as_value() else {
            return Err(fail(format!(
                "`{key}` must be a value (`{key} = ...`), not a table"
            )));
        };
        let written = strings(value).ok_or_else(|| {
            fail(format!(
                "`{key}`: a string, number, boolean or array of them"
            ))
        })?;
        let id = arg.get_id().as_str();
        let from_outside = matches!(
            m.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        let flag = format!("--{key}");
        let many = matches!(arg.get_action(), ArgAction::Append)
            || arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => {
                let on = match value.as_bool() {
                    Some(b) => b,
                    None => return Err(fail(format!("`{key}` is a switch: true or false"))),
                };
                if !from_outside && on {
                    extra.push(flag.into());
                }
            }
            ArgAction::Count => {
                let n = value.as_integer().filter(|n| (0..=255).contains(n));
                let Some(n) = n else {
                    return Err(fail(format!("`{key}` is a count: 0 to 255")));
                };
                if !from_outside {
                    extra.extend((0..n).map(|_| OsString::from(&flag)));
                }
            }
            _ => {
                if value.is_array() && !many {
                    return Err(fail(format!("`{key}` takes one value, not an array")));
                }
                if !from_outside {
                    extra.extend(
                        written
                            .iter()
                            .map(|v| OsString::from(format!("{flag}={v}"))),
                    );
                }
            }
        }
        values.insert(key.to_string(), written);
    }
    Ok((extra, values))
}

/// Every key a file may hold for `cmd`: its long flags, less the file's own, help and version.
fn valid_keys(cmd: &Command) -> Vec<&str> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, CONFIG_FLAG | CHECK_FLAG | "help" | "version"))
        .collect()
}

/// The valid key nearest to `key` by edit distance.
fn nearest<'a>(key: &str, keys: &[&'a str]) -> Option<&'a str> {
    keys.iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .min()
        .map(|(_, k)| k)
}

/// A TOML value as the strings it gives a flag: scalars one, arrays one per element.
fn strings(value: &toml_edit::Value) -> Option<Vec<String>> {
    use toml_edit::Value;
    let one = |v: &Value| -> Option<String> {
        Some(match v {
            Value::String(s) => s.value().clone(),
            Value::Integer(i) => i.value().to_string(),
            Value::Float(f) => f.value().to_string(),
            Value::Boolean(b) => b.value().to_string(),
            Value::Datetime(d) => d.value().to_string(),
            Value::Array(_) | Value::InlineTable(_) => return None,
        })
    };
    match value {
        Value::Array(a) => a.iter().map(one).collect(),
        v => one(v).map(|s| vec![s]),
    }
}

/// 1-based line and column (in characters) of byte offset `at` of `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// An example config for `cmd`: every key, commented out, with its help text and default, in
/// the order the program lists its flags (`lasthop-engine --print-example-config`).
pub fn example(cmd: &Command) -> String {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = format!(
        "# {} --config FILE: keys are the long flags; the command line and the environment\n\
         # override this file. Every key is here, commented out, with its default.\n",
        cmd.get_name()
    );
    let keys = valid_keys(&cmd);
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long().filter(|l| keys.contains(l)) else {
            continue;
        };
        out.push('\n');
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        for line in help.lines() {
            wrap_comment(&mut out, line, 96);
        }
        if let Some(env) = arg.get_env() {
            out.push_str(&format!("# (environment: {})\n", env.to_string_lossy()));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let shown = match arg.get_action() {
            ArgAction::SetTrue => "false".to_string(),
            ArgAction::SetFalse => "true".to_string(),
            ArgAction::Count => "0".to_string(),
            _ if defaults.is_empty() => {
                let many = matches!(arg.get_action(), ArgAction::Append);
                if many {
                    "[]".into()
                } else {
                    "\"\"".into()
                }
            }
            _ if matches!(arg.get_action(), ArgAction::Append) => format!(
                "[{}]",
                defaults
                    .iter()
                    .map(|d| toml_string(d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => toml_string(&defaults.join(",")),
        };
        out.push_str(&format!("#{long} = {shown}\n"));
    }
    out
}

/// `text` as `# ` comment lines of at most `width` characters (a longer word stands alone).
fn wrap_comment(out: &mut String, text: &str, width: usize) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// `s` as a TOML value: integers and booleans bare, everything else a string.
fn toml_string(s: &str) -> String {
    if s == "true" || s == "false" || s.parse::<i64>().is_ok() {
        s.to_string()
    } else {
        toml_edit::Value::from(s).to_string().trim().to_string()
    }
}

/// Writes what a package ships for the program `cmd` into `dir`: its man pages (one per
/// visible subcommand as well, `man/NAME[-SUB].1`), shell completions
/// (`completions/NAME.bash`, `completions/_NAME` for zsh, `completions/NAME.fish`), and the
/// example config of `config_cmd` (the command or subcommand that takes `--config`), every key
/// commented (`NAME.toml`). Returns the files written.
pub fn generate(cmd: Command, config_cmd: &Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use clap_complete::Shell;
    let name = cmd.get_name().to_string();
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    let mut written: Vec<PathBuf> = std::fs::read_dir(&man)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    for (shell, file) in [
        (Shell::Bash, format!("{name}.bash")),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let path = completions.join(file);
        let mut out = std::fs::File::create(&path)?;
        clap_complete::generate(shell, &mut cmd.clone(), name.clone(), &mut out);
        written.push(path);
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, example(config_cmd))?;
    written.push(path);
    written.sort();
    Ok(written)
}

#[cfg(test)]
mod tests;
