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
