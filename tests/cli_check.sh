# Helpers the command-line test scripts source (tests/test_*_cli.sh and others): results as "ok"/"FAIL" lines,
# `fail` set to 1 on any failure (the script exits with it).
fail=0
# check STATUS DESCRIPTION: ok when STATUS is 0
check() { if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; fail=1; fi; }
# expect_error DESCRIPTION COMMAND...: the command must exit non-zero with exactly one line on stderr and nothing
# on stdout ($tmp holds its stderr)
expect_error() {
    local what=$1; shift
    out=$("$@" 2>"$tmp/err.txt"); rc=$?
    lines=$(wc -l <"$tmp/err.txt")
    [ $rc -ne 0 ] && [ "$lines" = 1 ] && [ -z "$out" ]
    check $? "$what: exit $rc, $(head -c 200 "$tmp/err.txt")"
}
# each FUNCTION ARG...: FUNCTION ARG for every ARG, in subshells, G4_TEST_JOBS (default: the CPUs) at a time, each
# with its own output and $tmp/each-ARG/ (its ok/FAIL lines printed in ARG order once all ended; a FAIL sets fail).
# For independent cases whose commands are single-threaded (the CUDA emulator, a stage that leaves cores idle).
each() {
    local f=$1 a n=0 jobs=${G4_TEST_JOBS:-$(nproc)}
    shift
    for a in "$@"; do
        rm -rf "$tmp/each-$a"; mkdir -p "$tmp/each-$a"
        if [ "$n" -ge "$jobs" ]; then wait -n; else n=$((n + 1)); fi
        (fail=0; "$f" "$a" >"$tmp/each-$a.out" 2>&1; echo "$fail" >"$tmp/each-$a.rc") &
    done
    wait
    for a in "$@"; do
        cat "$tmp/each-$a.out"
        case "$(cat "$tmp/each-$a.rc" 2>/dev/null)" in
        0) ;;
        1) fail=1 ;;
        *) echo "FAIL $f $a: did not finish"; fail=1 ;;
        esac
    done
    return 0
}
