use std::io::Write;

use clap::{CommandFactory, Parser, Subcommand};

use super::*;

#[derive(Parser, Debug, PartialEq)]
#[command(name = "prog")]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Cores.
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<u32>,
    /// A switch.
    #[arg(long)]
    fixed_response: bool,
    /// Seconds.
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    check_config: bool,
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn run(argv: &[&str]) -> Result<(Args, Option<FileConfig>), ConfigError> {
    parse::<Args>(Args::command(), argv.iter().map(OsString::from).collect())
}

#[test]
fn the_file_sets_what_the_command_line_does_not() {
    let f =
        file("listen = \"0.0.0.0:80\"\ncpus = [0, 1]\nfixed-response = true\nidle-timeout = 5\n");
    let path = f.path().to_str().unwrap();
    let (args, loaded) = run(&["prog", "--config", path]).unwrap();
    assert_eq!(args.listen, "0.0.0.0:80");
    assert_eq!(args.cpus, vec![0, 1]);
    assert!(args.fixed_response);
    assert_eq!(args.idle_timeout, 5);
    assert_eq!(loaded.unwrap().values["cpus"], vec!["0", "1"]);
    // Flags win over the file.
    let (args, _) = run(&[
        "prog",
        "--config",
        path,
        "--idle-timeout",
        "9",
        "--cpus",
        "3",
    ])
    .unwrap();
    assert_eq!((args.idle_timeout, args.cpus), (9, vec![3]));
    // No file: defaults.
    let (args, loaded) = run(&["prog"]).unwrap();
    assert_eq!(
        (args.listen.as_str(), args.idle_timeout, loaded),
        ("127.0.0.1:8080", 60, None)
    );
}

#[derive(Parser, Debug)]
#[command(name = "envprog")]
struct EnvArgs {
    #[arg(long, env = "LASTHOP_CLI_TEST_ONLY_LISTEN", default_value = "d")]
    listen: String,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Parser, Debug)]
