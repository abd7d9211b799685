//! Every loss is counted by every command: a program whose signal handler leaves with
//! siglongjmp, traced without the signal frames (then the interrupted instruction is never
//! returned to, so the QEMU backend cannot tell which way the branch before it went and
//! writes OVF there), shows the same number of overflows in `run`'s summary, `report`,
//! `decode --format summary`, `dump` and `view`; with the frames, none.

// (Its track kinds are left unread here.)
#[allow(dead_code)]
mod pftrace_reader;
mod shim_util;

use std::process::Command;

use shim_util::{pttrace, qemu_available, text};

/// The number after `prefix` in `s` (e.g. "losses: 11 lossy windows" with "losses: ").
fn number_after(s: &str, prefix: &str) -> u64 {
    let at = s
        .find(prefix)
        .unwrap_or_else(|| panic!("{prefix:?} not in:\n{s}"))
        + prefix.len();
    s[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {prefix:?} in:\n{s}"))
}

#[test]
fn overflows_written_by_the_qemu_backend_are_counted_by_every_command() {
    if !qemu_available() {
        return;
    }
    shim_util::plugin();
    let dir = tempfile::tempdir().unwrap();
    let exe = shim_util::compile("sigjmp_loop", dir.path());
    let out = dir.path().join("trace");
    // The signal frames tell where each alarm interrupted the loop: nothing is lost.
    let exact = dir.path().join("exact");
    let o = Command::new(pttrace())
        .args(["run", "--backend", "qemu", "--out"])
        .arg(&exact)
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let run = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(number_after(&run, "losses: "), 0, "{run}");
    // Without them (as where a frame cannot be read) the plugin cannot tell which way the
    // last branch before each alarm went, as the handler leaves by siglongjmp: OVF there.
    let o = Command::new(pttrace())
        .args(["run", "--backend", "qemu", "--out"])
        .arg(&out)
        .arg("--")
        .arg(&exe)
        .env("PTTRACE_QEMU_SIGFRAMES", "off")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "20\n");
    let run = String::from_utf8_lossy(&o.stderr).into_owned();
    let lossy = number_after(&run, "losses: ");
    let flagged = number_after(&run, "lossy windows (");
    assert!(flagged >= 1, "{run}");
    assert_eq!(lossy, flagged, "only overflows are lost here: {run}");

    let report = String::from_utf8_lossy(
        &Command::new(pttrace())
            .arg("report")
            .arg(&out)
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert_eq!(
        number_after(&report, "lossy windows ("),
        flagged,
        "{report}"
    );

    let ptt: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "ptt"))
        .collect();
    assert_eq!(ptt.len(), 1);
    let dump = Command::new(pttrace())
        .args(["dump", "--ptt"])
        .arg(&ptt[0])
        .output()
        .unwrap();
    let packets = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("ovf"))
        .count() as u64;
    assert!(
        packets >= flagged,
        "{packets} ovf packets, {flagged} windows"
    );

    let decode = String::from_utf8_lossy(
        &Command::new(pttrace())
            .args(["decode", "--format", "summary"])
            .arg(&out)
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let total = decode.lines().find(|l| l.starts_with("total: ")).unwrap();
    assert!(
        total.contains(&format!(" 0 gaps, {packets} overflows, ")),
        "{decode}"
    );

    let view = Command::new(pttrace())
        .arg("view")
        .arg(&out)
        .arg("--out")
        .arg(dir.path().join("view"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&view.stdout);
    let gaps = match packets {
        1 => "1 gap".to_string(),
        n => format!("{n} gaps"),
    };
    assert!(said.contains(&format!(", {gaps};")), "{said}");
    let svg = std::fs::read_to_string(dir.path().join("view/flamegraph.svg")).unwrap();
    assert!(
        svg.contains(&format!("({packets} gaps or losses in the trace")),
        "the flame graph's title names the losses"
    );
    let timeline = std::fs::read_to_string(dir.path().join("view/timeline.json")).unwrap();
    assert_eq!(
        timeline.matches("\"what\":\"overflow").count() as u64,
        packets,
        "one instant event per overflow"
    );
    // The same gaps in Perfetto's timeline: an instant event each, saying what was lost,
    // where the JSON timeline has it (on the instruction axis, 1 ns an instruction).
    let json: serde_json::Value = serde_json::from_str(&timeline).unwrap();
    let mut from_json: Vec<(u64, String)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .map(|e| {
            let what = e["args"]["what"].as_str().unwrap();
            (e["ts"].as_u64().unwrap(), format!("gap: {what}"))
        })
        .collect();
    let pf =
        pftrace_reader::read(&std::fs::read(dir.path().join("view/timeline.pftrace")).unwrap())
            .unwrap();
    let mut from_pf: Vec<(u64, String)> = pf
        .instants
        .iter()
        .map(|(_, ts, n)| (*ts, n.clone()))
        .collect();
    from_json.sort();
    from_pf.sort();
    assert_eq!(from_pf.len() as u64, packets);
    assert!(
        from_pf.iter().all(|(_, n)| n.starts_with("gap: overflow")),
        "{from_pf:?}"
    );
    assert_eq!(from_pf, from_json);
    // The same line about the losses on stderr from every reader of the directory, and
    // exit status 1 (the output is written, but the trace is lossy) unless --keep-going.
    let line = format!(
        "lost: {flagged} lossy windows ({flagged} with PT overflows), 0 dropped windows: what \
         they lack is missing from the output"
    );
    let single = format!(
        "lost: {packets} PT overflows (OVF packets): the instructions around each are \
         missing from the output"
    );
    for (args, input, line) in [
        (&["report"][..], &out, &line),
        (&["decode", "--format", "summary"], &out, &line),
        (&["view", "--format", "folded"], &out, &line),
        (
            &["decode", "--format", "summary", "--ptt"],
            &ptt[0],
            &single,
        ),
        (&["dump", "--ptt"], &ptt[0], &single),
    ] {
        let o = Command::new(pttrace())
            .args(args)
            .arg(input)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        let want = format!("pttrace {}: {line}", args[0]);
        assert!(err.contains(&want), "{args:?}: want {want:?} in\n{err}");
        assert!(
            err.contains(&format!(
                "pttrace {}: the trace is lossy (`lost:` above); what could be read was \
                 used; pass --keep-going to accept that with exit status 0",
                args[0]
            )),
            "{err}"
        );
        let mut k = vec![args[0], "--keep-going"];
        k.extend_from_slice(&args[1..]);
        let o = Command::new(pttrace())
            .args(&k)
            .arg(input)
            .output()
            .unwrap();
        assert!(o.status.success(), "{k:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&want), "{k:?}: {err}");
        assert!(
            err.contains(&format!(
                "pttrace {}: continued past a lossy trace (--keep-going)",
                args[0]
            )),
            "{err}"
        );
    }
    // The exact trace: nothing lost, status 0 and no `lost:` line.
    for args in [&["report"][..], &["decode", "--format", "summary"]] {
        let o = Command::new(pttrace())
            .args(args)
            .arg(&exact)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("lost:"),
            "{o:?}"
        );
    }
}
