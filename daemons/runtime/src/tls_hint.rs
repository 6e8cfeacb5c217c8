//! What a failed connection's error chain means in words an operator can act on: rustls and h2 name the fault
//! (`invalid peer certificate: BadSignature`, `h2 protocol error`), not its usual cause (another tree's CA, a
//! plaintext client against a TLS port). Shared by the daemons' links and the `canopy` command.

/// The likely cause of a connection failure whose error chain reads `chain`, and what to do, if it is a TLS
/// fault.
pub fn hint(chain: &str) -> Option<&'static str> {
    let has = |words: &[&str]| words.iter().any(|w| chain.contains(w));
    if has(&["UnknownIssuer", "BadSignature"]) {
        return Some(
            "unknown CA: the peer's certificate is not signed by the CA this side trusts (another tree's \
             certificates? give the CA and certificates of the tree you mean: `canopy up` writes OUT/tls)",
        );
    }
    if has(&["Expired", "expired"]) {
        return Some("expired: a certificate is past its validity (`canopy certs` makes a new set)");
    }
    if has(&["NotValidYet"]) {
        return Some("not yet valid: a certificate's validity starts later (is this host's clock right?)");
    }
    if has(&["NotValidForName", "CertNotValidForName"]) {
        return Some(
            "name mismatch: the peer's certificate does not name the address dialled (dial the name or address \
             it was made for, or make it with `canopy certs ... --host ADDR`)",
        );
    }
    if has(&[
        "UnknownCA",
        "unknown ca",
        "BadCertificate",
        "bad certificate",
        "CertificateRequired",
    ]) {
        return Some(
            "refused certificate: the peer did not accept this side's certificate (not of its tree's CA, or none \
             given)",
        );
    }
    if has(&[
        "InvalidCertificate(Other",
        "certificate role",
        "extended key usage",
        "ExtendedKeyUsage",
    ]) {
        return Some("wrong role: the certificate is not one for this use (a node's, a client's)");
    }
    // A plaintext client's HTTP/2 preface meets a TLS server: the server's answer is no HTTP/2 frame.
    if has(&["h2 protocol error", "frame with invalid size"]) {
        return Some(
            "plaintext against TLS: the peer speaks TLS; leave out --insecure and give its certificates",
        );
    }
    // A TLS client's hello meets a plaintext server: its answer is no TLS record.
    if has(&["corrupt message", "InvalidContentType", "invalid content type"]) {
        return Some(
            "TLS against plaintext: the peer speaks plaintext (started with --insecure); give --insecure",
        );
    }
    None
}

/// An error and its causes on one line (transport errors hide the useful part in their sources), each cause
/// that only repeats the one before it said once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        // A wrapper whose message ends with its source's ("transport error: X" over "X") says it once.
        if !parts.last().is_some_and(|p| p.ends_with(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
}

/// `message`, with the hint for its chain after it (on the same line: a log line, a command's one-line error) if
/// there is one.
pub fn with_hint(message: &str) -> String {
    match hint(message) {
        Some(h) => format!("{message} ({h})"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tls_fault_is_named() {
        let cases = [
            (
                "transport error: invalid peer certificate: BadSignature",
                "unknown CA",
            ),
            ("invalid peer certificate: UnknownIssuer", "unknown CA"),
            ("invalid peer certificate: Expired", "expired"),
            ("invalid peer certificate: NotValidForName", "name mismatch"),
            ("received fatal alert: UnknownCA", "refused certificate"),
            (
                "Internal: h2 protocol error: http2 error",
                "plaintext against TLS",
            ),
            (
                "received corrupt message of type InvalidContentType",
                "TLS against plaintext",
            ),
        ];
        for (chain, want) in cases {
            let got = hint(chain).unwrap_or_default();
            assert!(got.starts_with(want), "{chain}: {got}");
        }
        assert_eq!(hint("connection refused"), None);
        assert_eq!(with_hint("connection refused"), "connection refused");
    }
}