#[command(name = "req")]
struct Required {
    #[arg(long)]
    key_file: PathBuf,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[test]
fn a_required_flag_may_come_from_the_file() {
    let f = file("key-file = \"/etc/k\"\n");
    let argv = |extra: &[&str]| {
        ["req"]
            .iter()
            .chain(extra)
            .map(OsString::from)
            .collect::<Vec<_>>()
    };
    let (r, _) = parse::<Required>(
        Required::command(),
        argv(&["--config", f.path().to_str().unwrap()]),
    )
    .unwrap();
    assert_eq!(r.key_file, PathBuf::from("/etc/k"));
    // Missing everywhere: clap's usage error, exit status 2.
    let e = parse::<Required>(Required::command(), argv(&[])).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    // --help still prints help (status 0), file or not.
    let e = parse::<Required>(Required::command(), argv(&["--help"])).unwrap_err();
    assert_eq!(e.exit_code(), 0, "{e}");
}

#[test]
fn the_environment_wins_over_the_file() {
    let f = file("listen = \"0.0.0.0:80\"\n");
    // Only this test's command reads this variable.
    std::env::set_var("LASTHOP_CLI_TEST_ONLY_LISTEN", "10.0.0.1:1");
    let got = parse::<EnvArgs>(
        EnvArgs::command(),
        ["envprog", "--config", f.path().to_str().unwrap()]
            .iter()
            .map(OsString::from)
            .collect(),
    );
    std::env::remove_var("LASTHOP_CLI_TEST_ONLY_LISTEN");
    assert_eq!(got.unwrap().0.listen, "10.0.0.1:1");
}

#[test]
fn unknown_keys_say_where_and_what_was_meant() {
    let f = file("# a comment\nidle-timeout = 5\n  lisen = \"x\"\n");
    let e = run(&["prog", "--config", f.path().to_str().unwrap()]).unwrap_err();
    let text = e.to_string();
    assert!(
        text.ends_with(":3:3: unknown key `lisen`; the nearest valid key is `listen`"),
        "{text}"
    );
    assert!(text.starts_with(f.path().to_str().unwrap()), "{text}");
    assert_eq!(e.exit_code(), 1);
    // The file's own flags are not keys.
    let f = file("config = \"other.toml\"\n");
    assert!(run(&["prog", "--config", f.path().to_str().unwrap()]).is_err());
}

#[test]
fn bad_values_are_reported_as_flags_are() {
    for (text, want) in [
        (
            "idle-timeout = \"soon\"\n",
            "invalid value 'soon' for '--idle-timeout",
        ),
        ("fixed-response = \"yes\"\n", "is a switch"),
        ("listen = [\"a\", \"b\"]\n", "takes one value"),
        ("[section]\nlisten = \"a\"\n", "no sections"),
        ("listen = { a = 1 }\n", "a string, number"),
        ("listen = \n", "TOML"),
    ] {
        let f = file(text);
        let e = run(&["prog", "--config", f.path().to_str().unwrap()]).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(
            shown.contains(want) || (want == "TOML" && matches!(e, ConfigError::Syntax { .. })),
            "{text:?}: {shown}"
        );
    }
    let e = run(&["prog", "--config", "/nonexistent/lasthop.toml"]).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
}

#[test]
fn a_reload_sees_what_changed() {
    let mut f = file("idle-timeout = 5\nlisten = \"a:1\"\n");
    let path = f.path().to_str().unwrap().to_string();
    let (_, before) = run(&["prog", "--config", &path]).unwrap();
    f.as_file_mut().set_len(0).unwrap();
    std::fs::write(&path, "idle-timeout = 6\ncpus = [1]\nlisten = \"a:1\"\n").unwrap();
    let (_, after) = parse::<Args>(
        Args::command(),
        ["prog", "--config", &path]
            .iter()
            .map(OsString::from)
            .collect(),
    )
    .unwrap();
    assert_eq!(
        before.unwrap().changed_keys(&after.unwrap()),
        vec!["cpus".to_string(), "idle-timeout".to_string()]
    );
}

#[derive(Parser, Debug)]
#[command(name = "ctl")]
struct Ctl {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    Serve {
        #[arg(long, default_value = "x")]
        api_listen: String,
        #[arg(long)]
        config: Option<PathBuf>,
    },
    Other,
}

#[test]
fn a_subcommand_reads_its_own_keys() {
    let f = file("api-listen = \"y\"\n");
    let (ctl, _) = parse::<Ctl>(
        Ctl::command(),
        ["ctl", "serve", "--config", f.path().to_str().unwrap()]
            .iter()
            .map(OsString::from)
            .collect(),
    )
    .unwrap();
    match ctl.command {
        Cmd::Serve { api_listen, .. } => assert_eq!(api_listen, "y"),
        Cmd::Other => panic!("serve"),
    }
}

#[test]
fn the_example_lists_every_key_and_parses_uncommented() {
    let example = example(&Args::command());
    for key in ["listen", "cpus", "fixed-response", "idle-timeout"] {
        assert!(
            example.contains(&format!("\n#{key} = ")),
            "{key}: {example}"
        );
    }
    assert!(!example.contains("#config ="), "{example}");
    // Uncommenting every key of the example gives the defaults back.
    let uncommented: String = example
        .lines()
        .filter_map(|l| l.strip_prefix('#').filter(|l| l.contains(" = ")))
        .map(|l| format!("{l}\n"))
        .collect();
    let f = file(&uncommented);
    let (args, _) = run(&["prog", "--config", f.path().to_str().unwrap()]).unwrap();
    let (defaults, _) = run(&["prog"]).unwrap();
    assert_eq!(
        args,
        Args {
            config: args.config.clone(),
            ..defaults
        }
    );
}

proptest::proptest! {
    /// Whatever the file holds, reading it never panics: it is read or refused.
    #[test]
    fn any_file_is_read_or_refused(text in "[a-z\\-= \\[\\]\"0-9,\n#.:]{0,120}") {
        let f = file(&text);
        let _ = run(&["prog", "--config", f.path().to_str().unwrap()]);
    }
}
