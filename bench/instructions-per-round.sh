#!/usr/bin/env bash
# Instructions one daemon executes per round, counted by callgrind: a by-hand benchmark that does not depend on
# the machine's load (docs/benchmarks.md, "Instructions per round").
#
#   bench/instructions-per-round.sh [relay|frontend|agent] [canopy up options...]
#
# Runs `canopy up` twice, for 100 and then 300 rounds, with every daemon of the chosen kind under
# `valgrind --tool=callgrind`, and prints the difference of the two runs over the 200 rounds between them, so
# that start-up, TLS handshakes and shutdown cancel out: instructions per round for the whole process, and the
# functions that execute most of them (self cost). memcpy and memset are counted by bytes under valgrind (one
# instruction per byte moved), so their lines give the bytes copied and set per round.
#
# Needs valgrind, callgrind_annotate and python3, and a release build (cargo build --release --workspace).
# Options after the kind go to `canopy up`; the default is the MRNet kit's 4 x 16 tree at a round every 60 ms.
set -euo pipefail

kind=${1:-relay}
shift || true
case "$kind" in
relay | frontend | agent) ;;
*)
    echo "usage: $0 [relay|frontend|agent] [canopy up options...]" >&2
    exit 64
    ;;
esac
for tool in valgrind callgrind_annotate python3; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is not installed" >&2
        exit 69
    }
done
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CANOPY_BIN:-$root/target/release}
[[ -x $bin/canopy && -x $bin/canopy-$kind ]] || {
    echo "$0: no release build in $bin (cargo build --release --workspace)" >&2
    exit 66
}
if [[ $# -eq 0 ]]; then
    set -- --ranks 64 --agents 4 --fanout 2 --events 100 --period-ms 60 --filters stats
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# `canopy up` starts the daemons it finds beside itself: a directory of links, with the chosen kind wrapped.
mkdir "$work/bin"
for f in "$bin"/canopy-* "$bin"/*.so; do
    [[ -e $f ]] && ln -s "$f" "$work/bin/"
done
cp "$bin/canopy" "$work/bin/canopy"
rm "$work/bin/canopy-$kind"
cat >"$work/bin/canopy-$kind" <<EOF
#!/usr/bin/env bash
exec valgrind --tool=callgrind --callgrind-out-file=$work/callgrind.\$\$.out "$bin/canopy-$kind" "\$@"
EOF
chmod +x "$work/bin/canopy-$kind"

for rounds in 100 300; do
    rm -f "$work"/callgrind.*.out
    "$work/bin/canopy" up --rounds "$rounds" --timeout-ms 5000 --quiet --out "$work/run-$rounds" "$@" >/dev/null
    # With several daemons of the kind, the one that executed most (an inner relay, say) is the one counted.
    out=$(ls -S "$work"/callgrind.*.out | head -1)
    callgrind_annotate --auto=no --threshold=100 "$out" >"$work/annotate-$rounds.txt" 2>/dev/null
done

python3 - "$work/annotate-100.txt" "$work/annotate-300.txt" "$kind" <<'EOF'
import re, sys
from collections import Counter

def self_costs(path):
    costs = Counter()
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m or "=>" in m.group(2):
            continue
        costs[m.group(2).strip()] += int(m.group(1).replace(",", ""))
    return costs

a, b = self_costs(sys.argv[1]), self_costs(sys.argv[2])
total = (b["PROGRAM TOTALS"] - a["PROGRAM TOTALS"]) / 200
print(f"canopy-{sys.argv[3]}: {total:,.0f} instructions per round (callgrind, runs of 100 and 300 rounds)")
per_round = Counter({k: (b[k] - a[k]) / 200 for k in b if k != "PROGRAM TOTALS"})
for name, n in per_round.most_common(25):
    name = re.sub(r"/root/\.cargo/registry/src/[^/]+/|/rustc/[0-9a-f]+/library/", "", name)
    print(f"{n:>10,.0f} {100 * n / total:5.1f}%  {name[:150]}")
EOF
