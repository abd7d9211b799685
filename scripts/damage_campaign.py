#!/usr/bin/env python3
"""Damage campaign: mutates every file kind of trace directories and runs every reader on
each mutant; prints, per command, how many damaged inputs it reported (exit status not 0,
or a `damaged:` line with --keep-going) out of those any command reported.

  scripts/damage_campaign.py PTTRACE DIR... [--runs N] [--seed S]

DIR: trace directories to mutate (copied; never changed). A mutant no command reports
may be harmless (a byte of padding, a free spool entry, two info records in another
order) or undetectable (the spool's in-flight syscalls, which carry no checksum; a flipped
bit inside PT bytes that still decode). Mutations: one byte set to 0xff,
one bit flipped, 256 bytes inserted, the end cut at a random byte, the file cut at a
record boundary, two windows swapped, the file deleted. A crash (signal), a panic or a
timeout is counted on its own line and is always a failure.
"""
import os, random, shutil, struct, subprocess, sys, tempfile

def frames(data):
    """(offset, length) of each frame of a .ptt/.info file (16-byte file header, then
    frames: u32 len, u16 type, u16 flags, payload[len], u32 crc; see pttrace-format)."""
    out, at = [], 16
    while at + 12 <= len(data):
        ln = struct.unpack_from("<I", data, at)[0]
        total = 12 + ln
        if at + total > len(data):
            break
        out.append((at, total))
        at += total
    return out

def mutate(path, rng):
    data = bytearray(open(path, "rb").read())
    kinds = ["ff", "bit", "insert", "cut", "delete"]
    if path.endswith((".ptt", ".info")):
        kinds += ["boundary", "swap"]
    k = rng.choice(kinds)
    if k == "delete" or not data:
        os.remove(path)
        return k
    i = rng.randrange(len(data))
    if k == "ff":
        data[i] = 0xff if data[i] != 0xff else 0
    elif k == "bit":
        data[i] ^= 1 << rng.randrange(8)
    elif k == "insert":
        data[i:i] = bytes(rng.randrange(256) for _ in range(256))
    elif k == "cut":
        del data[i:]
    else:
        fr = frames(bytes(data))
        if len(fr) < 4:
            del data[i:]
        elif k == "boundary":
            at = fr[rng.randrange(1, len(fr))][0]
            del data[at:]
        else:
            j = rng.randrange(1, len(fr) - 1)
            (a, la), (b, lb) = fr[j], fr[j + 1]
            data[a:b + lb] = data[b:b + lb] + data[a:a + la]
    open(path, "wb").write(data)
    return k

def run(cmd, timeout=120):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        return "crash"
    if "panicked" in err:
        return "panic"
    return "reported" if p.returncode != 0 or "damaged:" in err else "silent"

def main():
    args = sys.argv[1:]
    runs = int(args[args.index("--runs") + 1]) if "--runs" in args else 100
    seed = int(args[args.index("--seed") + 1]) if "--seed" in args else 1
    args = [a for i, a in enumerate(args) if a not in ("--runs", "--seed") and
            (i == 0 or args[i - 1] not in ("--runs", "--seed"))]
    exe, dirs = args[0], args[1:]
    rng = random.Random(seed)
    cmds = {
        "report": lambda d: [exe, "report", d],
        "decode DIR": lambda d: [exe, "decode", "--format", "summary", d],
        "view DIR": lambda d: [exe, "view", "--format", "folded", "--out", d + ".view", d],
    }
    tally = {c: {"reported": 0, "silent": 0, "crash": 0, "panic": 0, "timeout": 0} for c in cmds}
    damaged = 0
    by_kind = {}
    for n in range(runs):
        src = rng.choice(dirs)
        tmp = tempfile.mkdtemp()
        d = os.path.join(tmp, "t")
        shutil.copytree(src, d)
        files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
        victim = rng.choice(files)
        kind = os.path.splitext(victim)[1] + ":" + mutate(victim, rng)
        res = {c: run(f(d)) for c, f in cmds.items()}
        k = by_kind.setdefault(kind, [0, 0, 0])
        k[0] += 1
        if any(r != "silent" for r in res.values()):
            damaged += 1
            for c, r in res.items():
                tally[c][r] += 1
            k[1] += 1
            k[2] += all(r == "reported" for r in res.values())
        shutil.rmtree(tmp)
    print(f"{runs} mutants, {damaged} reported by at least one command")
    for c, t in tally.items():
        print(f"  {c:11} reported {t['reported']} of {damaged}; silent {t['silent']}; "
              f"crash {t['crash']}, panic {t['panic']}, timeout {t['timeout']}")
    print("  by file and mutation: mutants, reported by some command, by all:")
    for k, (total, some, every) in sorted(by_kind.items()):
        print(f"    {k:18} {total:4} {some:4} {every:4}")

if __name__ == "__main__":
    main()
