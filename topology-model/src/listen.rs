//! Listen addresses as the flags take them: `IP:PORT`, `[IPv6]:PORT`, and `[IP]:PORT` for either
//! family. The DaemonSet writes `[$(POD_IP)]:9464`, which reads the same on IPv4, IPv6 and
//! IPv6-primary dual-stack clusters; `$(POD_IP):9464` would become `fd00::5:9464`, itself an IPv6
//! address with no port.

use std::net::{IpAddr, SocketAddr};

/// A listen address that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a listen address: write IP:PORT, or [IP]:PORT for either family (as in [$(POD_IP)]:9464); an \
     IPv6 address needs the brackets"
)]
pub struct NotListenAddress(pub String);

/// Parses `IP:PORT`, `[IPv6]:PORT` or `[IPv4]:PORT`.
pub fn parse_listen(text: &str) -> Result<SocketAddr, NotListenAddress> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bracketed = text.strip_prefix('[').and_then(|rest| rest.split_once("]:"));
    bracketed
        .and_then(|(ip, port)| Some(SocketAddr::new(ip.parse::<IpAddr>().ok()?, port.parse().ok()?)))
        .ok_or_else(|| NotListenAddress(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_family_in_brackets_and_the_usual_forms() {
        let parsed = |text: &str| parse_listen(text).map(|addr| addr.to_string());
        assert_eq!(parsed("10.0.0.5:9464"), Ok("10.0.0.5:9464".into()));
        assert_eq!(parsed("[10.0.0.5]:9464"), Ok("10.0.0.5:9464".into()));
        assert_eq!(parsed("[fd00::5]:9464"), Ok("[fd00::5]:9464".into()));
        assert_eq!(parsed("127.0.0.1:0"), Ok("127.0.0.1:0".into()));
        for bad in ["fd00::5:9464", "10.0.0.5", "[10.0.0.5]", "[fd00::5]:", "[::1]:99999", "host:80", ""] {
            let error = parse_listen(bad).unwrap_err().to_string();
            assert!(error.starts_with(&format!("{bad:?} is not a listen address")), "{error}");
        }
    }
}
