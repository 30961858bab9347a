//! Faults the simulated apiserver can inject, switchable at run time.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How the server misbehaves. Every fault acts at the socket level the way the
/// real failure does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fault {
    /// Normal service.
    #[default]
    Up,
    /// The listener is closed: connections are refused. Open connections are
    /// reset.
    Refuse,
    /// The listener is closed, so new connections are refused, while
    /// established connections are still served: a firewall change that
    /// keeps its tracked flows, a draining load balancer, an apiserver out of
    /// file descriptors. A connection that carries a watch is reset, as a
    /// long-lived stream's flow is cut, so its client must reconnect.
    RefuseNew,
    /// Connections are accepted and never answered. Open connections are
    /// reset, as a cluster deletion kills them.
    Hang,
    /// Connections are accepted, then reset.
    Reset,
    /// `/readyz` answers `code`; with `all_paths`, every path does.
    Status {
        /// The HTTP status code.
        code: u16,
        /// Whether every path answers it, not only `/readyz`.
        all_paths: bool,
    },
    /// Every answer is delayed by this long.
    Slow(Duration),
    /// The server presents a certificate from another CA. Open connections
    /// are reset.
    TlsMismatch,
    /// A repeating script, advanced by each `/readyz` request: `true` answers
    /// normally, `false` resets that request's connection.
    Flap(Vec<bool>),
}

impl Fault {
    /// Whether switching to this fault ends open connections.
    pub(crate) fn kills_connections(&self) -> bool {
        matches!(
            self,
            Self::Refuse | Self::Hang | Self::Reset | Self::TlsMismatch
        )
    }

    /// Whether the server has no listener under this fault.
    pub(crate) fn closes_listener(&self) -> bool {
        matches!(self, Self::Refuse | Self::RefuseNew)
    }
}

/// Parses a duration such as `800ms`, `2s` or `1m`: jiff's friendly
/// grammar, the same as tether's configuration takes.
///
/// # Errors
///
/// A message naming the value if it is not a duration.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    jiff::fmt::friendly::SpanParser::new()
        .parse_unsigned_duration(value.trim())
        .map_err(|err| format!("{value:?} is not a duration like 800ms, 2s or 1m: {err}"))
}

impl FromStr for Fault {
    type Err = String;

    /// `up`, `refuse`, `refuse_new`, `hang`, `reset`, `tls_mismatch`, `status=503`,
    /// `status=503,all`, `slow=800ms`, `flap=1,0,0,1`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let input = input.trim();
        let (name, arg) = input.split_once('=').unwrap_or((input, ""));
        match (name, arg) {
            ("up", "") => Ok(Self::Up),
            ("refuse", "") => Ok(Self::Refuse),
            ("refuse_new", "") => Ok(Self::RefuseNew),
            ("hang", "") => Ok(Self::Hang),
            ("reset", "") => Ok(Self::Reset),
            ("tls_mismatch", "") => Ok(Self::TlsMismatch),
            ("status", arg) => {
                let (code, all) = arg.split_once(',').unwrap_or((arg, ""));
                let code: u16 = code
                    .parse()
                    .ok()
                    .filter(|c| (100..600).contains(c))
                    .ok_or_else(|| format!("status needs an HTTP code, got {code:?}"))?;
                match all {
                    "" => Ok(Self::Status {
                        code,
                        all_paths: false,
                    }),
                    "all" => Ok(Self::Status {
                        code,
                        all_paths: true,
                    }),
                    other => Err(format!("status takes `,all` or nothing, got {other:?}")),
                }
            }
            ("slow", arg) => parse_duration(arg).map(Self::Slow),
            ("flap", arg) => {
                let steps = arg
                    .split(',')
                    .map(|s| match s.trim() {
                        "1" | "up" => Ok(true),
                        "0" | "down" => Ok(false),
                        other => Err(format!("flap steps are 1/up or 0/down, got {other:?}")),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Self::Flap(steps))
            }
            _ => Err(format!(
                "unknown fault {input:?}: expected up, refuse, refuse_new, hang, reset, tls_mismatch, status=CODE[,all], slow=DURATION or flap=1,0,..."
            )),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Up => f.write_str("up"),
            Self::Refuse => f.write_str("refuse"),
            Self::RefuseNew => f.write_str("refuse_new"),
            Self::Hang => f.write_str("hang"),
            Self::Reset => f.write_str("reset"),
            Self::TlsMismatch => f.write_str("tls_mismatch"),
            Self::Status { code, all_paths } => {
                write!(f, "status={code}{}", if *all_paths { ",all" } else { "" })
            }
            Self::Slow(d) => write!(f, "slow={}ms", d.as_millis()),
            Self::Flap(steps) => {
                let steps: Vec<_> = steps.iter().map(|up| if *up { "1" } else { "0" }).collect();
                write!(f, "flap={}", steps.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_round_trips_through_its_text() {
        let faults = [
            Fault::Up,
            Fault::Refuse,
            Fault::RefuseNew,
            Fault::Hang,
            Fault::Reset,
            Fault::TlsMismatch,
            Fault::Status {
                code: 503,
                all_paths: false,
            },
            Fault::Status {
                code: 403,
                all_paths: true,
            },
            Fault::Slow(Duration::from_millis(800)),
            Fault::Flap(vec![true, false, false]),
        ];
        for fault in faults {
            assert_eq!(
                fault.to_string().parse::<Fault>(),
                Ok(fault.clone()),
                "{fault}"
            );
        }
    }

    #[test]
    fn bad_faults_say_what_was_expected() {
        assert!(
            "status=abc"
                .parse::<Fault>()
                .unwrap_err()
                .contains("HTTP code")
        );
        assert!("slow=5".parse::<Fault>().unwrap_err().contains("unit"));
        assert!(
            "explode"
                .parse::<Fault>()
                .unwrap_err()
                .contains("unknown fault")
        );
    }
}
