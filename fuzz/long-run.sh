#!/bin/sh
# Runs every fuzz target (or those named) one after the other for RUNS inputs each, with one libFuzzer process
# at a time, and prints a line of figures per target from libFuzzer's final stats. Crashes and hangs are written
# to fuzz/artifacts/TARGET/; the corpus grows in fuzz/corpus/TARGET/ (neither is committed).
#
#   fuzz/long-run.sh                     # every target, 10 million inputs each
#   RUNS=1000000 fuzz/long-run.sh topology config
#   MAX_TIME=600 fuzz/long-run.sh        # at most 10 minutes per target: fewer inputs where a target is slow
set -u
cd "$(dirname "$0")"
RUNS=${RUNS:-10000000}
RSS_MB=${RSS_MB:-2048}
TIMEOUT_S=${TIMEOUT_S:-10}
MAX_TIME=${MAX_TIME:-0}
TARGETS=${*:-$(cargo +nightly fuzz list)}
mkdir -p logs
cargo +nightly fuzz build -s none || exit 1
for t in $TARGETS; do
    mkdir -p "corpus/$t"
    start=$(date +%s)
    cargo +nightly fuzz run -s none "$t" "corpus/$t" "seeds/$t" -- \
        -runs="$RUNS" -max_total_time="$MAX_TIME" -rss_limit_mb="$RSS_MB" -timeout="$TIMEOUT_S" -max_len=4096 -print_final_stats=1 \
        >"logs/$t.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    stat() { sed -n "s/^stat::$1: *//p" "logs/$t.log" | tail -1; }
    crashes=$(ls "artifacts/$t" 2>/dev/null | grep -c '^crash-' || true)
    hangs=$(ls "artifacts/$t" 2>/dev/null | grep -c '^timeout-' || true)
    ooms=$(ls "artifacts/$t" 2>/dev/null | grep -c '^oom-' || true)
    echo "$t runs=$(stat number_of_executed_units) exec/s=$(stat average_exec_per_sec) peak_rss_mb=$(stat peak_rss_mb) slowest_s=$(stat slowest_unit_time_sec) seconds=$secs corpus=$(ls "corpus/$t" | wc -l) crashes=$crashes hangs=$hangs ooms=$ooms exit=$rc"
done
